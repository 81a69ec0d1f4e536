//! The pod fields a production cluster sends, on the real containerd and
//! checked from inside the containers: seccomp profiles (a syscall the
//! runtime's default profile blocks), runAsNonRoot against the image's
//! user, fsGroup and supplemental groups, sysctls (safe, allowed unsafe,
//! refused), native sidecars, and the pod's names, /etc/hosts and service
//! environment variables.

use std::{sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus, Service, ServicePort, ServiceSpec};
use swiftlet::volumes::MemoryObjects;
use swiftlet_tests::agent::TestAgent;

const BUSYBOX: &str = "swiftlet.local/busybox:1.35";
const T: Duration = Duration::from_secs(60);

/// A static pod; `spec` is the YAML of the spec's fields (indented by two
/// spaces), `containers` the containers' list items.
fn manifest(name: &str, spec: &str, containers: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  terminationGracePeriodSeconds: 2\n{spec}  containers:\n{containers}"
    )
}

fn sleeper(name: &str, extra: &str) -> String {
    format!("  - name: {name}\n    image: {BUSYBOX}\n    command: [\"sleep\", \"3600\"]\n{extra}")
}

fn cs<'a>(s: &'a PodStatus, name: &str) -> &'a ContainerStatus {
    s.container_statuses
        .iter()
        .chain(s.init_container_statuses.iter())
        .flatten()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no status for {name}"))
}

fn running(c: &ContainerStatus) -> bool {
    c.state.as_ref().is_some_and(|s| s.running.is_some())
}

fn waiting(c: &ContainerStatus) -> Option<(String, String)> {
    let w = c.state.as_ref()?.waiting.as_ref()?;
    Some((w.reason.clone().unwrap_or_default(), w.message.clone().unwrap_or_default()))
}

fn condition<'a>(s: &'a PodStatus, t: &str) -> Option<&'a str> {
    s.conditions.as_ref()?.iter().find(|c| c.type_ == t).map(|c| c.status.as_str())
}

#[test]
fn seccomp_runtime_default_blocks_a_syscall_that_unconfined_allows() {
    // seccompDefault: a pod that names no profile gets RuntimeDefault.
    let a = TestAgent::start("seccompDefault: true\n", &["--signal-source=cgroupfs"]);
    let net = "  hostNetwork: true\n";
    let profile = |t: &str| format!("{net}  securityContext:\n    seccompProfile: {{type: {t}}}\n");
    let explicit =
        a.add_manifest("rd.yaml", &manifest("sc-runtime-default", &profile("RuntimeDefault"), &sleeper("c", "")));
    let defaulted = a.add_manifest("df.yaml", &manifest("sc-defaulted", net, &sleeper("c", "")));
    let unconfined = a.add_manifest("un.yaml", &manifest("sc-unconfined", &profile("Unconfined"), &sleeper("c", "")));
    // unshare(CLONE_NEWUSER) needs no capability, but the runtime's default
    // profile only allows unshare to CAP_SYS_ADMIN.
    let probe = "grep '^Seccomp:' /proc/self/status; unshare -U true; echo rc=$?";
    for (pod, confined) in [(&explicit, true), (&defaulted, true), (&unconfined, false)] {
        a.wait_status(pod, T, "running", |s| running(cs(s, "c")));
        let (_, out, err) = a.exec(pod, "c", probe);
        if confined {
            assert!(out.contains("Seccomp:\t2"), "{pod}: a seccomp filter is in place: {out}");
            assert!(err.contains("Operation not permitted"), "{pod}: unshare refused with EPERM: {out} {err}");
            assert!(out.contains("rc=1"), "{pod}: {out}");
        } else {
            assert!(out.contains("Seccomp:\t0"), "{pod}: no filter: {out}");
            assert!(out.contains("rc=0"), "{pod}: unshare allowed: {out} {err}");
        }
    }
}

#[test]
fn run_as_non_root_is_checked_against_the_image_user() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let net = "  hostNetwork: true\n";
    let root = a.add_manifest(
        "root.yaml",
        &manifest("nonroot-image", &format!("{net}  securityContext: {{runAsNonRoot: true}}\n"), &sleeper("c", "")),
    );
    let user = a.add_manifest(
        "user.yaml",
        &manifest(
            "nonroot-1000",
            &format!("{net}  securityContext: {{runAsNonRoot: true, runAsUser: 1000}}\n"),
            &sleeper("c", ""),
        ),
    );
    // The busybox image names no user: it would run as root.
    let s = a.wait_status(&root, T, "CreateContainerConfigError", |s| {
        waiting(cs(s, "c")).is_some_and(|(r, _)| r == "CreateContainerConfigError")
    });
    let (_, message) = waiting(cs(&s, "c")).unwrap();
    assert!(
        message.starts_with("container has runAsNonRoot and image will run as root (pod: \"nonroot-image-")
            && message.ends_with("\", container: c)"),
        "{message}"
    );
    assert_eq!(s.phase.as_deref(), Some("Pending"));
    let failed = a.events.with_reason("Failed");
    assert!(
        failed.iter().any(|e| e.object == root && e.message.starts_with("Error: container has runAsNonRoot")),
        "{failed:?}"
    );
    // A numeric non-root user runs.
    a.wait_status(&user, T, "running", |s| running(cs(s, "c")));
    let (_, out, _) = a.exec(&user, "c", "id -u");
    assert_eq!(out.trim(), "1000");
}

#[test]
fn fs_group_owns_the_volume_and_groups_reach_the_process() {
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let spec = "  hostNetwork: true\n  securityContext: {runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000]}\n  volumes:\n  - name: data\n    emptyDir: {}\n";
    let pod = a.add_manifest(
        "fsgroup.yaml",
        &manifest("fsgroup", spec, &sleeper("c", "    volumeMounts: [{name: data, mountPath: /data}]\n")),
    );
    a.wait_status(&pod, T, "running", |s| running(cs(s, "c")));
    let (_, out, err) =
        a.exec(&pod, "c", "stat -c '%g %a' /data; id -u; id -g; id -G; touch /data/f && stat -c %g /data/f");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.first().copied(), Some("2000 2777"), "the volume is the fsGroup's, setgid: {out} {err}");
    assert_eq!(&lines[1..3], ["1000", "3000"], "{out}");
    let groups: Vec<&str> = lines[3].split_whitespace().collect();
    assert!(groups.contains(&"2000") && groups.contains(&"4000"), "fsGroup and supplementalGroups: {out}");
    assert_eq!(lines.get(4).copied(), Some("2000"), "a new file inherits the group: {out} {err}");
}

#[test]
fn sysctls_safe_allowed_and_refused() {
    let a = TestAgent::start("allowedUnsafeSysctls: [\"kernel.msg*\"]\n", &["--signal-source=cgroupfs"]);
    let with = |sysctls: &str, host_network: bool| {
        format!("  hostNetwork: {host_network}\n  securityContext:\n    sysctls: [{sysctls}]\n")
    };
    let safe = a.add_manifest(
        "safe.yaml",
        &manifest("sysctl-safe", &with("{name: kernel.shm_rmid_forced, value: \"1\"}", true), &sleeper("c", "")),
    );
    let allowed = a.add_manifest(
        "allowed.yaml",
        &manifest("sysctl-allowed", &with("{name: kernel.msgmax, value: \"65536\"}", true), &sleeper("c", "")),
    );
    let forbidden = a.add_manifest(
        "forbidden.yaml",
        &manifest(
            "sysctl-forbidden",
            &with("{name: kernel.sem, value: \"250 32000 32 128\"}", true),
            &sleeper("c", ""),
        ),
    );
    let host_net = a.add_manifest(
        "hostnet.yaml",
        &manifest("sysctl-hostnet", &with("{name: net.ipv4.tcp_syncookies, value: \"1\"}", true), &sleeper("c", "")),
    );
    let own_net = a.add_manifest(
        "ownnet.yaml",
        &manifest(
            "sysctl-ownnet",
            &with("{name: net.ipv4.ip_unprivileged_port_start, value: \"80\"}", false),
            &sleeper("c", ""),
        ),
    );

    for (pod, file, value) in [
        (&safe, "kernel/shm_rmid_forced", "1"),
        (&allowed, "kernel/msgmax", "65536"),
        (&own_net, "net/ipv4/ip_unprivileged_port_start", "80"),
    ] {
        a.wait_status(pod, T, "running", |s| running(cs(s, "c")));
        let (_, out, _) = a.exec(pod, "c", &format!("cat /proc/sys/{file}"));
        assert_eq!(out.trim(), value, "{pod}: {file}");
    }
    for (pod, message) in [
        (&forbidden, "forbidden sysctl: \"kernel.sem\" not allowlisted"),
        (&host_net, "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host net enabled"),
    ] {
        let s = a.wait_status(pod, T, "rejected", |s| s.phase.as_deref() == Some("Failed"));
        assert_eq!((s.reason.as_deref(), s.message.as_deref()), (Some("SysctlForbidden"), Some(message)), "{pod}");
        assert!(a.events.with_reason("SysctlForbidden").iter().any(|e| e.object == *pod && e.message == message));
    }
    let (sandboxes, _) = a.runtime_state(&a.pod(&forbidden).unwrap().metadata.uid.unwrap());
    assert!(sandboxes.is_empty(), "a rejected pod never reaches the runtime");
}

#[test]
fn a_native_sidecar_runs_beside_the_app_and_the_pod_completes_with_the_app() {
    // A 1 s restart back-off keeps the sidecar's restart quick.
    let a = TestAgent::start(
        "featureGates: {KubeletCrashLoopBackOffMax: true}\ncrashLoopBackOff: {maxContainerRestartPeriod: 1s}\n",
        &["--signal-source=cgroupfs"],
    );
    // The sidecar fails its first run, then serves /shared/ready; the app
    // waits for it, works 3 s and completes.
    let sidecar = "if [ ! -f /shared/once ]; then touch /shared/once; exit 1; fi; touch /shared/ready; exec sleep 3600";
    let spec = format!(
        "  hostNetwork: true\n  restartPolicy: Never\n  volumes:\n  - name: shared\n    emptyDir: {{}}\n  initContainers:\n  - name: proxy\n    image: {BUSYBOX}\n    restartPolicy: Always\n    command: [\"sh\", \"-c\", {sidecar:?}]\n    volumeMounts: [{{name: shared, mountPath: /shared}}]\n    readinessProbe:\n      exec: {{command: [\"test\", \"-f\", \"/shared/ready\"]}}\n      periodSeconds: 1\n"
    );
    let app = format!(
        "  - name: app\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"while [ ! -f /shared/ready ]; do sleep 0.2; done; sleep 3\"]\n    volumeMounts: [{{name: shared, mountPath: /shared}}]\n"
    );
    let pod = a.add_manifest("sidecar.yaml", &manifest("sidecar", &spec, &app));
    // Both run: the sidecar was restarted after its failure (under Never),
    // and it counts toward readiness.
    let s = a.wait_status(&pod, T, "app and sidecar running and Ready", |s| {
        running(cs(s, "app")) && running(cs(s, "proxy")) && condition(s, "Ready") == Some("True")
    });
    let proxy = cs(&s, "proxy");
    assert!(proxy.restart_count >= 1, "the failed sidecar was restarted: {proxy:?}");
    assert_eq!((proxy.started, proxy.ready), (Some(true), true));
    assert_eq!(s.phase.as_deref(), Some("Running"));
    assert_eq!(condition(&s, "Initialized"), Some("True"));
    // The app completes: the pod succeeds and the sidecar is stopped after it.
    let s = a.wait_status(&pod, T, "Succeeded", |s| s.phase.as_deref() == Some("Succeeded"));
    let app_done = cs(&s, "app").state.as_ref().unwrap().terminated.clone().expect("app terminated");
    assert_eq!(app_done.exit_code, 0);
    let proxy_done = cs(&s, "proxy").state.as_ref().unwrap().terminated.clone().expect("sidecar stopped");
    assert!(proxy_done.finished_at.unwrap().0 >= app_done.finished_at.unwrap().0, "the sidecar stopped after the app");
    let uid = a.pod(&pod).unwrap().metadata.uid.unwrap();
    let (_, containers) = a.runtime_state(&uid);
    assert!(
        containers
            .iter()
            .all(|c| swiftlet::cri::container_state(c.state) != swiftlet::cri::api::ContainerState::ContainerRunning),
        "nothing of the pod runs any more"
    );
}

#[test]
fn names_hosts_file_and_service_variables() {
    let objects = Arc::new(MemoryObjects::new());
    let service = |ns: &str, name: &str, ip: &str, port: i32| {
        let mut s = Service::default();
        s.metadata.namespace = Some(ns.into());
        s.metadata.name = Some(name.into());
        s.spec = Some(ServiceSpec {
            cluster_ip: Some(ip.into()),
            ports: Some(vec![ServicePort { name: Some("main".into()), port, ..Default::default() }]),
            ..Default::default()
        });
        s
    };
    objects.put_service(service("default", "kubernetes", "10.96.0.1", 443));
    objects.put_service(service("default", "redis-primary", "10.96.7.7", 6379));
    let a = TestAgent::start_with_objects("clusterDomain: cluster.local\n", &["--signal-source=cgroupfs"], objects);
    let spec = "  hostname: db\n  subdomain: backend\n  setHostnameAsFQDN: true\n  hostAliases:\n  - ip: 10.1.2.3\n    hostnames: [foo.local, bar.local]\n";
    let named = a.add_manifest("named.yaml", &manifest("named", spec, &sleeper("c", "")));
    let no_links = a.add_manifest(
        "nolinks.yaml",
        &manifest("no-links", "  hostNetwork: true\n  enableServiceLinks: false\n", &sleeper("c", "")),
    );

    let s = a.wait_status(&named, T, "running", |s| running(cs(s, "c")));
    let pod_ip = s.pod_ip.clone().expect("the pod has an address of its own");
    let (_, out, _) = a.exec(&named, "c", "hostname; cat /etc/hosts; env");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "db.backend.default.svc.cluster.local", "setHostnameAsFQDN: {out}");
    assert!(out.contains("# Kubernetes-managed hosts file.\n"), "{out}");
    assert!(out.contains(&format!("{pod_ip}\tdb.backend.default.svc.cluster.local\tdb\n")), "{out}");
    assert!(out.contains("# Entries added by HostAliases.\n10.1.2.3\tfoo.local\tbar.local\n"), "{out}");
    assert!(
        out.contains("KUBERNETES_SERVICE_HOST=10.96.0.1\n") && out.contains("REDIS_PRIMARY_SERVICE_PORT_MAIN=6379\n"),
        "{out}"
    );
    assert!(out.contains("REDIS_PRIMARY_PORT_6379_TCP=tcp://10.96.7.7:6379\n"), "{out}");

    a.wait_status(&no_links, T, "running", |s| running(cs(s, "c")));
    let (_, out, _) = a.exec(&no_links, "c", "env; head -1 /etc/hosts");
    assert!(out.contains("KUBERNETES_SERVICE_HOST=10.96.0.1"), "the master service is always there: {out}");
    assert!(!out.contains("REDIS_PRIMARY"), "enableServiceLinks: false: {out}");
    assert!(out.contains("# Kubernetes-managed hosts file (host network)."), "{out}");
}

/// What this host and the runtime cannot give is refused at admission
/// with the kubelet's reasons, rather than run without it: AppArmor (the
/// host has none), supplementalGroupsPolicy Strict (containerd 1.6 does not
/// report it; containerd 2 does, and the pod runs) and user namespaces
/// (not with this host's runc 1.1).
#[test]
fn what_the_host_cannot_give_is_refused_at_admission() {
    if std::path::Path::new("/sys/kernel/security/apparmor").is_dir() {
        panic!(
            "this test expects a host without AppArmor (as this project's machines); it found /sys/kernel/security/apparmor"
        );
    }
    let a = TestAgent::start("", &["--signal-source=cgroupfs"]);
    let net = "  hostNetwork: true\n";
    let apparmor = a.add_manifest(
        "aa.yaml",
        &manifest(
            "apparmor",
            &format!("{net}  securityContext:\n    appArmorProfile: {{type: RuntimeDefault}}\n"),
            &sleeper("c", ""),
        ),
    );
    let strict = a.add_manifest(
        "strict.yaml",
        &manifest(
            "strict-groups",
            &format!("{net}  securityContext: {{supplementalGroupsPolicy: Strict}}\n"),
            &sleeper("c", ""),
        ),
    );
    let userns =
        a.add_manifest("userns.yaml", &manifest("userns", &format!("{net}  hostUsers: false\n"), &sleeper("c", "")));
    let status = a.rt.block_on(swiftlet::cri::RuntimeService::status(&a.cri)).expect("the runtime's status");
    let strict_supported = status.features.is_some_and(|f| f.supplemental_groups_policy);
    let mut refused = vec![
        (&apparmor, "AppArmor", "Cannot enforce AppArmor: AppArmor is not enabled on the host"),
        (&userns, "UserNamespacesNotSupported", "RuntimeClass handler \"\" does not support user namespaces"),
    ];
    if strict_supported {
        a.wait_status(&strict, T, "running (the runtime supports Strict)", |s| s.phase.as_deref() == Some("Running"));
    } else {
        refused.push((
            &strict,
            "SupplementalGroupsPolicyNotSupported",
            "SupplementalGroupsPolicy=Strict is not supported in this node",
        ));
    }
    for (pod, reason, message) in refused {
        let s = a.wait_status(pod, T, "rejected", |s| s.phase.as_deref() == Some("Failed"));
        assert_eq!(s.reason.as_deref(), Some(reason), "{pod}");
        assert!(s.message.as_deref().is_some_and(|m| m.starts_with(message)), "{pod}: {:?}", s.message);
        let uid = a.pod(pod).unwrap().metadata.uid.unwrap();
        assert!(a.runtime_state(&uid).0.is_empty(), "{pod}: nothing ran");
    }
}
