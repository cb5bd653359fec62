//! Posting work requests to a queue pair without a safe layer: `unsafe` [`QueuePair::post_send`]
//! and [`QueuePair::post_recv`], with the checks every request passes first.

use super::state::{CanPostRecv, ReadyToSend, Transport};
use super::QueuePair;
use crate::error::{Error, Result};
use crate::post::raw::{self, Posted};
use crate::wr::{RecvRequest, SendRequest};

impl<'res, T: Transport> QueuePair<'res, T, ReadyToSend> {
    /// Posts a chain of send requests with one doorbell: `ibv_post_send()`.
    ///
    /// The requests are linked in slice order. Nothing is allocated.
    ///
    /// # Safety
    /// Until each request has completed (its own completion, or, for an unsignaled one, the
    /// completion of a later signaled request on this QP, or the QP being destroyed):
    /// - no Rust reference to the bytes it reads or writes may be alive (memory regions hand out
    ///   plain slices only through [`as_mut_slice`](crate::MemoryRegion::as_mut_slice) and
    ///   `as_mut_slice_unchecked`: do not call them on these regions meanwhile);
    ///
    /// Inline data is copied during the call and may be reused at once. Dropping a memory region
    /// while a request uses it is sound: deregistration revokes the NIC's access first.
    /// The safe alternative is [`QueuePair::scope`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a request has more SGEs or inline bytes than the QP was
    /// created for (nothing posted); [`Error::PostFailed`] naming how many were posted when
    /// the provider refuses one (`ENOMEM`: the send queue is full).
    #[doc(alias = "ibv_post_send")]
    #[inline]
    pub unsafe fn post_send(&self, wrs: &mut [SendRequest<'_, '_>]) -> Result<()> {
        // SAFETY: the caller keeps this function's contract.
        let posted = unsafe { self.post_send_checked(wrs, false) }?;
        posted.result("ibv_post_send", || self.inner.pd.context().name()).map(drop)
    }

    /// [`post_send`](Self::post_send); `scoped`: the caller is a posting scope, whose tags use
    /// the reserved `wr_id` bits. An error means nothing reached the provider; what the
    /// provider took is the [`Posted`].
    ///
    /// # Safety
    /// As `post_send`.
    #[inline]
    pub(crate) unsafe fn post_send_checked(&self, wrs: &mut [SendRequest<'_, '_>], scoped: bool) -> Result<Posted> {
        self.inner.check_postable("ibv_post_send")?;
        let device = self.inner.pd.context().name();
        let Some(first) =
            crate::wr::link_send(wrs, &self.inner.caps, T::QP_TYPE, self.inner.pd.as_raw(), device, scoped)?
        else {
            return Ok(Posted::all(0));
        };
        // SAFETY: `first` heads a chain of valid requests inside `wrs`, which outlives the call;
        // every SGE names registered memory (the caller keeps it untouched, as documented).
        Ok(unsafe {
            raw::post_send(self.inner.raw.as_ptr(), first, wrs.len(), |bad| crate::wr::index_of_send(wrs, bad))
        })
    }
}

impl<'res, T: Transport, S: CanPostRecv> QueuePair<'res, T, S> {
    /// Posts a chain of receive requests with one doorbell: `ibv_post_recv()`.
    ///
    /// # Safety
    /// Until each request has completed, no Rust reference to the bytes it names may be alive
    /// (see [`post_send`](QueuePair::post_send)). The safe alternative is [`QueuePair::scope`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a QP that takes receives from an SRQ, or a request with
    /// more SGEs than the QP was created for; [`Error::PostFailed`] when the provider refuses one
    /// (`ENOMEM`: the receive queue is full).
    #[doc(alias = "ibv_post_recv")]
    #[inline]
    pub unsafe fn post_recv(&self, wrs: &mut [RecvRequest<'_, '_>]) -> Result<()> {
        // SAFETY: the caller keeps this function's contract.
        let posted = unsafe { self.post_recv_checked(wrs, false) }?;
        posted.result("ibv_post_recv", || self.inner.pd.context().name()).map(drop)
    }

    /// [`post_recv`](Self::post_recv), for a posting scope when `scoped`.
    ///
    /// # Safety
    /// As `post_recv`.
    #[inline]
    pub(crate) unsafe fn post_recv_checked(&self, wrs: &mut [RecvRequest<'_, '_>], scoped: bool) -> Result<Posted> {
        self.inner.check_postable("ibv_post_recv")?;
        let device = self.inner.pd.context().name();
        if self.inner.srq.is_some() {
            return Err(Error::invalid("ibv_post_recv", Some(device), "this QP takes its receives from an SRQ"));
        }
        let Some(first) = crate::wr::link_recv(wrs, self.inner.caps.max_recv_sge, "ibv_post_recv", device, scoped)?
        else {
            return Ok(Posted::all(0));
        };
        // SAFETY: as in `post_send`.
        Ok(unsafe {
            raw::post_recv(self.inner.raw.as_ptr(), first, wrs.len(), |bad| crate::wr::index_of_recv(wrs, bad))
        })
    }
}
