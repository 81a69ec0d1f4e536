//! The node object and the agent's traffic to the API server: how often
//! status and lease are written, registration (providerID, taints),
//! graceful node shutdown, and the event and API client rate limits.

use k8s_openapi::api::core::v1::Taint;

use super::{configuration::KubeletConfiguration, non_negative};
use crate::config::{
    duration,
    error::ConfigError,
    tree::Node,
    validation,
    values::{Ctx, Object},
};

/// Reads the event and API client rate limits, the node status and lease
/// settings, registration and the shutdown grace periods.
pub(super) fn read(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = non_negative(o, "eventRecordQPS")? {
        c.event_record_qps = v;
    }
    if let Some(v) = non_negative(o, "eventBurst")?.filter(|v| *v != 0) {
        c.event_burst = v;
    }
    read_status(o, c)?;
    if let Some(v) = non_negative(o, "kubeAPIQPS")? {
        c.kube_api_qps = v;
    }
    if let Some(v) = non_negative(o, "kubeAPIBurst")?.filter(|v| *v != 0) {
        c.kube_api_burst = v;
    }
    c.provider_id = o.string("providerID")?.filter(|s| !s.is_empty());
    read_shutdown(cx, o, c)?;
    if let Some(n) = o.get("registerWithTaints") {
        c.register_with_taints = cx
            .list(n, "registerWithTaints")?
            .iter()
            .enumerate()
            .map(|(i, t)| read_taint(cx, t, &format!("registerWithTaints[{i}]")))
            .collect::<Result<_, _>>()?;
    }
    if let Some(v) = o.boolean("registerNode")? {
        c.register_node = v;
    }
    Ok(())
}

/// nodeStatusUpdateFrequency, nodeStatusReportFrequency,
/// nodeLeaseDurationSeconds and nodeStatusMaxImages.
fn read_status(o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    c.node_status_update_frequency = o.duration_or("nodeStatusUpdateFrequency", c.node_status_update_frequency)?;
    c.node_status_report_frequency = o.duration_or("nodeStatusReportFrequency", c.node_status_report_frequency)?;
    if let Some(v) = non_negative(o, "nodeLeaseDurationSeconds")?.filter(|v| *v != 0) {
        c.node_lease_duration_seconds = v;
    }
    if let Some(v) = o.int_in("nodeStatusMaxImages", -1, i32::MAX as i64)? {
        c.node_status_max_images = v as i32;
    }
    Ok(())
}

/// shutdownGracePeriod and shutdownGracePeriodCriticalPods, the second a
/// part of the first.
fn read_shutdown(cx: &Ctx, o: &mut Object, c: &mut KubeletConfiguration) -> Result<(), ConfigError> {
    if let Some(v) = o.duration("shutdownGracePeriod")? {
        c.shutdown_grace_period = v;
    }
    if let Some(n) = o.get("shutdownGracePeriodCriticalPods") {
        let v = cx.duration(n, "shutdownGracePeriodCriticalPods")?;
        if v > c.shutdown_grace_period {
            return Err(cx.err(
                n,
                "shutdownGracePeriodCriticalPods",
                format!(
                    "{} must not exceed shutdownGracePeriod ({})",
                    duration::format(v),
                    duration::format(c.shutdown_grace_period)
                ),
            ));
        }
        c.shutdown_grace_period_critical_pods = v;
    }
    Ok(())
}

/// One entry of registerWithTaints, checked as the API server checks a
/// node's taints.
fn read_taint(cx: &Ctx, node: &Node, field: &str) -> Result<Taint, ConfigError> {
    let mut o = Object::new(cx, node, field)?;
    let key = o.string("key")?.unwrap_or_default();
    let value = o.string("value")?.filter(|v| !v.is_empty());
    let effect = o.string("effect")?.unwrap_or_default();
    // timeAdded is set by the API server for NoExecute taints; accept it.
    o.get("timeAdded");
    o.finish()?;
    let spec = match &value {
        Some(v) => format!("{key}={v}:{effect}"),
        None => format!("{key}:{effect}"),
    };
    if let Err(why) = validation::qualified_name(&key) {
        return Err(cx.err(node, field, format!("taint {spec:?}: key {key:?} {why}")));
    }
    if let Some(v) = &value
        && let Err(why) = validation::label_value(v)
    {
        return Err(cx.err(node, field, format!("taint {spec:?}: value {v:?} {why}")));
    }
    if !["NoSchedule", "PreferNoSchedule", "NoExecute"].contains(&effect.as_str()) {
        let why = if effect.is_empty() { "needs an effect".to_owned() } else { format!("has effect {effect:?}") };
        return Err(cx.err(
            node,
            field,
            format!("taint {spec:?} {why}: expected NoSchedule, PreferNoSchedule or NoExecute"),
        ));
    }
    Ok(Taint { key, value, effect, time_added: None })
}
