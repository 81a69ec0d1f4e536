//! cAdvisor's pressure series on /metrics/cadvisor (KEP-4205):
//! `container_pressure_{cpu,memory,io}_{waiting,stalled}_seconds_total`,
//! waiting from the `some` line and stalled from `full`, the kernel's
//! microseconds as seconds, on every row whose cgroup has pressure files
//! (with cAdvisor's help texts and the kubelet's labels). Rows without
//! PSI (cgroup v1, a kernel without it) have no series, and the families
//! are left out when no row has any.

use std::fmt;

use prometheus_client::{encoding::DescriptorEncoder, metrics::MetricType};

use super::cadvisor::{Row, per_row};
use crate::psi::Resource;

fn seconds(us: u64) -> f64 {
    us as f64 / 1e6
}

/// The help text cAdvisor gives each family.
fn help(resource: Resource, stalled: bool) -> String {
    let what = match resource {
        Resource::Cpu => "CPU",
        Resource::Memory => "memory",
        Resource::Io => "IO",
    };
    if stalled {
        format!("Total time duration no tasks in the container could make progress due to {what} congestion.")
    } else {
        format!("Total time duration tasks in the container have waited due to {what} congestion.")
    }
}

/// Writes the six families (nothing when no row has PSI).
pub(super) fn encode(e: &mut DescriptorEncoder, rows: &[Row]) -> fmt::Result {
    if rows.iter().all(|r| r.cgroup.psi.is_empty()) {
        return Ok(());
    }
    for resource in Resource::ALL {
        for stalled in [true, false] {
            let name = format!(
                "container_pressure_{}_{}_seconds_total",
                resource.name(),
                if stalled { "stalled" } else { "waiting" }
            );
            per_row(e, rows, &name, &help(resource, stalled), MetricType::Counter, |r| {
                let p = r.cgroup.psi.get(resource)?;
                // No full line (the node's CPU before 5.13): nothing
                // stalled everyone, as cAdvisor's zero says.
                Some(seconds(if stalled { p.full.map_or(0, |f| f.total_us) } else { p.some.total_us }))
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use k8s_openapi::jiff::Timestamp;

    use crate::{
        psi::{Pressure, PsiLine, PsiSample},
        server::{
            cadvisor::CadvisorCollector,
            cgroup_sample::CgroupSample,
            collectors::registry_with,
            exposition,
            stats::{ContainerSample, NodeSample, PodSample, StatsSnapshot},
        },
    };

    fn snapshot(root: PsiSample, container: PsiSample) -> StatsSnapshot {
        let cg = |path: &str, psi| CgroupSample { path: path.into(), working_set: Some(1), psi, ..Default::default() };
        let at = Timestamp::from_second(1_700_000_000).unwrap();
        StatsSnapshot {
            time: at,
            node_name: "n1".into(),
            node: NodeSample {
                start_time: at,
                root: cg("", root),
                memory_capacity: 1,
                fs: None,
                imagefs: None,
                containerfs: None,
                maxpid: None,
                curproc: None,
                interfaces: vec![],
                system: vec![],
                qos: vec![],
                machine: Arc::default(),
            },
            pods: vec![PodSample {
                namespace: "default".into(),
                name: "web".into(),
                uid: "u1".into(),
                start_time: at,
                // The pod's own cgroup without PSI: no series for it.
                cgroup: Some(cg("kubepods/podu1", PsiSample::default())),
                sandbox: None,
                containers: vec![ContainerSample {
                    name: "app".into(),
                    id: "c1".into(),
                    image: "nginx:1".into(),
                    start_time: at,
                    cgroup: cg("kubepods/podu1/c1", container),
                    rootfs: None,
                    logs: None,
                }],
                ephemeral: None,
            }],
            errors: vec![],
        }
    }

    fn text(s: StatsSnapshot) -> String {
        exposition::encode(&[&registry_with(CadvisorCollector(Arc::new(s)))])
    }

    #[test]
    fn pressure_series_in_seconds_with_cadvisors_help() {
        let line = |total_us| PsiLine { avg10: 1.0, avg60: 0.0, avg300: 0.0, total_us };
        let memory = Pressure { some: line(2_500_000), full: Some(line(500_000)) };
        let root = PsiSample { cpu: Some(Pressure { some: line(1_000_000), full: None }), ..Default::default() };
        let t = text(snapshot(root, PsiSample { memory: Some(memory), ..Default::default() }));
        let c = r#"container="app",id="/kubepods/podu1/c1",image="nginx:1",name="c1",namespace="default",pod="web""#;
        for want in [
            format!("container_pressure_memory_waiting_seconds_total{{{c}}} 2.5"),
            format!("container_pressure_memory_stalled_seconds_total{{{c}}} 0.5"),
            r#"container_pressure_cpu_waiting_seconds_total{container="",id="/",image="",name="",namespace="",pod=""} 1"#
                .to_owned(),
            // No full line: nothing stalled everyone.
            r#"container_pressure_cpu_stalled_seconds_total{container="",id="/",image="",name="",namespace="",pod=""} 0"#
                .to_owned(),
            "# HELP container_pressure_io_stalled_seconds_total Total time duration no tasks in the container could make progress due to IO congestion".to_owned(),
            "# HELP container_pressure_memory_waiting_seconds_total Total time duration tasks in the container have waited due to memory congestion".to_owned(),
            "# TYPE container_pressure_cpu_waiting_seconds_total counter".to_owned(),
        ] {
            assert!(t.lines().any(|l| l == want), "{want} missing:\n{t}");
        }
        // Only rows with pressure files have series.
        assert!(!t.lines().any(|l| l.starts_with("container_pressure_") && l.contains(r#"id="/kubepods/podu1""#)));
        assert!(!t.lines().any(|l| l.starts_with("container_pressure_io_waiting_seconds_total{")), "no io read");
    }

    #[test]
    fn no_pressure_no_families() {
        let t = text(snapshot(PsiSample::default(), PsiSample::default()));
        assert!(!t.contains("container_pressure_"), "{t}");
        assert!(t.contains("container_memory_working_set_bytes"));
    }
}
