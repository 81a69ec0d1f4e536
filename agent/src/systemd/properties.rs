//! The unit properties of the pods' slices, as runc's systemd cgroup
//! manager (which the kubelet drives) sets them: pure, so the values can be
//! checked against the kubelet's without a systemd.

/// `USEC_INFINITY` in systemd: no quota.
pub const INFINITY: u64 = u64::MAX;

/// A unit property's value, in the D-Bus types systemd expects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Bool(bool),
    /// D-Bus `t`.
    U64(u64),
    Str(String),
    /// D-Bus `as`.
    StrList(Vec<String>),
}

/// One `(name, value)` of StartTransientUnit's or SetUnitProperties' `a(sv)`.
pub type Property = (&'static str, Value);

/// A slice's resource settings in systemd's terms.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceResources {
    /// `MemoryMax`; None leaves it unlimited.
    pub memory_max: Option<u64>,
    /// `CPUWeight` (1..10000), already converted from shares.
    pub cpu_weight: Option<u64>,
    /// CFS quota in µs per `cpu_period_us`; None: no quota.
    pub cpu_quota_us: Option<i64>,
    pub cpu_period_us: u64,
    /// `TasksMax`; None leaves it unlimited.
    pub tasks_max: Option<u64>,
}

/// `CPUQuotaPerSecUSec` for a CFS quota: systemd keeps the quota as a
/// percentage of one CPU, so a value that is not a whole percent is
/// rounded up to the next 10 ms per second (as runc does), and the exact
/// quota is then written to `cpu.max` directly.
pub fn cpu_quota_per_sec_usec(quota_us: Option<i64>, period_us: u64) -> u64 {
    match quota_us {
        Some(q) if q > 0 && period_us > 0 => {
            let per_sec = (q as u64).saturating_mul(1_000_000) / period_us;
            per_sec.div_ceil(10_000) * 10_000
        }
        _ => INFINITY,
    }
}

/// The resource properties of a slice (what SetUnitProperties changes):
/// only what is set, as runc sends only the kubelet's non-zero settings,
/// so updating a system slice leaves its other limits alone. A new slice
/// has no limit where none is given.
pub fn resource_properties(r: &SliceResources) -> Vec<Property> {
    let mut out: Vec<Property> = vec![];
    if let Some(m) = r.memory_max {
        out.push(("MemoryMax", Value::U64(m)));
    }
    if let Some(t) = r.tasks_max {
        out.push(("TasksMax", Value::U64(t)));
    }
    if let Some(w) = r.cpu_weight {
        out.push(("CPUWeight", Value::U64(w)));
    }
    if r.cpu_quota_us.is_some_and(|q| q > 0) {
        out.push(("CPUQuotaPeriodUSec", Value::U64(r.cpu_period_us)));
        out.push(("CPUQuotaPerSecUSec", Value::U64(cpu_quota_per_sec_usec(r.cpu_quota_us, r.cpu_period_us))));
    }
    out
}

/// Every property of a new transient slice: what it is, accounting on for
/// each controller the kubelet reads, no implicit dependencies (a slice of
/// pods must not be stopped with `shutdown.target` before the node
/// shutdown manager stops its pods), and its resources. Where it sits is
/// its name's: systemd makes a slice require and follow its parent slice
/// (runc adds a `Wants=` on it too, which keeps a stopped pod slice loaded
/// as long as its parent is; without it systemd unloads it once stopped).
/// No `Delegate=`: systemd refuses it on slices; the runtime's scopes
/// inside them are the delegated units.
pub fn slice_properties(description: &str, r: &SliceResources) -> Vec<Property> {
    let mut out: Vec<Property> = vec![
        ("Description", Value::Str(description.to_owned())),
        ("DefaultDependencies", Value::Bool(false)),
        ("MemoryAccounting", Value::Bool(true)),
        ("CPUAccounting", Value::Bool(true)),
        ("TasksAccounting", Value::Bool(true)),
        ("IOAccounting", Value::Bool(true)),
    ];
    out.extend(resource_properties(r));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_per_second_rounds_up_to_whole_percents() {
        let period = 100_000;
        for (quota, want) in [
            (None, INFINITY),
            (Some(0), INFINITY),
            (Some(-1), INFINITY),
            (Some(25_000), 250_000),
            (Some(1_000), 10_000),
            (Some(33_300), 340_000),
            (Some(200_000), 2_000_000),
        ] {
            assert_eq!(cpu_quota_per_sec_usec(quota, period), want, "{quota:?}");
        }
        assert_eq!(cpu_quota_per_sec_usec(Some(5_000), 50_000), 100_000);
    }

    #[test]
    fn a_pod_slice_carries_its_limits_and_accounting() {
        let r = SliceResources {
            memory_max: Some(256 << 20),
            cpu_weight: Some(10),
            cpu_quota_us: Some(25_000),
            cpu_period_us: 100_000,
            tasks_max: Some(1024),
        };
        let props = slice_properties("pod x", &r);
        let get = |name: &str| props.iter().find(|(n, _)| *n == name).map(|(_, v)| v.clone());
        assert_eq!(get("Wants"), None, "the parent comes from the name");
        assert_eq!(get("Delegate"), None, "systemd refuses Delegate on slices");
        assert_eq!(get("DefaultDependencies"), Some(Value::Bool(false)));
        assert_eq!(get("MemoryMax"), Some(Value::U64(256 << 20)));
        assert_eq!(get("CPUWeight"), Some(Value::U64(10)));
        assert_eq!(get("CPUQuotaPerSecUSec"), Some(Value::U64(250_000)));
        assert_eq!(get("CPUQuotaPeriodUSec"), Some(Value::U64(100_000)));
        assert_eq!(get("TasksMax"), Some(Value::U64(1024)));
        for accounting in ["MemoryAccounting", "CPUAccounting", "TasksAccounting", "IOAccounting"] {
            assert_eq!(get(accounting), Some(Value::Bool(true)), "{accounting}");
        }
    }

    #[test]
    fn only_what_is_set_is_sent() {
        assert!(resource_properties(&SliceResources::default()).is_empty());
        let shares_only = SliceResources { cpu_weight: Some(20), cpu_period_us: 100_000, ..Default::default() };
        assert_eq!(resource_properties(&shares_only), vec![("CPUWeight", Value::U64(20))]);
    }
}
