//! The fake API server, by hand:
//!
//! ```text
//! cargo run -p swiftlet-tests --bin fake-apiserver -- [--port N] [--tls]
//!     [--kubeconfig PATH] [--token TOKEN=USER[:GROUP,GROUP...]]...
//!     [--rule allow|deny:user=U,group=G,verb=V,resource=R,subresource=S,path=P]...
//!     [--bookmark-interval SECONDS] [--history N]
//!     [--storage] [--csi-controller DRIVER=SOCKET]... [--ca-file PATH]
//! ```
//!
//! It writes a kubeconfig (default: fake-apiserver.kubeconfig in the
//! current directory) that kubectl and swiftlet can use, prints where it
//! listens, and serves until Ctrl-C. With `--tls`, `--ca-file` copies its
//! CA certificate to PATH: the CA of the kubeconfig's users and of the
//! client certificate it proxies `kubectl exec`, `logs` and `port-forward`
//! with, so a kubelet that names it as `clientCAFile` trusts both.
//!
//! SubjectAccessReviews (the kubelet's webhook authorization) are answered
//! by the `--rule`s in order, then, as RBAC does for its superusers, by an
//! allow for the group `system:masters` (the kubeconfig's admin); anything
//! else is denied. TokenReviews know the `--token`s.
//!
//! `--storage` runs the storage controllers (PV binding and reclaim,
//! generic ephemeral volumes, and for the `--csi-controller` drivers
//! dynamic provisioning, attach/detach and expansion through the CSI
//! Controller service on SOCKET); see `swiftlet_tests::apiserver::storage`.

use std::{path::PathBuf, time::Duration};

use swiftlet_tests::apiserver::{
    Credentials, FakeApiServer, Options, StorageOptions,
    auth::{AccessRule, UserInfo},
};

fn usage() -> ! {
    eprintln!(
        "usage: fake-apiserver [--port N] [--tls] [--kubeconfig PATH] [--token TOKEN=USER[:GROUP,...]]... \
         [--rule allow|deny:key=value,...]... [--bookmark-interval SECONDS] [--history N] \
         [--storage] [--csi-controller DRIVER=SOCKET]... [--ca-file PATH]\n\
         SubjectAccessReviews: the --rules in order, then allow group system:masters (the kubeconfig's admin)"
    );
    std::process::exit(2)
}

fn main() {
    let mut options = Options::default();
    let mut kubeconfig = PathBuf::from("fake-apiserver.kubeconfig");
    let mut storage = false;
    let mut ca_out: Option<PathBuf> = None;
    let mut csi_controllers: Vec<(String, PathBuf)> = vec![];
    let mut args = std::env::args().skip(1);
    let value = |flag: &str, args: &mut dyn Iterator<Item = String>| {
        args.next().unwrap_or_else(|| {
            eprintln!("fake-apiserver: {flag} needs a value");
            usage()
        })
    };
    while let Some(a) = args.next() {
        let (flag, inline) = match a.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (a.clone(), None),
        };
        let v = |args: &mut dyn Iterator<Item = String>| inline.clone().unwrap_or_else(|| value(&flag, args));
        match flag.as_str() {
            "--port" => options.port = v(&mut args).parse().unwrap_or_else(|_| usage()),
            "--tls" => options.tls = true,
            "--kubeconfig" => kubeconfig = v(&mut args).into(),
            "--bookmark-interval" => {
                options.bookmark_interval = Duration::from_secs(v(&mut args).parse().unwrap_or_else(|_| usage()))
            }
            "--history" => options.history_limit = v(&mut args).parse().unwrap_or_else(|_| usage()),
            "--token" => {
                let spec = v(&mut args);
                let (token, who) = spec.split_once('=').unwrap_or_else(|| usage());
                let (user, groups) = who.split_once(':').unwrap_or((who, ""));
                let groups: Vec<&str> = groups.split(',').filter(|g| !g.is_empty()).collect();
                options.auth.tokens.insert(token.to_owned(), UserInfo::new(user, &groups));
            }
            "--rule" => match AccessRule::parse(&v(&mut args)) {
                Ok(r) => options.auth.rules.push(r),
                Err(e) => {
                    eprintln!("fake-apiserver: {e}");
                    usage()
                }
            },
            "--storage" => storage = true,
            "--ca-file" => ca_out = Some(v(&mut args).into()),
            "--csi-controller" => {
                let spec = v(&mut args);
                let (driver, socket) = spec.split_once('=').unwrap_or_else(|| usage());
                csi_controllers.push((driver.to_owned(), socket.into()));
            }
            "-h" | "--help" => usage(),
            other => {
                eprintln!("fake-apiserver: unknown flag {other}");
                usage()
            }
        }
    }
    // RBAC's superusers, after the rules given.
    options.auth.rules.push(AccessRule::superusers());
    let server = match FakeApiServer::start(options) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("fake-apiserver: cannot start: {e}");
            std::process::exit(1)
        }
    };
    for (driver, socket) in &csi_controllers {
        server.add_csi_controller(driver, socket);
        println!("fake-apiserver: CSI driver {driver}: controller at {}", socket.display());
    }
    if storage {
        server.start_storage_controllers(StorageOptions::default());
        println!("fake-apiserver: storage controllers running");
    } else if !csi_controllers.is_empty() {
        eprintln!("fake-apiserver: --csi-controller without --storage: the drivers are not used");
    }
    let credentials = match server.client_cert("admin", &["system:masters"]) {
        Some((cert, key)) => Credentials::ClientCert { cert, key },
        None => Credentials::None,
    };
    if let Err(e) = server.write_kubeconfig(&kubeconfig, &credentials) {
        eprintln!("fake-apiserver: cannot write {}: {e}", kubeconfig.display());
        std::process::exit(1)
    }
    if let Some(out) = &ca_out {
        let copied = match server.ca_file() {
            Some(ca) => std::fs::copy(&ca, out).map(drop),
            None => Err(std::io::Error::other("--ca-file needs --tls")),
        };
        if let Err(e) = copied {
            eprintln!("fake-apiserver: cannot write the CA to {}: {e}", out.display());
            std::process::exit(1)
        }
    }
    println!("fake-apiserver: serving {}", server.url());
    println!("fake-apiserver: kubeconfig {}", kubeconfig.display());
    println!("  kubectl --kubeconfig {} get nodes", kubeconfig.display());
    println!("fake-apiserver: SubjectAccessReviews: the --rules in order, then allow group system:masters");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });
    println!("fake-apiserver: stopping");
}
