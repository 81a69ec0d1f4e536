//! Certificate and key pairs on disk, as client-go's file store keeps them
//! in `--cert-dir`: each issued pair as `<prefix>-<YYYY-MM-DD-HH-MM-SS>.pem`
//! (certificate and key in one root-only file) and the pair in use as the
//! symlink `<prefix>-current.pem` (`kubelet-client-current.pem`,
//! `kubelet-server-current.pem`), swapped atomically. Reading, the current
//! pair wins, then the configured files (`--tls-cert-file` and key for the
//! serving pair), then `<prefix>.crt`/`<prefix>.key`.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

/// A certificate chain (leaf first), its key and the leaf's validity.
#[derive(Debug)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
    /// The key `key_pem` holds, parsed once.
    key: PrivateKeyDer<'static>,
    pub chain: Vec<CertificateDer<'static>>,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    /// The file it was read from or written to.
    pub source: PathBuf,
}

impl Pair {
    /// Parses certificates and a key from PEM text (one or two files).
    pub fn parse(cert_pem: &str, key_pem: &str, source: &Path) -> Result<Pair, String> {
        let err = |why: String| format!("{}: {why}", source.display());
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| err(format!("not a PEM certificate: {e}")))?;
        let leaf = chain.first().ok_or_else(|| err("no CERTIFICATE block".into()))?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| err(format!("no usable private key: {e}")))?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|e| err(format!("bad certificate: {e}")))?;
        let at = |t: i64| UNIX_EPOCH + Duration::from_secs(t.max(0) as u64);
        Ok(Pair {
            not_before: at(cert.validity().not_before.timestamp()),
            not_after: at(cert.validity().not_after.timestamp()),
            cert_pem: only_blocks(cert_pem, "CERTIFICATE"),
            key_pem: key_block(key_pem),
            key,
            chain,
            source: source.to_owned(),
        })
    }

    /// Reads a combined PEM file (certificate and key).
    pub fn read(path: &Path) -> Result<Pair, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Pair::parse(&text, &text, path)
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        self.key.clone_key()
    }
}

/// The PEM blocks of one kind, in order.
fn only_blocks(pem: &str, kind: &str) -> String {
    let (begin, end) = (format!("-----BEGIN {kind}-----"), format!("-----END {kind}-----"));
    let mut out = String::new();
    let mut rest = pem;
    while let Some(i) = rest.find(&begin) {
        let Some(j) = rest[i..].find(&end) else { break };
        out.push_str(&rest[i..i + j + end.len()]);
        out.push('\n');
        rest = &rest[i + j + end.len()..];
    }
    out
}

/// The first private-key PEM block, whatever its flavour.
fn key_block(pem: &str) -> String {
    for kind in ["PRIVATE KEY", "EC PRIVATE KEY", "RSA PRIVATE KEY"] {
        let b = only_blocks(pem, kind);
        if !b.is_empty() {
            return b.split_inclusive(&format!("-----END {kind}-----\n")).next().unwrap_or_default().to_owned();
        }
    }
    String::new()
}

/// One pair's files in the cert dir.
#[derive(Clone, Debug)]
pub struct FileStore {
    pub dir: PathBuf,
    pub prefix: &'static str,
    /// Configured files read when there is no current pair.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl FileStore {
    pub fn new(dir: &Path, prefix: &'static str) -> FileStore {
        FileStore { dir: dir.to_owned(), prefix, cert_file: None, key_file: None }
    }

    pub fn current_path(&self) -> PathBuf {
        self.dir.join(format!("{}-current.pem", self.prefix))
    }

    /// The pair in use, if any.
    pub fn current(&self) -> Result<Option<Pair>, String> {
        let current = self.current_path();
        if current.exists() {
            return Pair::read(&current).map(Some);
        }
        let fallback = |c: &Path, k: &Path| -> Result<Option<Pair>, String> {
            if !(c.exists() && k.exists()) {
                return Ok(None);
            }
            let cert = std::fs::read_to_string(c).map_err(|e| format!("{}: {e}", c.display()))?;
            let key = std::fs::read_to_string(k).map_err(|e| format!("{}: {e}", k.display()))?;
            Pair::parse(&cert, &key, c).map(Some)
        };
        if let (Some(c), Some(k)) = (&self.cert_file, &self.key_file)
            && let Some(p) = fallback(c, k)?
        {
            return Ok(Some(p));
        }
        let c = self.dir.join(format!("{}.crt", self.prefix));
        let k = self.dir.join(format!("{}.key", self.prefix));
        fallback(&c, &k)
    }

    /// Stores a newly issued pair and makes it the current one.
    pub fn update(&self, cert_pem: &str, key_pem: &str, now: SystemTime) -> Result<Pair, String> {
        crate::host::ensure_private_dir(&self.dir).map_err(|e| format!("{}: {e}", self.dir.display()))?;
        let stamp = k8s_openapi::jiff::Timestamp::try_from(now)
            .map(|t| t.strftime("%Y-%m-%d-%H-%M-%S").to_string())
            .unwrap_or_default();
        let file = self.dir.join(format!("{}-{stamp}.pem", self.prefix));
        let mut text = cert_pem.trim_end().to_owned();
        text.push('\n');
        text.push_str(key_pem.trim_end());
        text.push('\n');
        let pair = Pair::parse(&text, &text, &file)?;
        crate::host::write_private(&file, text.as_bytes()).map_err(|e| format!("{}: {e}", file.display()))?;
        let current = self.current_path();
        let link = self.dir.join(format!("{}-updated.pem", self.prefix));
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&file, &link)
            .and_then(|()| std::fs::rename(&link, &current))
            .map_err(|e| format!("{}: {e}", current.display()))?;
        Ok(pair)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A self-signed certificate valid for `secs` from now, and its key.
    pub fn pem_pair(cn: &str, secs: u64) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        p.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
        p.not_before = rcgen::date_time_ymd(1970, 1, 1) + now;
        p.not_after = rcgen::date_time_ymd(1970, 1, 1) + now + Duration::from_secs(secs);
        (p.self_signed(&key).unwrap().pem(), key.serialize_pem())
    }

    #[test]
    fn update_writes_a_stamped_pair_and_swaps_the_link() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::new(&dir.path().join("pki"), "kubelet-client");
        assert!(store.current().unwrap().is_none());
        let (c, k) = pem_pair("system:node:n1", 3600);
        let t = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let p = store.update(&c, &k, t).unwrap();
        assert_eq!(p.source.file_name().unwrap(), "kubelet-client-2023-11-14-22-13-20.pem");
        let life = p.not_after.duration_since(p.not_before).unwrap();
        assert!(life >= Duration::from_secs(3599) && life <= Duration::from_secs(3601), "{life:?}");
        let cur = store.current().unwrap().unwrap();
        assert_eq!(cur.cert_pem, p.cert_pem);
        assert!(std::fs::symlink_metadata(store.current_path()).unwrap().file_type().is_symlink());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&p.source).unwrap().permissions().mode() & 0o777, 0o600);
        let (c2, k2) = pem_pair("system:node:n1", 7200);
        store.update(&c2, &k2, t + Duration::from_secs(1)).unwrap();
        assert_ne!(store.current().unwrap().unwrap().cert_pem, p.cert_pem);
        let _ = cur.key();
    }

    #[test]
    fn fallbacks_and_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let (c, k) = pem_pair("n1", 60);
        std::fs::write(dir.path().join("kubelet-server.crt"), &c).unwrap();
        std::fs::write(dir.path().join("kubelet-server.key"), &k).unwrap();
        let store = FileStore::new(dir.path(), "kubelet-server");
        assert!(store.current().unwrap().unwrap().source.ends_with("kubelet-server.crt"));
        std::fs::write(dir.path().join("kubelet-server-current.pem"), "junk").unwrap();
        let e = store.current().unwrap_err();
        assert!(e.contains("kubelet-server-current.pem"), "{e}");
    }
}
