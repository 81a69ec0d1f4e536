//! The eviction manager: signals, thresholds, node conditions, ranking and
//! the decision (pure), and its driver at the edge.

pub mod signal;
