//! The fake API server, by hand:
//!
//! ```text
//! cargo run -p swiftlet-tests --bin fake-apiserver -- [--port N] [--tls]
//!     [--kubeconfig PATH] [--token TOKEN=USER[:GROUP,GROUP...]]...
//!     [--rule allow|deny:user=U,group=G,verb=V,resource=R,subresource=S,path=P]...
//!     [--bookmark-interval SECONDS] [--history N]
//! ```
//!
//! It writes a kubeconfig (default: fake-apiserver.kubeconfig in the
//! current directory) that kubectl and swiftlet can use, prints where it
//! listens, and serves until Ctrl-C.
//!
//! SubjectAccessReviews (the kubelet's webhook authorization) are answered
//! by the `--rule`s in order, then, as RBAC does for its superusers, by an
//! allow for the group `system:masters` (the kubeconfig's admin); anything
//! else is denied. TokenReviews know the `--token`s.

use std::{path::PathBuf, time::Duration};

use swiftlet_tests::apiserver::{
    Credentials, FakeApiServer, Options,
    auth::{AccessRule, UserInfo},
};

fn usage() -> ! {
    eprintln!(
        "usage: fake-apiserver [--port N] [--tls] [--kubeconfig PATH] [--token TOKEN=USER[:GROUP,...]]... \
         [--rule allow|deny:key=value,...]... [--bookmark-interval SECONDS] [--history N]\n\
         SubjectAccessReviews: the --rules in order, then allow group system:masters (the kubeconfig's admin)"
    );
    std::process::exit(2)
}

fn main() {
    let mut options = Options::default();
    let mut kubeconfig = PathBuf::from("fake-apiserver.kubeconfig");
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
    let credentials = match server.client_cert("admin", &["system:masters"]) {
        Some((cert, key)) => Credentials::ClientCert { cert, key },
        None => Credentials::None,
    };
    if let Err(e) = server.write_kubeconfig(&kubeconfig, &credentials) {
        eprintln!("fake-apiserver: cannot write {}: {e}", kubeconfig.display());
        std::process::exit(1)
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
