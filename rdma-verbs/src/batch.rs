//! Extended posting: [`WrBatch`], the work-request builders of `ibv_wr_post(3)` (`ibv_wr_start`,
//! `ibv_wr_*`, `ibv_wr_complete` / `ibv_wr_abort`, all made by `post::raw`) for the operations
//! an extended QP was created with ([`SendOps`]).
//!
//! A QP created with [`QpCreateAttr::send_ops`](crate::QpCreateAttr::send_ops) is an extended
//! QP (`ibv_create_qp_ex`); its posting scope opens batches with [`PostScope::batch`]. A batch
//! takes the same [`SendRequest`]s as [`PostScope::post_send`], checked the same way, and posts
//! them with one `ibv_wr_complete`. It cannot be left half-built: it is completed by
//! [`complete`](WrBatch::complete), or aborted when dropped (also on panic). While it is open it
//! borrows the scope, so nothing else can post through it:
//!
//! ```compile_fail
//! # use rdma_verbs::*;
//! # fn f(s: &mut PostScope<'_, '_, Rc, ReadyToSend>, wr: SendRequest<'_, '_>) -> Result<()> {
//! let mut batch = s.batch()?;
//! s.post_send(&mut [wr])?; // error: `*s` is borrowed by the open batch
//! batch.complete()?;
//! # Ok(()) }
//! ```
//!
//! # References
//! - [`ibv_wr_post(3)`](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html)
//! - [`ibv_create_qp_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp_ex.3.html)

use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::ffi;

use crate::error::{Error, Result};
use crate::post::raw::{self, Builders};
use crate::post::SendOps;
use crate::qp::state::{ReadyToSend, Transport};
use crate::scope::PostScope;
use crate::wr::SendRequest;
use crate::wr_id::SCOPE_SEND;

/// An open batch of work requests on an extended QP: `ibv_wr_start()` when made, the
/// `ibv_wr_*` builders for each [`push`](Self::push), then `ibv_wr_complete()`
/// ([`complete`](Self::complete)) or, when dropped unfinished, `ibv_wr_abort()`.
///
/// Made by [`PostScope::batch`]. The provider holds the QP's send-queue lock while the batch is
/// open, so a batch is not `Send` (it is completed on the thread that opened it) and should be
/// short: another thread posting to the QP waits meanwhile. A batch leaked with
/// `mem::forget` is aborted by its scope when the scope is next used on this thread, or when it
/// ends: nothing of the batch is posted, and until then other threads' posts to the QP wait.
///
/// # References
/// - [`ibv_wr_post(3)`](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html)
#[doc(alias = "ibv_wr_start")]
#[must_use = "a batch posts nothing until it is completed; dropping it aborts it"]
pub struct WrBatch<'b, 's, 'env, T: Transport> {
    scope: &'b mut PostScope<'s, 'env, T, ReadyToSend>,
    qpx: NonNull<ffi::ibv_qp_ex>,
    ops: SendOps,
    added: usize,
    /// How many requests the queues and CQs have room for, counted when the batch opened
    /// (nothing else posts through the scope while the batch borrows it).
    room: usize,
    finished: bool,
    /// Requests of more than one SGE or inline buffer are refused (rxe's builders).
    one_buffer_only: bool,
    /// Not `Send`: the provider's lock is this thread's until complete or abort.
    _thread: PhantomData<*const ()>,
}

impl<'s, 'env, T: Transport> PostScope<'s, 'env, T, ReadyToSend> {
    /// Opens a batch of work requests on this scope's extended QP: `ibv_wr_start()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the QP was not created with
    /// [`QpCreateAttr::send_ops`](crate::QpCreateAttr::send_ops).
    #[doc(alias = "ibv_wr_start")]
    pub fn batch(&mut self) -> Result<WrBatch<'_, 's, 'env, T>> {
        let qp = self.qp();
        let Some((qpx, ops)) = qp.extended() else {
            let device = qp.pd().context().name();
            return Err(Error::invalid("ibv_wr_start", Some(device), "the QP was created without send_ops"));
        };
        qp.shared().check_postable("ibv_wr_start")?;
        self.end_forgotten_batch();
        // SAFETY: a live extended QP (held by the scope's borrow); the batch ends with complete
        // or abort, on this thread (`WrBatch` is not `Send`), or by the scope once it is
        // forgotten (`end_forgotten_batch`, on this thread).
        unsafe { raw::start(qpx) };
        self.open_batch = Some(std::thread::current().id());
        let one_buffer_only = qp.pd().context().is_soft_roce();
        let room = self.send_room();
        Ok(WrBatch { scope: self, qpx, ops, added: 0, room, finished: false, one_buffer_only, _thread: PhantomData })
    }
}

impl<'s, T: Transport> WrBatch<'_, 's, '_, T> {
    /// Adds a request to the batch: the `ibv_wr_*` builder of its operation, its SGEs
    /// (`ibv_wr_set_sge_list`) or inline data (`ibv_wr_set_inline_data`, or `_list` for
    /// several buffers), its address (`ibv_wr_set_ud_addr`). On rxe a request takes one SGE or
    /// inline buffer at most: rdma-core's rxe builders before version 64 set the length of
    /// several wrongly (`docs/verbs-coverage.md`). It is made signaled, and its regions stay borrowed until the
    /// scope ends, as with [`PostScope::post_send`].
    ///
    /// # Errors
    /// As `post_send` for the request itself ([`Error::InvalidArgument`], [`Error::QueueFull`]
    /// counting the batch's requests), and [`Error::InvalidArgument`] for an operation the QP
    /// was not created with, [`Error::Unsupported`] for one the provider has no builder for.
    /// Nothing is added on error; the batch stays open.
    pub fn push(&mut self, wr: &SendRequest<'_, 's>) -> Result<()> {
        // The checks of `post_send`, with the queues' room counted once, when the batch opened:
        // one request costs what it costs there (instructions per request: docs/results).
        if self.added >= self.room {
            self.scope.check_room_beside(self.added, 1, 0)?;
        }
        self.scope.check_request(wr)?;
        let refuse =
            |reason: String| Error::invalid("ibv_wr_post", Some(self.scope.qp().pd().context().name()), reason);
        if self.one_buffer_only && wr.buffers() > 1 {
            return Err(refuse(format!(
                "request with wr_id {}: {} buffers; rxe's builders (rdma-core before 64) count only the first \
                 SGE's length (ibv_wr_set_sge_list) or none (ibv_wr_set_inline_data_list): post it with post_send",
                wr.wr_id(),
                wr.buffers()
            )));
        }
        let send_op = wr.send_op();
        let op = send_op.map_or(SendOps::empty(), |o| o.send_ops());
        let Some(send_op) = send_op.filter(|_| self.ops.contains(op)) else {
            return Err(refuse(format!(
                "request with wr_id {}: the QP was created without SendOps::{op:?}",
                wr.wr_id()
            )));
        };
        // SAFETY: `qpx` is the live extended QP the scope borrows.
        let builders = unsafe { Builders::of(self.qpx) };
        // SAFETY: this batch is open on the live extended QP, on this thread, and the operation
        // is among the QP's; the request's regions are borrowed for 's, until the scope saw it
        // complete (as `post_send`).
        unsafe { wr.build_ex(self.qpx, &builders, &send_op, wr.wr_id() | SCOPE_SEND, true) }.map_err(|builder| {
            Error::unsupported(
                "ibv_wr_post",
                Some(self.scope.qp().pd().context().name()),
                format!("the provider has no {builder}"),
            )
        })?;
        self.added += 1;
        Ok(())
    }

    /// How many requests the batch holds.
    pub fn len(&self) -> usize {
        self.added
    }

    /// Whether the batch holds none.
    pub fn is_empty(&self) -> bool {
        self.added == 0
    }

    /// Posts the batch: `ibv_wr_complete()`. Returns how many requests were posted.
    ///
    /// # Errors
    /// [`Error::PostFailed`] when the provider refuses the batch: its requests count as maybe
    /// posted (`posted` is all of them; a provider may have queued them before refusing), and
    /// the scope waits for them as for any outstanding request.
    #[doc(alias = "ibv_wr_complete")]
    pub fn complete(mut self) -> Result<usize> {
        self.finished = true;
        self.scope.open_batch = None;
        // SAFETY: the batch is open on this thread; its requests' regions are borrowed for 's.
        let posted = unsafe { raw::complete(self.qpx, self.added) };
        // Counted even when refused (`post::raw`: a refused batch may be queued), so the
        // scope's drain waits for them, flushes them, or resets the QP before their regions'
        // borrows end.
        self.scope.count_sends(posted.in_flight());
        posted.result("ibv_wr_complete", || self.scope.qp().pd().context().name())
    }
}

impl<T: Transport> Drop for WrBatch<'_, '_, '_, T> {
    #[doc(alias = "ibv_wr_abort")]
    fn drop(&mut self) {
        if !self.finished {
            self.scope.open_batch = None;
            // SAFETY: the batch is open on this thread; aborting discards its requests.
            unsafe { raw::abort(self.qpx) };
        }
    }
}
