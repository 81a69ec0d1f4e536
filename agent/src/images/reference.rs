//! Image references, parsed and normalized as docker's reference library
//! (`distribution/reference.ParseNormalizedNamed`) and containerd
//! (`ParseDockerRef`) do:
//!
//! ```text
//! reference  := name [ ":" tag ] [ "@" digest ]
//! name       := [domain '/'] path-component ['/' path-component]*
//! domain     := host [':' port]          host: DNS labels, or [IPv6]
//! path-comp. := [a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*
//! tag        := [\w][\w.-]{0,127}
//! digest     := algorithm ":" hex        (sha256: 64, sha384: 96, sha512: 128)
//! ```
//!
//! The first component is a domain only if it has a `.` or `:`, is
//! `localhost`, or has an upper-case letter; otherwise the domain is
//! `docker.io`, and a single-component path gets `library/`.
//!
//! Hand-written because no maintained crate parses the same way: oci-spec's
//! `distribution::Reference` (which oci-client re-exports) fills in
//! `latest` so a given tag cannot be told from none, takes an upper-case
//! first component for a path rather than a domain, lets 64-hex names
//! through, and words its errors otherwise than the reference library,
//! whose words the kubelet's InvalidImageName events carry.

use std::fmt;

use thiserror::Error;

pub const DEFAULT_DOMAIN: &str = "docker.io";
const LEGACY_DEFAULT_DOMAIN: &str = "index.docker.io";
const OFFICIAL_REPO_PREFIX: &str = "library/";
const NAME_TOTAL_LENGTH_MAX: usize = 255;
const DEFAULT_TAG: &str = "latest";

/// Why a reference does not parse, in the reference library's words.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ReferenceError {
    #[error("invalid reference format")]
    InvalidFormat,
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    #[error("repository name must not be more than 255 characters")]
    NameTooLong,
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    HexName(String),
    #[error("invalid checksum digest format")]
    DigestFormat,
    #[error("invalid checksum digest length")]
    DigestLength,
    #[error("unsupported digest algorithm")]
    DigestAlgorithm,
}

/// A parsed, normalized reference.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Reference {
    /// The registry host (and port): `docker.io`, `localhost:5000`, ...
    pub domain: String,
    /// The repository path: `library/busybox`.
    pub path: String,
    pub tag: Option<String>,
    /// `algorithm:hex`.
    pub digest: Option<String>,
}

impl Reference {
    /// `ParseNormalizedNamed`: a reference as users write it.
    pub fn parse(s: &str) -> Result<Reference, ReferenceError> {
        if s.len() == 64 && s.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
            return Err(ReferenceError::HexName(s.to_owned()));
        }
        let (domain, remainder) = split_docker_domain(s);
        let remote_name = remainder.split_once(':').map(|(n, _)| n).unwrap_or(&remainder);
        if remote_name.to_lowercase() != remote_name {
            return Err(ReferenceError::Uppercase(remote_name.to_owned()));
        }
        parse_full(&domain, &remainder)
    }

    /// The full name without tag or digest: `docker.io/library/busybox`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.domain, self.path)
    }

    /// The reference as containerd stores and pulls it (`ParseDockerRef`):
    /// fully qualified, `:latest` when there is neither tag nor digest, and
    /// only the digest when there are both.
    pub fn normalized(&self) -> String {
        match (&self.tag, &self.digest) {
            (_, Some(d)) => format!("{}@{d}", self.name()),
            (Some(t), None) => format!("{}:{t}", self.name()),
            (None, None) => format!("{}:{DEFAULT_TAG}", self.name()),
        }
    }

    /// The tag a pull resolves: the given one, or `latest` when there is
    /// no digest either (`parsers.ParseImageName`).
    pub fn effective_tag(&self) -> Option<&str> {
        match (&self.tag, &self.digest) {
            (Some(t), _) => Some(t),
            (None, None) => Some(DEFAULT_TAG),
            (None, Some(_)) => None,
        }
    }
}

impl fmt::Display for Reference {
    /// The full form, with whatever tag and digest were given.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

/// The kubelet's `applyDefaultImageTag`: `image` with `:latest` appended
/// when it has neither tag nor digest, otherwise unchanged. The name is
/// *not* qualified (`busybox` → `busybox:latest`), so the runtime applies
/// its own defaults, as with the kubelet.
pub fn with_default_tag(image: &str) -> Result<String, ReferenceError> {
    let r = Reference::parse(image)?;
    Ok(match (&r.tag, &r.digest) {
        (None, None) => format!("{image}:{DEFAULT_TAG}"),
        _ => image.to_owned(),
    })
}

fn split_docker_domain(name: &str) -> (String, String) {
    let (mut domain, mut remainder) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" || first.to_lowercase() != first => {
            (first.to_owned(), rest.to_owned())
        }
        _ => (DEFAULT_DOMAIN.to_owned(), name.to_owned()),
    };
    if domain == LEGACY_DEFAULT_DOMAIN {
        domain = DEFAULT_DOMAIN.to_owned();
    }
    if domain == DEFAULT_DOMAIN && !remainder.contains('/') {
        remainder = format!("{OFFICIAL_REPO_PREFIX}{remainder}");
    }
    (domain, remainder)
}

/// `reference.Parse` of `domain/remainder`.
fn parse_full(domain: &str, remainder: &str) -> Result<Reference, ReferenceError> {
    let (name_tag, digest) = match remainder.split_once('@') {
        Some((n, d)) => (n, Some(d)),
        None => (remainder, None),
    };
    // A tag follows the last ':' of the path (the domain's port is not in
    // `remainder`).
    let (path, tag) = match name_tag.rsplit_once(':') {
        Some((p, t)) => (p, Some(t)),
        None => (name_tag, None),
    };
    let valid = is_domain(domain)
        && !path.is_empty()
        && path.split('/').all(is_path_component)
        && tag.is_none_or(is_tag)
        && digest.is_none_or(is_digest_syntax);
    if !valid {
        return Err(ReferenceError::InvalidFormat);
    }
    if domain.len() + 1 + path.len() > NAME_TOTAL_LENGTH_MAX {
        return Err(ReferenceError::NameTooLong);
    }
    if let Some(d) = digest {
        validate_digest(d)?;
    }
    Ok(Reference {
        domain: domain.to_owned(),
        path: path.to_owned(),
        tag: tag.map(str::to_owned),
        digest: digest.map(str::to_owned),
    })
}

fn is_alnum_lower(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

/// `[a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*`
fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    if b.is_empty() || !is_alnum_lower(b[0]) || !is_alnum_lower(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if is_alnum_lower(b[i]) {
            i += 1;
            continue;
        }
        // A separator run: ".", "_", "__" or "-+", then an alphanumeric.
        let start = i;
        while i < b.len() && !is_alnum_lower(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-');
        if !ok {
            return false;
        }
    }
    true
}

/// `host [':' port]`, host being DNS-label components or `[IPv6]`.
fn is_domain(d: &str) -> bool {
    let (host, port) = if let Some(rest) = d.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else { return false };
        if v6.is_empty() || !v6.bytes().all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.') {
            return false;
        }
        match after {
            "" => return true,
            p => match p.strip_prefix(':') {
                Some(port) => ("x", Some(port)),
                None => return false,
            },
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (d, None),
        }
    };
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return false;
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
        })
}

/// `[\w][\w.-]{0,127}`
fn is_tag(t: &str) -> bool {
    let w = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let b = t.as_bytes();
    !b.is_empty() && b.len() <= 128 && w(b[0]) && b.iter().all(|x| w(*x) || *x == b'.' || *x == b'-')
}

/// `[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}`
fn is_digest_syntax(d: &str) -> bool {
    let Some((alg, hex)) = d.split_once(':') else { return false };
    let alg_ok = alg.split(['-', '_', '+', '.']).all(|c| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    });
    alg_ok && hex.len() >= 32 && hex.bytes().all(|b| b.is_ascii_hexdigit())
}

/// go-digest's `Digest.Validate` for the registered algorithms.
fn validate_digest(d: &str) -> Result<(), ReferenceError> {
    let (alg, hex) = d.split_once(':').ok_or(ReferenceError::DigestFormat)?;
    let len = match alg {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => return Err(ReferenceError::DigestAlgorithm),
    };
    if hex.len() != len {
        return Err(ReferenceError::DigestLength);
    }
    if !hex.bytes().all(|b| matches!(b, b'a'..=b'f' | b'0'..=b'9')) {
        return Err(ReferenceError::DigestFormat);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:2d4e459f4ecb5329407ae3e47cbc107a2fbace221354ca75960af4c047b3cb13";

    #[test]
    fn normalization_as_containerd() {
        let d = |s: &str| format!("{s}@{D}");
        let cases: Vec<(String, String)> = vec![
            ("busybox".into(), "docker.io/library/busybox:latest".into()),
            ("busybox:1.36".into(), "docker.io/library/busybox:1.36".into()),
            ("library/busybox".into(), "docker.io/library/busybox:latest".into()),
            ("docker.io/busybox".into(), "docker.io/library/busybox:latest".into()),
            ("index.docker.io/busybox".into(), "docker.io/library/busybox:latest".into()),
            ("bitnami/nginx:1.25".into(), "docker.io/bitnami/nginx:1.25".into()),
            ("registry.k8s.io/pause:3.9".into(), "registry.k8s.io/pause:3.9".into()),
            ("localhost/app".into(), "localhost/app:latest".into()),
            ("localhost:5000/team/app:v1".into(), "localhost:5000/team/app:v1".into()),
            ("127.0.0.1:5000/app".into(), "127.0.0.1:5000/app:latest".into()),
            ("[::1]:5000/app:v2".into(), "[::1]:5000/app:v2".into()),
            ("Registry.Example.com/app".into(), "Registry.Example.com/app:latest".into()),
            ("ghcr.io/a/b/c/d:x_y-z.1".into(), "ghcr.io/a/b/c/d:x_y-z.1".into()),
            ("a.b__c-d--e_f:tag".into(), "docker.io/library/a.b__c-d--e_f:tag".into()),
            // A digest without a tag keeps no tag; with both, containerd
            // drops the tag.
            (d("busybox"), format!("docker.io/library/busybox@{D}")),
            (format!("busybox:1.36@{D}"), format!("docker.io/library/busybox@{D}")),
            // `sha256:abc` is a name with a tag, not a digest.
            ("sha256:abc".into(), "docker.io/library/sha256:abc".into()),
        ];
        for (input, want) in cases {
            let r = Reference::parse(&input).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(r.normalized(), want, "{input}");
        }
    }

    #[test]
    fn invalid_names() {
        let hex64 = "a".repeat(64);
        let long = format!("x/{}", "a".repeat(300));
        let cases: Vec<(&str, ReferenceError)> = vec![
            ("", ReferenceError::InvalidFormat),
            ("Busybox", ReferenceError::Uppercase("library/Busybox".into())),
            ("foo/Bar", ReferenceError::Uppercase("foo/Bar".into())),
            ("busybox:", ReferenceError::InvalidFormat),
            (":tag", ReferenceError::InvalidFormat),
            ("busybox:-x", ReferenceError::InvalidFormat),
            ("busy box", ReferenceError::InvalidFormat),
            ("busybox!", ReferenceError::InvalidFormat),
            ("-busybox", ReferenceError::InvalidFormat),
            ("busybox-", ReferenceError::InvalidFormat),
            ("a..b", ReferenceError::InvalidFormat),
            ("a___b", ReferenceError::InvalidFormat),
            ("foo//bar", ReferenceError::InvalidFormat),
            ("localhost:port/app", ReferenceError::InvalidFormat),
            ("exa_mple.com/app", ReferenceError::InvalidFormat),
            ("busybox@sha256:abc", ReferenceError::InvalidFormat),
            (
                "busybox@sha256:ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789ABCDEF0123456789",
                ReferenceError::DigestFormat,
            ),
            ("busybox@sha256:0123456789abcdef0123456789abcdef", ReferenceError::DigestLength),
            ("busybox@md5:0123456789abcdef0123456789abcdef", ReferenceError::DigestAlgorithm),
            (hex64.as_str(), ReferenceError::HexName(hex64.clone())),
            (long.as_str(), ReferenceError::NameTooLong),
        ];
        for (input, want) in cases {
            assert_eq!(Reference::parse(input), Err(want), "{input:?}");
        }
        let long_tag = format!("busybox:{}", "t".repeat(129));
        assert_eq!(Reference::parse(&long_tag), Err(ReferenceError::InvalidFormat));
        assert!(Reference::parse(&format!("busybox:{}", "t".repeat(128))).is_ok());
    }

    #[test]
    fn default_tag_as_the_kubelet() {
        let cases = [
            ("busybox", "busybox:latest"),
            ("busybox:1.36", "busybox:1.36"),
            ("localhost:5000/app", "localhost:5000/app:latest"),
            ("docker.io/library/busybox", "docker.io/library/busybox:latest"),
        ];
        for (input, want) in cases {
            assert_eq!(with_default_tag(input).unwrap(), want, "{input}");
        }
        let digested = format!("busybox@{D}");
        assert_eq!(with_default_tag(&digested).unwrap(), digested);
        assert!(with_default_tag("Busybox").is_err());
    }

    #[test]
    fn effective_tag() {
        assert_eq!(Reference::parse("busybox").unwrap().effective_tag(), Some("latest"));
        assert_eq!(Reference::parse("busybox:1").unwrap().effective_tag(), Some("1"));
        assert_eq!(Reference::parse(&format!("busybox@{D}")).unwrap().effective_tag(), None);
        assert_eq!(Reference::parse(&format!("busybox:latest@{D}")).unwrap().effective_tag(), Some("latest"));
    }
}
