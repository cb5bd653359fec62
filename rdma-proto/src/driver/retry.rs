//! When a failed send is tried again ([`SendOptions::retries`]): the one rule, for the
//! blocking and the async send alike.

use std::time::Duration;

use rdma_verbs::Deadline;

use super::io::{Io, Wakes};
use super::{Error, SendOptions};
use crate::Status;

/// The wait before the first retry; each later one waits twice the one before, up to
/// [`MOST_BACKOFF`]. Long enough for a receiver's device to finish retransmitting what the
/// lost connection left in flight, short beside any transfer worth resuming.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The longest wait between two attempts.
const MOST_BACKOFF: Duration = Duration::from_secs(4);

/// A wait for a busy receiver is its hint (or the backoff) times a random factor from
/// `1 - JITTER` to `1 + JITTER`: senders turned away together come back spread out.
const JITTER: f64 = 0.5;

/// `wait` times the jitter factor that `random` (any `u32`) picks, evenly from `1 - JITTER`
/// to `1 + JITTER`.
fn jittered(wait: Duration, random: u32) -> Duration {
    let factor = 1.0 - JITTER + 2.0 * JITTER * (f64::from(random) / f64::from(u32::MAX));
    wait.mul_f64(factor)
}

/// How much each retry raises the QP's ACK timeout exponent ([`SendOptions::ack_timeout`]):
/// one that fails mid-session is most often one whose peer's device was too slow to answer in
/// time, and a retransmission is what Linux 6.1's rxe then mishandles ([`docs/testing.md`, Known
/// limits](https://github.com/rdma-rs/rdma-rs/blob/main/docs/testing.md#known-limits)). Sixteen senders at once on 6.1 under TCG lost 65 sessions in 48 sends at exponent
/// 14 (67 ms) and none at 18 (1.07 s), where 6.12 lost none at 14; a lossy wire, on the other
/// hand, recovers a lost last packet only after a whole timeout, so the first attempt keeps
/// the one asked for.
const ACK_TIMEOUT_STEP: u8 = 2;

/// The longest ACK timeout exponent a retry raises it to (20: 4.3 s).
const MOST_ACK_TIMEOUT: u8 = 20;

/// Waits `wait`, unless the send is cancelled meanwhile: then [`Error::Cancelled`] at once
/// (the wait wakes for [`SendOptions::cancel`]).
pub(super) async fn sleep<I: Io>(io: &I, wait: Duration, opts: &SendOptions) -> Result<(), Error> {
    let until = Deadline::after(wait);
    while !until.has_passed() {
        cancelled(opts)?;
        let wakes = Wakes::none().and(opts.cancel.fd());
        io.readable(wakes.fds(), wakes.until(until)).await;
    }
    cancelled(opts)
}

/// `Err(Cancelled)` once the send is cancelled.
fn cancelled(opts: &SendOptions) -> Result<(), Error> {
    match opts.cancel.is_set() {
        true => Err(Error::Cancelled),
        false => Ok(()),
    }
}

/// The attempts of one send: how many retries are left, and the error that started them.
pub(super) struct Retries {
    left: u32,
    made: u32,
    /// What is left of [`SendOptions::busy_wait`].
    busy_left: Duration,
    /// Waits for a busy receiver so far.
    busy_waits: u32,
    /// The first attempt's error: what the send reports if a retry cannot even connect.
    first: Option<Error>,
}

/// How an attempt ended, as the retry rule needs to know it.
pub(super) enum Attempt<T> {
    /// It ended with a verdict or an error that no retry changes.
    Done(Result<T, Error>),
    /// The session started (connected) and failed with this error.
    SessionFailed(Error),
    /// No session started: connecting failed with this error.
    ConnectFailed(Error),
}

impl Retries {
    /// The retries `opts` allows.
    pub(super) fn new(opts: &SendOptions) -> Self {
        Retries { left: opts.retries, made: 0, busy_left: opts.busy_wait, busy_waits: 0, first: None }
    }

    /// Failed attempts tried again so far.
    pub(super) fn made(&self) -> u32 {
        self.made
    }

    /// The options of the next attempt: `opts` for the first, and for each retry the ACK
    /// timeout raised by [`ACK_TIMEOUT_STEP`] per retry made, up to [`MOST_ACK_TIMEOUT`]
    /// (never lowered).
    pub(super) fn options(&self, opts: &SendOptions) -> Option<SendOptions> {
        (self.made > 0).then(|| SendOptions { ack_timeout: self.ack_timeout(opts.ack_timeout), ..opts.clone() })
    }

    fn ack_timeout(&self, asked: u8) -> u8 {
        let raised = u32::from(asked) + u32::from(ACK_TIMEOUT_STEP) * self.made;
        (raised.min(u32::from(MOST_ACK_TIMEOUT)) as u8).max(asked)
    }

    /// After an attempt: `Ok(wait)` to try again after `wait`, or `Err` with the send's
    /// result. Retries start only after an error that says the connection failed mid-session
    /// ([`Error::is_transient`]). A retry that cannot connect (the receiver restarting, say)
    /// uses up a retry too; if the last one cannot, the send ends with the error that started
    /// the retries (the peer that left is the cause, not that it is gone now). A verdict is
    /// never retried, at connect time either, except `Busy`: that one is asked again after the
    /// receiver's hint, within [`SendOptions::busy_wait`] (not a retry).
    /// Once the send is cancelled, a failure that would be retried ends it as
    /// [`Error::Cancelled`]. A retry told `Exists` says that an earlier attempt may have stored
    /// the file (its ACK lost with the connection).
    /// After a `Busy`: `Ok(wait)` within what is left of [`SendOptions::busy_wait`], or the
    /// refusal. `random` picks the jitter.
    fn busy<T>(&mut self, e: Error, opts: &SendOptions, random: [u8; 4]) -> Result<Duration, Result<T, Error>> {
        let Error::Refused { retry_after, .. } = &e else { return Err(Err(e)) };
        if opts.cancel.is_set() {
            return Err(Err(Error::Cancelled));
        }
        let backoff = FIRST_BACKOFF.saturating_mul(1 << self.busy_waits.min(8)).min(MOST_BACKOFF);
        let wait = jittered(retry_after.unwrap_or(backoff), u32::from_ne_bytes(random)).min(self.busy_left);
        if wait.is_zero() {
            return Err(Err(e));
        }
        self.busy_left -= wait;
        self.busy_waits += 1;
        tracing::info!(error = %e, ?wait, busy_wait_left = ?self.busy_left, "the receiver is busy: asking again");
        Ok(wait)
    }

    pub(super) fn after<T>(&mut self, attempt: Attempt<T>, opts: &SendOptions) -> Result<Duration, Result<T, Error>> {
        let retrying = self.first.is_some();
        let e = match attempt {
            Attempt::Done(r) => return Err(r),
            Attempt::ConnectFailed(e @ Error::Refused { status: Status::Busy, .. })
            | Attempt::SessionFailed(e @ Error::Refused { status: Status::Busy, .. }) => {
                return self.busy(e, opts, crate::driver::random_bytes())
            }
            Attempt::SessionFailed(Error::Refused { status: Status::Exists, detail, .. }) if retrying => {
                let detail = if detail.is_empty() { String::new() } else { format!("{detail}; ") };
                let detail = format!("{detail}an earlier attempt whose connection failed may have stored it");
                return Err(Err(Error::Refused { status: Status::Exists, detail, retry_after: None }));
            }
            Attempt::ConnectFailed(e) | Attempt::SessionFailed(e) if !retrying && !e.is_transient() => {
                return Err(Err(e))
            }
            Attempt::ConnectFailed(e @ Error::Refused { .. }) => return Err(Err(e)),
            Attempt::SessionFailed(e) if !e.is_transient() => return Err(Err(e)),
            Attempt::ConnectFailed(e) | Attempt::SessionFailed(e) => e,
        };
        if opts.cancel.is_set() {
            return Err(Err(Error::Cancelled));
        }
        if self.left == 0 {
            // A retry that could not connect reports what started the retries.
            return Err(Err(if e.is_transient() { e } else { self.first.take().unwrap_or(e) }));
        }
        self.left -= 1;
        self.made += 1;
        let ack_timeout = self.ack_timeout(opts.ack_timeout);
        tracing::info!(error = %e, retries_left = self.left, ack_timeout, "sending again");
        self.first.get_or_insert(e);
        Ok(FIRST_BACKOFF.saturating_mul(1 << (self.made - 1).min(8)).min(MOST_BACKOFF))
    }
}

#[cfg(test)]
mod tests {
    use super::super::io::{block_on, Blocking};
    use super::*;

    fn opts(retries: u32) -> SendOptions {
        let mut o = SendOptions::new("127.0.0.1:1".parse().unwrap());
        o.retries = retries;
        o
    }

    fn waits(r: &mut Retries, o: &SendOptions) -> Vec<Duration> {
        let mut w = Vec::new();
        while let Ok(d) = r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), o) {
            w.push(d);
        }
        w
    }

    #[test]
    fn a_lost_connection_is_tried_again_as_often_as_allowed_with_growing_waits() {
        let o = opts(5);
        let mut r = Retries::new(&o);
        let ms: Vec<u128> = waits(&mut r, &o).iter().map(Duration::as_millis).collect();
        assert_eq!(ms, [500, 1000, 2000, 4000, 4000]);
        assert_eq!(r.made(), 5);
        assert!(waits(&mut Retries::new(&opts(0)), &opts(0)).is_empty(), "0 retries: none");
    }

    #[test]
    fn each_retry_waits_longer_for_acks_up_to_a_bound() {
        let mut o = opts(5);
        o.ack_timeout = 14;
        let mut r = Retries::new(&o);
        assert!(r.options(&o).is_none(), "the first attempt as asked");
        let mut seen = Vec::new();
        while r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok() {
            seen.push(r.options(&o).expect("a retry's options").ack_timeout);
        }
        assert_eq!(seen, [16, 18, 20, 20, 20]);
        o.ack_timeout = 24;
        let mut r = Retries::new(&o);
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        assert_eq!(r.options(&o).unwrap().ack_timeout, 24, "never lowered");
    }

    #[test]
    fn a_verdict_or_a_lasting_error_is_not_tried_again() {
        let o = opts(3);
        let mut r = Retries::new(&o);
        let refused = || Error::Refused { status: Status::TooLarge, detail: String::new(), retry_after: None };
        assert!(matches!(r.after::<()>(Attempt::SessionFailed(refused()), &o), Err(Err(Error::Refused { .. }))));
        // Nor at connect time, on a retry either: the receiver's verdict is reported as it is.
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        let busy = r.after::<()>(Attempt::ConnectFailed(refused()), &o);
        assert!(matches!(busy, Err(Err(Error::Refused { status: Status::TooLarge, .. }))));
        // Busy without a busy_wait (the default) is reported as it is too.
        let busy = Error::Refused { status: Status::Busy, detail: String::new(), retry_after: None };
        let busy = r.after::<()>(Attempt::ConnectFailed(busy), &o);
        assert!(matches!(busy, Err(Err(Error::Refused { status: Status::Busy, .. }))));
        let usage = Error::Usage("x".into());
        assert!(matches!(r.after::<()>(Attempt::SessionFailed(usage), &o), Err(Err(Error::Usage(_)))));
        assert!(matches!(r.after::<u8>(Attempt::Done(Ok(7)), &o), Err(Ok(7))));
        assert_eq!(r.made(), 1);
    }

    #[test]
    fn a_retry_told_exists_says_an_earlier_attempt_may_have_stored_it() {
        let o = opts(3);
        let exists = || Error::Refused { status: Status::Exists, detail: String::new(), retry_after: None };
        // The first attempt's Exists is the receiver's plain verdict.
        let first = Retries::new(&o).after::<()>(Attempt::SessionFailed(exists()), &o);
        assert!(matches!(first, Err(Err(Error::Refused { ref detail, .. })) if detail.is_empty()));
        let mut r = Retries::new(&o);
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        match r.after::<()>(Attempt::SessionFailed(exists()), &o) {
            Err(Err(Error::Refused { status: Status::Exists, detail, .. })) => {
                assert!(detail.contains("earlier attempt"), "{detail}")
            }
            other => panic!("{:?}", other.err()),
        }
    }

    #[test]
    fn retries_that_cannot_connect_end_with_the_error_that_started_them() {
        let o = opts(3);
        let mut r = Retries::new(&o);
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        // Retries that cannot connect use up the retries, then the first error is reported.
        let refused = || Error::Usage("connection refused".into());
        assert!(r.after::<()>(Attempt::ConnectFailed(refused()), &o).is_ok());
        assert!(r.after::<()>(Attempt::ConnectFailed(refused()), &o).is_ok());
        assert_eq!(r.made(), 3);
        assert!(matches!(r.after::<()>(Attempt::ConnectFailed(refused()), &o), Err(Err(Error::PeerDisconnected))));
        // The first attempt's own connect failure is reported as it is.
        let mut r = Retries::new(&o);
        let e = r.after::<()>(Attempt::ConnectFailed(Error::Usage("no route".into())), &o);
        assert!(matches!(e, Err(Err(Error::Usage(_)))));
    }

    /// A `Busy` is asked again after the receiver's hint, with jitter, within `busy_wait`, and
    /// uses up no retry: senders turned away together by a full receiver come back spread out
    /// and are served in turn.
    #[test]
    fn busy_is_asked_again_after_its_hint_with_jitter_within_busy_wait() {
        let mut o = opts(0);
        o.busy_wait = Duration::from_secs(10);
        let busy = |hint: Option<u64>| Error::Refused {
            status: Status::Busy,
            detail: String::new(),
            retry_after: hint.map(Duration::from_millis),
        };
        let mut r = Retries::new(&o);
        // The hint, scaled by the jitter: 0.5x at the least random value, 1.5x at the most.
        assert_eq!(r.busy::<()>(busy(Some(1000)), &o, 0u32.to_ne_bytes()).ok(), Some(Duration::from_millis(500)));
        let most = r.busy::<()>(busy(Some(1000)), &o, u32::MAX.to_ne_bytes()).ok();
        assert_eq!(most, Some(Duration::from_millis(1500)));
        // Without a hint (an older receiver): the backoff, doubling from the third wait on.
        let half = (u32::MAX / 2).to_ne_bytes();
        let w = r.busy::<()>(busy(None), &o, half).unwrap();
        assert!(w.abs_diff(Duration::from_secs(2)) < Duration::from_millis(1), "{w:?}");
        assert_eq!(r.made(), 0, "no retry used up");
        // Through `after`, at connect time and mid-session alike, until busy_wait is spent: the
        // last wait is cut to what is left, and then the Busy is reported.
        let mut waited = Duration::from_millis(4000);
        let mut n = 0;
        loop {
            let attempt = if n % 2 == 0 {
                Attempt::ConnectFailed(busy(Some(1000)))
            } else {
                Attempt::SessionFailed(busy(Some(1000)))
            };
            match r.after::<()>(attempt, &o) {
                Ok(w) => {
                    assert!(w <= Duration::from_millis(1500), "{w:?}");
                    waited += w;
                    n += 1;
                }
                Err(e) => {
                    assert!(matches!(e, Err(Error::Refused { status: Status::Busy, .. })));
                    break;
                }
            }
        }
        assert_eq!(waited, o.busy_wait, "every wait together is busy_wait");
        assert!(n >= 4, "{n} waits");
        // Jitter spreads senders turned away together.
        let mut waits: Vec<Duration> = (0..16)
            .map(|_| Retries::new(&o).after::<()>(Attempt::ConnectFailed(busy(Some(1000))), &o).unwrap())
            .collect();
        waits.sort();
        waits.dedup();
        assert!(waits.len() > 8, "{waits:?}");
    }

    #[test]
    fn a_wait_between_attempts_lasts_its_time() {
        let o = opts(3);
        let t = std::time::Instant::now();
        block_on(sleep(&Blocking, Duration::from_millis(120), &o)).unwrap();
        let took = t.elapsed();
        assert!(took >= Duration::from_millis(120) && took < Duration::from_secs(2), "{took:?}");
    }

    #[test]
    fn a_send_cancelled_while_it_waits_to_retry_ends_at_once() {
        let o = opts(3);
        let cancel = o.cancel.clone();
        let t = std::time::Instant::now();
        let setter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            cancel.set();
        });
        assert!(matches!(block_on(sleep(&Blocking, Duration::from_secs(4), &o)), Err(Error::Cancelled)));
        setter.join().unwrap();
        // Woken by the flag's eventfd, not by a periodic look at it.
        assert!(t.elapsed() < Duration::from_millis(500), "it waited {:?}", t.elapsed());
    }

    #[test]
    fn a_cancelled_send_is_not_tried_again_and_says_it_was_cancelled() {
        let o = opts(3);
        let mut r = Retries::new(&o);
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        o.cancel.set();
        let refused = Error::Usage("connection refused".into());
        assert!(matches!(r.after::<()>(Attempt::ConnectFailed(refused), &o), Err(Err(Error::Cancelled))));
        assert!(
            matches!(block_on(sleep(&Blocking, Duration::ZERO, &o)), Err(Error::Cancelled)),
            "checked after the wait too"
        );
    }
}
