//! The victim plans the kernel executes at a crossing, as the agent writes
//! them: one plan slot per kernel line, each written as a seqlock (see
//! `swiftlet_common::VictimPlan`) through the mapped `PLANS` array, so the
//! kernel never acts on half of one plan and half of another, and never
//! has its record of the last executed generation overwritten.

use std::{
    collections::HashMap,
    sync::atomic::{AtomicU64, Ordering},
};

use parking_lot::Mutex;
use swiftlet_common::{MAX_PLANS, VictimPlan};

use super::{Signal, Target};

/// Where the plans live: the mapped BPF array, or plain memory in tests.
pub(super) trait PlanMemory: Send + Sync {
    fn plan(&self, index: u32) -> *mut VictimPlan;
}

impl PlanMemory for super::mapped::MappedArray<VictimPlan> {
    fn plan(&self, index: u32) -> *mut VictimPlan {
        self.at(index)
    }
}

/// What the agent wants the kernel to do at a line's crossing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Wanted {
    pub trigger_slot: u32,
    pub signal: Signal,
    pub victim_slot: u32,
    pub victim_cgroup_id: u64,
    /// The victim's largest process (0: none known); a change keeps the
    /// plan's generation, as it names the same victim.
    pub victim_tgid: u32,
    pub planned_ns: u64,
    pub max_age_ns: u64,
}

#[derive(Default)]
struct Lines {
    /// Plan slot and what was last written there, by line.
    by_line: HashMap<(Target, Signal), (u32, Option<Wanted>, u64)>,
    /// The last generation handed out (generations are unique across plan
    /// slots and never reused).
    generation: u64,
}

pub(super) struct PlanTable<M> {
    memory: M,
    lines: Mutex<Lines>,
}

impl<M: PlanMemory> PlanTable<M> {
    pub(super) fn new(memory: M) -> PlanTable<M> {
        PlanTable { memory, lines: Mutex::new(Lines::default()) }
    }

    /// Sets or withdraws (None) the plan of `line`. The same victim again
    /// keeps its generation (the kernel executes a generation once) and
    /// only moves `planned_ns`, unless the kernel executed it meanwhile;
    /// any other change is a new generation.
    pub(super) fn set(&self, line: (Target, Signal), wanted: Option<Wanted>) -> Result<(), &'static str> {
        let mut lines = self.lines.lock();
        let index = match lines.by_line.get(&line) {
            Some(&(index, _, _)) => index,
            None => (0..MAX_PLANS)
                .find(|i| !lines.by_line.values().any(|(used, _, _)| used == i))
                .ok_or("more kernel lines than plan slots")?,
        };
        let (before, generation) =
            lines.by_line.get(&line).map_or((None, 0), |&(_, written, generation)| (written, generation));
        let executed = self.executed(index);
        let same_victim = |a: &Wanted, b: &Wanted| {
            (a.trigger_slot, a.signal, a.victim_slot, a.victim_cgroup_id)
                == (b.trigger_slot, b.signal, b.victim_slot, b.victim_cgroup_id)
        };
        let generation = match (&before, &wanted) {
            (Some(b), Some(w)) if same_victim(b, w) && generation != 0 && executed != generation => {
                if b == w {
                    return Ok(());
                }
                generation
            }
            (None, None) => return Ok(()),
            (_, None) => 0,
            (_, Some(_)) => {
                lines.generation += 1;
                lines.generation
            }
        };
        self.write(index, generation, wanted.as_ref());
        lines.by_line.insert(line, (index, wanted, generation));
        Ok(())
    }

    /// Withdraws the plans of lines on `cgroup` (going away) and frees
    /// their plan slots.
    pub(super) fn drop_lines_of(&self, cgroup: &str) {
        let mut lines = self.lines.lock();
        let gone: Vec<(Target, Signal)> =
            lines.by_line.keys().filter(|(t, _)| matches!(t, Target::Cgroup(c) if c == cgroup)).cloned().collect();
        for key in gone {
            if let Some((index, _, _)) = lines.by_line.remove(&key) {
                self.write(index, 0, None);
            }
        }
    }

    /// The generation the kernel last executed in plan slot `index`.
    fn executed(&self, index: u32) -> u64 {
        // SAFETY: a plain read of a field the kernel writes atomically.
        unsafe { std::ptr::read_volatile(&raw const (*self.memory.plan(index)).executed_generation) }
    }

    /// One seqlock write: `seq` odd, the fields, `seq` even. The atomic
    /// read-modify-writes are full barriers, so no field store moves out of
    /// the odd window; `executed_generation` is the kernel's and left alone.
    fn write(&self, index: u32, generation: u64, wanted: Option<&Wanted>) {
        let plan = self.memory.plan(index);
        // SAFETY: `plan` points at a plan slot of the table, which only this
        // writer (under the lines lock) and the kernel touch; `seq` is an
        // aligned u64 changed only here.
        unsafe {
            let seq = AtomicU64::from_ptr(&raw mut (*plan).seq);
            seq.fetch_add(1, Ordering::SeqCst);
            let w = wanted.copied().unwrap_or(Wanted {
                trigger_slot: 0,
                signal: Signal::MemoryWorkingSet,
                victim_slot: 0,
                victim_cgroup_id: 0,
                victim_tgid: 0,
                planned_ns: 0,
                max_age_ns: 0,
            });
            std::ptr::write_volatile(&raw mut (*plan).generation, generation);
            std::ptr::write_volatile(&raw mut (*plan).trigger_slot, w.trigger_slot);
            std::ptr::write_volatile(&raw mut (*plan).signal, w.signal as u32);
            std::ptr::write_volatile(&raw mut (*plan).victim_slot, w.victim_slot);
            std::ptr::write_volatile(&raw mut (*plan).victim_cgroup_id, w.victim_cgroup_id);
            std::ptr::write_volatile(&raw mut (*plan).victim_tgid, w.victim_tgid);
            std::ptr::write_volatile(&raw mut (*plan).planned_ns, w.planned_ns);
            std::ptr::write_volatile(&raw mut (*plan).max_age_ns, w.max_age_ns);
            seq.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, atomic::AtomicBool};

    use super::*;

    struct Heap(Box<[std::cell::UnsafeCell<VictimPlan>]>);

    // SAFETY: tests share the plans between a writer and a reader thread
    // through raw pointers only, as the agent and the kernel do.
    unsafe impl Send for Heap {}
    // SAFETY: as for Send: shared only through raw pointers.
    unsafe impl Sync for Heap {}

    impl PlanMemory for Heap {
        fn plan(&self, index: u32) -> *mut VictimPlan {
            self.0[index as usize].get()
        }
    }

    impl PlanMemory for Arc<Heap> {
        fn plan(&self, index: u32) -> *mut VictimPlan {
            self.as_ref().plan(index)
        }
    }

    fn heap() -> Arc<Heap> {
        Arc::new(Heap((0..MAX_PLANS).map(|_| std::cell::UnsafeCell::new(VictimPlan::default())).collect()))
    }

    fn wanted(victim_slot: u32, planned_ns: u64) -> Wanted {
        Wanted {
            trigger_slot: 0,
            signal: Signal::MemoryWorkingSet,
            victim_slot,
            victim_cgroup_id: 1000 + u64::from(victim_slot),
            victim_tgid: 2000 + victim_slot,
            planned_ns,
            max_age_ns: 0,
        }
    }

    /// The kernel's reader, as `swiftlet_execute_plan` reads a plan.
    fn read(plan: *const VictimPlan) -> Option<VictimPlan> {
        // SAFETY: a plan of the test's table.
        unsafe {
            let seq = std::ptr::read_volatile(&raw const (*plan).seq);
            let p = std::ptr::read_volatile(plan);
            (seq & 1 == 0 && std::ptr::read_volatile(&raw const (*plan).seq) == seq).then_some(p)
        }
    }

    #[test]
    fn generations_follow_the_victim_and_the_kernels_execution() {
        let mem = heap();
        let t = PlanTable::new(mem.clone());
        let line = (Target::Node, Signal::MemoryWorkingSet);
        let plan = |i| read(mem.plan(i)).unwrap();
        t.set(line.clone(), Some(wanted(5, 10))).unwrap();
        assert_eq!((plan(0).generation, plan(0).victim_slot, plan(0).planned_ns), (1, 5, 10));
        // Ranked again, same victim: same generation, a newer ranking time.
        t.set(line.clone(), Some(wanted(5, 20))).unwrap();
        assert_eq!((plan(0).generation, plan(0).planned_ns), (1, 20));
        // Its largest process changed: still the same victim and generation.
        t.set(line.clone(), Some(Wanted { victim_tgid: 42, ..wanted(5, 25) })).unwrap();
        assert_eq!((plan(0).generation, plan(0).victim_tgid, plan(0).victim_slot), (1, 42, 5));
        // Another victim: a new generation.
        t.set(line.clone(), Some(wanted(6, 30))).unwrap();
        assert_eq!((plan(0).generation, plan(0).victim_slot), (2, 6));
        // The kernel executed it: the same victim again is a new plan.
        // SAFETY: the test's table.
        unsafe { (*mem.plan(0)).executed_generation = 2 };
        t.set(line.clone(), Some(wanted(6, 30))).unwrap();
        assert_eq!(plan(0).generation, 3);
        assert_eq!(plan(0).executed_generation, 2, "the kernel's field is never written by the agent");
        // A second line takes the next slot; withdrawing frees nothing else.
        let pods = (Target::Cgroup("kubepods".into()), Signal::MemoryWorkingSet);
        t.set(pods.clone(), Some(wanted(7, 40))).unwrap();
        assert_eq!((plan(1).generation, plan(1).victim_slot), (4, 7));
        t.set(line, None).unwrap();
        assert_eq!(plan(0).generation, 0, "withdrawn");
        t.drop_lines_of("kubepods");
        assert_eq!(plan(1).generation, 0);
        assert_eq!(plan(0).seq % 2, 0);
    }

    /// A reader following the kernel's protocol never sees a plan made of
    /// two writes: the victim's slot and cgroup id always belong together.
    #[test]
    fn a_plan_is_never_read_half_written() {
        let mem = heap();
        let t = Arc::new(PlanTable::new(mem.clone()));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (t, stop) = (t.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    t.set((Target::Node, Signal::MemoryWorkingSet), Some(wanted((i % 2) as u32 + 5, i))).unwrap();
                }
            })
        };
        let (mut whole, mut refused) = (0u64, 0u64);
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(300);
        while std::time::Instant::now() < deadline {
            match read(mem.plan(0)) {
                Some(p) if p.generation != 0 => {
                    assert_eq!(p.victim_cgroup_id, 1000 + u64::from(p.victim_slot), "a torn plan: {p:?}");
                    assert_eq!(p.victim_tgid, 2000 + p.victim_slot, "a torn plan: {p:?}");
                    whole += 1;
                }
                Some(_) => {}
                None => refused += 1,
            }
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
        assert!(whole > 0, "the reader saw no whole plan ({refused} refused)");
    }
}
