//! A cheap timestamp for the latency and bandwidth tools, as perftest's `get_cycles()`.
//!
//! [`ticks`] reads the x86_64 time-stamp counter (`rdtsc`, a few nanoseconds on hardware and
//! no system call under emulation), and on other architectures falls back to [`Instant`]
//! (nanoseconds since the first call). Ticks become time through a [`TickRate`] that a
//! [`Calibration`] measures against [`Instant`] over the measured run itself: one `Instant` at
//! its start, one at its end, so the timed loop reads no system clock at all. perftest instead
//! samples the frequency for a moment (`gettimeofday` regression) and trusts /proc/cpuinfo's
//! MHz when the two agree within 2%.
//!
//! Why it matters: in the Soft-RoCE VM (qemu TCG) the guest's clocksource is HPET, so every
//! `Instant::now()` is a system call of about 1 us, a tenth of a round trip. Under TCG `rdtsc`
//! returns the host's counter (constant rate), so calibrating against the guest's clock works.
//!
//! Spin loops must still give up some day: [`SpinTimeout`] counts spins and reads the clock
//! only every [`CHECK_EVERY`] of them.

use std::time::{Duration, Instant};

/// The raw counter: TSC cycles on x86_64, nanoseconds since the first call elsewhere.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: `rdtsc` reads a counter and has no other effect; every x86_64 CPU has it (it
        // is in the x86_64 baseline), and the intrinsic takes no pointers or arguments.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        BASE.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// An empty vector for `n` stamps whose memory is already touched, so pushing them in a timed
/// loop never takes a page fault (tens of microseconds each under emulation: a fresh
/// allocation's pages are mapped on first write).
pub fn stamp_buffer(n: usize) -> Vec<u64> {
    let mut v = Vec::with_capacity(n);
    v.resize(n, 1);
    v.clear();
    v
}

/// What the counter is, for reports.
pub const SOURCE: &str = if cfg!(target_arch = "x86_64") { "rdtsc" } else { "Instant" };

/// Ticks per microsecond (the counter's frequency in MHz).
#[derive(Debug, Clone, Copy)]
pub struct TickRate(f64);

impl TickRate {
    /// Microseconds in `ticks` ticks.
    #[inline]
    pub fn us(self, ticks: u64) -> f64 {
        ticks as f64 / self.0
    }

    /// Seconds in `ticks` ticks.
    #[inline]
    pub fn secs(self, ticks: u64) -> f64 {
        self.us(ticks) / 1e6
    }

    /// Ticks per microsecond: the counter's frequency in MHz.
    pub fn mhz(self) -> f64 {
        self.0
    }
}

/// The shortest span a calibration measures (it waits out the rest): the error of each end is
/// about one clock read (1 us under emulation), 1e-4 of this.
pub const MIN_SPAN: Duration = Duration::from_millis(20);

/// A calibration in progress: the counter and the system clock read together at its start.
#[derive(Debug, Clone, Copy)]
pub struct Calibration {
    instant: Instant,
    ticks: u64,
}

impl Calibration {
    /// Reads both clocks (the counter on both sides of the `Instant`, which it then stands for).
    pub fn start() -> Self {
        let (instant, ticks) = pair();
        Calibration { instant, ticks }
    }

    /// Reads both clocks again, after at least [`MIN_SPAN`] (sleeping out the rest), and
    /// returns the counter's rate over the span.
    ///
    /// # Errors
    /// When the counter did not advance (an unusable TSC).
    pub fn finish(&self) -> Result<TickRate, String> {
        let left = MIN_SPAN.saturating_sub(self.instant.elapsed());
        if !left.is_zero() {
            std::thread::sleep(left);
        }
        let (instant, ticks) = pair();
        let us = (instant - self.instant).as_secs_f64() * 1e6;
        let dt = ticks.wrapping_sub(self.ticks);
        if dt == 0 || dt > i64::MAX as u64 || us <= 0.0 {
            return Err(format!("the {SOURCE} counter did not advance ({dt} ticks in {us:.0} us)"));
        }
        Ok(TickRate(dt as f64 / us))
    }
}

/// An `Instant` and the counter at the same moment: the mean of the counter read before and
/// after it.
fn pair() -> (Instant, u64) {
    let a = ticks();
    let now = Instant::now();
    let b = ticks();
    (now, a + b.wrapping_sub(a) / 2)
}

/// How many spins pass between two reads of the clock in a [`SpinTimeout`].
pub const CHECK_EVERY: u32 = 4096;

/// A timeout for a spin loop that reads the clock only every [`CHECK_EVERY`] spins: creating
/// one reads nothing, the deadline is set at the first check, so a wait gives up after at
/// most `limit` plus [`CHECK_EVERY`] spins. A wait shorter than that reads no clock at all.
#[derive(Debug, Clone, Copy)]
pub struct SpinTimeout {
    limit: Duration,
    deadline: Option<Instant>,
    spins: u32,
}

impl SpinTimeout {
    /// A timeout of `limit`, counted from the first check.
    #[inline]
    pub fn new(limit: Duration) -> Self {
        SpinTimeout { limit, deadline: None, spins: 0 }
    }

    /// Counts one spin; `true` once the deadline has passed.
    #[inline]
    pub fn expired(&mut self) -> bool {
        self.spins += 1;
        if self.spins < CHECK_EVERY {
            return false;
        }
        self.spins = 0;
        let now = Instant::now();
        match self.deadline {
            None => {
                self.deadline = Some(now + self.limit);
                false
            }
            Some(d) => now >= d,
        }
    }

    /// The limit, for messages.
    pub fn limit(&self) -> Duration {
        self.limit
    }
}

/// The kernel's current clocksource (`tsc`, `hpet`, ...), or `?` if it cannot be read.
pub fn clocksource() -> String {
    std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}
