//! When a failed send is tried again (the driver's `SendOptions::retries`), and after how
//! long: the one rule, for the blocking and the async send alike, and for a busy receiver
//! asked again within `SendOptions::busy_wait`.
//!
//! No I/O: the driver says how an attempt failed ([`Failure`]), whether the send was
//! cancelled, and a random number for the jitter; [`Retries::after`] says what to do next.

use std::time::Duration;

/// The wait before the first retry; each later one waits twice the one before, up to
/// [`MOST_BACKOFF`]. Long enough for a receiver's device to finish retransmitting what the
/// lost connection left in flight, short beside any transfer worth resuming.
pub const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The longest wait between two attempts.
pub const MOST_BACKOFF: Duration = Duration::from_secs(4);

/// A wait for a busy receiver is its hint (or the backoff) times a random factor from
/// `1 - JITTER` to `1 + JITTER`: senders turned away together come back spread out.
const JITTER: f64 = 0.5;

/// How much each retry raises the QP's ACK timeout exponent (`SendOptions::ack_timeout`):
/// one that fails mid-session is most often one whose peer's device was too slow to answer in
/// time, and a retransmission is what Linux 6.1's rxe then mishandles ([`docs/testing.md`, Known
/// limits](https://github.com/rdma-rs/rdma-rs/blob/main/docs/testing.md#known-limits)). Sixteen senders at once on 6.1 under TCG lost 65 sessions in 48 sends at exponent
/// 14 (67 ms) and none at 18 (1.07 s), where 6.12 lost none at 14; a lossy wire, on the other
/// hand, recovers a lost last packet only after a whole timeout, so the first attempt keeps
/// the one asked for.
pub const ACK_TIMEOUT_STEP: u8 = 2;

/// The longest ACK timeout exponent a retry raises it to (20: 4.3 s).
pub const MOST_ACK_TIMEOUT: u8 = 20;

/// `wait` times the jitter factor that `random` (any `u32`) picks, evenly from `1 - JITTER`
/// to `1 + JITTER`.
fn jittered(wait: Duration, random: u32) -> Duration {
    let factor = 1.0 - JITTER + 2.0 * JITTER * (f64::from(random) / f64::from(u32::MAX));
    wait.mul_f64(factor)
}

/// The wait after `n` waits of the same kind: [`FIRST_BACKOFF`] doubled `n` times, at most
/// [`MOST_BACKOFF`].
fn backoff(n: u32) -> Duration {
    FIRST_BACKOFF.saturating_mul(1 << n.min(8)).min(MOST_BACKOFF)
}

/// How an attempt failed, as the retry rule needs to know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The receiver answered `Busy`, asking to be asked again after `retry_after` if it said.
    Busy {
        /// The receiver's hint.
        retry_after: Option<Duration>,
    },
    /// The receiver answered `Exists`.
    Exists,
    /// Another verdict of the receiver.
    Refused,
    /// The connection failed mid-session, without a verdict (the driver's
    /// `Error::is_transient`): sent again, the transfer may succeed.
    Transient,
    /// Anything else (a local error, a connection that could not be made).
    Lasting,
}

/// When an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// No session started: connecting failed.
    Connect,
    /// The session started (connected) and failed.
    Session,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Send again after this wait: a retry, used up.
    Retry(Duration),
    /// Ask the busy receiver again after this wait (no retry used up).
    AskAgain(Duration),
    /// End the send with this attempt's error.
    Report,
    /// End the send with the error that started the retries (this attempt, a retry, could not
    /// even connect: the peer that left is the cause, not that it is gone now).
    ReportFirst,
    /// End the send as cancelled.
    Cancelled,
    /// End the send with this `Exists`, saying that an earlier attempt whose connection failed
    /// may have stored the file (its ACK lost with the connection).
    MayBeStored,
}

/// The attempts of one send: how many retries are left, and how long a busy receiver may
/// still be waited for.
#[derive(Debug, Clone)]
pub struct Retries {
    left: u32,
    made: u32,
    /// What is left of `SendOptions::busy_wait`.
    busy_left: Duration,
    /// Waits for a busy receiver so far.
    busy_waits: u32,
}

impl Retries {
    /// `retries` retries at most, and `busy_wait` in all for a busy receiver.
    pub fn new(retries: u32, busy_wait: Duration) -> Self {
        Retries { left: retries, made: 0, busy_left: busy_wait, busy_waits: 0 }
    }

    /// Failed attempts tried again so far.
    pub fn made(&self) -> u32 {
        self.made
    }

    /// What is left of the time a busy receiver may be waited for.
    pub fn busy_left(&self) -> Duration {
        self.busy_left
    }

    /// Retries left.
    pub fn left(&self) -> u32 {
        self.left
    }

    /// The ACK timeout exponent of the next attempt when `asked` was asked for: `asked` for the
    /// first, raised by [`ACK_TIMEOUT_STEP`] per retry made up to [`MOST_ACK_TIMEOUT`], never
    /// lowered.
    pub fn ack_timeout(&self, asked: u8) -> u8 {
        let raised = u32::from(asked) + u32::from(ACK_TIMEOUT_STEP) * self.made;
        (raised.min(u32::from(MOST_ACK_TIMEOUT)) as u8).max(asked)
    }

    /// After an attempt that failed at `stage` with `failure`, the send `cancelled` or not:
    /// what to do. Retries start only after a connection failed mid-session
    /// ([`Failure::Transient`]). A retry that cannot connect uses up a retry too; if the last
    /// one cannot, the send ends with the error that started the retries. A verdict is never
    /// retried, at connect time either, except `Busy`: that one is asked again after the
    /// receiver's hint (or the backoff) with jitter picked by `random`, within `busy_wait`
    /// (not a retry). Once the send is cancelled, a failure that would be retried ends it as
    /// cancelled. A retry told `Exists` says that an earlier attempt may have stored the file.
    pub fn after(&mut self, stage: Stage, failure: Failure, cancelled: bool, random: u32) -> Next {
        let retrying = self.made > 0;
        match (stage, failure) {
            (_, Failure::Busy { retry_after }) => return self.busy(retry_after, cancelled, random),
            (Stage::Session, Failure::Exists) if retrying => return Next::MayBeStored,
            (_, f) if !retrying && f != Failure::Transient => return Next::Report,
            (Stage::Connect, Failure::Exists | Failure::Refused) => return Next::Report,
            (Stage::Session, f) if f != Failure::Transient => return Next::Report,
            _ => {}
        }
        if cancelled {
            return Next::Cancelled;
        }
        if self.left == 0 {
            return if failure == Failure::Transient { Next::Report } else { Next::ReportFirst };
        }
        self.left -= 1;
        self.made += 1;
        Next::Retry(backoff(self.made - 1))
    }

    /// After a `Busy`: ask again within what is left of `busy_wait`, or report it.
    fn busy(&mut self, retry_after: Option<Duration>, cancelled: bool, random: u32) -> Next {
        if cancelled {
            return Next::Cancelled;
        }
        let wait = jittered(retry_after.unwrap_or(backoff(self.busy_waits)), random).min(self.busy_left);
        if wait.is_zero() {
            return Next::Report;
        }
        self.busy_left -= wait;
        self.busy_waits += 1;
        Next::AskAgain(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOST: (Stage, Failure) = (Stage::Session, Failure::Transient);

    fn after(r: &mut Retries, (stage, failure): (Stage, Failure)) -> Next {
        r.after(stage, failure, false, u32::MAX / 2)
    }

    fn waits(r: &mut Retries) -> Vec<Duration> {
        let mut w = Vec::new();
        while let Next::Retry(d) = after(r, LOST) {
            w.push(d);
        }
        w
    }

    #[test]
    fn a_lost_connection_is_tried_again_as_often_as_allowed_with_growing_waits() {
        let mut r = Retries::new(5, Duration::ZERO);
        let ms: Vec<u128> = waits(&mut r).iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [500, 1000, 2000, 4000, 4000]);
        assert_eq!((r.made(), r.left()), (5, 0));
        assert!(waits(&mut Retries::new(0, Duration::ZERO)).is_empty(), "0 retries: none");
    }

    #[test]
    fn each_retry_waits_longer_for_acks_up_to_a_bound() {
        let mut r = Retries::new(5, Duration::ZERO);
        assert_eq!(r.ack_timeout(14), 14, "the first attempt as asked");
        let mut seen = Vec::new();
        while matches!(after(&mut r, LOST), Next::Retry(_)) {
            seen.push(r.ack_timeout(14));
        }
        assert_eq!(seen, [16, 18, 20, 20, 20]);
        assert_eq!(r.ack_timeout(24), 24, "never lowered");
    }

    #[test]
    fn a_verdict_or_a_lasting_error_is_not_tried_again() {
        let mut r = Retries::new(3, Duration::ZERO);
        assert_eq!(after(&mut r, (Stage::Session, Failure::Refused)), Next::Report);
        // Nor at connect time, on a retry either: the receiver's verdict is reported as it is.
        assert!(matches!(after(&mut r, LOST), Next::Retry(_)));
        assert_eq!(after(&mut r, (Stage::Connect, Failure::Refused)), Next::Report);
        assert_eq!(after(&mut r, (Stage::Connect, Failure::Exists)), Next::Report);
        // Busy without a busy_wait is reported as it is too.
        assert_eq!(after(&mut r, (Stage::Connect, Failure::Busy { retry_after: None })), Next::Report);
        assert_eq!(after(&mut r, (Stage::Session, Failure::Lasting)), Next::Report);
        assert_eq!(r.made(), 1);
    }

    #[test]
    fn a_retry_told_exists_says_an_earlier_attempt_may_have_stored_it() {
        // The first attempt's Exists is the receiver's plain verdict.
        assert_eq!(after(&mut Retries::new(3, Duration::ZERO), (Stage::Session, Failure::Exists)), Next::Report);
        let mut r = Retries::new(3, Duration::ZERO);
        assert!(matches!(after(&mut r, LOST), Next::Retry(_)));
        assert_eq!(after(&mut r, (Stage::Session, Failure::Exists)), Next::MayBeStored);
    }

    #[test]
    fn retries_that_cannot_connect_end_with_the_error_that_started_them() {
        let mut r = Retries::new(3, Duration::ZERO);
        assert!(matches!(after(&mut r, LOST), Next::Retry(_)));
        // Retries that cannot connect use up the retries, then the first error is reported.
        assert!(matches!(after(&mut r, (Stage::Connect, Failure::Lasting)), Next::Retry(_)));
        assert!(matches!(after(&mut r, (Stage::Connect, Failure::Lasting)), Next::Retry(_)));
        assert_eq!(r.made(), 3);
        assert_eq!(after(&mut r, (Stage::Connect, Failure::Lasting)), Next::ReportFirst);
        // A lost connection with no retry left is reported as it is.
        assert_eq!(after(&mut r, LOST), Next::Report);
        // The first attempt's own connect failure is reported as it is.
        assert_eq!(after(&mut Retries::new(3, Duration::ZERO), (Stage::Connect, Failure::Lasting)), Next::Report);
    }

    #[test]
    fn a_cancelled_send_is_not_tried_again() {
        let mut r = Retries::new(3, Duration::from_secs(10));
        assert!(matches!(after(&mut r, LOST), Next::Retry(_)));
        assert_eq!(r.after(Stage::Connect, Failure::Lasting, true, 0), Next::Cancelled);
        assert_eq!(r.after(Stage::Session, Failure::Transient, true, 0), Next::Cancelled);
        assert_eq!(r.after(Stage::Connect, Failure::Busy { retry_after: None }, true, 0), Next::Cancelled);
        assert_eq!(r.made(), 1);
    }

    /// A `Busy` is asked again after the receiver's hint, with jitter, within `busy_wait`, and
    /// uses up no retry: senders turned away together by a full receiver come back spread out
    /// and are served in turn.
    #[test]
    fn busy_is_asked_again_after_its_hint_with_jitter_within_busy_wait() {
        let busy_wait = Duration::from_secs(10);
        let busy = |hint: Option<u64>| Failure::Busy { retry_after: hint.map(Duration::from_millis) };
        let mut r = Retries::new(0, busy_wait);
        // The hint, scaled by the jitter: 0.5x at the least random value, 1.5x at the most.
        let ms = Duration::from_millis;
        assert_eq!(r.after(Stage::Connect, busy(Some(1000)), false, 0), Next::AskAgain(ms(500)));
        assert_eq!(r.after(Stage::Connect, busy(Some(1000)), false, u32::MAX), Next::AskAgain(ms(1500)));
        // Without a hint (an older receiver): the backoff, doubling from the third wait on.
        let Next::AskAgain(w) = r.after(Stage::Session, busy(None), false, u32::MAX / 2) else { panic!() };
        assert!(w.abs_diff(Duration::from_secs(2)) < ms(1), "{w:?}");
        assert_eq!(r.made(), 0, "no retry used up");
        // At connect time and mid-session alike, until busy_wait is spent: the last wait is cut
        // to what is left, and then the Busy is reported.
        let mut waited = ms(4000);
        let mut n = 0u32;
        loop {
            let stage = if n % 2 == 0 { Stage::Connect } else { Stage::Session };
            match r.after(stage, busy(Some(1000)), false, n.wrapping_mul(0x9e37_79b9)) {
                Next::AskAgain(w) => {
                    assert!(w <= ms(1500), "{w:?}");
                    waited += w;
                    n += 1;
                }
                next => {
                    assert_eq!(next, Next::Report);
                    break;
                }
            }
        }
        assert_eq!(waited, busy_wait, "every wait together is busy_wait");
        assert_eq!(r.busy_left(), Duration::ZERO);
        assert!(n >= 4, "{n} waits");
        // Jitter spreads senders turned away together.
        let mut waits: Vec<Duration> = (0..16u32)
            .filter_map(|i| match Retries::new(0, busy_wait).after(Stage::Connect, busy(Some(1000)), false, i << 28) {
                Next::AskAgain(w) => Some(w),
                _ => None,
            })
            .collect();
        waits.sort();
        waits.dedup();
        assert_eq!(waits.len(), 16, "{waits:?}");
    }
}
