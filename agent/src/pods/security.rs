//! Pod and container security contexts mapped to CRI as the kubelet maps
//! them (kuberuntime's security_context.go and helpers):
//!
//! - the container's effective context is its own, with the pod's
//!   seLinuxOptions, runAsUser, runAsGroup and runAsNonRoot where the
//!   container does not set them;
//! - seccomp: the container's profile, else the pod's, else RuntimeDefault
//!   with `seccompDefault`, else Unconfined; Localhost profiles are files
//!   under `<root-dir>/seccomp/`; the sandbox always gets RuntimeDefault;
//! - AppArmor: the container's field, else the pod's, else the deprecated
//!   `container.apparmor.security.beta.kubernetes.io/<name>` annotation
//!   (nothing set: the runtime's default);
//! - supplemental groups: fsGroup first, then supplementalGroups, with
//!   supplementalGroupsPolicy;
//! - runAsNonRoot checked against the user the container will run as (its
//!   runAsUser, else the image's user from ImageStatus) with the kubelet's
//!   CreateContainerConfigError messages.
//!
//! The deprecated seccomp annotations are read as the API server reads
//! them (it copies them into empty fields when a pod is created), so
//! static pods that only carry the annotations get the same profile.
//!
//! Pure.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{
    AppArmorProfile, Container, Pod, PodSecurityContext, SELinuxOptions, SeccompProfile, SecurityContext,
};

use crate::cri::api;

/// The annotation a pod-wide seccomp profile was once given in.
pub const SECCOMP_POD_ANNOTATION: &str = "seccomp.security.alpha.kubernetes.io/pod";
/// The per-container seccomp annotation prefix.
pub const SECCOMP_CONTAINER_ANNOTATION_PREFIX: &str = "container.seccomp.security.alpha.kubernetes.io/";
/// The per-container AppArmor annotation prefix the kubelet still reads.
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// What the node contributes to security contexts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecuritySettings {
    /// seccompDefault: RuntimeDefault instead of Unconfined when a pod
    /// names no profile.
    pub seccomp_default: bool,
    /// `<root-dir>/seccomp`: where Localhost profiles are.
    pub seccomp_root: PathBuf,
}

impl Default for SecuritySettings {
    fn default() -> Self {
        SecuritySettings { seccomp_default: false, seccomp_root: PathBuf::from("/var/lib/kubelet/seccomp") }
    }
}

/// The user an image runs as, from ImageStatus.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageUser {
    pub uid: Option<i64>,
    pub username: String,
}

impl ImageUser {
    /// From the runtime's image record: a numeric uid, else a name, else
    /// nothing (which the kubelet takes for root).
    pub fn of(image: Option<&api::Image>) -> ImageUser {
        match image {
            Some(i) if i.uid.is_some() => ImageUser { uid: i.uid.as_ref().map(|u| u.value), username: String::new() },
            Some(i) if !i.username.is_empty() => ImageUser { uid: None, username: i.username.clone() },
            _ => ImageUser { uid: Some(0), username: String::new() },
        }
    }
}

/// The kubelet's `format.Pod`: `name_namespace(uid)`.
pub fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or(""),
        pod.metadata.namespace.as_deref().unwrap_or(""),
        pod.metadata.uid.as_deref().unwrap_or("")
    )
}

fn pod_sc(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref().and_then(|s| s.security_context.as_ref())
}

/// The container's context with the pod's user, group, runAsNonRoot and
/// SELinux options filled in where the container leaves them out (the
/// kubelet's DetermineEffectiveSecurityContext).
pub fn effective(pod: &Pod, c: &Container) -> SecurityContext {
    let mut sc = c.security_context.clone().unwrap_or_default();
    if let Some(p) = pod_sc(pod) {
        sc.se_linux_options = sc.se_linux_options.or_else(|| p.se_linux_options.clone());
        sc.run_as_user = sc.run_as_user.or(p.run_as_user);
        sc.run_as_group = sc.run_as_group.or(p.run_as_group);
        sc.run_as_non_root = sc.run_as_non_root.or(p.run_as_non_root);
    }
    sc
}

/// verifyRunAsNonRoot: the CreateContainerConfigError message when the
/// container would run as root (or as a user that cannot be checked).
pub fn verify_run_as_non_root(pod: &Pod, c: &Container, image: &ImageUser) -> Result<(), String> {
    let sc = effective(pod, c);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let at = format!("(pod: {:?}, container: {})", format_pod(pod), c.name);
    if let Some(uid) = sc.run_as_user {
        return if uid == 0 { Err(format!("container's runAsUser breaks non-root policy {at}")) } else { Ok(()) };
    }
    match (&image.uid, image.username.as_str()) {
        (Some(0), _) => Err(format!("container has runAsNonRoot and image will run as root {at}")),
        (None, name) if !name.is_empty() => Err(format!(
            "container has runAsNonRoot and image has non-numeric user ({name}), cannot verify user is non-root {at}"
        )),
        _ => Ok(()),
    }
}

fn profile(kind: api::security_profile::ProfileType, localhost_ref: String) -> api::SecurityProfile {
    api::SecurityProfile { profile_type: kind as i32, localhost_ref }
}

/// A seccomp annotation value (`runtime/default`, `docker/default`,
/// `unconfined`, `localhost/<path>`) as the field the API server makes of it.
fn seccomp_from_annotation(value: &str) -> Option<SeccompProfile> {
    let (type_, localhost) = match value {
        "runtime/default" | "docker/default" => ("RuntimeDefault", None),
        "unconfined" => ("Unconfined", None),
        v => ("Localhost", Some(v.strip_prefix("localhost/")?.to_owned())),
    };
    Some(SeccompProfile { type_: type_.into(), localhost_profile: localhost })
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// The seccomp field in effect for a container (None: not set anywhere).
fn seccomp_field(pod: &Pod, c: Option<&Container>) -> Option<SeccompProfile> {
    if let Some(p) = c.and_then(|c| c.security_context.as_ref()).and_then(|s| s.seccomp_profile.clone()) {
        return Some(p);
    }
    if let Some(p) = pod_sc(pod).and_then(|s| s.seccomp_profile.clone()) {
        return Some(p);
    }
    // Annotations count only where the fields are empty, as the API server
    // copies them.
    if let Some(c) = c
        && let Some(p) = annotation(pod, &format!("{SECCOMP_CONTAINER_ANNOTATION_PREFIX}{}", c.name))
            .and_then(seccomp_from_annotation)
    {
        return Some(p);
    }
    annotation(pod, SECCOMP_POD_ANNOTATION).and_then(seccomp_from_annotation)
}

/// The container's seccomp profile (getSeccompProfile).
pub fn seccomp(pod: &Pod, c: &Container, settings: &SecuritySettings) -> Result<api::SecurityProfile, String> {
    use api::security_profile::ProfileType;
    let fallback = if settings.seccomp_default { ProfileType::RuntimeDefault } else { ProfileType::Unconfined };
    let Some(p) = seccomp_field(pod, Some(c)) else { return Ok(profile(fallback, String::new())) };
    Ok(match p.type_.as_str() {
        "RuntimeDefault" => profile(ProfileType::RuntimeDefault, String::new()),
        "Localhost" => match p.localhost_profile.as_deref().filter(|p| !p.is_empty()) {
            Some(rel) => profile(ProfileType::Localhost, localhost_path(&settings.seccomp_root, rel)),
            None => return Err("localhostProfile must be set if seccompProfile type is Localhost.".into()),
        },
        _ => profile(ProfileType::Unconfined, String::new()),
    })
}

fn localhost_path(root: &Path, rel: &str) -> String {
    root.join(rel.trim_start_matches('/')).to_string_lossy().into_owned()
}

/// The AppArmor profile in effect for a container (apparmor.GetProfile):
/// its field, the pod's, then the container's annotation.
pub fn apparmor_field(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    if let Some(p) = c.security_context.as_ref().and_then(|s| s.app_armor_profile.clone()) {
        return Some(p);
    }
    if let Some(p) = pod_sc(pod).and_then(|s| s.app_armor_profile.clone()) {
        return Some(p);
    }
    let value = annotation(pod, &format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name))?;
    Some(match value {
        "runtime/default" => AppArmorProfile { type_: "RuntimeDefault".into(), localhost_profile: None },
        "unconfined" => AppArmorProfile { type_: "Unconfined".into(), localhost_profile: None },
        v => AppArmorProfile {
            type_: "Localhost".into(),
            localhost_profile: Some(v.strip_prefix("localhost/").unwrap_or(v).to_owned()),
        },
    })
}

/// The container's AppArmor profile and its deprecated string form
/// (getAppArmorProfile); None when nothing asks for one.
pub fn apparmor(pod: &Pod, c: &Container) -> Result<Option<(api::SecurityProfile, String)>, String> {
    use api::security_profile::ProfileType;
    let Some(p) = apparmor_field(pod, c) else { return Ok(None) };
    Ok(Some(match p.type_.as_str() {
        "RuntimeDefault" => (profile(ProfileType::RuntimeDefault, String::new()), "runtime/default".into()),
        "Unconfined" => (profile(ProfileType::Unconfined, String::new()), "unconfined".into()),
        "Localhost" => {
            let name = p.localhost_profile.ok_or("missing localhost apparmor profile name")?;
            (profile(ProfileType::Localhost, name.clone()), format!("localhost/{name}"))
        }
        other => return Err(format!("unknown apparmor profile type: {other:?}")),
    }))
}

/// Whether a pod asks for AppArmor confinement (the kubelet's isRequired):
/// any profile other than Unconfined, in a field or an annotation.
pub fn requires_apparmor(pod: &Pod) -> bool {
    let confined = |p: &AppArmorProfile| p.type_ != "Unconfined";
    if pod_sc(pod).and_then(|s| s.app_armor_profile.as_ref()).is_some_and(confined) {
        return true;
    }
    let spec = pod.spec.as_ref();
    let containers = spec.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
    if containers.filter_map(|c| c.security_context.as_ref()?.app_armor_profile.as_ref()).any(confined) {
        return true;
    }
    pod.metadata
        .annotations
        .iter()
        .flatten()
        .any(|(k, v)| k.starts_with(APPARMOR_ANNOTATION_PREFIX) && v != "unconfined")
}

fn selinux(o: &SELinuxOptions) -> api::SeLinuxOption {
    api::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

/// fsGroup, then supplementalGroups (the order the kubelet appends them).
pub fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let Some(p) = pod_sc(pod) else { return vec![] };
    p.fs_group.into_iter().chain(p.supplemental_groups.iter().flatten().copied()).collect()
}

/// The CRI value of supplementalGroupsPolicy (Merge when unset).
pub fn supplemental_groups_policy(pod: &Pod) -> i32 {
    match pod_sc(pod).and_then(|p| p.supplemental_groups_policy.as_deref()) {
        Some("Strict") => api::SupplementalGroupsPolicy::Strict as i32,
        _ => api::SupplementalGroupsPolicy::Merge as i32,
    }
}

/// /proc paths masked and made read-only unless procMount is Unmasked (the
/// runtime ignores them for privileged containers).
const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
const READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// The container's CRI security context (determineEffectiveSecurityContext).
/// `namespaces` are the pod's namespace options. Errors are the kubelet's
/// CreateContainerConfigError messages.
pub fn container_context(
    pod: &Pod,
    c: &Container,
    settings: &SecuritySettings,
    image: &ImageUser,
    namespaces: api::NamespaceOption,
) -> Result<api::LinuxContainerSecurityContext, String> {
    verify_run_as_non_root(pod, c, image)?;
    let sc = effective(pod, c);
    let caps = sc.capabilities.as_ref();
    let unmasked = sc.proc_mount.as_deref() == Some("Unmasked");
    let paths = |list: &[&str]| if unmasked { vec![] } else { list.iter().map(|s| s.to_string()).collect() };
    let (apparmor, apparmor_profile) = match apparmor(pod, c)? {
        Some((p, s)) => (Some(p), s),
        None => (None, String::new()),
    };
    let mut out = api::LinuxContainerSecurityContext {
        capabilities: Some(api::Capability {
            add_capabilities: caps.and_then(|c| c.add.clone()).unwrap_or_default(),
            drop_capabilities: caps.and_then(|c| c.drop.clone()).unwrap_or_default(),
            ..Default::default()
        }),
        privileged: sc.privileged.unwrap_or(false),
        namespace_options: Some(namespaces),
        selinux_options: sc.se_linux_options.as_ref().map(selinux),
        run_as_user: sc.run_as_user.map(|value| api::Int64Value { value }),
        run_as_group: sc.run_as_group.map(|value| api::Int64Value { value }),
        readonly_rootfs: sc.read_only_root_filesystem.unwrap_or(false),
        supplemental_groups: supplemental_groups(pod),
        supplemental_groups_policy: supplemental_groups_policy(pod),
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        masked_paths: paths(MASKED_PATHS),
        readonly_paths: paths(READONLY_PATHS),
        seccomp: Some(seccomp(pod, c, settings)?),
        apparmor,
        ..Default::default()
    };
    #[allow(deprecated)]
    {
        // Still read by runtimes older than the SecurityProfile fields.
        out.apparmor_profile = apparmor_profile;
    }
    if out.run_as_user.is_none() {
        out.run_as_user = image.uid.map(|value| api::Int64Value { value });
        out.run_as_username = image.username.clone();
    }
    Ok(out)
}

/// The sandbox's CRI security context (generatePodSandboxLinuxConfig):
/// the pod's user, group, groups and SELinux options, privileged when any
/// container is, and always the runtime's default seccomp profile.
pub fn sandbox_context(pod: &Pod, namespaces: api::NamespaceOption) -> api::LinuxSandboxSecurityContext {
    let p = pod_sc(pod);
    let spec = pod.spec.as_ref();
    let privileged = spec.is_some_and(|s| {
        s.containers
            .iter()
            .chain(s.init_containers.iter().flatten())
            .any(|c| c.security_context.as_ref().and_then(|sc| sc.privileged).unwrap_or(false))
    });
    api::LinuxSandboxSecurityContext {
        namespace_options: Some(namespaces),
        selinux_options: p.and_then(|p| p.se_linux_options.as_ref()).map(selinux),
        run_as_user: p.and_then(|s| s.run_as_user).map(|value| api::Int64Value { value }),
        run_as_group: p.and_then(|s| s.run_as_group).map(|value| api::Int64Value { value }),
        supplemental_groups: supplemental_groups(pod),
        supplemental_groups_policy: supplemental_groups_policy(pod),
        privileged,
        seccomp: Some(profile(api::security_profile::ProfileType::RuntimeDefault, String::new())),
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "security_tests.rs"]
mod tests;
