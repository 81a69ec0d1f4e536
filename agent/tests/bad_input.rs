//! Bad input, against the real parsers: the quantity parser, the eviction
//! threshold statements, the KubeletConfiguration loader and the static pod
//! manifest reader.
//!
//! `fuzz_*` are property tests: inputs are either arbitrary text or seeds
//! from `tests/fixtures/fuzz/<target>/` mutated by random edits (inserted,
//! deleted, duplicated and replaced spans, YAML and number tokens). None may
//! panic; errors must name where the bad value came from; what parses must
//! read back the same once written out again. `cargo xtask fuzz --time N`
//! runs them again and again with fresh seeds for N seconds.
//!
//! `malformed_manifests_*` checks every case in
//! `tests/fixtures/malformed/manifests/` against its exact expected message.

use std::{
    collections::BTreeMap,
    fs, io,
    path::{Path, PathBuf},
    time::Duration,
};

use proptest::{prelude::*, sample::select};
use swiftlet::{
    config::{self, ConfigFs, format_quantity, thresholds},
    eviction::signal::ThresholdValue,
    pods::manifest,
    quantity::{Quantity, QuantityError, format_bytes},
};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures")
}

/// The seeds of one target: each line of `seeds.txt`, or each other file.
fn seeds(target: &str) -> Vec<String> {
    let dir = fixtures().join("fuzz").join(target);
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("the fuzz corpus {} is missing: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    let mut out = vec![];
    for f in files {
        let text = fs::read_to_string(&f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        if f.file_name().is_some_and(|n| n == "seeds.txt") {
            out.extend(text.lines().map(str::to_owned));
        } else {
            out.push(text);
        }
    }
    assert!(!out.is_empty(), "the fuzz corpus {} holds no seed", dir.display());
    out
}

/// Pieces that make parsers take their less travelled paths.
const TOKENS: &[&str] = &[
    ":",
    ": ",
    "-",
    "- ",
    "\n",
    "\n  ",
    "{",
    "}",
    "[",
    "]",
    ",",
    "'",
    "\"",
    "#",
    "&a ",
    "*a",
    "!!binary ",
    "!!str ",
    "<<: ",
    "---\n",
    "...\n",
    "~",
    "null",
    "true",
    "0x1F",
    "1e99",
    "-1",
    "9223372036854775808",
    ".",
    "%",
    "Ki",
    "Mi",
    "Gi",
    "Ei",
    "E",
    "m",
    "n",
    "e-30",
    "e30",
    "\t",
    "\u{0}",
    "\u{feff}",
    "é",
    "\u{1F600}",
    "memory.available",
    "pid.available",
    "10%",
    "100Mi",
    "1m30s",
    "-5s",
    "apiVersion: v1\n",
    "kind: Pod\n",
    "spec:\n",
    "containers:\n",
    "name: ",
    "image: ",
    "resources: {limits: {memory: ",
    "evictionHard:\n",
    "maxPods: ",
    "podPidsLimit: ",
];

#[derive(Clone, Debug)]
enum Edit {
    Insert(usize, String),
    Delete(usize, usize),
    Replace(usize, String),
    Duplicate(usize, usize),
    Truncate(usize),
}

fn piece() -> impl Strategy<Value = String> {
    prop_oneof![select(TOKENS).prop_map(str::to_owned), any::<char>().prop_map(String::from), "[ -~\n]{0,8}",]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), piece()).prop_map(|(at, s)| Edit::Insert(at, s)),
        (any::<usize>(), 1..16usize).prop_map(|(at, n)| Edit::Delete(at, n)),
        (any::<usize>(), piece()).prop_map(|(at, s)| Edit::Replace(at, s)),
        (any::<usize>(), 1..32usize).prop_map(|(at, n)| Edit::Duplicate(at, n)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

/// Applies the edits on characters, positions taken modulo the length.
fn mutate(seed: &str, edits: &[Edit]) -> String {
    let mut c: Vec<char> = seed.chars().collect();
    for e in edits {
        let at = |p: usize, len: usize| p % (len + 1);
        match e {
            Edit::Insert(p, s) => {
                let i = at(*p, c.len());
                c.splice(i..i, s.chars());
            }
            Edit::Delete(p, n) => {
                let i = at(*p, c.len());
                let end = (i + n).min(c.len());
                c.drain(i..end);
            }
            Edit::Replace(p, s) => {
                let i = at(*p, c.len());
                let end = (i + s.chars().count()).min(c.len());
                c.splice(i..end, s.chars());
            }
            Edit::Duplicate(p, n) => {
                let i = at(*p, c.len());
                let end = (i + n).min(c.len());
                let span: Vec<char> = c[i..end].to_vec();
                c.splice(end..end, span);
            }
            Edit::Truncate(p) => c.truncate(at(*p, c.len())),
        }
    }
    c.into_iter().collect()
}

/// Mostly mutated seeds, sometimes arbitrary text.
fn input(target: &str) -> impl Strategy<Value = String> + use<> {
    let seeds = seeds(target);
    let n = seeds.len();
    prop_oneof![
        6 => (0..n, prop::collection::vec(edit(), 0..8)).prop_map(move |(i, e)| mutate(&seeds[i], &e)),
        1 => any::<String>(),
        1 => "[-+0-9.eEkKMGTPimnu% :\n]{0,16}",
    ]
}

// ---------------------------------------------------------------- quantity

fn quantity_input() -> impl Strategy<Value = String> {
    input("quantity")
}

const BINARY: [(&str, u32); 6] = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40), ("Pi", 50), ("Ei", 60)];
const DECIMAL: [(&str, u32); 6] = [("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15), ("E", 18)];

proptest! {
    /// Any text: a quantity or an error naming the text; what parses prints
    /// back to itself.
    #[test]
    fn fuzz_quantity(s in quantity_input()) {
        match Quantity::parse(&s) {
            Ok(q) => {
                let shown = q.to_string();
                prop_assert_eq!(Quantity::parse(&shown), Ok(q), "{:?} printed as {:?}", s, shown);
                // value() rounds up to whole units; milli_value() is exact
                // while it fits.
                let m = q.milli_value();
                if m > i64::MIN && m < i64::MAX {
                    let (v, m) = (i128::from(q.value()), i128::from(m));
                    prop_assert!(v * 1000 >= m && (v - 1) * 1000 < m, "value() {} of {} milli", v, m);
                    // The config's spelling (binary suffixes) reads back too.
                    let spelled = format_quantity(&q);
                    prop_assert_eq!(Quantity::parse(&spelled), Ok(q), "{:?} spelled as {:?}", s, spelled);
                }
            }
            Err(QuantityError::Empty) => prop_assert!(s.trim().is_empty()),
            Err(QuantityError::Invalid(t) | QuantityError::Overflow(t)) => prop_assert_eq!(t, s),
        }
    }

    /// Exact values: n with each suffix is n × the suffix's multiplier.
    #[test]
    fn fuzz_quantity_suffixes_are_exact(n in 0i64..(1 << 40), b in select(&BINARY[..]), d in select(&DECIMAL[..])) {
        let (bs, shift) = b;
        let want = i128::from(n) << shift;
        let got = Quantity::parse(&format!("{n}{bs}")).expect("binary quantity");
        if want <= i128::from(i64::MAX) {
            prop_assert_eq!(i128::from(got.value()), want);
        }
        let (ds, exp) = d;
        let want = i128::from(n) * 10i128.pow(exp);
        let got = Quantity::parse(&format!("{n}{ds}")).expect("decimal quantity");
        if want <= i128::from(i64::MAX) {
            prop_assert_eq!(i128::from(got.value()), want);
        }
        prop_assert_eq!(Quantity::parse(&format!("{n}e{exp}")).expect("exponent"), got);
    }

    /// Byte counts as the API prints them read back to the same count.
    #[test]
    fn fuzz_quantity_bytes_round_trip(b in 0u64..=(i64::MAX as u64)) {
        let shown = format_bytes(b);
        prop_assert_eq!(Quantity::parse(&shown).map(|q| q.value()), Ok(b as i64), "{} printed as {:?}", b, shown);
    }
}

// ---------------------------------------------------------------- thresholds

fn signal_name() -> impl Strategy<Value = String> {
    let names: Vec<String> =
        seeds("threshold").iter().filter_map(|l| l.split('\t').next()).map(str::to_owned).collect();
    prop_oneof![4 => select(names), 1 => "[a-zA-Z.]{0,20}"]
}

fn threshold_value() -> impl Strategy<Value = String> {
    let values: Vec<String> =
        seeds("threshold").iter().filter_map(|l| l.split('\t').nth(1)).map(str::to_owned).collect();
    let n = values.len();
    prop_oneof![
        3 => (0..n, prop::collection::vec(edit(), 0..4)).prop_map(move |(i, e)| mutate(&values[i], &e)),
        1 => quantity_input(),
        1 => (0.0f64..=100.0).prop_map(|p| format!("{p}%")),
    ]
}

fn same_value(a: &ThresholdValue, b: &ThresholdValue) -> bool {
    match (a, b) {
        (ThresholdValue::Quantity(x), ThresholdValue::Quantity(y)) => x == y,
        // Written with 6 decimals of a percent.
        (ThresholdValue::Percentage(x), ThresholdValue::Percentage(y)) => (x - y).abs() <= 1e-8,
        _ => false,
    }
}

fn in_config_range(v: &ThresholdValue) -> bool {
    match v {
        ThresholdValue::Quantity(q) => q.milli_value() < i64::MAX,
        ThresholdValue::Percentage(_) => true,
    }
}

proptest! {
    /// `signal: value` statements (evictionHard, evictionSoft,
    /// evictionMinimumReclaim, evictionSoftGracePeriod): no panic, errors
    /// name the signal, what parses is written back to the same threshold.
    #[test]
    fn fuzz_threshold(signal in signal_name(), raw in threshold_value()) {
        let named = format!("{signal:?}");
        match thresholds::parse_threshold(&signal, &raw) {
            Ok(Some((s, v))) => {
                prop_assert_eq!(s.name(), signal.as_str());
                if in_config_range(&v) {
                    let written = thresholds::format_value(&v);
                    let back = thresholds::parse_threshold(&signal, &written);
                    prop_assert!(
                        matches!(&back, Ok(Some((s2, v2))) if *s2 == s && same_value(v2, &v)),
                        "{:?} read as {:?}, written as {:?}, read back as {:?}", raw, v, written, back
                    );
                }
            }
            Ok(None) => prop_assert!(raw == "0%" || raw == "100%", "{:?} ignored", raw),
            Err(e) => prop_assert!(e.contains(&named), "{:?}: the error {:?} does not name the signal", raw, e),
        }
        match thresholds::parse_min_reclaim(&signal, &raw) {
            Ok((_, v)) if in_config_range(&v) => {
                let written = thresholds::format_value(&v);
                let back = thresholds::parse_min_reclaim(&signal, &written);
                prop_assert!(matches!(&back, Ok((_, v2)) if same_value(v2, &v)), "{:?} → {:?} → {:?}", raw, written, back);
            }
            Ok(_) => {}
            Err(e) => prop_assert!(e.contains(&named), "{:?}: {:?}", raw, e),
        }
        match thresholds::parse_grace_period(&signal, &raw) {
            Ok((_, d)) => prop_assert!(d > Duration::ZERO),
            Err(e) => prop_assert!(e.contains(&named), "{:?}: {:?}", raw, e),
        }
    }
}

// ---------------------------------------------------------------- KubeletConfiguration

/// The config loader's files, in memory.
struct MemFs(BTreeMap<PathBuf, String>);

impl ConfigFs for MemFs {
    fn read_to_string(&self, path: &Path) -> io::Result<String> {
        self.0.get(path).cloned().ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<(PathBuf, bool)>> {
        let out: Vec<_> = self.0.keys().filter(|p| p.parent() == Some(dir)).map(|p| (p.clone(), false)).collect();
        if out.is_empty() { Err(io::Error::from(io::ErrorKind::NotFound)) } else { Ok(out) }
    }
}

const CONFIG: &str = "/etc/kubernetes/kubelet.yaml";
const DROP_IN: &str = "/etc/kubernetes/kubelet.conf.d/10-fuzz.conf";

fn load(files: &[(&str, &str)], extra: &[String]) -> Result<config::Config, config::ConfigError> {
    let fs = MemFs(files.iter().map(|(p, t)| (PathBuf::from(p), (*t).to_owned())).collect());
    let mut args = vec![format!("--config={CONFIG}"), "--config-dir=/etc/kubernetes/kubelet.conf.d".to_owned()];
    args.extend(extra.iter().cloned());
    config::load_with(args, &fs)
}

/// Flags that take values the parsers above read.
const VALUE_FLAGS: &[&str] = &[
    "--eviction-hard",
    "--eviction-soft",
    "--eviction-soft-grace-period",
    "--eviction-minimum-reclaim",
    "--system-reserved",
    "--kube-reserved",
    "--max-pods",
    "--pod-max-pids",
    "--sync-frequency",
    "--feature-gates",
    "--node-labels",
    "--cluster-dns",
    "--address",
];

proptest! {
    /// A config file and a drop-in from the corpus, mutated, and a flag with
    /// a mutated value: a configuration or an error naming the file (and
    /// line) or the flag; a configuration written out as JSON reads back the
    /// same.
    #[test]
    fn fuzz_kubelet_config(
        text in input("kubelet-config"),
        drop_in in prop_oneof![1 => Just(String::new()), 1 => input("kubelet-config")],
        flag in prop::option::of((select(VALUE_FLAGS), threshold_value())),
    ) {
        let extra: Vec<String> = flag.iter().map(|(f, v)| format!("{f}={v}")).collect();
        match load(&[(CONFIG, &text), (DROP_IN, &drop_in)], &extra) {
            Ok(c) => {
                let mut json = c.kubelet.to_json();
                let m = json.as_object_mut().expect("to_json is an object");
                m.insert("apiVersion".into(), config::API_VERSION.into());
                m.insert("kind".into(), config::KIND.into());
                let written = serde_json::to_string_pretty(&json).expect("json");
                let back = load(&[(CONFIG, &written), (DROP_IN, "")], &[]);
                prop_assert!(back.is_ok(), "written back as\n{}\nit fails: {}", written, back.unwrap_err());
                prop_assert_eq!(back.unwrap().kubelet, c.kubelet);
            }
            Err(e) => {
                let msg = e.to_string();
                prop_assert!(
                    msg.starts_with(CONFIG) || msg.starts_with(DROP_IN) || msg.starts_with("flag --"),
                    "the error does not say where: {}", msg
                );
            }
        }
    }
}

// ---------------------------------------------------------------- static pod manifests

proptest! {
    /// A manifest: a pod or an error naming the file; a pod read from YAML
    /// reads back the same from its JSON.
    #[test]
    fn fuzz_manifest(text in input("manifest")) {
        let file = Path::new("/etc/kubernetes/manifests/fuzz.yaml");
        match manifest::read_pod(file, &text) {
            Ok(pod) => {
                let json = serde_json::to_string(&pod).expect("a pod serializes");
                let back = manifest::read_pod(file, &json);
                prop_assert_eq!(back.as_ref(), Ok(&pod));
                match manifest::static_pod(pod, file, "node-a") {
                    Ok(p) => {
                        let name = p.metadata.name.unwrap_or_default();
                        prop_assert!(name.ends_with("-node-a"), "{}", name);
                        let node = p.spec.and_then(|s| s.node_name);
                        prop_assert_eq!(node.as_deref(), Some("node-a"));
                    }
                    Err(e) => prop_assert!(e.to_string().starts_with("/etc/kubernetes/manifests/fuzz.yaml: "), "{}", e),
                }
            }
            Err(e) => prop_assert!(e.to_string().starts_with("/etc/kubernetes/manifests/fuzz.yaml: "), "{}", e),
        }
    }
}

/// Nesting and aliases that blow up naive parsers are refused, not
/// followed to a stack overflow or out of memory, nor left to a YAML
/// scanner whose time grows with the square of the nesting (100,000
/// levels held serde_yaml's for over 14 minutes).
#[test]
fn deep_nesting_and_alias_bombs_are_errors() {
    let deep = format!("apiVersion: v1\nkind: Pod\nspec: {}{}\n", "[".repeat(100_000), "]".repeat(100_000));
    let laughs = "apiVersion: v1\nkind: Pod\nmetadata:\n  a: &a [x, x, x, x, x, x, x, x, x, x]\n  b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n  c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n  d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n  e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n  f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n  g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\n  h: [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n";
    let file = Path::new("bomb.yaml");
    for text in [deep.as_str(), laughs] {
        let t = std::time::Instant::now();
        let e = manifest::read_pod(file, text).expect_err("refused");
        println!("manifest: {:?}: {e}", t.elapsed());
        assert!(e.to_string().starts_with("bomb.yaml: "), "{e}");
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        let cfg = text.replace("apiVersion: v1\nkind: Pod\n", head);
        let t = std::time::Instant::now();
        let e = load(&[(CONFIG, &cfg), (DROP_IN, "")], &[]).expect_err("refused");
        println!("config: {:?}: {e}", t.elapsed());
        assert!(e.to_string().starts_with(CONFIG), "{e}");
    }
}

// ---------------------------------------------------------------- malformed manifests

/// Each `<name>.yaml` (or `.json`) in tests/fixtures/malformed/manifests has
/// a `<name>.expected`: the exact error the loader gives, with the path
/// relative to that directory.
#[test]
fn malformed_manifests_give_their_exact_error() {
    let dir = fixtures().join("malformed/manifests");
    let mut cases: Vec<PathBuf> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "expected"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 12, "expected the malformed manifests in {}, found {}", dir.display(), cases.len());
    let mut failures = vec![];
    for expected_file in &cases {
        let stem = expected_file.file_stem().expect("stem").to_string_lossy().into_owned();
        let manifest_file = ["yaml", "json"]
            .iter()
            .map(|ext| dir.join(format!("{stem}.{ext}")))
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{stem}.expected has no {stem}.yaml or {stem}.json"));
        let expected = fs::read_to_string(expected_file).expect("expected").trim_end().to_owned();
        let got = match manifest::load(&manifest_file, "node-a") {
            Ok(pod) => format!("loaded as {:?}", pod.metadata.name),
            Err(e) => {
                let msg = e.to_string();
                let prefix = format!("{}/", dir.display());
                msg.strip_prefix(&prefix).map(str::to_owned).unwrap_or(msg)
            }
        };
        println!("{stem}: {got}");
        if got != expected {
            failures.push(format!("{stem}:\n  expected: {expected}\n  got:      {got}"));
        }
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}
