//! How every wait of the safe layer waits for completions: [`WaitPolicy`] and [`CqWaiter`].
//!
//! The steps are documented on [`CqWaiter`].

use std::os::fd::BorrowedFd;
use std::time::Instant;

use crate::completion_channel::{CompletionChannel, CompletionEvent};
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::wait::deadline::Deadline;
use crate::wait::policy::{WaitPolicy, SHARED_CHANNEL_SLICE};
use crate::wait::sleepers::Kick;

/// What one [`CqWaiter::idle`] step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Idle {
    /// Spun once (the budget is not spent, or the CQs have no channel): poll again.
    Spun,
    /// Armed the CQs: poll once more before the next step sleeps.
    Armed,
    /// Slept and was woken by a completion event: poll again.
    Woken,
    /// Slept until the deadline (or the re-check) given, with no event.
    Slept,
    /// Slept and was woken by one of the other file descriptors the step watched
    /// ([`CqWaiter::idle_with`], and `idle_async_with` with the feature `tokio`): the caller
    /// reads what they have to say before it idles again.
    Signalled,
}

/// The state of one wait over one or more CQs: how long it has spun, whether the CQs are armed.
///
/// [`wait`](Self::wait) runs a wait to its end: it calls the caller's `step` (a poll that
/// takes what arrived) and, while that finds nothing,
/// 1. **spins** (calls `step` again at once) until the policy's spin budget, counted from the
///    first empty step, is spent: a completion due within microseconds is taken without a
///    system call;
/// 2. then **arms** the CQs (`ibv_req_notify_cq`) and steps once more: a completion that came
///    between the last step and the arming raises no event, so the step after arming is what
///    sees it, as `ibv_req_notify_cq(3)` prescribes. A CQ the waiter armed before whose event
///    has not been read since is not armed again (its arm still stands: the next completion
///    raises an event, or raised one still pending), when the waiter knows that: its CQs (at
///    most four) report to one channel, and every event read from it since was read by
///    this waiter;
/// 3. then **sleeps** on the CQs' completion channel (`poll(2)`; `wait_async` awaits the
///    channel's readiness on the tokio reactor instead) until an event or the deadline, and
///    steps again. A blocking sleep reads one event from a channel that `poll(2)` reported
///    readable, and none from the others: a second event pending ends the next sleep at once
///    (the fd stays readable), which costs what the read that found no event would have. An
///    async sleep reads and acknowledges every pending event (the reactor reports readiness
///    once, not while the fd stays readable).
///
/// Every event goes through [`CompletionChannel::try_recv`] (and the waits built on it),
/// which counts it: events read around it (with `ibv_get_cq_event` on the raw channel) would
/// leave a waiter believing an arm stands that is spent.
///
/// Before its last step and its sleep, a sleeper registers with the channel (a thread-local
/// `eventfd`): a wait that reads an event of a CQ it does not wait for (CQs of several queues
/// may share a channel, and their waits may run on other threads) wakes every registered
/// sleeper, which steps again. So no completion is missed whoever reads its event; an event
/// read before a sleeper registered is no loss either, since its completion was in the CQ
/// before the sleeper's last step. (Async waits register the channel's fd with the reactor of
/// the runtime they run on, and a wake-up from the other waits, before their last step, to the
/// same end.) Events read by other means ([`CompletionChannel::recv`],
/// [`CompletionQueue::wait`]) wake nobody: do not mix those with these waits on one channel.
///
/// A CQ without a completion channel can only spin: its waits poll until their deadline.
///
/// For a polling loop of one's own, where a round does more than poll (the transfer driver of
/// `rdma-proto`), [`idle`](Self::idle) is one step of the same sequence, called after each
/// round that found nothing; [`reset`](Self::reset) after each that found work. Such a loop
/// must be the only waiter on its channel(s): a sleep on a channel other CQs report to lasts at
/// most [`SHARED_CHANNEL_SLICE`].
///
/// Every wait of [`RecvRing`], [`SendQueue`], [`PostScope`] and
/// [`CompletionQueue::poll_wait`] is a [`wait`](Self::wait).
///
/// [`RecvRing`]: crate::RecvRing
/// [`SendQueue`]: crate::SendQueue
/// [`PostScope`]: crate::PostScope
#[derive(Debug)]
pub struct CqWaiter {
    policy: WaitPolicy,
    /// When the spin of this wait ends, once it began (`Some(None)`: never).
    spin_until: Option<Option<Instant>>,
    armed: bool,
    /// The arms of the waiter's CQs that still stand, while it can tell.
    arms: Option<Arms>,
    /// [`idle_async`](Self::idle_async)'s registration of its channel, kept while the waiter
    /// sleeps on that channel (a polling loop sleeps thousands of times a second).
    #[cfg(feature = "tokio")]
    kept: Option<Kept>,
}

/// What [`CqWaiter::idle_async`] keeps across its sleeps on one channel.
#[cfg(feature = "tokio")]
#[derive(Debug)]
struct Kept {
    /// The channel's [serial](CompletionChannel::serial): its identity (an address may be a new
    /// channel's, after the old one was dropped).
    serial: u64,
    watch: crate::wait::reactor::Watch,
    /// The re-check's timer, made on the first sleep with one.
    alarm: Option<crate::wait::reactor::Alarm>,
}

/// Most CQs of one wait whose arms a [`CqWaiter`] keeps track of; a wait over more arms every
/// one of them before each sleep.
const TRACKED: usize = 4;

/// Which of a waiter's CQs are armed and have had no event read since ([`CqWaiter`], step 2):
/// valid while every event read from their one channel was read by the waiter.
#[derive(Debug)]
struct Arms {
    /// The channel's address, and its [`reads`](CompletionChannel::reads) as the waiter last
    /// accounted for them.
    channel: usize,
    reads: u64,
    /// The CQs' [serials](CompletionQueue::serial), in the wait's order.
    cqs: [u64; TRACKED],
    len: usize,
    /// Bit `i`: `cqs[i]` is armed, and no event of it has been read since.
    standing: u8,
}

impl Arms {
    /// Arms can be tracked for `cqs`: at most [`TRACKED`], each with a channel, all one.
    fn channel_of<'a>(cqs: &[&'a CompletionQueue<'_>]) -> Option<&'a CompletionChannel<'a>> {
        if cqs.len() > TRACKED {
            return None;
        }
        let first = cqs.first()?.channel()?;
        cqs.iter().all(|cq| cq.channel().is_some_and(|c| std::ptr::eq(c, first))).then_some(first)
    }

    /// Whether these arms are of `cqs` on `channel`, and no one else read an event since.
    fn hold_for(&self, cqs: &[&CompletionQueue<'_>], channel: &CompletionChannel<'_>) -> bool {
        self.channel == channel as *const CompletionChannel<'_> as usize
            && self.reads == channel.reads()
            && self.len == cqs.len()
            && cqs.iter().zip(&self.cqs).all(|(cq, serial)| cq.serial() == *serial)
    }

    /// Accounts for an event this waiter read in a sleep on `cqs`: `true` when it was for one of
    /// them. Arms of other CQs than `cqs` are forgotten (the bits name CQs by their place).
    fn read(arms: &mut Option<Arms>, cqs: &[&CompletionQueue<'_>], event: &CompletionEvent) -> bool {
        let at = cqs.iter().position(|cq| event.is_for(cq));
        if arms.as_ref().is_some_and(|a| a.len != cqs.len() || cqs.iter().zip(&a.cqs).any(|(cq, s)| cq.serial() != *s))
        {
            *arms = None;
        }
        if let Some(a) = arms {
            a.reads += 1;
            if let Some(i) = at {
                a.standing &= !(1 << i);
            }
        }
        at.is_some()
    }
}

impl CqWaiter {
    /// A waiter that has not spun yet.
    pub fn new(policy: WaitPolicy) -> Self {
        CqWaiter {
            policy,
            spin_until: None,
            armed: false,
            arms: None,
            #[cfg(feature = "tokio")]
            kept: None,
        }
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

    /// Waits until `step` gives a value (`Ok(Some)`) or `until` passes (`Ok(None)`), spinning,
    /// arming and sleeping on `cqs` in between as the [type docs](Self) describe. `step` is
    /// called at least once, and once more after `until` passed.
    ///
    /// # Errors
    /// `step`'s errors; [`Error::Verb`] when arming a CQ (`ibv_req_notify_cq`), waiting
    /// (`poll(2)`) or reading an event (`ibv_get_cq_event`) fails; [`Error::NothingToWaitFor`]
    /// after the first step for a wait over no CQ with [`Deadline::never`] (nothing could end
    /// it).
    pub fn wait<T>(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        until: Deadline,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        loop {
            if let Some(v) = step()? {
                self.reset();
                return Ok(Some(v));
            }
            if until.has_passed() {
                return Ok(None);
            }
            nothing_wakes(cqs, until)?;
            match self.spin_or_arm(cqs)? {
                Some(Idle::Spun) => std::hint::spin_loop(),
                Some(_) => {}
                None => {
                    self.armed = false;
                    if let Some(v) = sleep_registered(cqs, until, &mut step, &mut self.arms)? {
                        self.reset();
                        return Ok(Some(v));
                    }
                }
            }
        }
    }

    /// [`wait`](Self::wait) for async code (feature `tokio`): until `step` gives a value
    /// (`Ok(Some)`) or `until` passes (`Ok(None)`; [`Deadline::never`] for no end). The spin
    /// yields to the runtime (`tokio::task::yield_now`) instead of busy-polling, and the sleep
    /// awaits the channel's readiness on the reactor of the runtime it runs on (each sleep
    /// registers the fd anew: a queue may be used from one runtime, then another). The CQs
    /// must report to one channel.
    ///
    /// Cancellation-safe: `step` runs only between awaits, and whatever it takes it returns
    /// at once; dropped at an await, the future has taken nothing. At worst the CQs stay armed,
    /// and the event that raises wakes a later wait once.
    ///
    /// # Errors
    /// `step`'s errors; [`Error::InvalidArgument`] when a CQ has no channel or the CQs report
    /// to two; [`Error::NoRuntime`] outside a tokio runtime; as `wait`.
    ///
    /// # Panics
    /// In a runtime without IO enabled, as tokio's own types. (A deadline is a `timerfd` on the
    /// reactor, not a tokio timer: a runtime without time is fine.)
    #[cfg(feature = "tokio")]
    pub async fn wait_async<T>(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        until: Deadline,
        mut step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<Option<T>> {
        crate::wait::reactor::in_runtime("ibv_get_cq_event")?;
        let channel = single_channel(cqs)?;
        loop {
            if let Some(v) = step()? {
                self.reset();
                return Ok(Some(v));
            }
            if until.has_passed() {
                return Ok(None);
            }
            nothing_wakes(cqs, until)?;
            match self.spin_or_arm(cqs)? {
                Some(Idle::Spun) => tokio::task::yield_now().await,
                Some(_) => {}
                None => {
                    self.armed = false;
                    if let Some(v) = sleep_async(channel, cqs, until, &mut step, &mut self.arms).await? {
                        self.reset();
                        return Ok(Some(v));
                    }
                }
            }
        }
    }

    /// One step of a polling loop of one's own, after a round that found nothing: spins, arms
    /// (the next round is the poll after arming), or sleeps on `cqs`' channel(s) until an event
    /// or `until` (see the [type docs](Self); the loop must be the only waiter on its channels).
    ///
    /// # Errors
    /// [`Error::Verb`] when arming a CQ (`ibv_req_notify_cq`), waiting (`poll(2)`) or reading
    /// an event (`ibv_get_cq_event`) fails; [`Error::NothingToWaitFor`] over no CQ without a
    /// deadline.
    pub fn idle(&mut self, cqs: &[&CompletionQueue<'_>], until: Deadline) -> Result<Idle> {
        self.idle_with(cqs, until, &[])
    }

    /// [`idle`](Self::idle), whose sleep also ends when one of `also` is readable
    /// ([`Idle::Signalled`]): the other things a polling loop waits for, such as its
    /// connection's CM event channel or an `eventfd` another thread writes to stop it. So the
    /// loop sleeps until a completion, one of those, or its own next deadline (`until`), and
    /// needs no periodic wake-up to look at them. `also` is polled as it is (level-triggered):
    /// read from each what made it readable before idling again, or the next sleep ends at once.
    ///
    /// # Errors
    /// As [`idle`](Self::idle); [`Error::NothingToWaitFor`] over no CQ and no `also` without a
    /// deadline (nothing could end the sleep).
    pub fn idle_with(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        until: Deadline,
        also: &[BorrowedFd<'_>],
    ) -> Result<Idle> {
        self.idle_quiet_with(cqs, &[], until, also)
    }

    /// [`idle_with`](Self::idle_with) over `cqs`, beside `quiet`: CQs of the same loop whose
    /// completions it polls each round but needs no event of for now (a sender waiting for
    /// room at its peer, whose own WRITEs' completions free nothing it needs). `quiet` CQs are
    /// not armed, and count as the loop's own, so a channel they share with `cqs` is not taken
    /// for one other waits read (the sleep is not sliced for them). An event of an arm they kept
    /// from an earlier step still ends a sleep, once.
    ///
    /// # Errors
    /// As [`idle_with`](Self::idle_with).
    pub fn idle_quiet_with(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        quiet: &[&CompletionQueue<'_>],
        until: Deadline,
        also: &[BorrowedFd<'_>],
    ) -> Result<Idle> {
        if also.is_empty() {
            // Nothing could end a sleep over no CQ without a deadline.
            nothing_wakes(cqs, until)?;
        }
        if let Some(step) = self.spin_or_arm(cqs)? {
            if step == Idle::Spun {
                std::hint::spin_loop();
            }
            return Ok(step);
        }
        self.armed = false;
        let channels = Channels::of(cqs);
        let slice = sliced_if_shared(cqs, quiet, &channels, until);
        Ok(match sleep_on(cqs, &channels, None, also, slice, &mut self.arms)? {
            Woke::Also => Idle::Signalled,
            Woke::Event => Idle::Woken,
            Woke::Nothing => Idle::Slept,
        })
    }

    /// [`idle`](Self::idle) for async code (feature `tokio`): the spin yields to the runtime,
    /// the sleep awaits the channel's readiness on the tokio reactor, for at most `recheck`.
    /// The CQs must report to one channel. The channel's registration with the reactor is made
    /// on the first sleep and kept while the waiter lives: use one waiter within one runtime.
    ///
    /// Cancellation-safe: dropped at its await, it has taken nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a CQ has no channel or the CQs report to several;
    /// [`Error::NothingToWaitFor`] over no CQ (await other readiness directly);
    /// [`Error::NoRuntime`] outside a tokio runtime; as `idle`.
    #[cfg(feature = "tokio")]
    pub async fn idle_async(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        recheck: Option<std::time::Duration>,
    ) -> Result<Idle> {
        self.idle_async_quiet(cqs, &[], recheck).await
    }

    /// [`idle_async`](Self::idle_async) beside `quiet` CQs, as
    /// [`idle_quiet_with`](Self::idle_quiet_with).
    #[cfg(feature = "tokio")]
    async fn idle_async_quiet(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        quiet: &[&CompletionQueue<'_>],
        recheck: Option<std::time::Duration>,
    ) -> Result<Idle> {
        crate::wait::reactor::in_runtime("ibv_get_cq_event")?;
        if cqs.is_empty() {
            return Err(Error::NothingToWaitFor { what: "an async idle step over no CQ" });
        }
        let channel = single_channel(cqs)?;
        if let Some(step) = self.spin_or_arm(cqs)? {
            if step == Idle::Spun {
                tokio::task::yield_now().await;
            }
            return Ok(step);
        }
        self.armed = false;
        let recheck = match recheck {
            _ if !shared(cqs, quiet, &Channels::of(cqs)) => recheck,
            None => Some(SHARED_CHANNEL_SLICE),
            Some(r) => Some(r.min(SHARED_CHANNEL_SLICE)),
        };
        let serial = channel.serial();
        let kept = match self.kept.take().filter(|k| k.serial == serial) {
            Some(kept) => kept,
            None => Kept { serial, watch: channel.watch()?, alarm: None },
        };
        let kept = self.kept.insert(kept);
        let arms = &mut self.arms;
        let woken =
            channel.readable_async_with(&kept.watch, &mut kept.alarm, |e| Arms::read(arms, cqs, e), recheck).await?;
        Ok(if woken { Idle::Woken } else { Idle::Slept })
    }

    /// [`idle_async`](Self::idle_async), whose sleep also ends when one of `also` is ready
    /// ([`Idle::Signalled`]; see [`idle_with`](Self::idle_with)). The readiness that ended it is
    /// cleared: read from each what made it readable before idling again, or what arrives
    /// meanwhile may wake nothing. `also` is looked at first: one the reactor has already seen
    /// ready ends the step before it spins, arms or sleeps (one that became readable since, the
    /// reactor sees when the task next yields).
    ///
    /// # Errors
    /// As [`idle_async`](Self::idle_async); [`Error::Verb`] when the reactor fails on one of
    /// `also`.
    #[cfg(feature = "tokio")]
    pub async fn idle_async_with(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        recheck: Option<std::time::Duration>,
        also: &[&crate::wait::Readiness],
    ) -> Result<Idle> {
        self.idle_async_quiet_with(cqs, &[], recheck, also).await
    }

    /// [`idle_async_with`](Self::idle_async_with) beside `quiet` CQs, as
    /// [`idle_quiet_with`](Self::idle_quiet_with).
    ///
    /// # Errors
    /// As [`idle_async_with`](Self::idle_async_with).
    #[cfg(feature = "tokio")]
    pub async fn idle_async_quiet_with(
        &mut self,
        cqs: &[&CompletionQueue<'_>],
        quiet: &[&CompletionQueue<'_>],
        recheck: Option<std::time::Duration>,
        also: &[&crate::wait::Readiness],
    ) -> Result<Idle> {
        use std::future::Future;
        use std::task::Poll;
        let device = cqs.first().map_or("", |cq| cq.context().name());
        let mut idle = std::pin::pin!(self.idle_async_quiet(cqs, quiet, recheck));
        std::future::poll_fn(|cx| {
            for readiness in also {
                if let Poll::Ready(ready) = readiness.poll_ready(cx) {
                    let ready = ready.map_err(|e| crate::wait::reactor::io_error("epoll_wait", device, &e))?;
                    ready.clear();
                    return Poll::Ready(Ok(Idle::Signalled));
                }
            }
            idle.as_mut().poll(cx)
        })
        .await
    }

    /// Spins while the budget lasts (or forever without channels), else arms once: `None` when
    /// the next step is a sleep.
    fn spin_or_arm(&mut self, cqs: &[&CompletionQueue<'_>]) -> Result<Option<Idle>> {
        let now = Instant::now();
        // A budget too large for an `Instant` spins for the whole wait, as `Duration::MAX` does.
        let spin_until = *self.spin_until.get_or_insert_with(|| now.checked_add(self.policy.spin()));
        let spinning = spin_until.map_or(true, |end| now < end);
        if spinning || !Self::can_sleep(cqs) {
            return Ok(Some(Idle::Spun));
        }
        if !self.armed {
            self.arm(cqs)?;
            self.armed = true;
            return Ok(Some(Idle::Armed));
        }
        Ok(None)
    }

    /// Arms those of `cqs` whose arm does not stand (step 2 of the [type docs](Self)).
    fn arm(&mut self, cqs: &[&CompletionQueue<'_>]) -> Result<()> {
        let channel = Arms::channel_of(cqs);
        // The channel's reads before any arming: an event of these arms read by someone else
        // from here on shows as a read this waiter did not make.
        let reads = channel.map(CompletionChannel::reads);
        let standing = match (self.arms.take(), channel) {
            (Some(a), Some(ch)) if a.hold_for(cqs, ch) => a.standing,
            _ => 0,
        };
        for (i, cq) in cqs.iter().enumerate() {
            if standing & (1 << i) == 0 {
                cq.arm(false)?;
            }
        }
        if let (Some(ch), Some(reads)) = (channel, reads) {
            let mut ids = [0; TRACKED];
            for (id, cq) in ids.iter_mut().zip(cqs) {
                *id = cq.serial();
            }
            let all = ((1u16 << cqs.len()) - 1) as u8;
            self.arms = Some(Arms {
                channel: ch as *const CompletionChannel<'_> as usize,
                reads,
                cqs: ids,
                len: cqs.len(),
                standing: all,
            });
        }
        Ok(())
    }
}

/// A wait over no CQ without a deadline would last for ever (nothing can end it): refused with
/// [`Error::NothingToWaitFor`] once its step found nothing.
fn nothing_wakes(cqs: &[&CompletionQueue<'_>], until: Deadline) -> Result<()> {
    match cqs.is_empty() && until.instant().is_none() {
        true => Err(Error::NothingToWaitFor { what: "completions of no CQ, without a deadline" }),
        false => Ok(()),
    }
}

/// The one channel of `cqs`, for the async waits.
#[cfg(feature = "tokio")]
fn single_channel<'a>(cqs: &[&'a CompletionQueue<'_>]) -> Result<&'a CompletionChannel<'a>> {
    let device = cqs.first().map(|cq| cq.context().name());
    if !CqWaiter::can_sleep(cqs) {
        return Err(Error::invalid(
            "ibv_get_cq_event",
            device,
            "an async wait needs a CQ with a completion channel (`Context::create_cq_with_channel`; \
             `SendQueue::for_async` and `RecvRing::for_async` refuse one without when they are made)",
        ));
    }
    let channels = Channels::of(cqs);
    match (channels.more.is_empty(), channels.few) {
        (true, [Some(channel), None]) => Ok(channel),
        _ => Err(Error::invalid("ibv_get_cq_event", device, "an async wait over CQs of several completion channels")),
    }
}

/// `until`, or at most [`SHARED_CHANNEL_SLICE`] from now when CQs other than `cqs` report to
/// the channels.
fn sliced_if_shared(
    cqs: &[&CompletionQueue<'_>],
    quiet: &[&CompletionQueue<'_>],
    channels: &Channels<'_>,
    until: Deadline,
) -> Deadline {
    if shared(cqs, quiet, channels) {
        until.min(Deadline::after(SHARED_CHANNEL_SLICE))
    } else {
        until
    }
}

/// Whether CQs other than `cqs` report to one of `channels`: their waits may read this wait's
/// events.
fn shared(cqs: &[&CompletionQueue<'_>], quiet: &[&CompletionQueue<'_>], channels: &Channels<'_>) -> bool {
    channels.iter().any(|ch| {
        let ours = cqs.iter().chain(quiet).filter(|cq| cq.channel().is_some_and(|c| std::ptr::eq(c, ch))).count();
        ch.cq_count() > ours
    })
}

/// The distinct completion channels of a wait's CQs, each once: the first two in place, any
/// more in a `Vec`, so that a wait over one or two channels allocates nothing. A blocking sleep
/// watches all of them: an event on any one must wake it.
pub(crate) struct Channels<'a> {
    few: [Option<&'a CompletionChannel<'a>>; 2],
    more: Vec<&'a CompletionChannel<'a>>,
}

impl<'a> Channels<'a> {
    /// The channels of `cqs`, in the order first met.
    pub(crate) fn of(cqs: &[&'a CompletionQueue<'_>]) -> Self {
        let mut out = Channels { few: [None, None], more: Vec::new() };
        for ch in cqs.iter().filter_map(|cq| cq.channel()) {
            if out.iter().any(|c| std::ptr::eq(c, ch)) {
                continue;
            }
            match out.few.iter_mut().find(|c| c.is_none()) {
                Some(free) => *free = Some(ch),
                None => out.more.push(ch),
            }
        }
        out
    }

    /// Each channel once.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &'a CompletionChannel<'a>> + '_ {
        self.few.iter().flatten().copied().chain(self.more.iter().copied())
    }

    /// How many there are.
    pub(crate) fn len(&self) -> usize {
        self.few.iter().flatten().count() + self.more.len()
    }
}

/// The sleep of [`CqWaiter::wait_async`]: registers the channel's fd with the current runtime's
/// reactor and enables a wake-up from the channel's other waits, steps once more, then awaits
/// readiness, the wake-up or `until`.
#[cfg(feature = "tokio")]
async fn sleep_async<T>(
    channel: &CompletionChannel<'_>,
    cqs: &[&CompletionQueue<'_>],
    until: Deadline,
    step: &mut impl FnMut() -> Result<Option<T>>,
    arms: &mut Option<Arms>,
) -> Result<Option<T>> {
    use std::future::Future;
    use std::task::Poll;
    let watch = channel.watch()?;
    let mut woken = std::pin::pin!(channel.sleepers().tasks().notified());
    woken.as_mut().enable();
    let mut readable = std::pin::pin!(watch.readable());
    // Registered for readiness (and the wake-up) before the last step: an event that comes
    // after the step wakes this task, whoever reads it.
    let polled = std::future::poll_fn(|cx| Poll::Ready(readable.as_mut().poll(cx))).await;
    let reads = rearm_if_others_read(cqs, arms)?;
    if let Some(v) = step()? {
        return Ok(Some(v));
    }
    if read_during_step(cqs, reads) {
        *arms = None;
        return Ok(None);
    }
    let either = std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = readable.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        woken.as_mut().poll(cx).map(|()| None)
    });
    let ready = match polled {
        Poll::Ready(r) => Some(r),
        Poll::Pending => {
            match crate::wait::reactor::until(until, either, "ibv_get_cq_event", channel.context().name()).await? {
                Some(r) => r,
                None => return Ok(None),
            }
        }
    };
    // Readable: take the events (waking the others if some were theirs). Woken by another wait:
    // the caller steps again.
    if let Some(guard) = ready {
        let guard = guard?;
        channel.drain_events(|e| Arms::read(arms, cqs, e), None)?;
        guard.clear();
    }
    Ok(None)
}

/// The sleep of [`CqWaiter::wait`]: registers this thread's kick fd with the channels, steps
/// once more, then sleeps until an event, a kick or `until`.
fn sleep_registered<T>(
    cqs: &[&CompletionQueue<'_>],
    until: Deadline,
    step: &mut impl FnMut() -> Result<Option<T>>,
    arms: &mut Option<Arms>,
) -> Result<Option<T>> {
    let channels = Channels::of(cqs);
    let kick = crate::wait::sleepers::this_threads_kick();
    let registered = Registered::new(&channels, kick.as_ref());
    let reads = rearm_if_others_read(cqs, arms)?;
    if let Some(v) = step()? {
        return Ok(Some(v));
    }
    if read_during_step(cqs, reads) {
        *arms = None;
        return Ok(None);
    }
    // Without a registration (no eventfd, or too many sleepers) a shared channel's sleep is
    // sliced, as `idle`'s.
    let until = if registered.complete() { until } else { sliced_if_shared(cqs, &[], &channels, until) };
    sleep_on(cqs, &channels, kick.as_ref(), &[], until, arms)?;
    Ok(None)
}

/// A waiter's check, once registered for wake-ups and before its last step: when an event was
/// read from the channel by someone else since the waiter decided which arms still stand, an
/// arm it kept may be spent (that read took its event), and the reader's wake-up came before
/// the registration, so nothing would end the sleep. Every CQ is armed again then (the last
/// step, after it, sees any completion that came before). Returns the channels' read count as
/// of the check, for [`read_during_step`].
fn rearm_if_others_read(cqs: &[&CompletionQueue<'_>], arms: &mut Option<Arms>) -> Result<u64> {
    let reads = reads_of(cqs);
    let Some(kept) = arms.as_ref() else { return Ok(reads) };
    if Arms::channel_of(cqs).is_some_and(|channel| kept.hold_for(cqs, channel)) {
        return Ok(reads);
    }
    *arms = None;
    for cq in cqs {
        cq.arm(false)?;
    }
    Ok(reads)
}

/// Whether an event was read from the channels of `cqs` since [`rearm_if_others_read`]
/// counted `reads`: then the sleep is skipped and the wait steps and arms again. A read by
/// another thread wakes the registered waiter, but a wait nested in the last step (on this
/// thread, over another CQ of the channel) can read this wait's event and wakes every sleeper
/// but its own thread, or take this thread's wake-up itself: either way the count moved.
fn read_during_step(cqs: &[&CompletionQueue<'_>], reads: u64) -> bool {
    reads_of(cqs) != reads
}

/// The read counts of the channels of `cqs`, summed (each channel once).
fn reads_of(cqs: &[&CompletionQueue<'_>]) -> u64 {
    Channels::of(cqs).iter().map(CompletionChannel::reads).fold(0, u64::wrapping_add)
}

/// What ended a [`sleep_on`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Woke {
    /// The deadline.
    Nothing,
    /// A completion event (or a kick).
    Event,
    /// One of the other fds.
    Also,
}

/// Descriptors one sleep watches without allocating: the kick, two channels and five more.
const IN_PLACE: usize = 8;

/// Sleeps until a channel has an event, `kick` (this thread's eventfd) is written, one of
/// `also` is readable, or `until`; reads and acknowledges one event of each channel `poll(2)`
/// reported readable (an event left pending keeps its fd readable: the next sleep ends at once),
/// waking the channels' sleepers when one was for a CQ outside `cqs`.
fn sleep_on(
    cqs: &[&CompletionQueue<'_>],
    channels: &Channels<'_>,
    kick: Option<&crate::wait::sleepers::Kick>,
    also: &[BorrowedFd<'_>],
    until: Deadline,
    arms: &mut Option<Arms>,
) -> Result<Woke> {
    use std::os::fd::AsFd;
    // The kick first, then every channel, then `also`: in place for up to `IN_PLACE` fds.
    let mut fds =
        kick.map(|k| k.as_fd()).into_iter().chain(channels.iter().map(|ch| ch.as_fd())).chain(also.iter().copied());
    let n = usize::from(kick.is_some()) + channels.len() + also.len();
    let (mut few_fds, mut few_ready, more_fds, mut more_ready);
    let (fds, readable): (&[BorrowedFd<'_>], &mut [bool]) = match fds.next() {
        None => (&[], &mut []),
        Some(first) if n <= IN_PLACE => {
            few_fds = [first; IN_PLACE];
            for (slot, fd) in few_fds[1..].iter_mut().zip(fds) {
                *slot = fd;
            }
            few_ready = [false; IN_PLACE];
            (&few_fds[..n], &mut few_ready[..n])
        }
        Some(first) => {
            more_fds = std::iter::once(first).chain(fds).collect::<Vec<_>>();
            more_ready = vec![false; n];
            (&more_fds, &mut more_ready)
        }
    };
    if let Err(e) = crate::wait::poll_fds(fds, until, readable) {
        let device = channels.iter().next().map(|c| c.context().name());
        return Err(Error::from_errno("ibv_get_cq_event", device, e.raw_os_error().unwrap_or(libc::EIO)));
    }
    let kicked = kick.is_some_and(|k| readable[0] && crate::wait::sleepers::take_kick(k));
    let mut woken = kicked;
    let first_channel = usize::from(kick.is_some());
    for (ch, _) in channels.iter().zip(&readable[first_channel..]).filter(|(_, r)| **r) {
        if let Some(event) = ch.try_recv()? {
            woken = true;
            if !Arms::read(arms, cqs, &event) {
                ch.sleepers().wake_all_but(kick);
            }
        }
    }
    let signalled = readable[n - also.len()..].iter().any(|r| *r);
    Ok(match (signalled, woken) {
        (true, _) => Woke::Also,
        (false, true) => Woke::Event,
        (false, false) => Woke::Nothing,
    })
}

/// This thread's registration with the channels it is about to sleep on; removed on drop
/// (also when the step before the sleep panics).
pub(crate) struct Registered<'r, 'a> {
    channels: &'r Channels<'a>,
    kick: Option<&'r Kick>,
    complete: bool,
}

impl<'r, 'a> Registered<'r, 'a> {
    pub(crate) fn new(channels: &'r Channels<'a>, kick: Option<&'r Kick>) -> Self {
        let mut complete = kick.is_some();
        if let Some(kick) = kick {
            for ch in channels.iter() {
                complete &= ch.sleepers().add(kick);
            }
        }
        Registered { channels, kick, complete }
    }

    /// Whether every channel registered the thread (else its sleep must be sliced).
    pub(crate) fn complete(&self) -> bool {
        self.complete
    }
}

impl Drop for Registered<'_, '_> {
    fn drop(&mut self) {
        if let Some(kick) = self.kick {
            for ch in self.channels.iter() {
                ch.sleepers().remove(kick);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A wait over no CQ and without a deadline is refused: nothing could end its sleep.
    #[test]
    fn a_wait_over_no_cq_without_a_deadline_is_refused_at_once() {
        let mut steps = 0;
        let r = CqWaiter::new(WaitPolicy::sleep_at_once()).wait(&[], Deadline::never(), || {
            steps += 1;
            Ok(None::<()>)
        });
        assert!(matches!(r, Err(Error::NothingToWaitFor { .. })), "{r:?}");
        assert_eq!(steps, 1, "its step ran once");
        let ended =
            CqWaiter::new(WaitPolicy::sleep_at_once())
                .wait(&[], Deadline::after(Duration::from_millis(5)), || Ok(None::<()>));
        assert!(matches!(ended, Ok(None)), "with a deadline it waits to it: {ended:?}");
    }

    /// An idle step over no CQ and without a deadline is refused too (its sleep could never
    /// end); with a deadline it sleeps to it, and with a fd of `also` it wakes for it.
    #[test]
    fn an_idle_step_over_no_cq_without_a_deadline_is_refused() {
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
            let steps: Vec<_> = (0..3).map(|_| waiter.idle(&[], Deadline::never())).collect();
            let _ = done.send(format!("{steps:?}"));
        });
        let steps = finished.recv_timeout(Duration::from_secs(5)).expect("the idle step slept for ever");
        assert!(steps.contains("NothingToWaitFor"), "{steps}");
        let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
        let soon = || Deadline::after(Duration::from_millis(5));
        assert!(matches!(waiter.idle(&[], soon()), Ok(Idle::Armed)));
        assert!(matches!(waiter.idle(&[], soon()), Ok(Idle::Slept)), "with a deadline it sleeps to it");
        let (r, w) = std::os::unix::net::UnixStream::pair().unwrap();
        std::io::Write::write_all(&mut &w, b"x").unwrap();
        use std::os::fd::AsFd;
        let steps: Vec<_> = (0..2).map(|_| waiter.idle_with(&[], Deadline::never(), &[r.as_fd()])).collect();
        assert!(matches!(steps[..], [Ok(Idle::Armed), Ok(Idle::Signalled)]), "{steps:?}");
    }

    /// A budget too large for an `Instant` spins for the whole wait, as `Duration::MAX` does,
    /// rather than ending the spin at once.
    #[test]
    fn a_budget_too_large_for_an_instant_spins() {
        for spin in [Duration::MAX, Duration::from_secs(u64::MAX), Duration::from_secs(u64::MAX / 2)] {
            let mut waiter = CqWaiter::new(WaitPolicy::spin_then_sleep(spin));
            assert_eq!(waiter.spin_or_arm(&[]).unwrap(), Some(Idle::Spun), "{spin:?}");
            std::thread::sleep(Duration::from_millis(5));
            assert_eq!(waiter.spin_or_arm(&[]).unwrap(), Some(Idle::Spun), "{spin:?}");
        }
        let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
        assert_eq!(waiter.spin_or_arm(&[]).unwrap(), Some(Idle::Armed));
        assert_eq!(waiter.spin_or_arm(&[]).unwrap(), None, "armed: the next step sleeps");
    }
}
