use k8s_openapi::api::core::v1::{Capabilities, PodSpec};

use super::*;

fn pod(psc: Option<PodSecurityContext>, csc: Option<SecurityContext>) -> Pod {
    let mut p = Pod::default();
    p.metadata.name = Some("web".into());
    p.metadata.namespace = Some("prod".into());
    p.metadata.uid = Some("u1".into());
    p.spec = Some(PodSpec {
        security_context: psc,
        containers: vec![Container { name: "app".into(), security_context: csc, ..Default::default() }],
        ..Default::default()
    });
    p
}

fn c0(p: &Pod) -> &Container {
    &p.spec.as_ref().unwrap().containers[0]
}

fn seccomp_profile(t: &str, localhost: Option<&str>) -> SeccompProfile {
    SeccompProfile { type_: t.into(), localhost_profile: localhost.map(str::to_owned) }
}

fn settings(default: bool) -> SecuritySettings {
    SecuritySettings { seccomp_default: default, seccomp_root: "/var/lib/kubelet/seccomp".into() }
}

use api::security_profile::ProfileType::{Localhost, RuntimeDefault, Unconfined};

#[test]
fn seccomp_table() {
    let annotated = |key: &str, value: &str| {
        let mut p = pod(None, None);
        p.metadata.annotations = Some([(key.to_string(), value.to_string())].into());
        p
    };
    type Want<'a> = Result<(api::security_profile::ProfileType, &'a str), &'a str>;
    let cases: Vec<(&str, Pod, bool, Want)> = vec![
        ("nothing set", pod(None, None), false, Ok((Unconfined, ""))),
        ("nothing set, seccompDefault", pod(None, None), true, Ok((RuntimeDefault, ""))),
        (
            "pod RuntimeDefault",
            pod(
                Some(PodSecurityContext {
                    seccomp_profile: Some(seccomp_profile("RuntimeDefault", None)),
                    ..Default::default()
                }),
                None,
            ),
            false,
            Ok((RuntimeDefault, "")),
        ),
        (
            "the container overrides the pod",
            pod(
                Some(PodSecurityContext {
                    seccomp_profile: Some(seccomp_profile("RuntimeDefault", None)),
                    ..Default::default()
                }),
                Some(SecurityContext {
                    seccomp_profile: Some(seccomp_profile("Unconfined", None)),
                    ..Default::default()
                }),
            ),
            true,
            Ok((Unconfined, "")),
        ),
        (
            "Localhost under <root-dir>/seccomp",
            pod(
                None,
                Some(SecurityContext {
                    seccomp_profile: Some(seccomp_profile("Localhost", Some("profiles/audit.json"))),
                    ..Default::default()
                }),
            ),
            false,
            Ok((Localhost, "/var/lib/kubelet/seccomp/profiles/audit.json")),
        ),
        (
            "Localhost without a profile",
            pod(
                None,
                Some(SecurityContext {
                    seccomp_profile: Some(seccomp_profile("Localhost", None)),
                    ..Default::default()
                }),
            ),
            false,
            Err("localhostProfile must be set if seccompProfile type is Localhost."),
        ),
        (
            "the deprecated pod annotation",
            annotated(SECCOMP_POD_ANNOTATION, "runtime/default"),
            false,
            Ok((RuntimeDefault, "")),
        ),
        (
            "the deprecated container annotation",
            annotated("container.seccomp.security.alpha.kubernetes.io/app", "localhost/x.json"),
            false,
            Ok((Localhost, "/var/lib/kubelet/seccomp/x.json")),
        ),
        (
            "docker/default is RuntimeDefault",
            annotated(SECCOMP_POD_ANNOTATION, "docker/default"),
            false,
            Ok((RuntimeDefault, "")),
        ),
    ];
    for (name, p, default, want) in cases {
        let got = seccomp(&p, c0(&p), &settings(default));
        let got = got
            .as_ref()
            .map(|p| (api::security_profile::ProfileType::try_from(p.profile_type).unwrap(), p.localhost_ref.as_str()));
        assert_eq!(got.map_err(|e| e.as_str()), want, "{name}");
    }
}

#[test]
fn run_as_non_root_table() {
    let nonroot = |user: Option<i64>| {
        pod(Some(PodSecurityContext { run_as_non_root: Some(true), run_as_user: user, ..Default::default() }), None)
    };
    let numeric = |uid| ImageUser { uid: Some(uid), username: String::new() };
    let named = ImageUser { uid: None, username: "nginx".into() };
    let at = "(pod: \"web_prod(u1)\", container: app)";
    let cases: Vec<(&str, Pod, ImageUser, Result<(), String>)> = vec![
        ("not asked", pod(None, None), numeric(0), Ok(())),
        (
            "root image",
            nonroot(None),
            numeric(0),
            Err(format!("container has runAsNonRoot and image will run as root {at}")),
        ),
        ("numeric non-root image", nonroot(None), numeric(1000), Ok(())),
        (
            "named image user",
            nonroot(None),
            named.clone(),
            Err(format!(
                "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root {at}"
            )),
        ),
        ("runAsUser wins over the image", nonroot(Some(1000)), numeric(0), Ok(())),
        (
            "runAsUser 0",
            nonroot(Some(0)),
            numeric(1000),
            Err(format!("container's runAsUser breaks non-root policy {at}")),
        ),
        (
            "the container's runAsNonRoot false wins",
            pod(
                Some(PodSecurityContext { run_as_non_root: Some(true), ..Default::default() }),
                Some(SecurityContext { run_as_non_root: Some(false), ..Default::default() }),
            ),
            numeric(0),
            Ok(()),
        ),
        (
            "an image without a user runs as root",
            nonroot(None),
            ImageUser::of(Some(&api::Image::default())),
            Err(format!("container has runAsNonRoot and image will run as root {at}")),
        ),
    ];
    for (name, p, image, want) in cases {
        assert_eq!(verify_run_as_non_root(&p, c0(&p), &image), want, "{name}");
    }
}

#[test]
fn container_context_as_the_kubelet_builds_it() {
    let p = pod(
        Some(PodSecurityContext {
            run_as_user: Some(1000),
            run_as_group: Some(3000),
            fs_group: Some(2000),
            supplemental_groups: Some(vec![4000, 5000]),
            supplemental_groups_policy: Some("Strict".into()),
            se_linux_options: Some(SELinuxOptions { level: Some("s0:c123,c456".into()), ..Default::default() }),
            ..Default::default()
        }),
        Some(SecurityContext {
            run_as_user: Some(1001),
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities { add: Some(vec!["NET_ADMIN".into()]), drop: Some(vec!["ALL".into()]) }),
            ..Default::default()
        }),
    );
    let sc =
        container_context(&p, c0(&p), &settings(true), &ImageUser::default(), api::NamespaceOption::default()).unwrap();
    assert_eq!(sc.run_as_user.map(|u| u.value), Some(1001), "the container's user wins");
    assert_eq!(sc.run_as_group.map(|g| g.value), Some(3000), "the pod's group fills in");
    assert_eq!(sc.supplemental_groups, vec![2000, 4000, 5000], "fsGroup first");
    assert_eq!(sc.supplemental_groups_policy, api::SupplementalGroupsPolicy::Strict as i32);
    assert_eq!(sc.selinux_options.unwrap().level, "s0:c123,c456");
    assert!(sc.no_new_privs && sc.readonly_rootfs && !sc.privileged);
    let caps = sc.capabilities.unwrap();
    assert_eq!(
        (caps.add_capabilities, caps.drop_capabilities),
        (vec!["NET_ADMIN".to_string()], vec!["ALL".to_string()])
    );
    assert_eq!(sc.seccomp.unwrap().profile_type, RuntimeDefault as i32);
    assert!(sc.apparmor.is_none(), "nothing asked: the runtime's default");
    assert!(sc.masked_paths.contains(&"/proc/kcore".to_string()));

    // No runAsUser anywhere: the image's user.
    let p = pod(None, Some(SecurityContext { proc_mount: Some("Unmasked".into()), ..Default::default() }));
    let image = ImageUser { uid: None, username: "www".into() };
    let sc = container_context(&p, c0(&p), &settings(false), &image, api::NamespaceOption::default()).unwrap();
    assert_eq!((sc.run_as_user, sc.run_as_username.as_str()), (None, "www"));
    assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty(), "Unmasked");
    assert_eq!(sc.seccomp.unwrap().profile_type, Unconfined as i32);
}

#[test]
fn apparmor_from_fields_and_annotations() {
    let p = pod(
        None,
        Some(SecurityContext {
            app_armor_profile: Some(AppArmorProfile {
                type_: "Localhost".into(),
                localhost_profile: Some("k8s-deny".into()),
            }),
            ..Default::default()
        }),
    );
    let (profile, deprecated) = apparmor(&p, c0(&p)).unwrap().unwrap();
    assert_eq!(
        (profile.profile_type, profile.localhost_ref.as_str(), deprecated.as_str()),
        (Localhost as i32, "k8s-deny", "localhost/k8s-deny")
    );
    assert!(requires_apparmor(&p));

    let mut p = pod(None, None);
    assert!(!requires_apparmor(&p));
    p.metadata.annotations = Some([(format!("{APPARMOR_ANNOTATION_PREFIX}app"), "runtime/default".to_string())].into());
    assert!(requires_apparmor(&p));
    assert_eq!(apparmor(&p, c0(&p)).unwrap().unwrap().1, "runtime/default");
    p.metadata.annotations = Some([(format!("{APPARMOR_ANNOTATION_PREFIX}app"), "unconfined".to_string())].into());
    assert!(!requires_apparmor(&p), "unconfined needs no AppArmor");

    let p = pod(
        Some(PodSecurityContext {
            app_armor_profile: Some(AppArmorProfile { type_: "Unconfined".into(), localhost_profile: None }),
            ..Default::default()
        }),
        None,
    );
    assert!(!requires_apparmor(&p));
    assert_eq!(apparmor(&p, c0(&p)).unwrap().unwrap().0.profile_type, Unconfined as i32);
}

#[test]
fn sandbox_context_always_has_the_runtime_default_seccomp() {
    let mut p = pod(
        Some(PodSecurityContext { run_as_user: Some(1000), fs_group: Some(2000), ..Default::default() }),
        Some(SecurityContext { privileged: Some(true), ..Default::default() }),
    );
    let sc = sandbox_context(&p, api::NamespaceOption::default());
    assert_eq!(sc.seccomp.unwrap().profile_type, RuntimeDefault as i32);
    assert!(sc.privileged);
    assert_eq!(sc.run_as_user.map(|u| u.value), Some(1000));
    assert_eq!(sc.supplemental_groups, vec![2000]);
    p.spec.as_mut().unwrap().containers[0].security_context = None;
    assert!(!sandbox_context(&p, api::NamespaceOption::default()).privileged);
}
