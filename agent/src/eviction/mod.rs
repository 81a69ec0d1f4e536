//! The eviction manager: signals, thresholds, node conditions, ranking and
//! the decision (pure: `core`, `ranking`, `observe`), and its driver at the
//! edge (`driver`: kernel lines, victim plan, fast-path kill, event loop).

pub mod core;
pub mod driver;
pub mod observe;
pub mod ranking;
pub mod reclaim;
pub mod signal;
