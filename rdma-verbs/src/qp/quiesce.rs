//! Taking a QP's outstanding requests out of the device's reach: the one routine a
//! [`SendQueue`](crate::SendQueue) or [`RecvRing`](crate::RecvRing) being dropped and a posting
//! scope that ends all follow.
//!
//! A request's memory may be reused only once the device is done with it, and the device says
//! so with the request's completion. So a layer that must let go of its requests:
//! 1. if it holds the QP's last handle, resets the QP and lets it be destroyed
//!    ([`reset_before_destroy`]): a destroyed QP is done with every request (rxe waits for its
//!    tasks to go idle);
//! 2. otherwise waits up to its drain timeout for the completions ([`quiesce`]; a ring flushes
//!    first, since receives complete only when a peer sends);
//! 3. then flushes the QP (error state): every request still queued completes, flushed, and
//!    the local device alone makes those completions, so it waits for them at least
//!    [`FLUSH_CONFIRM`] whatever the drain timeout. It flushes even a QP already in error,
//!    because rxe (Linux 6.1 and 6.12) completes receives posted to a QP in error only when moved
//!    to error again;
//! 4. and if completions are still missing after that ([`Quiesced::Lost`]: a CQ overrun by
//!    other QPs loses them) resets the QP, which removes every request without a completion.
//!    A queue or ring does not take the reset's word for it and leaks what never came back; a
//!    posting scope, which must end its borrows, relies on the reset after `FLUSH_CONFIRM` (and
//!    aborts the process if even the reset fails).

use std::sync::Arc;
use std::time::Duration;

use crate::cq::CompletionQueue;
use crate::ffi::ibv_qp_state::{IBV_QPS_ERR, IBV_QPS_RESET};
use crate::wait::deadline::Deadline;
use crate::wait::{CqWaiter, WaitPolicy};

use super::Inner;

/// How long a drain waits, at least, for the completions of a flush before it resets the QP.
///
/// Flushed completions are made by the local device alone (no peer takes part), so they come
/// quickly whatever the drain timeout. Waiting for them matters for soundness: a completion is
/// the device's word that it is done with a request's memory, while on rxe (kernel 6.1) a
/// reset is not: `ibv_modify_qp(RESET)` can return while the kernel is still copying one packet
/// of a READ response into the requester's memory.
/// After five seconds in the error state no such copy is left in progress, and a reset only
/// clears requests whose completions were lost.
pub(crate) const FLUSH_CONFIRM: Duration = Duration::from_secs(5);

/// How long a drain waits, after the flush, for the completions of requests that need none as
/// proof: requests posted unsignaled after the last signaled one (a completion comes for them
/// only if the flush caught them still queued) whose memory the device only reads (a SEND or a
/// WRITE). Those the flush caught complete within milliseconds: waiting this long lets their
/// completions arrive before the layer gives its CQ up, and any packet the device was building
/// from their memory go out first. The rest completed silently before and never report, and a
/// device that still read their memory could not change the bytes Rust code holds, so after
/// this the layer lets them go.
pub(crate) const FLUSH_GRACE: Duration = Duration::from_millis(250);

/// How a layer's outstanding requests left the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Quiesced {
    /// Every one completed within the drain timeout, unflushed.
    Completed,
    /// Every one completed after the QP was flushed.
    Flushed,
    /// Some never completed, even `FLUSH_CONFIRM` after a flush (`flushed`: whether the QP did
    /// enter the error state). Their memory may only be reused after a reset, if at all.
    Lost {
        /// Whether the flush succeeded.
        flushed: bool,
    },
}

/// Whether `qp` is its last handle: dropping it destroys the QP.
pub(crate) fn is_last_handle(qp: &Arc<Inner<'_>>) -> bool {
    Arc::strong_count(qp) == 1
}

/// Step 1: resets the QP whose last handle is about to be dropped, then lets `poll_all` take
/// what the reset left in the CQ. The QP is destroyed when the handle drops.
pub(crate) fn reset_before_destroy(qp: &Inner<'_>, poll_all: impl FnOnce()) {
    if qp.set_state(IBV_QPS_RESET).is_ok() {
        poll_all();
    }
}

/// Steps 2 and 3: `poll` takes what completed and says whether nothing is outstanding any more;
/// it is called at least once per phase, whatever the timeout, so that requests that already
/// completed are never flushed for want of a look. Between polls it spins, then sleeps on
/// `cqs` (the CQs the caller owns and polls: no other thread waits on them) as every wait does
/// ([`CqWaiter`]). `flush_first`: flush before the first wait too (receives, which only a peer
/// completes otherwise). `no_proof_left`, asked after the flush: whether what is still
/// outstanding needs no completion as proof (see [`FLUSH_GRACE`]); then the flush's
/// completions are waited for `FLUSH_GRACE` rather than [`FLUSH_CONFIRM`].
pub(crate) fn quiesce(
    qp: &Inner<'_>,
    cqs: &[&CompletionQueue<'_>],
    drain_timeout: Duration,
    flush_first: bool,
    mut poll: impl FnMut() -> bool,
    no_proof_left: impl FnOnce() -> bool,
) -> Quiesced {
    if flush_first {
        let _ = qp.set_state(IBV_QPS_ERR);
    }
    if wait(cqs, drain_timeout, &mut poll) {
        return if flush_first { Quiesced::Flushed } else { Quiesced::Completed };
    }
    let flushed = qp.set_state(IBV_QPS_ERR).is_ok();
    let confirm = if flushed && no_proof_left() { FLUSH_GRACE } else { drain_timeout.max(FLUSH_CONFIRM) };
    if wait(cqs, confirm, &mut poll) {
        return Quiesced::Flushed;
    }
    Quiesced::Lost { flushed }
}

/// Step 4's reset.
pub(crate) fn reset(qp: &Inner<'_>) -> bool {
    let reset = qp.set_state(IBV_QPS_RESET).is_ok();
    if reset {
        // Typed for another state, in RESET: refuse posts until a transition (`check_postable`).
        qp.set_reset_by_drain(true);
    }
    reset
}

pub(crate) fn wait(cqs: &[&CompletionQueue<'_>], timeout: Duration, poll: &mut impl FnMut() -> bool) -> bool {
    let deadline = Deadline::after(timeout);
    let mut waiter = CqWaiter::new(WaitPolicy::default());
    loop {
        match waiter.wait(cqs, deadline, || Ok(poll().then_some(()))) {
            Ok(done) => return done.is_some(),
            // Arming or sleeping failed: go on polling (a drain must reach its deadline).
            Err(_) if deadline.has_passed() => return poll(),
            Err(_) => std::hint::spin_loop(),
        }
    }
}
