//! Queue pairs: [`QueuePair`], with its transport and state as types.
//!
//! ```text
//! pd.create_qp::<Rc>(..)     QueuePair<Rc, Reset>
//!   .init(..)                QueuePair<Rc, Init>            receives may be posted
//!   .ready_to_receive(..)    QueuePair<Rc, ReadyToReceive>
//!   .ready_to_send(..)       QueuePair<Rc, ReadyToSend>     sends may be posted
//! ```
//! A transition consumes the QP and returns it in its new state. On failure, the plain form
//! (`init`, ...) returns an [`Error`] and drops the QP, so `?` works into any error type; the
//! `try_` form (`try_init`, ...) gives the QP back inside a [`TransitionError`].
//! Only a `QueuePair<_, ReadyToSend>` has send methods:
//!
//! ```compile_fail
//! # use rdma_verbs::*;
//! # fn f(qp: &QueuePair<'_, Rc, Init>, mut wr: SendRequest<'_, '_>) {
//! unsafe { qp.post_send(std::slice::from_mut(&mut wr)) }; // error: no method `post_send` in Init
//! # }
//! ```

pub mod attr;
mod multicast;
mod post;
pub(crate) mod quiesce;
pub mod state;
mod transition;

pub use multicast::MulticastAttachment;
pub(crate) use transition::zeroed_attr;
pub use transition::{Transition, TransitionError};

use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::ffi;

use crate::cq::CompletionQueue;
use crate::device_attr_ex::DeviceCapabilities;
use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;
use crate::post::SendOps;
use crate::srq::SharedReceiveQueue;
use attr::{QpCaps, QpEndpoint};
use state::{QpState, Reset, Transport, TypeState};

/// What a queue pair is created with (`struct ibv_qp_init_attr`): its completion queues,
/// optional SRQ, and queue sizes.
///
/// The CQs and SRQ are given borrowed (`&cq`) or shared (`Arc<CompletionQueue>`), see
/// [`Parent`]; the QP holds them as given.
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until it is used"]
pub struct QpCreateAttr<'res> {
    send_cq: Parent<'res, CompletionQueue<'res>>,
    recv_cq: Parent<'res, CompletionQueue<'res>>,
    srq: Option<Parent<'res, SharedReceiveQueue<'res>>>,
    caps: QpCaps,
    sq_sig_all: bool,
    send_ops: Option<SendOps>,
}

impl<'res> QpCreateAttr<'res> {
    /// Completions of sends go to `send_cq`, of receives to `recv_cq` (they may be the same).
    pub fn new(
        send_cq: impl Into<Parent<'res, CompletionQueue<'res>>>,
        recv_cq: impl Into<Parent<'res, CompletionQueue<'res>>>,
    ) -> Self {
        let (send_cq, recv_cq) = (send_cq.into(), recv_cq.into());
        QpCreateAttr { send_cq, recv_cq, srq: None, caps: QpCaps::default(), sq_sig_all: false, send_ops: None }
    }

    /// Sets the queue sizes.
    pub fn caps(mut self, caps: QpCaps) -> Self {
        self.caps = caps;
        self
    }

    /// Takes receives from a shared receive queue instead of the QP's own.
    pub fn srq(mut self, srq: impl Into<Parent<'res, SharedReceiveQueue<'res>>>) -> Self {
        self.srq = Some(srq.into());
        self
    }

    /// Makes every send signaled, whatever the request says.
    pub fn signal_all(mut self, yes: bool) -> Self {
        self.sq_sig_all = yes;
        self
    }

    /// Creates an extended QP (`ibv_create_qp_ex` with `IBV_QP_INIT_ATTR_SEND_OPS_FLAGS`) that
    /// may post `ops` through [`PostScope::batch`](crate::PostScope::batch)'s builders, besides
    /// `ibv_post_send`.
    #[doc(alias = "ibv_create_qp_ex")]
    #[doc(alias = "send_ops_flags")]
    pub fn send_ops(mut self, ops: SendOps) -> Self {
        self.send_ops = Some(ops);
        self
    }
}

/// A queue pair (`struct ibv_qp`), destroyed on drop.
///
/// `T` is its transport ([`Rc`](state::Rc), [`Uc`](state::Uc), [`Ud`](state::Ud)); `S` the state it was last
/// moved to. It holds its protection domain, completion queues and SRQ, borrowed or shared (see
/// [`Parent`]). The verbs QP is destroyed when the last of this value and the
/// [`SendQueue`](crate::SendQueue)s and [`RecvRing`](crate::RecvRing)s made from it is gone.
///
/// # References
/// - [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
/// - [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
#[doc(alias = "ibv_qp")]
#[must_use = "dropping it at once releases what was just made"]
pub struct QueuePair<'res, T: Transport, S: TypeState> {
    inner: Arc<Inner<'res>>,
    _type: PhantomData<(T, S)>,
}

/// The verbs QP and what it holds, shared by its typed handle and the posting layers made from it.
pub(crate) struct Inner<'res> {
    raw: NonNull<ffi::ibv_qp>,
    pub(crate) pd: Parent<'res, ProtectionDomain<'res>>,
    pub(crate) send_cq: Parent<'res, CompletionQueue<'res>>,
    pub(crate) recv_cq: Parent<'res, CompletionQueue<'res>>,
    srq: Option<Parent<'res, SharedReceiveQueue<'res>>>,
    pub(crate) caps: QpCaps,
    sq_sig_all: bool,
    port: AtomicU8,
    /// The extended QP (`ibv_qp_to_qp_ex`) and the operations it was created with.
    pub(crate) extended: Option<Extended>,
    /// The multicast groups a UD QP is attached to: detached before it is destroyed.
    multicast: multicast::Attachments,
    /// The type 2 memory windows that may be bound to the QP: deallocated before it is
    /// destroyed (see `mw::WindowCell`).
    pub(crate) windows: crate::mw::QpWindows,
    /// Set when a drain reset the QP after completions were lost (`quiesce::reset`): the QP is
    /// in RESET behind a handle typed for another state, and takes no request until a
    /// transition brings it back.
    reset_by_drain: std::sync::atomic::AtomicBool,
}

/// An extended QP's view (`struct ibv_qp_ex`) and the operations it was created with.
pub(crate) type Extended = (NonNull<ffi::ibv_qp_ex>, SendOps);

// SAFETY: ibv_post_send/recv and ibv_modify_qp are thread-safe in libibverbs providers (they lock
// the queues); `Inner` owns the pointer and holds `Sync` parents.
unsafe impl Send for Inner<'_> {}
// SAFETY: as above.
unsafe impl Sync for Inner<'_> {}

impl Inner<'_> {
    pub(crate) fn raw(&self) -> *mut ffi::ibv_qp {
        self.raw.as_ptr()
    }

    pub(crate) fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; `qp_num` is a plain field set at creation.
        unsafe { self.raw.as_ref().qp_num }
    }

    pub(crate) fn device(&self) -> &str {
        self.pd.context().name()
    }

    pub(crate) fn has_srq(&self) -> bool {
        self.srq.is_some()
    }

    /// `ibv_modify_qp` to `state` with only `IBV_QP_STATE` (error or reset).
    /// The QP's state as the device has it: `ibv_query_qp()`.
    pub(crate) fn query_state(&self) -> Result<ffi::ibv_qp_state::Type> {
        let mut attr = MaybeUninit::<ffi::ibv_qp_attr>::zeroed();
        let mut init = MaybeUninit::<ffi::ibv_qp_init_attr>::zeroed();
        // SAFETY: live QP; both out-structs are writable.
        let rc = unsafe {
            ffi::ibv_query_qp(
                self.raw.as_ptr(),
                attr.as_mut_ptr(),
                ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int,
                init.as_mut_ptr(),
            )
        };
        Error::check("ibv_query_qp", Some(self.device()), rc)?;
        // SAFETY: the query succeeded and set `qp_state` (the rest is zeroed plain data).
        Ok(unsafe { attr.assume_init() }.qp_state)
    }

    /// Moves a QP that is in the error state to the error state again, so that receives posted
    /// to it since complete (flushed). The verbs spec has such receives complete flushed at
    /// once; rxe (Linux 6.1 and 6.12) completes them only when the QP is moved to error again,
    /// so a wait for them would never end. Waits that receives could end call this now and then
    /// when nothing came. Does nothing to a QP in any other state.
    pub(crate) fn reflush_if_in_error(&self) {
        if self.query_state().is_ok_and(|s| s == ffi::ibv_qp_state::IBV_QPS_ERR) {
            let _ = self.set_state(ffi::ibv_qp_state::IBV_QPS_ERR);
        }
    }

    /// Refuses a post to a QP a drain reset (see `reset_by_drain`): a provider may queue a
    /// request posted to a QP in RESET and run it after a later transition, when what it names
    /// may be gone, though the post itself failed (rxe's stores the request before its
    /// doorbell is refused).
    pub(crate) fn check_postable(&self, verb: &'static str) -> Result<()> {
        if !self.reset_by_drain.load(std::sync::atomic::Ordering::Acquire) {
            return Ok(());
        }
        let reason = "a drain reset this QP after completions were lost; it takes no request until a \
                      transition (modify_with) brings it out of RESET";
        Err(Error::invalid(verb, Some(self.device()), reason))
    }

    /// Marks the QP reset by a drain (`true`), or brought out of it by a transition.
    pub(crate) fn set_reset_by_drain(&self, reset: bool) {
        self.reset_by_drain.store(reset, std::sync::atomic::Ordering::Release);
    }

    pub(crate) fn set_state(&self, state: ffi::ibv_qp_state::Type) -> Result<()> {
        let mut attr = zeroed_attr(state);
        // SAFETY: live QP; `attr` holds the state the mask names.
        let rc = unsafe {
            ffi::ibv_modify_qp(self.raw.as_ptr(), &mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int)
        };
        Error::check("ibv_modify_qp", Some(self.device()), rc)
    }
}

impl Drop for Inner<'_> {
    #[doc(alias = "ibv_destroy_qp")]
    fn drop(&mut self) {
        // An attached QP cannot be destroyed (`EBUSY`): detach what a caller left attached.
        multicast::detach_all(self);
        // rxe holds a QP a type 2 window is bound to until the window is invalidated or
        // deallocated, and frees it anyway after a long wait: the window's later deallocation
        // would then write to freed kernel memory. Deallocate every such window first; should
        // one refuse, leave the QP to the context, which deallocates windows before QPs.
        if !self.windows.release(&self.pd) {
            return;
        }
        // SAFETY: created by `ibv_create_qp`, destroyed only here. Requests still in flight are
        // discarded by the device; the memory they name stays registered (regions outlive no
        // borrow they do not have) or was deregistered, which revoked the NIC's access.
        let _ = self
            .pd
            .context()
            .registry()
            .release(self.raw.as_ptr(), || unsafe { ffi::ibv_destroy_qp(self.raw.as_ptr()) });
    }
}

impl<T: Transport, S: TypeState> fmt::Debug for QueuePair<'_, T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("transport", &T::NAME)
            .field("state", &std::any::type_name::<S>().rsplit("::").next().unwrap_or("?"))
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

impl<'ctx> ProtectionDomain<'ctx> {
    /// Creates a queue pair of transport `T` in the `Reset` state: `ibv_create_qp()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for queue sizes over the device's limits (`max_qp_wr`,
    /// `max_sge`) or CQs of another device; [`Error::Verb`] when creation fails.
    #[doc(alias = "ibv_create_qp")]
    pub fn create_qp<'res, T: Transport>(&'res self, init: QpCreateAttr<'res>) -> Result<QueuePair<'res, T, Reset>> {
        QueuePair::create(self, init)
    }
}

impl<'res, T: Transport> QueuePair<'res, T, Reset> {
    /// Creates a queue pair of transport `T` in `pd`, borrowed or shared (see [`Parent`]), in the
    /// `Reset` state: `ibv_create_qp()`. With a shared PD and shared CQs the QP is
    /// `QueuePair<'static, ..>`: a thread can own it.
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_qp`].
    ///
    /// # References
    /// - [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
    #[doc(alias = "ibv_create_qp")]
    pub fn create(pd: impl Into<Parent<'res, ProtectionDomain<'res>>>, init: QpCreateAttr<'res>) -> Result<Self> {
        let pd = pd.into();
        let ctx = pd.context();
        let dev = ctx.attr();
        let c = init.caps;
        let bad = |reason: String| Err(Error::invalid("ibv_create_qp", Some(ctx.name()), reason));
        if c.max_send_wr > dev.max_qp_wr || c.max_recv_wr > dev.max_qp_wr {
            return bad(format!(
                "{} send / {} receive requests: the device allows {}",
                c.max_send_wr, c.max_recv_wr, dev.max_qp_wr
            ));
        }
        if c.max_send_sge > dev.max_sge || c.max_recv_sge > dev.max_sge {
            return bad(format!(
                "{} send / {} receive SGEs: the device allows {}",
                c.max_send_sge, c.max_recv_sge, dev.max_sge
            ));
        }
        if !std::ptr::eq(init.send_cq.context(), ctx) || !std::ptr::eq(init.recv_cq.context(), ctx) {
            return bad("the completion queues belong to another device context".into());
        }
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: std::ptr::null_mut(),
            send_cq: init.send_cq.as_raw(),
            recv_cq: init.recv_cq.as_raw(),
            srq: init.srq.as_ref().map_or(std::ptr::null_mut(), |s| s.as_raw()),
            cap: ffi::ibv_qp_cap {
                max_send_wr: c.max_send_wr,
                max_recv_wr: if init.srq.is_some() { 0 } else { c.max_recv_wr },
                max_send_sge: c.max_send_sge,
                max_recv_sge: c.max_recv_sge,
                max_inline_data: c.max_inline_data,
            },
            qp_type: T::QP_TYPE,
            sq_sig_all: i32::from(init.sq_sig_all),
        };
        if let Some(srq) = &init.srq {
            if !std::ptr::eq(srq.pd().context(), ctx) {
                return bad("the shared receive queue belongs to another device context".into());
            }
            if !srq.note_qp_cq(init.recv_cq.as_raw()) {
                return bad(
                    "a receive ring owns the SRQ and polls another CQ: use the ring's CQ as the receive CQ".into()
                );
            }
        }
        let (raw, extended) = match init.send_ops {
            None => {
                // SAFETY: live PD, CQs and SRQ (held by the QP for its whole life); `attr` is
                // initialised.
                let raw = unsafe { ffi::ibv_create_qp(pd.as_raw(), &mut attr) };
                (NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_create_qp", Some(ctx.name())))?, None)
            }
            Some(ops) => create_extended(&pd, &mut attr, ops)?,
        };
        // The provider wrote the sizes it actually gave back into `attr.cap`.
        let caps = QpCaps {
            max_send_wr: attr.cap.max_send_wr,
            max_recv_wr: attr.cap.max_recv_wr,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            max_inline_data: attr.cap.max_inline_data,
        };
        pd.context().registry().add(crate::registry::Kind::Qp, raw.as_ptr());
        let inner = Inner {
            raw,
            pd,
            send_cq: init.send_cq,
            recv_cq: init.recv_cq,
            srq: init.srq,
            caps,
            sq_sig_all: init.sq_sig_all,
            port: AtomicU8::new(0),
            extended,
            multicast: multicast::Attachments::default(),
            windows: crate::mw::QpWindows::default(),
            reset_by_drain: std::sync::atomic::AtomicBool::new(false),
        };
        Ok(QueuePair { inner: Arc::new(inner), _type: PhantomData })
    }
}

/// `ibv_create_qp_ex()` with `attr` and `ops`, then its extended view (`ibv_qp_to_qp_ex`).
fn create_extended(
    pd: &ProtectionDomain<'_>,
    attr: &mut ffi::ibv_qp_init_attr,
    ops: SendOps,
) -> Result<(NonNull<ffi::ibv_qp>, Option<Extended>)> {
    const VERB: &str = "ibv_create_qp_ex";
    let ctx = pd.context();
    if ops.contains(SendOps::ATOMIC_WRITE) && !ctx.capabilities().contains(DeviceCapabilities::ATOMIC_WRITE) {
        let reason = "the device does not advertise atomic write (IB_UVERBS_DEVICE_ATOMIC_WRITE, Linux 6.2 for rxe)";
        return Err(Error::unsupported(VERB, Some(ctx.name()), reason));
    }
    // SAFETY: `ibv_qp_init_attr_ex` is integers, pointers and a union of them: all-zero is valid.
    let mut ex: ffi::ibv_qp_init_attr_ex = unsafe { std::mem::zeroed() };
    ex.qp_context = attr.qp_context;
    ex.send_cq = attr.send_cq;
    ex.recv_cq = attr.recv_cq;
    ex.srq = attr.srq;
    ex.cap = attr.cap;
    ex.qp_type = attr.qp_type;
    ex.sq_sig_all = attr.sq_sig_all;
    ex.comp_mask = ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0
        | ffi::ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_SEND_OPS_FLAGS.0;
    ex.pd = pd.as_raw();
    ex.send_ops_flags = ops.bits();
    // SAFETY: live context, PD, CQs and SRQ (held by the QP for its whole life); `ex` is
    // initialised.
    let raw = unsafe { crate::ffi_compat::create_qp_ex(ctx.as_raw(), &mut ex) };
    let Some(raw) = NonNull::new(raw) else {
        let e = Error::last_os_error(VERB, Some(ctx.name()));
        return Err(match e.errno() {
            Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                verb: VERB,
                device: Some(ctx.name().to_owned()),
                reason: format!("the provider cannot create a QP with {ops:?}"),
                errno: Some(errno),
            },
            _ => e,
        });
    };
    attr.cap = ex.cap;
    // SAFETY: a QP just created with `ibv_create_qp_ex`.
    let qpx = unsafe { ffi::ibv_qp_to_qp_ex(raw.as_ptr()) };
    let Some(qpx) = NonNull::new(qpx) else {
        // SAFETY: created above, not yet owned by anything: destroyed once, here.
        unsafe { ffi::ibv_destroy_qp(raw.as_ptr()) };
        return Err(Error::unsupported(VERB, Some(ctx.name()), "the provider gave a QP without its extended view"));
    };
    Ok((raw, Some((qpx, ops))))
}

impl<'res, T: Transport, S: TypeState> QueuePair<'res, T, S> {
    /// The operations this QP was created to post through batches
    /// ([`QpCreateAttr::send_ops`]); `None` for a QP made with `ibv_create_qp`.
    pub fn send_ops(&self) -> Option<SendOps> {
        self.inner.extended.map(|(_, ops)| ops)
    }

    /// The extended view and its operations, for batches.
    pub(crate) fn extended(&self) -> Option<Extended> {
        self.inner.extended
    }

    /// The QP number, which peers address.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live; `qp_num` is a plain field set at creation.
        unsafe { self.inner.raw.as_ref().qp_num }
    }

    /// The queue sizes the device actually gave.
    pub fn caps(&self) -> QpCaps {
        self.inner.caps
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain<'res> {
        &self.inner.pd
    }

    /// The completion queue of sends.
    pub fn send_cq(&self) -> &CompletionQueue<'res> {
        &self.inner.send_cq
    }

    /// The completion queue of receives.
    pub fn recv_cq(&self) -> &CompletionQueue<'res> {
        &self.inner.recv_cq
    }

    /// The shared receive queue receives come from, if any.
    pub fn srq(&self) -> Option<&SharedReceiveQueue<'res>> {
        self.inner.srq.as_deref()
    }

    /// Whether every send is signaled (`sq_sig_all`).
    pub fn signals_all(&self) -> bool {
        self.inner.sq_sig_all
    }

    /// The port set by [`init`](QueuePair::init); 0 before.
    pub fn port(&self) -> u8 {
        self.inner.port.load(Ordering::Relaxed)
    }

    /// The state the device reports now: `ibv_query_qp()`. This is how the error state, which
    /// the device enters on its own, is seen.
    ///
    /// # Errors
    /// [`Error::Verb`] when the query fails.
    #[doc(alias = "ibv_query_qp")]
    pub fn state(&self) -> Result<QpState> {
        self.inner.query_state().map(QpState::from_raw)
    }

    /// Moves the QP to the error state (`ibv_modify_qp` to `IBV_QPS_ERR`): every outstanding
    /// request completes with [`WcStatus::WrFlushError`](crate::WcStatus::WrFlushError).
    ///
    /// # Errors
    /// [`Error::Verb`] when the transition fails.
    pub fn flush(&self) -> Result<()> {
        // SAFETY: zeroed `ibv_qp_attr` is valid.
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = ffi::ibv_qp_state::IBV_QPS_ERR;
        self.modify(&mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }

    /// Whether receives come from a shared receive queue.
    pub(crate) fn has_srq(&self) -> bool {
        self.inner.srq.is_some()
    }

    /// The shared state, for the posting layers that keep the QP alive.
    pub(crate) fn shared(&self) -> &Arc<Inner<'res>> {
        &self.inner
    }

    /// The raw `struct ibv_qp *`. It stays owned by `self`; changing its state behind this
    /// type's back makes the type lie, not the program unsound.
    pub fn as_raw(&self) -> *mut ffi::ibv_qp {
        self.inner.raw.as_ptr()
    }
}

impl<'res, T: Transport, S: TypeState> QueuePair<'res, T, S> {
    /// This side's [`QpEndpoint`] to give the peer: QP number, the PSN this side will start
    /// sending at, and the GID at `gid_index` of the QP's port (set by `init`).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] before `init` (no port yet); what
    /// [`Context::query_gid`](crate::Context::query_gid) returns.
    pub fn endpoint(&self, gid_index: u8, psn: u32) -> Result<QpEndpoint> {
        let ctx = self.inner.pd.context();
        let port = self.port();
        if port == 0 {
            return Err(Error::invalid("ibv_query_gid_ex", Some(ctx.name()), "the QP has no port before init"));
        }
        let gid = ctx.query_gid(port, gid_index)?.gid;
        let lid = ctx.query_port(port)?.lid;
        Ok(QpEndpoint { qp_num: self.qp_num(), psn: psn & 0x00ff_ffff, gid, lid })
    }
}
