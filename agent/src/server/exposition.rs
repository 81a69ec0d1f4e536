//! The exposition formats: OpenMetrics 1.0 when the scraper asks for it
//! (`Accept: application/openmetrics-text`, as Prometheus does), and the
//! Prometheus text format 0.0.4 otherwise (curl, metrics-server, promtool).
//!
//! prometheus-client writes OpenMetrics only; the text format is derived
//! from it line by line: counter families are named as their samples
//! (`x_total`), `_created` samples, `# UNIT`, exemplars and `# EOF` go, info
//! metrics become gauges. A few kubelet counters predate the `_total`
//! convention (`kubelet_evictions`): in the text format they keep the
//! kubelet's sample name, typed `untyped` so linters accept the name.

use prometheus_client::registry::Registry;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Format {
    /// text/plain; version=0.0.4
    Text,
    /// application/openmetrics-text; version=1.0.0
    OpenMetrics,
}

impl Format {
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Text => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

/// The format for an `Accept` header: OpenMetrics when it is listed with a
/// non-zero quality.
pub fn negotiate(accept: Option<&str>) -> Format {
    let Some(accept) = accept else { return Format::Text };
    for part in accept.split(',') {
        let mut params = part.split(';').map(str::trim);
        let media = params.next().unwrap_or_default();
        if media.eq_ignore_ascii_case("application/openmetrics-text") {
            let q = params.find_map(|p| p.strip_prefix("q=")).and_then(|q| q.parse::<f64>().ok()).unwrap_or(1.0);
            if q > 0.0 {
                return Format::OpenMetrics;
            }
        }
    }
    Format::Text
}

/// Counters the kubelet exposes without the `_total` suffix.
pub const LEGACY_COUNTERS: &[&str] = &[
    "kubelet_evictions",
    "kubelet_certificate_manager_client_expiration_renew_errors",
    "kubelet_server_expiration_renew_errors",
];

/// Encodes the registries (their families must not overlap) in `format`.
pub fn encode(registries: &[&Registry], format: Format) -> String {
    let mut om = String::with_capacity(16 * 1024);
    for r in registries {
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode_registry(&mut om, r);
    }
    match format {
        Format::OpenMetrics => {
            om.push_str("# EOF\n");
            om
        }
        Format::Text => openmetrics_to_text(&om, LEGACY_COUNTERS),
    }
}

/// How one family's names change.
struct Family {
    /// The OpenMetrics family name.
    name: String,
    kind: String,
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
            let legacy = legacy_counters.contains(&name);
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
                out.push_str(&format!("# HELP {text_name} {text}\n"));
            }
            out.push_str(&format!("# TYPE {text_name} {text_kind}\n"));
            family =
                Some(Family { name: name.to_owned(), kind: if legacy { "legacy".into() } else { kind.to_owned() } });
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
        let value = line[end..].split_whitespace().next().unwrap_or("");
        let name_end = series.find('{').unwrap_or(series.len());
        let name = &series[..name_end];
        let labels = &series[name_end..];
        if let Some(f) = &family {
            if name == format!("{}_created", f.name) {
                continue;
            }
            if f.kind == "legacy" && name == format!("{}_total", f.name) {
                out.push_str(&format!("{}{labels} {value}\n", f.name));
                continue;
            }
        }
        out.push_str(&format!("{series} {value}\n"));
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
    fn negotiation() {
        assert_eq!(negotiate(None), Format::Text);
        assert_eq!(negotiate(Some("*/*")), Format::Text);
        assert_eq!(negotiate(Some("text/plain;version=0.0.4")), Format::Text);
        // What Prometheus 2.x sends.
        assert_eq!(
            negotiate(Some(
                "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
            )),
            Format::OpenMetrics
        );
        assert_eq!(negotiate(Some("application/openmetrics-text; q=0, text/plain")), Format::Text);
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
        let om = encode(&[&r], Format::OpenMetrics);
        assert!(om.ends_with("# EOF\n"));
        assert!(om.contains("kubelet_evictions_total{eviction_signal=\"memory.available\"} 1"), "{om}");
        let text = encode(&[&r], Format::Text);
        let want = "\
# HELP kubelet_evictions Cumulative number of pod evictions by eviction signal.
# TYPE kubelet_evictions untyped
kubelet_evictions{eviction_signal=\"memory.available\"} 1
# HELP kubelet_runtime_operations_total Cumulative number of runtime operations.
# TYPE kubelet_runtime_operations_total counter
kubelet_runtime_operations_total 3
# HELP kubelet_running_pods Number of pods that have a running pod sandbox.
# TYPE kubelet_running_pods gauge
kubelet_running_pods 2
# HELP kubelet_pod_start_duration_seconds Pod start.
# TYPE kubelet_pod_start_duration_seconds histogram
kubelet_pod_start_duration_seconds_sum 0.7
kubelet_pod_start_duration_seconds_count 1
kubelet_pod_start_duration_seconds_bucket{le=\"0.5\"} 0
kubelet_pod_start_duration_seconds_bucket{le=\"1.0\"} 1
kubelet_pod_start_duration_seconds_bucket{le=\"+Inf\"} 1
# HELP kubelet_build_info Build.
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
            "# HELP x_events_total Events.\n# TYPE x_events_total counter\nx_events_total{a=\"} # {\"} 5\n"
        );
    }
}
