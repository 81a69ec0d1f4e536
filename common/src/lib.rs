//! Types shared by swiftlet's kernel programs (`swiftlet-ebpf`) and its agent.
//!
//! Everything here is `#[repr(C)]` plain data with no logic: it is the layout
//! of BPF map values, ring-buffer records and load-time constants. The kernel
//! side and the agent must agree on it byte for byte, so each type has a size
//! assertion at the bottom of this file.
//!
//! # Cgroup slots
//! The agent registers each cgroup it cares about (the node, `kubepods`, the
//! QoS cgroups, every pod and container) into a slot of the mmap-able
//! [`CgroupSlot`] array. The kernel keeps the slot's counters current; the
//! agent reads them through the mapping with no syscall per pod, and writes
//! thresholds into the same slot. Slot [`NODE_SLOT`] is the node as a whole.
//!
//! # Modules
//! One per concern, all re-exported here: the slot array and the counting
//! programs' per-CPU state (`slots`), the shared control block (`control`),
//! victim plans and what the kernel did with them (`plan`), the ring
//! buffer's records (`event`), and the kernel's layout (`layout`).

#![no_std]

#[cfg(feature = "build")]
extern crate std;

#[cfg(feature = "build")]
pub mod build;

mod control;
mod event;
mod layout;
mod plan;
mod slots;

pub use control::*;
pub use event::*;
pub use layout::*;
pub use plan::*;
pub use slots::*;

// Layout checks: the kernel side and the agent compile these types separately.
const _: () = assert!(core::mem::size_of::<CgroupSlot>() == 128);
const _: () = assert!(core::mem::offset_of!(ProcCpu, slots) == 36);
const _: () = assert!(core::mem::size_of::<Resolution>() == 208);
const _: () = assert!(core::mem::size_of::<Control>() == 112);
const _: () = assert!(core::mem::size_of::<VictimPlan>() == 64);
const _: () = assert!(core::mem::size_of::<Event>() == 64);
const _: () = assert!(core::mem::size_of::<KernelLayout>() == 124);

#[cfg(feature = "user")]
mod user {
    use super::*;
    // Each of these is repr(C) plain integers (arrays of them, or of each
    // other), so any bit pattern is a valid value and copying bytes is a
    // copy of the value.
    // SAFETY: `CgroupSlot` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for CgroupSlot {}
    // SAFETY: `Resolution` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Resolution {}
    // SAFETY: `Control` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Control {}
    // SAFETY: `VictimPlan` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for VictimPlan {}
    // SAFETY: `Event` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Event {}
    // SAFETY: `KernelLayout` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for KernelLayout {}
    // SAFETY: `Threshold` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for Threshold {}
    // SAFETY: `ProcCpu` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for ProcCpu {}
    // SAFETY: `NodePending` is repr(C) plain integers: any bit pattern is a value.
    unsafe impl aya::Pod for NodePending {}
}
