//! The `cgroupDriver` setting and the check the systemd driver needs of
//! `cgroupRoot`. They are configuration values, so they live with the
//! configuration; the container manager (`cm::naming`) builds the cgroup
//! names from them.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    #[default]
    Cgroupfs,
    Systemd,
}

/// The name parts of `cgroupRoot` for the systemd driver: none for `/`, and
/// for a slice path (`/swiftlet.slice`, `/a.slice/a-b.slice`) the parts of
/// its last slice, each nested in the one before as systemd nests them.
/// Anything else cannot hold the kubelet's slices.
pub fn systemd_root_parts(cgroup_root: &str) -> Result<Vec<String>, String> {
    let root = cgroup_root.trim_matches('/');
    if root.is_empty() {
        return Ok(vec![]);
    }
    let mut expected = String::new();
    let mut parts: Vec<String> = vec![];
    for slice in root.split('/') {
        let Some(stem) = slice.strip_suffix(".slice").filter(|s| !s.is_empty()) else {
            return Err(format!(
                "{cgroup_root:?} is not a systemd slice path: with cgroupDriver systemd it must be / or slices such as /swiftlet.slice"
            ));
        };
        let own = match stem.strip_prefix(&expected) {
            Some(rest) if expected.is_empty() || rest.starts_with('-') => rest.trim_start_matches('-'),
            _ => return Err(format!("{cgroup_root:?}: {slice} is not inside {} as systemd nests slices", expected)),
        };
        if own.is_empty() || own.contains('-') {
            return Err(format!("{cgroup_root:?}: {slice} must add exactly one dash-separated part to its parent"));
        }
        parts.push(own.to_owned());
        expected = stem.to_owned();
    }
    Ok(parts)
}
