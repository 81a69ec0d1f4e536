//! The kubelet's BasicDockerKeyring: credentials indexed by registry key
//! (`host[:port][/path]`, normalized from what a docker config says:
//! scheme dropped, `/v1/` and `/v2/` prefixes dropped), looked up for an
//! image repository by URL matching: the same port, the same number of
//! host labels each matching as a glob (`*.example.com`), and the key's
//! path a prefix of the image's. More specific keys come first (the index
//! is sorted in reverse), and `index.docker.io` serves Docker Hub images.
//! Pure.

use std::collections::HashMap;

use super::dockerconfig::{Credential, DockerConfig};

const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    index: Vec<String>,
    creds: HashMap<String, Vec<Credential>>,
}

/// `https://gcr.io/v2/foo` → `gcr.io/foo`; `quay.io/` → `quay.io`.
pub fn normalize_key(location: &str) -> String {
    let rest = location.strip_prefix("https://").or_else(|| location.strip_prefix("http://")).unwrap_or(location);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path =
        path.strip_prefix("/v2").or_else(|| path.strip_prefix("/v1")).filter(|p| p.starts_with('/')).unwrap_or(path);
    if path.is_empty() || path == "/" { host.to_owned() } else { format!("{host}{path}") }
}

/// (host labels, port, path) of a schemeless URL.
fn split(url: &str) -> (Vec<&str>, &str, &str) {
    let (host, path) = match url.find('/') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    };
    let (host, port) = match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, p),
        _ => (host, ""),
    };
    (host.split('.').collect(), port, path)
}

/// Go's filepath.Match for one host label: `*` and `?`.
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    fn go(p: &[char], t: &[char]) -> bool {
        match p.first() {
            None => t.is_empty(),
            Some('*') => (0..=t.len()).any(|i| go(&p[1..], &t[i..])),
            Some('?') => !t.is_empty() && go(&p[1..], &t[1..]),
            Some(c) => t.first() == Some(c) && go(&p[1..], &t[1..]),
        }
    }
    go(&p, &t)
}

/// URLsMatch: whether `target` (an image repository) matches `glob_url`
/// (a registry key or a `matchImages` pattern).
pub fn urls_match(glob_url: &str, target: &str) -> bool {
    let (g_host, g_port, g_path) = split(glob_url);
    let (t_host, t_port, t_path) = split(target);
    g_port == t_port
        && g_host.len() == t_host.len()
        && t_path.starts_with(g_path)
        && g_host.iter().zip(&t_host).all(|(g, t)| glob(g, t))
}

/// Whether an image is on Docker Hub (no registry host, or docker.io).
fn is_default_registry(image: &str) -> bool {
    match image.split_once('/') {
        None => !image.is_empty(),
        Some(("", _)) => false,
        Some((first, _)) => first == "docker.io" || first == "index.docker.io" || !first.contains(['.', ':']),
    }
}

impl Keyring {
    pub fn add(&mut self, config: &DockerConfig) {
        for (location, cred) in config {
            let key = normalize_key(location);
            self.creds.entry(key.clone()).or_default().push(cred.clone());
            self.index.push(key);
        }
        self.index.sort();
        self.index.dedup();
        self.index.reverse();
    }

    /// The credentials for an image repository (`registry/path`, no tag),
    /// most specific key first.
    pub fn lookup(&self, image: &str) -> Vec<Credential> {
        let mut out: Vec<Credential> = vec![];
        for k in &self.index {
            if urls_match(k, image) {
                out.extend(self.creds[k].iter().cloned());
            }
        }
        if out.is_empty() && is_default_registry(image) {
            out.extend(self.creds.get(DEFAULT_REGISTRY_HOST).into_iter().flatten().cloned());
        }
        out
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cred(u: &str) -> Credential {
        Credential { username: u.into(), password: "p".into() }
    }

    #[test]
    fn url_matching_table() {
        let cases = [
            ("*.docker.io", "blah.docker.io/x", true),
            ("*.docker.io", "not.right.io/x", false),
            ("*.*.registry.io", "a.b.registry.io/x", true),
            ("*.registry.io", "a.b.registry.io/x", false),
            ("registry.io:8080", "registry.io:8080/x", true),
            ("registry.io:8080", "registry.io/x", false),
            ("registry.io", "registry.io:8080/x", false),
            ("quay.io/coreos", "quay.io/coreos/etcd", true),
            ("quay.io/coreos", "quay.io/other/etcd", false),
            ("gcr.io", "gcr.io/etcd-development/etcd", true),
            ("127.0.0.1:5000", "127.0.0.1:5000/private/app", true),
        ];
        for (glob_url, target, want) in cases {
            assert_eq!(urls_match(glob_url, target), want, "{glob_url} vs {target}");
        }
    }

    #[test]
    fn keys_normalize() {
        assert_eq!(normalize_key("https://index.docker.io/v1/"), "index.docker.io");
        assert_eq!(normalize_key("http://quay.io/v2/coreos"), "quay.io/coreos");
        assert_eq!(normalize_key("registry.example.com:5000"), "registry.example.com:5000");
        assert_eq!(normalize_key("gcr.io/project/"), "gcr.io/project/");
    }

    #[test]
    fn lookup_order_and_docker_hub() {
        let mut k = Keyring::default();
        k.add(&vec![("quay.io".into(), cred("host")), ("quay.io/coreos".into(), cred("path"))]);
        k.add(&vec![("https://index.docker.io/v1/".into(), cred("hub"))]);
        assert_eq!(k.lookup("quay.io/coreos/etcd"), vec![cred("path"), cred("host")], "the specific key first");
        assert_eq!(k.lookup("quay.io/other/x"), vec![cred("host")]);
        assert_eq!(k.lookup("docker.io/library/busybox"), vec![cred("hub")]);
        assert!(k.lookup("ghcr.io/x/y").is_empty());
    }
}
