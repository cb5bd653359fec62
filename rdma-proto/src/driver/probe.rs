//! When a session sends a tail-loss probe ([`SendQueue::probe`](rdma_verbs::SendQueue::probe)):
//! [`Prober`].
//!
//! The rule: a connection with requests in flight that has seen no progress for twice the
//! longest recent gap between two progressing rounds (plus [`PROBE_MIN`]; a slowly decaying
//! maximum, [`Prober::progressed`]) posts a zero-length
//! WRITE on it. The peer acknowledges it, and with it everything before it, or answers the
//! sequence NAK of a lost packet, which the QP then sends again at once. Each probe without
//! progress since doubles the wait, up to [`PROBE_MAX`].
//!
//! Why: without a probe, a lost last packet of a burst (a chunk's last packet, a CREDIT, a
//! message of the handshake, the FIN) or its lost ACK is recovered only when the QP's local ACK
//! timeout fires; with one, at the pace of the transfer. The receiver's verdict is not probed:
//! its session ends as it is sent, and a lost one waits for the timeout. A probe cannot
//! recover everything: rxe's responder answers one sequence NAK per gap and drops what comes
//! after it until the gap is filled, so a lost NAK, or a lost packet of the go-back-N that
//! followed it, still waits for the timeout ([`SEND_ACK_TIMEOUT`](super::link::SEND_ACK_TIMEOUT),
//! [`RECEIVE_ACK_TIMEOUT`](super::link::RECEIVE_ACK_TIMEOUT); docs/protocol.md, "Recovery
//! under loss").

use std::time::{Duration, Instant};

/// The least a connection waits before it probes, beyond twice the recent gap: more than a
/// round trip of a small message under TCG (about 0.1 ms), and than the scheduling noise of a
/// busy guest.
pub(crate) const PROBE_MIN: Duration = Duration::from_millis(10);

/// The most a connection waits between two probes when nothing answers: the QP's own timeout
/// takes over after that many (a peer that is gone is seen by its CM events or the session's
/// timeout, not by probes).
pub(crate) const PROBE_MAX: Duration = Duration::from_secs(1);

/// The longest gap between two progressing rounds that counts toward the pace: a longer one
/// is a pause (a file's fsync, an admission wait, the peer thinking), not the flow, and must
/// not hold the probe off for the next hundred chunks.
pub(crate) const PACE_MAX: Duration = Duration::from_millis(200);

/// A session's probe clock: when it last saw progress, how long its progress usually takes,
/// and how many probes it sent since.
#[derive(Debug)]
pub(crate) struct Prober {
    /// The last progress, or the last probe.
    since: Instant,
    /// The longest recent gap between two progressing rounds, decaying by 1/64 each progress:
    /// a session's progress comes in bursts (a completion, then a message), and the probe
    /// must wait out the pauses between them, not the bursts' gaps.
    gap: Duration,
    /// Probes sent since the last progress.
    sent: u32,
}

impl Prober {
    /// A clock that starts at `now`, with no gap seen yet.
    pub(crate) fn new(now: Instant) -> Self {
        Prober { since: now, gap: Duration::ZERO, sent: 0 }
    }

    /// A round made progress at `now`. The gap since the last one counts toward the pace,
    /// unless a probe ended it (a loss is not the pace).
    pub(crate) fn progressed(&mut self, now: Instant) {
        if self.sent == 0 {
            // A pause that is no flow (a file's fsync, an admission wait) counts as PACE_MAX.
            let gap = now.saturating_duration_since(self.since).min(PACE_MAX);
            self.gap = gap.max(self.gap - self.gap / 64);
        }
        self.since = now;
        self.sent = 0;
    }

    /// How long the connection waits, from the last progress or probe, before it probes.
    pub(crate) fn wait(&self) -> Duration {
        let first = (self.gap * 2 + PROBE_MIN).min(PROBE_MAX);
        first.saturating_mul(1 << self.sent.min(16)).min(PROBE_MAX)
    }

    /// When the connection probes if nothing comes.
    pub(crate) fn deadline(&self) -> Instant {
        self.since + self.wait()
    }

    /// Whether a probe is due at `now`; if so, it counts as sent (the next waits twice as long).
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        if now < self.deadline() {
            return false;
        }
        self.since = now;
        self.sent += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_first_probe_waits_twice_the_pace_and_each_unanswered_one_twice_as_long_again() {
        let t0 = Instant::now();
        let mut p = Prober::new(t0);
        // Progress every 20 ms: the pace.
        for i in 1..=5 {
            p.progressed(t0 + 20 * MS * i);
        }
        let last = t0 + 100 * MS;
        assert_eq!(p.wait(), 50 * MS, "2 x 20 ms + 10 ms");
        assert!(!p.due(last + 49 * MS));
        assert!(p.due(last + 50 * MS));
        assert_eq!(p.deadline(), last + 150 * MS, "the second waits 100 ms");
        assert!(p.due(last + 150 * MS));
        assert_eq!(p.wait(), 200 * MS);
        // Answered: the wait is the pace's again, and the gap a probe ended is not the pace.
        p.progressed(last + 160 * MS);
        assert_eq!(p.wait(), 50 * MS);
    }

    #[test]
    fn the_wait_is_bounded_and_the_pace_decays() {
        let t0 = Instant::now();
        let mut p = Prober::new(t0);
        assert_eq!(p.wait(), PROBE_MIN, "no pace seen yet");
        p.progressed(t0 + Duration::from_secs(5));
        assert_eq!(p.wait(), 2 * PACE_MAX + PROBE_MIN, "a pause counts as PACE_MAX");
        let mut now = t0 + Duration::from_secs(5);
        for _ in 0..2000 {
            now += MS;
            p.progressed(now);
        }
        assert!(p.wait() < 15 * MS, "a slow start is forgotten: {:?}", p.wait());
        for _ in 0..40 {
            assert!(!p.due(now));
            now = p.deadline();
            assert!(p.due(now));
        }
        assert_eq!(p.wait(), PROBE_MAX, "unanswered probes back off to PROBE_MAX");
    }
}
