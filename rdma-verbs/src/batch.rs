//! Extended posting: [`SendOps`] and [`WrBatch`], the work-request builders of
//! `ibv_wr_post(3)` (`ibv_wr_start`, `ibv_wr_*`, `ibv_wr_complete` / `ibv_wr_abort`).
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
use crate::qp::state::{ReadyToSend, Transport};
use crate::scope::PostScope;
use crate::wr::SendRequest;
use crate::wr_id::SCOPE_SEND;

bitflags::bitflags! {
    /// The operations an extended QP may post (`enum ibv_qp_create_send_ops_flags`); a request
    /// of another kind is refused by its batch.
    #[doc(alias = "ibv_qp_create_send_ops_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct SendOps: u64 {
        /// `IBV_QP_EX_WITH_RDMA_WRITE`.
        const RDMA_WRITE = 1;
        /// `IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM`.
        const RDMA_WRITE_WITH_IMM = 1 << 1;
        /// `IBV_QP_EX_WITH_SEND`.
        const SEND = 1 << 2;
        /// `IBV_QP_EX_WITH_SEND_WITH_IMM`.
        const SEND_WITH_IMM = 1 << 3;
        /// `IBV_QP_EX_WITH_RDMA_READ`.
        const RDMA_READ = 1 << 4;
        /// `IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP`.
        const ATOMIC_CMP_AND_SWP = 1 << 5;
        /// `IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD`.
        const ATOMIC_FETCH_AND_ADD = 1 << 6;
        /// `IBV_QP_EX_WITH_LOCAL_INV`.
        const LOCAL_INV = 1 << 7;
        /// `IBV_QP_EX_WITH_BIND_MW`.
        const BIND_MW = 1 << 8;
        /// `IBV_QP_EX_WITH_SEND_WITH_INV`.
        const SEND_WITH_INV = 1 << 9;
        /// `IBV_QP_EX_WITH_ATOMIC_WRITE` (rdma-core 43; rxe from Linux 6.2).
        const ATOMIC_WRITE = 1 << 12;
    }
}

/// An open batch of work requests on an extended QP: `ibv_wr_start()` when made, the
/// `ibv_wr_*` builders for each [`push`](Self::push), then `ibv_wr_complete()`
/// ([`complete`](Self::complete)) or, when dropped unfinished, `ibv_wr_abort()`.
///
/// Made by [`PostScope::batch`]. The provider holds the QP's send-queue lock while the batch is
/// open, so a batch is not `Send` (it is completed on the thread that opened it) and should be
/// short: another thread posting to the QP waits meanwhile. A batch leaked with
/// `mem::forget` keeps that lock, and every later post to the QP waits for ever (no memory is
/// touched: nothing of the batch was posted).
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
        // SAFETY: a live extended QP (held by the scope's borrow); the batch ends with complete
        // or abort, on this thread (`WrBatch` is not `Send`).
        unsafe { ffi::ibv_wr_start(qpx.as_ptr()) };
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
        let op = wr.send_op();
        if op.is_empty() || !self.ops.contains(op) {
            return Err(refuse(format!(
                "request with wr_id {}: the QP was created without SendOps::{op:?}",
                wr.wr_id()
            )));
        }
        // SAFETY: this batch is open on the live extended QP, on this thread; the request's
        // regions are borrowed for 's, until the scope saw it complete (as `post_send`).
        unsafe { wr.build_ex(self.qpx.as_ptr(), wr.wr_id() | SCOPE_SEND, true) }.map_err(|builder| {
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
        // SAFETY: the batch is open on this thread.
        let rc = unsafe { ffi::ibv_wr_complete(self.qpx.as_ptr()) };
        // Counted even when refused: a provider may have queued the requests before its
        // doorbell was refused (rxe's does), so the scope's drain waits for them, flushes them,
        // or resets the QP before their regions' borrows end.
        self.scope.count_sends(self.added);
        if rc != 0 {
            return Err(Error::post_failed("ibv_wr_complete", self.scope.qp().pd().context().name(), rc, self.added));
        }
        Ok(self.added)
    }
}

impl<T: Transport> Drop for WrBatch<'_, '_, '_, T> {
    #[doc(alias = "ibv_wr_abort")]
    fn drop(&mut self) {
        if !self.finished {
            // SAFETY: the batch is open on this thread; aborting discards its requests.
            unsafe { ffi::ibv_wr_abort(self.qpx.as_ptr()) };
        }
    }
}

/// Type of a builder with no argument but the QP.
type Builder0 = Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex)>;
/// Type of a builder of an RDMA operation (key, address).
type RdmaBuilder = Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64)>;

/// The builders of an extended QP (`struct ibv_qp_ex`'s `wr_*` members), copied out of it.
///
/// No reference to the `ibv_qp_ex` is ever made: the provider reads and writes it during every
/// builder call, and `ibv_modify_qp` on another thread writes its `qp_base`. Its members are
/// read and written through the pointer only: [`Builders::of`], [`set_request`].
#[derive(Clone, Copy)]
pub(crate) struct Builders {
    pub(crate) send: Builder0,
    pub(crate) send_imm: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32)>,
    pub(crate) send_inv: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32)>,
    pub(crate) rdma_write: RdmaBuilder,
    pub(crate) rdma_write_imm: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32)>,
    pub(crate) rdma_read: RdmaBuilder,
    pub(crate) atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u64, u64)>,
    pub(crate) atomic_fetch_add: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u64)>,
    pub(crate) atomic_write: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, *const libc::c_void)>,
    pub(crate) local_inv: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32)>,
    pub(crate) bind_mw:
        Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut ffi::ibv_mw, u32, *const ffi::ibv_mw_bind_info)>,
    pub(crate) set_ud_addr: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut ffi::ibv_ah, u32, u32)>,
    pub(crate) set_inline_data: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut libc::c_void, usize)>,
    pub(crate) set_inline_data_list: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, usize, *const ffi::ibv_data_buf)>,
    pub(crate) set_sge: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32)>,
    pub(crate) set_sge_list: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, usize, *const ffi::ibv_sge)>,
}

impl Builders {
    /// The builders of the extended QP `qpx`, each member read by value through the pointer.
    ///
    /// # Safety
    /// `qpx` is a live extended QP.
    pub(crate) unsafe fn of(qpx: *mut ffi::ibv_qp_ex) -> Self {
        // SAFETY: the caller's contract; each member is a plain function pointer the provider
        // set at creation, read by value (no reference to the struct is made).
        unsafe {
            Builders {
                send: (*qpx).wr_send,
                send_imm: (*qpx).wr_send_imm,
                send_inv: (*qpx).wr_send_inv,
                rdma_write: (*qpx).wr_rdma_write,
                rdma_write_imm: (*qpx).wr_rdma_write_imm,
                rdma_read: (*qpx).wr_rdma_read,
                atomic_cmp_swp: (*qpx).wr_atomic_cmp_swp,
                atomic_fetch_add: (*qpx).wr_atomic_fetch_add,
                atomic_write: (*qpx).wr_atomic_write,
                local_inv: (*qpx).wr_local_inv,
                bind_mw: (*qpx).wr_bind_mw,
                set_ud_addr: (*qpx).wr_set_ud_addr,
                set_inline_data: (*qpx).wr_set_inline_data,
                set_inline_data_list: (*qpx).wr_set_inline_data_list,
                set_sge: (*qpx).wr_set_sge,
                set_sge_list: (*qpx).wr_set_sge_list,
            }
        }
    }
}

/// Sets the `wr_id` and `wr_flags` the next builder of the batch open on `qpx` takes, through
/// the pointer.
///
/// # Safety
/// `qpx` is a live extended QP with a batch open by this thread.
pub(crate) unsafe fn set_request(qpx: *mut ffi::ibv_qp_ex, wr_id: u64, flags: u32) {
    // SAFETY: the caller's contract; two plain members the provider reads in the next builder,
    // written through the pointer (no reference to the struct is made).
    unsafe {
        (*qpx).wr_id = wr_id;
        (*qpx).wr_flags = flags;
    }
}
