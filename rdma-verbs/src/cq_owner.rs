//! Who owns a completion queue's completions, and how an owner hands the CQ on.
//!
//! A posting scope, a [`SendQueue`](crate::SendQueue) and a [`RecvRing`](crate::RecvRing) count
//! on seeing every completion of their requests, so each takes its CQs for itself while it
//! lives ([`CqOwner`]): one owner at a time, and no direct
//! [`CompletionQueue::poll`](crate::CompletionQueue::poll) meanwhile ([`Error::Busy`] names the
//! holder). The rules an owner keeps:
//! - it lets go only when none of its requests can complete any more: each completed and was
//!   taken, or its QP or SRQ is destroyed first (the owner's fields drop in that order);
//! - a send queue or a ring then discards what the CQ still holds, so that the next owner never
//!   sees a completion of the previous one (its `wr_id` tags tell owners apart only up to a
//!   generation counter that wraps: `wr_id.rs`); a posting scope hands every completion to its
//!   caller, its own included, and leaves the others where they are;
//! - an owner that cannot prove its requests done (it leaked their slots, or an SRQ adopted its
//!   receives) keeps the CQ owned for good.

use crate::cq::CompletionQueue;
use crate::cq_holder::CqHolder;
use crate::error::Result;
use crate::parent::Parent;
use crate::wc::WorkCompletion;

/// Ownership of a CQ's completions (see the module docs). Released on drop; forgetting it
/// leaves the CQ owned for good.
pub(crate) struct CqOwner<'res> {
    cq: Parent<'res, CompletionQueue<'res>>,
    holder: CqHolder,
    keep: bool,
}

impl<'res> CqOwner<'res> {
    /// Takes `cq` for `holder`.
    ///
    /// # Errors
    /// [`Error::Busy`](crate::Error::Busy) (for `what`) when another owner holds it.
    pub(crate) fn claim(cq: Parent<'res, CompletionQueue<'res>>, holder: CqHolder, what: &'static str) -> Result<Self> {
        cq.own(holder, what)?;
        Ok(CqOwner { cq, holder, keep: false })
    }

    /// Keeps the CQ owned for good: its owner leaked requests whose completions may still
    /// come, and no later owner may count them as its own.
    pub(crate) fn keep_forever(&mut self) {
        self.keep = true;
    }

    #[inline]
    pub(crate) fn poll<'o>(&self, out: &'o mut [WorkCompletion]) -> Result<&'o mut [WorkCompletion]> {
        self.cq.poll_owned(out)
    }

    pub(crate) fn cq(&self) -> &CompletionQueue<'res> {
        &self.cq
    }

    /// A handle on the CQ (a reference or an `Arc`) that does not borrow the owner: for a wait
    /// that sleeps on the CQ while its steps poll through the owner.
    pub(crate) fn handle(&self) -> Parent<'res, CompletionQueue<'res>> {
        self.cq.clone()
    }
}

impl Drop for CqOwner<'_> {
    /// Discards what the CQ still holds (a send queue's or a ring's), then lets it go.
    ///
    /// Completions the owner left unpolled (a ring whose SRQ or QP was destroyed with receives
    /// done but not taken) must not reach a later owner, which could take one for a request of
    /// its own that the device still holds. They are discarded with those of other QPs, which
    /// these owners discard anyway. The CQ held at most `capacity` completions when this
    /// started, and none of the owner's can come after them.
    fn drop(&mut self) {
        if self.keep {
            return;
        }
        if self.holder != CqHolder::PostingScope {
            let mut wcs = [WorkCompletion::default(); 16];
            let mut left = self.cq.capacity();
            while left > 0 {
                let take = left.min(wcs.len());
                match self.cq.poll_owned(&mut wcs[..take]) {
                    Ok(got) if !got.is_empty() => left -= got.len(),
                    _ => break,
                }
            }
        }
        self.cq.disown();
    }
}
