//! The loader against an in-memory filesystem: flag forms, precedence,
//! defaults, thresholds, and the exact error messages. The in-memory
//! filesystem and helpers are here; the tests are split by concern.

mod errors;
mod files;
mod loading;
mod thresholds;

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    net::IpAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use super::*;
use crate::{
    cm::naming::CgroupDriver,
    config::thresholds::default_hard_thresholds,
    eviction::signal::{EvictionSignal, EvictionThreshold, ThresholdValue},
    quantity::Quantity,
    signals::SourceChoice,
};

/// Files by path; directories are implied. `read_dir` returns entries in
/// reverse order so the loader's own sorting is what is tested.
#[derive(Default)]
struct MemFs(BTreeMap<PathBuf, String>);

impl MemFs {
    fn with(files: &[(&str, &str)]) -> MemFs {
        MemFs(files.iter().map(|(p, t)| (PathBuf::from(p), (*t).to_owned())).collect())
    }
}

impl ConfigFs for MemFs {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        self.0.get(path).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        let mut out = BTreeSet::new();
        for p in self.0.keys() {
            if let Ok(rest) = p.strip_prefix(dir) {
                let mut parts = rest.components();
                let first = parts.next().expect("file below dir");
                out.insert((dir.join(first), parts.next().is_some()));
            }
        }
        if out.is_empty() {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(out.into_iter().rev().collect())
    }
}

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn load_mem(args: &[&str], files: &[(&str, &str)]) -> Result<Config, ConfigError> {
    load_with(args.iter().copied(), &MemFs::with(files))
}

fn ok(args: &[&str], files: &[(&str, &str)]) -> Config {
    load_mem(args, files).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn err(args: &[&str], files: &[(&str, &str)]) -> String {
    match load_mem(args, files) {
        Ok(_) => panic!("{args:?} must fail"),
        Err(e) => e.to_string(),
    }
}

fn file(body: &str) -> String {
    format!("{HEAD}{body}")
}

fn q(s: &str) -> Quantity {
    s.parse().unwrap()
}

fn hard(signal: EvictionSignal, v: ThresholdValue) -> EvictionThreshold {
    EvictionThreshold { signal, value: v, grace_period: Duration::ZERO, min_reclaim: None }
}
