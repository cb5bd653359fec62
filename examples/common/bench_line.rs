//! The result line of the stream and gRPC load generators, which `scripts/guest/compare` reads:
//! `bench: messages=N seconds=S rate=R p50_us=P p99_us=Q`, from one latency (ns) per message.

use std::time::Duration;

/// Prints the result line for the latencies `lat` (ns) measured over `elapsed`.
pub fn print(mut lat: Vec<u64>, elapsed: Duration) {
    lat.sort_unstable();
    let q = |p: f64| {
        let i = ((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1));
        lat.get(i).copied().unwrap_or(0) as f64 / 1e3
    };
    println!(
        "bench: messages={} seconds={:.3} rate={:.1} p50_us={:.2} p99_us={:.2}",
        lat.len(),
        elapsed.as_secs_f64(),
        lat.len() as f64 / elapsed.as_secs_f64(),
        q(0.5),
        q(0.99)
    );
}
