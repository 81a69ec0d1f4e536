//! client-go's `flowcontrol` as the kubelet uses it: token buckets with a
//! qps and a burst (kubeAPIQPS, registryPullQPS, event spam filter, token
//! reviews) over `governor`, and the per-key exponential [`Backoff`]
//! (image pulls, CrashLoopBackOff).

pub mod backoff;
pub mod ratelimit;

pub use backoff::{Backoff, BackoffPolicy};
pub use ratelimit::{KeyedBucket, TokenBucket};
