//! client-go's `flowcontrol` as the kubelet uses it: token buckets with a
//! qps and a burst (kubeAPIQPS, registryPullQPS, event spam filter, token
//! reviews) over `governor`, and the per-key exponential [`Backoff`]
//! (image pulls, CrashLoopBackOff); and [`Periodic`], the periodic
//! managers' loop (apimachinery's `wait.Until`).

pub mod backoff;
pub mod periodic;
pub mod ratelimit;

pub use backoff::{Backoff, BackoffPolicy};
pub use periodic::Periodic;
pub use ratelimit::{KeyedBucket, TokenBucket};
