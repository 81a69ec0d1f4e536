//! The exposition format: the Prometheus text format 0.0.4, whatever the
//! scraper asks for, as the kubelet serves it (component-base's handler
//! does not offer OpenMetrics). Under OpenMetrics a counter's samples must
//! end in `_total`, which would rename the kubelet's `kubelet_evictions`
//! and break the alerts that query it (KubeNodeEviction).
//!
//! prometheus-client writes OpenMetrics only; the text format is derived
//! from it line by line: counter families are named as their samples
//! (`x_total`), `_created` samples, `# UNIT`, exemplars and `# EOF` go,
//! info metrics become gauges, and numbers (sample values and `le`
//! bounds) are written as Go writes them (`1`, `2.5`, `1e-06`), so bucket
//! labels match the kubelet's. A few kubelet counters predate the `_total`
//! convention ([`LEGACY_COUNTERS`]): they keep the kubelet's sample name,
//! typed `untyped` so linters (`promtool check metrics`) accept the name.

use std::fmt::Write as _;

use prometheus_client::registry::Registry;

/// `Content-Type` of every metrics response.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Counters the kubelet exposes without the `_total` suffix.
pub const LEGACY_COUNTERS: &[&str] = &[
    "kubelet_evictions",
    "kubelet_pleg_discard_events",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Encodes the registries (their families must not overlap) in the text
/// format.
pub fn encode(registries: &[&Registry]) -> String {
    let mut om = String::with_capacity(16 * 1024);
    for r in registries {
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut om, r);
    }
    openmetrics_to_text(&om, LEGACY_COUNTERS)
}

/// How one family's names change.
struct Family {
    /// The OpenMetrics family name.
    name: String,
    legacy: bool,
}

/// The end of a sample's name and labels (the index after `}` or the name).
fn series_end(line: &str) -> usize {
    let b = line.as_bytes();
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    if b.get(name_end) != Some(&b'{') {
        return name_end;
    }
    let mut i = name_end + 1;
    let mut in_quotes = false;
    while i < b.len() {
        match b[i] {
            b'\\' if in_quotes => i += 1,
            b'"' => in_quotes = !in_quotes,
            b'}' if !in_quotes => return i + 1,
            _ => {}
        }
        i += 1;
    }
    b.len()
}

/// A number as Go's `strconv.FormatFloat(v, 'g', -1, 64)` writes it (what
/// client_golang writes for values and bucket bounds); text that is not a
/// number is returned as it is.
pub fn go_float(text: &str) -> String {
    let v: f64 = match text.parse() {
        Ok(v) => v,
        Err(_) => return text.to_owned(),
    };
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf".into() } else { "-Inf".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0".into() } else { "0".into() };
    }
    // Shortest round-trip digits and exponent, from Rust's `{:e}`.
    let sci = format!("{v:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    // Go's %g with the shortest precision switches to an exponent below
    // 1e-4 and from 1e21 on.
    if !(-4..21).contains(&exp) {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() { String::new() } else { format!(".{rest}") };
        let esign = if exp < 0 { '-' } else { '+' };
        return format!("{sign}{first}{frac}e{esign}{:02}", exp.abs());
    }
    let point = exp + 1;
    if point <= 0 {
        return format!("{sign}0.{}{digits}", "0".repeat((-point) as usize));
    }
    let point = point as usize;
    if digits.len() <= point {
        format!("{sign}{digits}{}", "0".repeat(point - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

/// `labels` (`{le="1.0",a="b"}`, as prometheus-client writes a bucket)
/// with the `le` bound written as Go writes it and put last, as
/// client_golang puts it (`{a="b",le="1"}`).
fn normalise_le(labels: &str) -> String {
    let Some(at) = labels.find("le=\"") else { return labels.to_owned() };
    // Only a label named exactly `le` (the first, or after a comma).
    if at != 1 && labels.as_bytes().get(at - 1) != Some(&b',') {
        return labels.to_owned();
    }
    let start = at + 4;
    let Some(len) = labels[start..].find('"') else { return labels.to_owned() };
    let bound = go_float(&labels[start..start + len]);
    // The other labels, without `le="…"` and its comma.
    let before = labels[1..at].trim_end_matches(',');
    let after = labels[start + len + 1..].trim_start_matches(',').trim_end_matches('}');
    let others: Vec<&str> = [before, after].into_iter().filter(|x| !x.is_empty()).collect();
    if others.is_empty() { format!("{{le=\"{bound}\"}}") } else { format!("{{{},le=\"{bound}\"}}", others.join(",")) }
}

/// Converts an OpenMetrics text exposition (as prometheus-client writes
/// it) into the Prometheus text format 0.0.4.
pub fn openmetrics_to_text(om: &str, legacy_counters: &[&str]) -> String {
    let mut out = String::with_capacity(om.len());
    let mut help: Option<String> = None;
    let mut family: Option<Family> = None;
    for line in om.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = Some(rest.to_owned());
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, "unknown"));
            let legacy = kind == "counter" && legacy_counters.contains(&name);
            let (text_name, text_kind) = match kind {
                "counter" if legacy => (name.to_owned(), "untyped"),
                "counter" => (format!("{name}_total"), "counter"),
                "gauge" => (name.to_owned(), "gauge"),
                "histogram" => (name.to_owned(), "histogram"),
                "summary" => (name.to_owned(), "summary"),
                "info" => (format!("{name}_info"), "gauge"),
                _ => (name.to_owned(), "untyped"),
            };
            if let Some(h) = help.take() {
                let text = h.split_once(' ').map(|(_, t)| t).unwrap_or("");
                // client_golang writes the help as given, without the
                // period prometheus-client adds.
                let text = text.strip_suffix('.').unwrap_or(text);
                let _ = writeln!(out, "# HELP {text_name} {text}");
            }
            let _ = writeln!(out, "# TYPE {text_name} {text_kind}");
            family = Some(Family { name: name.to_owned(), legacy });
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            // # UNIT, # EOF and anything else OpenMetrics-only.
            continue;
        }
        let end = series_end(line);
        let series = &line[..end];
        // The value is the first field after the series; timestamps and
        // exemplars are dropped.
        let value = go_float(line[end..].split_whitespace().next().unwrap_or(""));
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        let labels = match &series[name_end..] {
            // An empty label set (a collector's `[]`) is written without braces.
            "{}" => String::new(),
            l => normalise_le(l),
        };
        if let Some(f) = &family {
            if name.len() == f.name.len() + 8 && name.starts_with(&f.name) && name.ends_with("_created") {
                continue;
            }
            if f.legacy && name.len() == f.name.len() + 6 && name.starts_with(&f.name) && name.ends_with("_total") {
                let _ = writeln!(out, "{}{labels} {value}", f.name);
                continue;
            }
        }
        let _ = writeln!(out, "{name}{labels} {value}");
    }
    out
}

#[cfg(test)]
mod tests {
    use prometheus_client::{
        encoding::EncodeLabelSet,
        metrics::{counter::Counter, family::Family as F, gauge::Gauge, histogram::Histogram, info::Info},
    };

    use super::*;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct L {
        eviction_signal: String,
    }

    #[test]
    fn numbers_as_go_writes_them() {
        for (input, want) in [
            ("1.0", "1"),
            ("2.5", "2.5"),
            ("0.005", "0.005"),
            ("0.0001", "0.0001"),
            ("0.00001", "1e-05"),
            ("0.000001", "1e-06"),
            ("3600.0", "3600"),
            ("1000000.0", "1000000"),
            ("1e21", "1e+21"),
            ("123456789012.0", "123456789012"),
            ("-2.0", "-2"),
            ("0.0", "0"),
            ("+Inf", "+Inf"),
            ("-Inf", "-Inf"),
            ("NaN", "NaN"),
            ("1700000000.25", "1700000000.25"),
            ("0.078125", "0.078125"),
            ("x", "x"),
        ] {
            assert_eq!(go_float(input), want, "{input}");
        }
        assert_eq!(normalise_le("{le=\"1.0\"}"), "{le=\"1\"}");
        assert_eq!(normalise_le("{a=\"x\",le=\"0.25\"}"), "{a=\"x\",le=\"0.25\"}");
        assert_eq!(normalise_le("{le=\"5.0\",a=\"x\",b=\"y\"}"), "{a=\"x\",b=\"y\",le=\"5\"}");
        assert_eq!(normalise_le("{handle=\"1.0\"}"), "{handle=\"1.0\"}");
    }

    #[test]
    fn text_format_from_openmetrics() {
        let mut r = Registry::default();
        let ev: F<L, Counter> = F::default();
        r.register("kubelet_evictions", "Cumulative number of pod evictions by eviction signal", ev.clone());
        ev.get_or_create(&L { eviction_signal: "memory.available".into() }).inc();
        let ops: Counter = Counter::default();
        r.register("kubelet_runtime_operations", "Cumulative number of runtime operations", ops.clone());
        ops.inc_by(3);
        let g: Gauge = Gauge::default();
        r.register("kubelet_running_pods", "Number of pods that have a running pod sandbox", g.clone());
        g.set(2);
        let h = Histogram::new([0.5, 1.0]);
        r.register("kubelet_pod_start_duration_seconds", "Pod start", h.clone());
        h.observe(0.7);
        r.register("kubelet_build", "Build", Info::new(vec![("version".to_owned(), "1".to_owned())]));
        let text = encode(&[&r]);
        let want = "\
# HELP kubelet_evictions Cumulative number of pod evictions by eviction signal
# TYPE kubelet_evictions untyped
kubelet_evictions{eviction_signal=\"memory.available\"} 1
# HELP kubelet_runtime_operations_total Cumulative number of runtime operations
# TYPE kubelet_runtime_operations_total counter
kubelet_runtime_operations_total 3
# HELP kubelet_running_pods Number of pods that have a running pod sandbox
# TYPE kubelet_running_pods gauge
kubelet_running_pods 2
# HELP kubelet_pod_start_duration_seconds Pod start
# TYPE kubelet_pod_start_duration_seconds histogram
kubelet_pod_start_duration_seconds_sum 0.7
kubelet_pod_start_duration_seconds_count 1
kubelet_pod_start_duration_seconds_bucket{le=\"0.5\"} 0
kubelet_pod_start_duration_seconds_bucket{le=\"1\"} 1
kubelet_pod_start_duration_seconds_bucket{le=\"+Inf\"} 1
# HELP kubelet_build_info Build
# TYPE kubelet_build_info gauge
kubelet_build_info{version=\"1\"} 1
";
        assert_eq!(text, want);
    }

    #[test]
    fn exemplars_created_and_tricky_labels() {
        let om = "# HELP x_events Events.\n# TYPE x_events counter\n# UNIT x_events events\n\
                  x_events_total{a=\"} # {\"} 5 # {trace_id=\"1\"} 1.0\nx_events_created 1.7e9\n# EOF\n";
        assert_eq!(
            openmetrics_to_text(om, &[]),
            "# HELP x_events_total Events\n# TYPE x_events_total counter\nx_events_total{a=\"} # {\"} 5\n"
        );
    }
}
