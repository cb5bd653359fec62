//! Carrying out the retry rule ([`crate::policy::retry`]) for a send: which failure an error
//! is, the error a send ends with, and the wait between attempts.

use std::time::Duration;

use rdma_verbs::Deadline;

use super::io::{Io, Wakes};
use super::{Error, SendOptions};
use crate::policy::retry::{self, Failure, Next, Stage};
use crate::Status;

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

/// The attempts of one send: the rule's state, and the error that started the retries.
pub(super) struct Retries {
    rule: retry::Retries,
    /// The first attempt's error: what the send reports if a retry cannot even connect.
    first: Option<Error>,
}

/// How an attempt ended.
pub(super) enum Attempt<T> {
    /// It ended with a verdict or an error that no retry changes.
    Done(Result<T, Error>),
    /// The session started (connected) and failed with this error.
    SessionFailed(Error),
    /// No session started: connecting failed with this error.
    ConnectFailed(Error),
}

/// Which failure of the retry rule `e` is.
fn failure(e: &Error) -> Failure {
    match e {
        Error::Refused { status: Status::Busy, retry_after, .. } => Failure::Busy { retry_after: *retry_after },
        Error::Refused { status: Status::Exists, .. } => Failure::Exists,
        Error::Refused { .. } => Failure::Refused,
        e if e.is_transient() => Failure::Transient,
        _ => Failure::Lasting,
    }
}

impl Retries {
    /// The retries `opts` allows.
    pub(super) fn new(opts: &SendOptions) -> Self {
        Retries { rule: retry::Retries::new(opts.retries, opts.busy_wait), first: None }
    }

    /// Failed attempts tried again so far.
    pub(super) fn made(&self) -> u32 {
        self.rule.made()
    }

    /// The options of the next attempt: `opts` for the first, and for each retry the ACK
    /// timeout the rule raises.
    pub(super) fn options(&self, opts: &SendOptions) -> Option<SendOptions> {
        (self.made() > 0).then(|| SendOptions { ack_timeout: self.rule.ack_timeout(opts.ack_timeout), ..opts.clone() })
    }

    /// After an attempt: `Ok(wait)` to try again after `wait`, or `Err` with the send's
    /// result, as [`retry::Retries::after`] decides.
    pub(super) fn after<T>(&mut self, attempt: Attempt<T>, opts: &SendOptions) -> Result<Duration, Result<T, Error>> {
        self.after_with(attempt, opts, u32::from_ne_bytes(crate::driver::random_bytes()))
    }

    fn after_with<T>(
        &mut self,
        attempt: Attempt<T>,
        opts: &SendOptions,
        random: u32,
    ) -> Result<Duration, Result<T, Error>> {
        let (stage, e) = match attempt {
            Attempt::Done(r) => return Err(r),
            Attempt::ConnectFailed(e) => (Stage::Connect, e),
            Attempt::SessionFailed(e) => (Stage::Session, e),
        };
        match self.rule.after(stage, failure(&e), opts.cancel.is_set(), random) {
            Next::Retry(wait) => {
                let (retries_left, ack_timeout) = (self.rule.left(), self.rule.ack_timeout(opts.ack_timeout));
                tracing::info!(error = %e, retries_left, ack_timeout, "sending again");
                self.first.get_or_insert(e);
                Ok(wait)
            }
            Next::AskAgain(wait) => {
                let busy_wait_left = self.rule.busy_left();
                tracing::info!(error = %e, ?wait, ?busy_wait_left, "the receiver is busy: asking again");
                Ok(wait)
            }
            Next::Report => Err(Err(e)),
            Next::ReportFirst => Err(Err(self.first.take().unwrap_or(e))),
            Next::Cancelled => Err(Err(Error::Cancelled)),
            Next::MayBeStored => {
                let Error::Refused { detail, .. } = e else { return Err(Err(e)) };
                let detail = if detail.is_empty() { String::new() } else { format!("{detail}; ") };
                let detail = format!("{detail}an earlier attempt whose connection failed may have stored it");
                Err(Err(Error::Refused { status: Status::Exists, detail, retry_after: None }))
            }
        }
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

    #[test]
    fn each_error_is_the_failure_the_rule_knows_and_retries_raise_the_ack_timeout() {
        let refused = |status| Error::Refused { status, detail: String::new(), retry_after: None };
        let hint = Some(Duration::from_secs(1));
        let busy = Error::Refused { status: Status::Busy, detail: String::new(), retry_after: hint };
        assert_eq!(failure(&busy), Failure::Busy { retry_after: hint });
        assert_eq!(failure(&refused(Status::Exists)), Failure::Exists);
        assert_eq!(failure(&refused(Status::TooLarge)), Failure::Refused);
        assert_eq!(failure(&Error::PeerDisconnected), Failure::Transient);
        assert_eq!(failure(&Error::Usage("x".into())), Failure::Lasting);
        let mut o = opts(5);
        o.ack_timeout = 14;
        let mut r = Retries::new(&o);
        assert!(r.options(&o).is_none(), "the first attempt as asked");
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        assert_eq!(r.options(&o).expect("a retry's options").ack_timeout, 16);
        assert!(matches!(r.after::<u8>(Attempt::Done(Ok(7)), &o), Err(Ok(7))));
    }

    #[test]
    fn a_retry_told_exists_says_an_earlier_attempt_may_have_stored_it() {
        let o = opts(3);
        let exists = || Error::Refused { status: Status::Exists, detail: "there".into(), retry_after: None };
        let mut r = Retries::new(&o);
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        match r.after::<()>(Attempt::SessionFailed(exists()), &o) {
            Err(Err(Error::Refused { status: Status::Exists, detail, .. })) => {
                assert!(detail.starts_with("there; ") && detail.contains("earlier attempt"), "{detail}")
            }
            other => panic!("{:?}", other.err()),
        }
    }

    #[test]
    fn retries_that_cannot_connect_end_with_the_error_that_started_them() {
        let o = opts(1);
        let mut r = Retries::new(&o);
        assert!(r.after::<()>(Attempt::SessionFailed(Error::PeerDisconnected), &o).is_ok());
        let refused = Error::Usage("connection refused".into());
        assert!(matches!(r.after::<()>(Attempt::ConnectFailed(refused), &o), Err(Err(Error::PeerDisconnected))));
        // A busy receiver is asked again after its hint, with jitter.
        let mut o = opts(0);
        o.busy_wait = Duration::from_secs(10);
        let busy = Error::Refused { status: Status::Busy, detail: String::new(), retry_after: None };
        let w = Retries::new(&o).after_with::<()>(Attempt::ConnectFailed(busy), &o, 0);
        assert_eq!(w.ok(), Some(Duration::from_millis(250)));
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
