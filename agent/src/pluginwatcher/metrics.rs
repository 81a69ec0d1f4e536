//! `plugin_manager_total_plugins{socket_path,state}` (the kubelet's
//! pkg/kubelet/pluginmanager/metrics), read at scrape time: 1 per socket
//! on disk (`desired_state_of_world`) and per plugin registered
//! (`actual_state_of_world`).

use std::{collections::BTreeMap, fmt, sync::Arc};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{MetricType, gauge::ConstGauge},
};

use super::PluginWatcher;

pub struct PluginManagerCollector(pub Arc<PluginWatcher>);

impl fmt::Debug for PluginManagerCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PluginManagerCollector")
    }
}

impl Collector for PluginManagerCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let mut counts: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
        for socket in self.0.sockets() {
            *counts.entry(("desired_state_of_world", socket.display().to_string())).or_default() += 1;
        }
        for p in self.0.plugins() {
            *counts.entry(("actual_state_of_world", p.socket.display().to_string())).or_default() += 1;
        }
        let mut me = enc.encode_descriptor(
            "plugin_manager_total_plugins",
            "Number of plugins in Plugin Manager",
            None,
            MetricType::Gauge,
        )?;
        for ((state, socket), count) in counts {
            let labels = [("socket_path", socket.as_str()), ("state", state)];
            ConstGauge::new(count as f64).encode(me.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
