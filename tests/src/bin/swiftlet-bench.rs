//! Benchmark runner (placeholder until the harness lands).
fn main() {}
