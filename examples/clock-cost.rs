//! What reading the time costs here: `Instant::now()`, the CPU's counter, and the stamping the
//! latency tools (`write_lat`, `send_lat`, `read_bw`) do, each averaged over many calls, with
//! the kernel's clocksource.
//!
//! ```text
//! clock-cost              # 1,000,000 calls of each
//! clock-cost -n 100000
//! scripts/softroce run -- target/release/examples/clock-cost    # inside the VM
//! ```
//! Under qemu TCG the guest's kernel would pick HPET, where `Instant::now()` is a system call
//! (measured 2.8 us; `SOFTROCE_APPEND="clocksource=hpet"` brings it back), so the Soft-RoCE VM
//! boots on the TSC (192 ns); the tools stamp with the counter anyway (`common/clock.rs`). Also prints the counter's rate as calibrated
//! against `Instant` and the MHz /proc/cpuinfo claims (perftest's two sources).

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::clock::{self, Calibration, SpinTimeout};

fn main() {
    let mut n: u32 = 1_000_000;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match (a.as_str(), it.next().and_then(|v| v.parse().ok())) {
            ("-n", Some(v)) if v > 0 => n = v,
            _ => {
                eprintln!("usage: clock-cost [-n CALLS]");
                std::process::exit(2)
            }
        }
    }
    println!("clocksource: {} (available: {})", clock::clocksource(), available());
    println!("counter: {}", clock::SOURCE);
    let calibration = Calibration::start();

    let instant = per_call(n, || {
        black_box(Instant::now());
    });
    let ticks = per_call(n, || {
        black_box(clock::ticks());
    });
    // What the latency tools do once per iteration: push a counter value into a Vec reserved
    // (and touched) beforehand.
    let mut stamps = clock::stamp_buffer(n as usize);
    let stamp = per_call(n, || stamps.push(clock::ticks()));
    black_box(&stamps);
    // What their waits do once per spin.
    let mut timeout = SpinTimeout::new(Duration::from_secs(3600));
    let spin = per_call(n, || {
        black_box(timeout.expired());
    });

    println!("{:<44} {:>10}", "per call, averaged over", n);
    println!("{:<44} {:>10.1} ns", "Instant::now()", instant);
    println!("{:<44} {:>10.1} ns", format!("counter read ({})", clock::SOURCE), ticks);
    println!("{:<44} {:>10.1} ns", "latency tools' stamp (push of a counter read)", stamp);
    println!("{:<44} {:>10.1} ns", format!("SpinTimeout::expired (clock every {})", clock::CHECK_EVERY), spin);
    match calibration.finish() {
        Ok(rate) => println!("counter rate: {:.2} MHz (calibrated against Instant over the run)", rate.mhz()),
        Err(e) => println!("counter rate: {e}"),
    }
    println!("/proc/cpuinfo: {}", cpuinfo_mhz());
}

/// Nanoseconds per call of `f`, over `n` calls (one `Instant` at each end).
fn per_call(n: u32, mut f: impl FnMut()) -> f64 {
    let t0 = Instant::now();
    for _ in 0..n {
        f();
    }
    t0.elapsed().as_secs_f64() * 1e9 / f64::from(n)
}

fn available() -> String {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/available_clocksource")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

fn cpuinfo_mhz() -> String {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    match info.lines().find(|l| l.starts_with("cpu MHz")) {
        Some(l) => format!("{} MHz", l.split(':').nth(1).unwrap_or("?").trim()),
        None => "no cpu MHz line".into(),
    }
}
