//! Eviction thresholds: hard ones replace the defaults, the allocatable
//! twins follow enforcement, soft ones with grace periods and reclaim.

use super::*;

#[test]
fn hard_thresholds_replace_the_defaults() {
    let mem = |v: &str| hard(EvictionSignal::MemoryAvailable, ThresholdValue::Quantity(q(v)));
    let cfg = |body: &str| file(body);
    type Case = (&'static str, Vec<&'static str>, Vec<(&'static str, String)>, Vec<EvictionThreshold>);
    let cases: Vec<Case> = vec![
        (
            "file sets one",
            vec!["--config=/k.yaml"],
            vec![("/k.yaml", cfg("evictionHard:\n  memory.available: 1Gi\n"))],
            vec![mem("1Gi")],
        ),
        ("flag sets one", vec!["--eviction-hard=memory.available<2Gi"], vec![], vec![mem("2Gi")]),
        (
            "flag replaces the file's map",
            vec!["--config=/k.yaml", "--eviction-hard=memory.available<2Gi"],
            vec![("/k.yaml", cfg("evictionHard:\n  nodefs.available: 20%\n"))],
            vec![mem("2Gi")],
        ),
        ("an empty map means none", vec!["--config=/k.yaml"], vec![("/k.yaml", cfg("evictionHard: {}\n"))], vec![]),
        ("an empty flag means none", vec!["--eviction-hard="], vec![], vec![]),
        (
            "0% replaces the defaults and is itself ignored",
            vec!["--config=/k.yaml"],
            vec![("/k.yaml", cfg("evictionHard:\n  memory.available: 0%\n"))],
            vec![],
        ),
        ("null means the defaults", vec!["--config=/k.yaml"], vec![("/k.yaml", cfg("evictionHard: null\n"))], {
            let mut d = default_hard_thresholds();
            d.sort_by_key(|t| t.signal);
            d
        }),
        (
            "mergeDefaultEvictionSettings keeps the other defaults",
            vec!["--config=/k.yaml"],
            vec![(
                "/k.yaml",
                cfg(
                    "mergeDefaultEvictionSettings: true\nevictionHard:\n  memory.available: 1Gi\n  imagefs.available: 0%\n",
                ),
            )],
            vec![
                mem("1Gi"),
                hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
                hard(EvictionSignal::NodeFsInodesFree, ThresholdValue::Percentage(0.05)),
            ],
        ),
        (
            // The kubelet merges a drop-in into the main file's effective
            // map, which is the defaults when the main file has none.
            "a drop-in's evictionHard merges into the defaults",
            vec!["--config-dir=/d"],
            vec![("/d/10.conf", cfg("evictionHard:\n  memory.available: 1Gi\n  nodefs.inodesFree: null\n"))],
            vec![
                mem("1Gi"),
                hard(EvictionSignal::NodeFsAvailable, ThresholdValue::Percentage(0.10)),
                hard(EvictionSignal::ImageFsAvailable, ThresholdValue::Percentage(0.15)),
            ],
        ),
        (
            "a drop-in merges into the main file's map",
            vec!["--config=/k.yaml", "--config-dir=/d"],
            vec![
                ("/k.yaml", cfg("evictionHard:\n  memory.available: 1Gi\n")),
                ("/d/10.conf", cfg("evictionHard:\n  pid.available: 100\n")),
            ],
            vec![mem("1Gi"), hard(EvictionSignal::PidAvailable, ThresholdValue::Quantity(q("100")))],
        ),
    ];
    for (name, args, files, want) in cases {
        let files: Vec<(&str, &str)> = files.iter().map(|(p, t)| (*p, t.as_str())).collect();
        let c = ok(&args, &files);
        assert_eq!(c.kubelet.eviction_hard, want, "{name}");
    }
}

#[test]
fn allocatable_memory_twins_follow_enforcement() {
    let c = ok(&["--eviction-hard=memory.available<500Mi"], &[]);
    let signals: Vec<EvictionSignal> = c.kubelet.eviction_thresholds().iter().map(|t| t.signal).collect();
    assert_eq!(signals, vec![EvictionSignal::MemoryAvailable, EvictionSignal::AllocatableMemoryAvailable]);
    let c = ok(&["--eviction-hard=memory.available<500Mi", "--enforce-node-allocatable=none"], &[]);
    assert_eq!(c.kubelet.eviction_thresholds().len(), 1);
}

#[test]
fn soft_thresholds_with_grace_and_reclaim_from_a_file() {
    let cfg = file(
        "evictionSoft:\n  memory.available: 1.5Gi\n  nodefs.available: 15%\nevictionSoftGracePeriod:\n  memory.available: 1m30s\n  nodefs.available: 2m\nevictionMinimumReclaim:\n  nodefs.available: 5%\n  memory.available: 0\nevictionMaxPodGracePeriod: 60\n",
    );
    let c = ok(&["--config=/k.yaml"], &[("/k.yaml", &cfg)]);
    let soft = &c.kubelet.eviction_soft;
    assert_eq!(soft.len(), 2);
    assert_eq!(soft[0].signal, EvictionSignal::MemoryAvailable);
    assert_eq!(soft[0].value, ThresholdValue::Quantity(q("1.5Gi")));
    assert_eq!(soft[0].grace_period, Duration::from_secs(90));
    assert_eq!(soft[0].min_reclaim, Some(ThresholdValue::Quantity(q("0"))));
    assert_eq!(soft[1].grace_period, Duration::from_secs(120));
    assert_eq!(soft[1].min_reclaim, Some(ThresholdValue::Percentage(0.05)));
    let nodefs_hard = c.kubelet.eviction_hard.iter().find(|t| t.signal == EvictionSignal::NodeFsAvailable).unwrap();
    assert_eq!(nodefs_hard.min_reclaim, Some(ThresholdValue::Percentage(0.05)), "reclaims apply to hard ones too");
    assert_eq!(c.kubelet.eviction_max_pod_grace_period, 60);
}
