//! perftest's latency report (`print_report_lat`), from one counter stamp per iteration.
//!
//! As perftest: the `n` stamps give `n - 1` periods (a round trip each: stamp, post, the
//! peer's answer, next stamp), halved for a ping-pong; sorted, the two longest are dropped
//! (`LAT_MEASURE_TAIL`); t_typical is their median, t_max the longest kept, and the
//! percentiles are `sorted[ceil(kept * p)]`. One difference: perftest truncates each deviation
//! to an integer before squaring it (its t_stdev is coarse); this prints the true standard
//! deviation of the kept periods.

use super::clock::TickRate;

/// perftest's header (`RESULT_FMT_LAT`).
pub const HEADER: &str = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";

/// perftest drops this many of the longest periods.
const TAIL: usize = 2;

/// The fewest iterations a report needs (periods left after the tail).
pub const MIN_ITERS: usize = TAIL + 2;

/// The figures of one run, in microseconds.
#[derive(Debug, Clone, Copy)]
pub struct Latency {
    pub min: f64,
    pub max: f64,
    pub typical: f64,
    pub avg: f64,
    pub stdev: f64,
    pub p99: f64,
    pub p999: f64,
}

/// Computes the figures from `stamps` (one per iteration, in counter ticks); each period
/// counts `1 / rtt_factor` (2 for a ping-pong, 1 for a READ). `periods` is scratch.
///
/// # Errors
/// With fewer than [`MIN_ITERS`] stamps.
pub fn compute(stamps: &[u64], rate: TickRate, rtt_factor: f64, periods: &mut Vec<u64>) -> Result<Latency, String> {
    if stamps.len() < MIN_ITERS {
        return Err(format!("{} iterations: a latency report needs at least {MIN_ITERS}", stamps.len()));
    }
    periods.clear();
    periods.extend(stamps.windows(2).map(|w| w[1].wrapping_sub(w[0])));
    periods.sort_unstable();
    let us = |t: u64| rate.us(t) / rtt_factor;
    let kept = periods.len() - TAIL;
    let typical = if (kept - 1) % 2 == 1 {
        // An even count: the mean of the middle two, as perftest's get_median (in ticks).
        us((periods[kept / 2] + periods[kept / 2 - 1]) / 2)
    } else {
        us(periods[kept / 2])
    };
    let avg = periods[..kept].iter().map(|&t| us(t)).sum::<f64>() / kept as f64;
    let var = periods[..kept].iter().map(|&t| (us(t) - avg).powi(2)).sum::<f64>() / kept as f64;
    let at = |p: f64| us(periods[((kept as f64 * p).ceil() as usize).min(periods.len() - 1)]);
    Ok(Latency {
        min: us(periods[0]),
        max: us(periods[kept]),
        typical,
        avg,
        stdev: var.sqrt(),
        p99: at(0.99),
        p999: at(0.999),
    })
}

/// Prints perftest's result line for `size` bytes and `iters` iterations, then `tag` if any.
pub fn print(size: usize, iters: usize, l: &Latency, tag: &str) {
    let tag = if tag.is_empty() { String::new() } else { format!("   {tag}") };
    println!(
        " {:<6} {:<10}       {:<10.2}     {:<10.2}   {:<10.2}         {:<10.2}     {:<10.2}      {:<10.2}             {:<10.2}{tag}",
        size, iters, l.min, l.max, l.typical, l.avg, l.stdev, l.p99, l.p999
    );
}
