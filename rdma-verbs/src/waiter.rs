//! How every wait of the safe layer waits for completions: [`WaitPolicy`] and [`CqWaiter`].
//!
//! The steps are documented on [`CqWaiter`].

use std::time::{Duration, Instant};

use crate::cq::{CompletionChannel, CompletionQueue};
use crate::deadline::Deadline;
use crate::error::{Error, Result};

/// How a blocking wait of this crate waits for completions: it spins (polls without a system
/// call) for a budget, then sleeps on the completion channel (see [`CqWaiter`]).
///
/// The spin budget trades CPU for latency: a completion that comes within it is taken at once;
/// one that comes later costs a wake-up (tens of microseconds on hardware, more under
/// emulation). A waiting thread burns a core for at most the budget, then sleeps.
///
/// ```
/// use std::time::Duration;
/// use rdma_verbs::WaitPolicy;
///
/// assert_eq!(WaitPolicy::default().spin(), WaitPolicy::DEFAULT_SPIN);
/// assert_eq!(WaitPolicy::sleep_at_once().spin(), Duration::ZERO);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitPolicy {
    spin: Duration,
}

impl WaitPolicy {
    /// The default spin budget: 50 µs, about one round trip of a small message on a RoCE NIC,
    /// so that a ping-pong on hardware is answered while spinning, while an idle wait sleeps
    /// after a twenty-thousandth of a second.
    pub const DEFAULT_SPIN: Duration = Duration::from_micros(50);

    /// Spins for `spin` before sleeping. [`Duration::MAX`] spins until the deadline: the
    /// lowest latency, a whole core per waiting thread.
    pub const fn spin_then_sleep(spin: Duration) -> Self {
        WaitPolicy { spin }
    }

    /// Sleeps as soon as a poll finds nothing (arming first, then polling once more), as
    /// rdma-core's `ibv_rc_pingpong -e` does.
    pub const fn sleep_at_once() -> Self {
        WaitPolicy { spin: Duration::ZERO }
    }

    /// The spin budget.
    pub const fn spin(&self) -> Duration {
        self.spin
    }
}

impl Default for WaitPolicy {
    fn default() -> Self {
        WaitPolicy::spin_then_sleep(Self::DEFAULT_SPIN)
    }
}

/// The longest one sleep lasts on a channel that CQs outside the wait also report to.
pub const SHARED_CHANNEL_SLICE: Duration = Duration::from_millis(10);

/// What one [`CqWaiter::idle`] step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Idle {
    /// Spun once (the budget is not spent, or the CQs have no channel): poll again.
    Spun,
    /// Armed the CQs: poll once more before the next step sleeps.
    Armed,
    /// Slept and was woken by a completion event: poll again.
    Woken,
    /// Slept until the deadline (or the re-check) given, with no event.
    Slept,
}

/// The state of one wait over one or two CQs: how long it has spun, whether the CQs are armed.
///
/// A wait polls its CQs. When a poll finds nothing it calls [`CqWaiter::idle`], which
/// 1. **spins** (polls again at once) until the policy's spin budget, counted from the first
///    empty poll, is spent: a completion due within microseconds is taken without a system call;
/// 2. then **arms** the CQs (`ibv_req_notify_cq`) and has the caller poll once more: a completion
///    that came between the last poll and the arming raises no event, so the poll after arming
///    is what sees it, as `ibv_req_notify_cq(3)` prescribes;
/// 3. then **sleeps** on the CQs' completion channel (`poll(2)`, or the tokio reactor for
///    `idle_async`, feature `tokio`) until an event, the caller's deadline or a re-check
///    the caller asked for; it reads and acknowledges every event pending, and the caller polls.
///
/// A CQ without a completion channel can only spin: its waits poll until their deadline.
/// Events of a channel shared with CQs the wait does not know of may be read by another
/// thread's wait: a sleep on such a channel lasts at most [`SHARED_CHANNEL_SLICE`], so a wake-up
/// taken by someone else costs that much latency, never a lost completion.
///
/// Make one per wait (or per polling loop: call [`reset`](Self::reset) whenever a poll found
/// work) and call [`idle`](Self::idle) after each poll that found nothing. The CQs are passed
/// to each call, so the waiter borrows nothing between them. Every wait of [`RecvRing`],
/// [`SendQueue`], [`PostScope`] and [`CompletionQueue::poll_wait`] is this loop; a polling loop
/// of one's own over several queues (the transfer driver of `rdma-proto` is one) uses it too.
///
/// [`RecvRing`]: crate::RecvRing
/// [`SendQueue`]: crate::SendQueue
/// [`PostScope`]: crate::PostScope
#[derive(Debug, Clone)]
pub struct CqWaiter {
    policy: WaitPolicy,
    spin_until: Option<Instant>,
    armed: bool,
}

impl CqWaiter {
    /// A waiter that has not spun yet.
    pub fn new(policy: WaitPolicy) -> Self {
        CqWaiter { policy, spin_until: None, armed: false }
    }

    /// Work came: the next idle step spins again for the whole budget.
    pub fn reset(&mut self) {
        self.spin_until = None;
        self.armed = false;
    }

    /// Whether waits on `cqs` can sleep: every one has a completion channel.
    pub fn can_sleep(cqs: &[&CompletionQueue<'_>]) -> bool {
        cqs.iter().all(|cq| cq.channel().is_some())
    }

    /// One step after a poll of `cqs` found nothing: spins, arms, or sleeps until an event of
    /// their channel(s) or `until`, whichever comes first (see the [type docs](Self)).
    ///
    /// # Errors
    /// [`Error::Verb`] when arming a CQ (`ibv_req_notify_cq`), waiting (`poll(2)`) or reading
    /// an event (`ibv_get_cq_event`) fails.
    pub fn idle(&mut self, cqs: &[&CompletionQueue<'_>], until: Deadline) -> Result<Idle> {
        if let Some(step) = self.spin_or_arm(cqs)? {
            if step == Idle::Spun {
                std::hint::spin_loop();
            }
            return Ok(step);
        }
        self.armed = false;
        let mut channels = channels_of(cqs);
        let slice = self.slice(cqs, &channels, until);
        let woken = sleep_on(&mut channels, slice)?;
        Ok(if woken { Idle::Woken } else { Idle::Slept })
    }

    /// Spins while the budget lasts (or forever without channels), else arms once: `None` when
    /// the next step is a sleep.
    fn spin_or_arm(&mut self, cqs: &[&CompletionQueue<'_>]) -> Result<Option<Idle>> {
        let now = Instant::now();
        let spin_until = *self.spin_until.get_or_insert_with(|| now.checked_add(self.policy.spin).unwrap_or(now));
        let spinning = self.policy.spin == Duration::MAX || now < spin_until;
        if spinning || !Self::can_sleep(cqs) {
            return Ok(Some(Idle::Spun));
        }
        if !self.armed {
            for cq in cqs {
                cq.arm(false)?;
            }
            self.armed = true;
            return Ok(Some(Idle::Armed));
        }
        Ok(None)
    }

    /// How long the next sleep may last: until `until`, and at most [`SHARED_CHANNEL_SLICE`] on
    /// a channel that other CQs report to.
    fn slice(
        &self,
        cqs: &[&CompletionQueue<'_>],
        channels: &[Option<&CompletionChannel<'_>>; 2],
        until: Deadline,
    ) -> Deadline {
        let shared = channels.iter().flatten().any(|ch| {
            let ours = cqs.iter().filter(|cq| cq.channel().is_some_and(|c| std::ptr::eq(c, *ch))).count();
            ch.cq_count() > ours
        });
        match until.instant() {
            _ if !shared => until,
            None => Deadline::after(SHARED_CHANNEL_SLICE),
            Some(at) => Deadline::after(at.saturating_duration_since(Instant::now()).min(SHARED_CHANNEL_SLICE)),
        }
    }

    /// [`idle`](Self::idle) for async code: the spin yields to the runtime
    /// (`tokio::task::yield_now`) instead of busy-polling, and the sleep awaits the channel's
    /// readiness on the tokio reactor, for at most `recheck` when given. The CQs must report to
    /// one channel.
    ///
    /// Cancellation-safe: dropped at its await, it has taken nothing; at worst the CQs stay
    /// armed, and an event raised for that wakes a later wait once, harmlessly.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the CQs report to two channels; [`Error::NoRuntime`]
    /// outside a tokio runtime; as `idle`.
    #[cfg(feature = "tokio")]
    pub async fn idle_async(&mut self, cqs: &[&CompletionQueue<'_>], recheck: Option<Duration>) -> Result<Idle> {
        if let Some(step) = self.spin_or_arm(cqs)? {
            if step == Idle::Spun {
                if !Self::can_sleep(cqs) {
                    return Err(Error::invalid(
                        "ibv_get_cq_event",
                        cqs.first().map(|cq| cq.context().name()),
                        "an async wait needs a CQ with a completion channel",
                    ));
                }
                tokio::task::yield_now().await;
            }
            return Ok(step);
        }
        self.armed = false;
        let channels = channels_of(cqs);
        let channel = match channels {
            [Some(a), None] => a,
            _ => {
                return Err(Error::invalid(
                    "ibv_get_cq_event",
                    cqs.first().map(|cq| cq.context().name()),
                    "an async wait over CQs of two completion channels",
                ))
            }
        };
        let woken = channel.readable_async(recheck).await?;
        Ok(if woken { Idle::Woken } else { Idle::Slept })
    }
}

/// The distinct channels of `cqs` (at most two are looked at).
fn channels_of<'a>(cqs: &[&'a CompletionQueue<'_>]) -> [Option<&'a CompletionChannel<'a>>; 2] {
    let mut out: [Option<&CompletionChannel<'_>>; 2] = [None, None];
    for ch in cqs.iter().filter_map(|cq| cq.channel()) {
        if out.iter().flatten().any(|c| std::ptr::eq(*c, ch)) {
            continue;
        }
        if let Some(free) = out.iter_mut().find(|c| c.is_none()) {
            *free = Some(ch);
        }
    }
    out
}

/// Sleeps until a channel has an event or `until`; reads and acknowledges every pending event.
/// `true` when woken by one.
fn sleep_on(channels: &mut [Option<&CompletionChannel<'_>>; 2], until: Deadline) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let mut pfds = [libc::pollfd { fd: -1, events: libc::POLLIN, revents: 0 }; 2];
    for (pfd, ch) in pfds.iter_mut().zip(channels.iter()) {
        if let Some(ch) = ch {
            pfd.fd = ch.as_raw_fd();
        }
    }
    loop {
        // SAFETY: two valid pollfds (a negative fd is ignored by poll(2)).
        let n = unsafe { libc::poll(pfds.as_mut_ptr(), 2, until.poll_timeout_ms()) };
        if n >= 0 {
            let mut woken = false;
            for ch in channels.iter().flatten() {
                while ch.try_recv()?.is_some() {
                    woken = true;
                }
            }
            return Ok(woken);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            let device = channels.iter().flatten().next().map(|c| c.context().name());
            return Err(Error::from_errno("ibv_get_cq_event", device, err.raw_os_error().unwrap_or(libc::EIO)));
        }
    }
}
