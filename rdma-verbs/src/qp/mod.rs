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
pub mod state;

use std::fmt;
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use crate::ffi;

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;
use crate::srq::SharedReceiveQueue;
use crate::wr::{RecvRequest, SendRequest};
use attr::{InitAttr, QpCaps, QpEndpoint, RtrAttr, RtsAttr};
use state::{CanPostRecv, Connected, Init, QpState, ReadyToReceive, ReadyToSend, Reset, State, Transport, Ud};

/// What a queue pair is created with (`struct ibv_qp_init_attr`): its completion queues,
/// optional SRQ, and queue sizes.
///
/// The CQs and SRQ are given borrowed (`&cq`) or shared (`Arc<CompletionQueue>`), see
/// [`Parent`]; the QP holds them as given.
#[doc(alias = "ibv_qp_init_attr")]
#[derive(Debug, Clone)]
pub struct QpCreateAttr<'res> {
    send_cq: Parent<'res, CompletionQueue<'res>>,
    recv_cq: Parent<'res, CompletionQueue<'res>>,
    srq: Option<Parent<'res, SharedReceiveQueue<'res>>>,
    caps: QpCaps,
    sq_sig_all: bool,
}

impl<'res> QpCreateAttr<'res> {
    /// Completions of sends go to `send_cq`, of receives to `recv_cq` (they may be the same).
    pub fn new(
        send_cq: impl Into<Parent<'res, CompletionQueue<'res>>>,
        recv_cq: impl Into<Parent<'res, CompletionQueue<'res>>>,
    ) -> Self {
        let (send_cq, recv_cq) = (send_cq.into(), recv_cq.into());
        QpCreateAttr { send_cq, recv_cq, srq: None, caps: QpCaps::default(), sq_sig_all: false }
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
}

/// A queue pair (`struct ibv_qp`), destroyed on drop.
///
/// `T` is its transport ([`Rc`](state::Rc), [`Uc`](state::Uc), [`Ud`]); `S` the state it was last
/// moved to. It holds its protection domain, completion queues and SRQ, borrowed or shared (see
/// [`Parent`]). The verbs QP is destroyed when the last of this value and the
/// [`SendQueue`](crate::SendQueue)s and [`RecvRing`](crate::RecvRing)s made from it is gone.
///
/// # References
/// - [`ibv_create_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_create_qp.3.html)
/// - [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
#[doc(alias = "ibv_qp")]
pub struct QueuePair<'res, T: Transport, S: State> {
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
}

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
        if rc != 0 {
            return Err(Error::from_errno("ibv_query_qp", Some(self.device()), rc));
        }
        // SAFETY: the query succeeded and set `qp_state` (the rest is zeroed plain data).
        Ok(unsafe { attr.assume_init() }.qp_state)
    }

    /// Moves a QP that is in the error state to the error state again, so that receives posted
    /// to it since complete (flushed). The verbs spec has such receives complete flushed at
    /// once; rxe (Linux 6.1) completes them only when the QP is moved to error again, so a wait
    /// for them would never end. Waits that receives could end call this now and then when
    /// nothing came. Does nothing to a QP in any other state.
    pub(crate) fn reflush_if_in_error(&self) {
        if self.query_state().is_ok_and(|s| s == ffi::ibv_qp_state::IBV_QPS_ERR) {
            let _ = self.set_state(ffi::ibv_qp_state::IBV_QPS_ERR);
        }
    }

    pub(crate) fn set_state(&self, state: ffi::ibv_qp_state::Type) -> Result<()> {
        let mut attr = zeroed_attr(state);
        // SAFETY: live QP; `attr` holds the state the mask names.
        let rc = unsafe {
            ffi::ibv_modify_qp(self.raw.as_ptr(), &mut attr, ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 as libc::c_int)
        };
        if rc != 0 {
            return Err(Error::from_errno("ibv_modify_qp", Some(self.device()), rc));
        }
        Ok(())
    }
}

impl Drop for Inner<'_> {
    #[doc(alias = "ibv_destroy_qp")]
    fn drop(&mut self) {
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

impl<T: Transport, S: State> fmt::Debug for QueuePair<'_, T, S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("transport", &T::NAME)
            .field("state", &std::any::type_name::<S>().rsplit("::").next().unwrap_or("?"))
            .field("qp_num", &self.qp_num())
            .finish()
    }
}

/// A failed transition: the error, and the queue pair in the state it had.
///
/// Returned by the `try_` transitions. `?` converts it into [`Error`] (dropping the QP); the
/// plain transitions (`init`, ...) return that `Error` directly.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct TransitionError<Q: fmt::Debug> {
    /// The queue pair, unchanged (its type is the state before the transition).
    pub qp: Q,
    /// Why the transition failed.
    #[source]
    pub error: Error,
}

impl<Q: fmt::Debug> From<TransitionError<Q>> for Error {
    /// Keeps the error and drops (destroys) the queue pair.
    fn from(e: TransitionError<Q>) -> Error {
        e.error
    }
}

/// The result of a transition from `QueuePair<T, S>`.
pub type Transition<'res, T, S, N> = std::result::Result<QueuePair<'res, T, N>, TransitionError<QueuePair<'res, T, S>>>;

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
        // SAFETY: live PD, CQs and SRQ (held by the QP for its whole life); `attr` is initialised.
        let raw = unsafe { ffi::ibv_create_qp(pd.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_create_qp", Some(ctx.name())))?;
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
        };
        Ok(QueuePair { inner: Arc::new(inner), _type: PhantomData })
    }
}

impl<'res, T: Transport, S: State> QueuePair<'res, T, S> {
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

    /// Moves the QP to the reset state, which removes every outstanding request without a
    /// completion: the device no longer touches their memory. A posting scope's last resort.
    pub(crate) fn reset(&self) -> Result<()> {
        let mut attr = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_RESET);
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

    fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> Result<()> {
        // SAFETY: live QP; `attr` holds every field `mask` names.
        let rc = unsafe { ffi::ibv_modify_qp(self.inner.raw.as_ptr(), attr, mask.0 as libc::c_int) };
        if rc != 0 {
            return Err(Error::from_errno("ibv_modify_qp", Some(self.inner.pd.context().name()), rc));
        }
        Ok(())
    }

    fn transition<N: State>(
        self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Transition<'res, T, S, N> {
        match self.modify(attr, mask) {
            Ok(()) => Ok(QueuePair { inner: self.inner, _type: PhantomData }),
            Err(error) => Err(TransitionError { qp: self, error }),
        }
    }

    fn reject<N: State>(self, reason: String) -> Transition<'res, T, S, N> {
        let error = Error::invalid("ibv_modify_qp", Some(self.inner.pd.context().name()), reason);
        Err(TransitionError { qp: self, error })
    }
}

fn zeroed_attr(state: ffi::ibv_qp_state::Type) -> ffi::ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is plain integers and structs of them: all-zero is valid.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = state;
    attr
}

impl<'res, T: Transport, S: State> QueuePair<'res, T, S> {
    /// Moves the QP to state `N` with attributes computed elsewhere: `ibv_modify_qp(qp, attr,
    /// mask)`, for attributes a connection manager derives for you (`rdma_init_qp_attr(3)`, used
    /// by the `rdma-cm` crate) rather than the typed [`InitAttr`], [`RtrAttr`] and [`RtsAttr`].
    ///
    /// `attr.qp_state` must be `N`'s state, `mask` must hold `IBV_QP_STATE`, and `N` may not be
    /// [`Reset`]; whether the transition
    /// from `S` is legal, and the attributes valid for it, the device checks. A transition to the
    /// same state (`Init -> Init`) updates attributes. When `mask` names the port, the QP
    /// remembers it as [`port`](Self::port).
    ///
    /// # Errors
    /// [`TransitionError`], with the QP back: `attr.qp_state` is not `N`'s, `mask` lacks
    /// `IBV_QP_STATE`, `N` is `Reset`, or the verb failed.
    ///
    /// # References
    /// - [`ibv_modify_qp(3)`](https://man7.org/linux/man-pages/man3/ibv_modify_qp.3.html)
    /// - [`rdma_init_qp_attr(3)`](https://man7.org/linux/man-pages/man3/rdma_init_qp_attr.3.html)
    #[doc(alias = "ibv_modify_qp")]
    pub fn try_modify_with<N: State>(
        self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Transition<'res, T, S, N> {
        if N::QP_STATE == ffi::ibv_qp_state::IBV_QPS_RESET {
            return self.reject("moving to Reset is not a typed transition".to_owned());
        }
        if attr.qp_state != N::QP_STATE {
            return self.reject(format!("attr.qp_state is {}, the target type's is {}", attr.qp_state, N::QP_STATE));
        }
        if mask.0 & ffi::ibv_qp_attr_mask::IBV_QP_STATE.0 == 0 {
            // Without it the device would change attributes in the current state, and the type
            // would claim a state the QP is not in.
            return self.reject("the mask lacks IBV_QP_STATE: a typed transition must change the state".to_owned());
        }
        if mask.0 & ffi::ibv_qp_attr_mask::IBV_QP_PORT.0 != 0 {
            if let Err(error) = self.inner.pd.context().check_port_arg("ibv_modify_qp", attr.port_num) {
                return Err(TransitionError { qp: self, error });
            }
            self.inner.port.store(attr.port_num, Ordering::Relaxed);
        }
        self.transition(attr, mask)
    }
}

impl<'res, T: Transport> QueuePair<'res, T, Reset> {
    /// `Reset -> Init`: sets the port, P_Key index, and remote access (connected) or Q_Key (UD).
    ///
    /// # Errors
    /// [`TransitionError`], with the QP back: a port the device does not have, or the verb failed.
    pub fn try_init(self, attr: InitAttr) -> Transition<'res, T, Reset, Init> {
        if let Err(error) = self.inner.pd.context().check_port_arg("ibv_modify_qp", attr.port) {
            return Err(TransitionError { qp: self, error });
        }
        use ffi::ibv_qp_attr_mask as m;
        let mut raw = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_INIT);
        raw.port_num = attr.port;
        raw.pkey_index = attr.pkey_index;
        let mask = if T::QP_TYPE == ffi::ibv_qp_type::IBV_QPT_UD {
            raw.qkey = attr.qkey;
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_QKEY
        } else {
            raw.qp_access_flags = attr.access.bits();
            m::IBV_QP_STATE | m::IBV_QP_PKEY_INDEX | m::IBV_QP_PORT | m::IBV_QP_ACCESS_FLAGS
        };
        self.inner.port.store(attr.port, Ordering::Relaxed);
        self.transition(&mut raw, mask)
    }
}

impl<'res, T: Connected> QueuePair<'res, T, Init> {
    /// `Init -> ReadyToReceive` for RC and UC: names the peer QP and the path to it.
    ///
    /// # Errors
    /// [`TransitionError`], with the QP back: a GID index past the port's table, READ/atomic depth
    /// over the device's limit, or the verb failed.
    pub fn try_ready_to_receive(self, attr: &RtrAttr) -> Transition<'res, T, Init, ReadyToReceive> {
        let ctx = self.inner.pd.context();
        if let Err(error) = ctx.check_port_arg("ibv_modify_qp", attr.path.port) {
            return Err(TransitionError { qp: self, error });
        }
        let gids = ctx.query_port(attr.path.port).map(|p| p.gid_table_len).unwrap_or(0);
        if u32::from(attr.path.sgid_index) >= gids {
            return self.reject(format!("GID index {} is past the port's table of {gids}", attr.path.sgid_index));
        }
        let rc = T::QP_TYPE == ffi::ibv_qp_type::IBV_QPT_RC;
        if rc && u32::from(attr.max_dest_rd_atomic) > ctx.attr().max_qp_rd_atom {
            let max = ctx.attr().max_qp_rd_atom;
            return self.reject(format!("max_dest_rd_atomic {} is over the device's {max}", attr.max_dest_rd_atomic));
        }
        use ffi::ibv_qp_attr_mask as m;
        let mut raw = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_RTR);
        raw.path_mtu = attr.path_mtu.as_raw();
        raw.dest_qp_num = attr.remote.qp_num;
        raw.rq_psn = attr.remote.psn;
        raw.ah_attr = attr.path.to_raw();
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_AV | m::IBV_QP_PATH_MTU | m::IBV_QP_DEST_QPN | m::IBV_QP_RQ_PSN;
        if rc {
            raw.max_dest_rd_atomic = attr.max_dest_rd_atomic;
            raw.min_rnr_timer = attr.min_rnr_timer;
            mask = mask | m::IBV_QP_MAX_DEST_RD_ATOMIC | m::IBV_QP_MIN_RNR_TIMER;
        }
        self.transition(&mut raw, mask)
    }
}

impl<'res, T: Connected> QueuePair<'res, T, ReadyToReceive> {
    /// `ReadyToReceive -> ReadyToSend` for RC and UC.
    ///
    /// # Errors
    /// [`TransitionError`], with the QP back: READ/atomic depth over the device's limit, or the
    /// verb failed.
    pub fn try_ready_to_send(self, attr: &RtsAttr) -> Transition<'res, T, ReadyToReceive, ReadyToSend> {
        let rc = T::QP_TYPE == ffi::ibv_qp_type::IBV_QPT_RC;
        let max = self.inner.pd.context().attr().max_qp_init_rd_atom;
        if rc && u32::from(attr.max_rd_atomic) > max {
            return self.reject(format!("max_rd_atomic {} is over the device's {max}", attr.max_rd_atomic));
        }
        use ffi::ibv_qp_attr_mask as m;
        let mut raw = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_RTS);
        raw.sq_psn = attr.sq_psn;
        let mut mask = m::IBV_QP_STATE | m::IBV_QP_SQ_PSN;
        if rc {
            raw.timeout = attr.timeout;
            raw.retry_cnt = attr.retry_cnt;
            raw.rnr_retry = attr.rnr_retry;
            raw.max_rd_atomic = attr.max_rd_atomic;
            mask = mask | m::IBV_QP_TIMEOUT | m::IBV_QP_RETRY_CNT | m::IBV_QP_RNR_RETRY | m::IBV_QP_MAX_QP_RD_ATOMIC;
        }
        self.transition(&mut raw, mask)
    }
}

impl<'res> QueuePair<'res, Ud, Init> {
    /// `Init -> ReadyToReceive` for UD (no peer to name).
    ///
    /// # Errors
    /// [`TransitionError`], with the QP back, when the verb fails.
    pub fn try_ready_to_receive(self) -> Transition<'res, Ud, Init, ReadyToReceive> {
        let mut raw = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_RTR);
        self.transition(&mut raw, ffi::ibv_qp_attr_mask::IBV_QP_STATE)
    }
}

impl<'res> QueuePair<'res, Ud, ReadyToReceive> {
    /// `ReadyToReceive -> ReadyToSend` for UD, starting at `sq_psn`.
    ///
    /// # Errors
    /// [`TransitionError`], with the QP back, when the verb fails.
    pub fn try_ready_to_send(self, sq_psn: u32) -> Transition<'res, Ud, ReadyToReceive, ReadyToSend> {
        let mut raw = zeroed_attr(ffi::ibv_qp_state::IBV_QPS_RTS);
        raw.sq_psn = sq_psn;
        use ffi::ibv_qp_attr_mask as m;
        self.transition(&mut raw, m::IBV_QP_STATE | m::IBV_QP_SQ_PSN)
    }
}

impl<'res, T: Transport, S: State> QueuePair<'res, T, S> {
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
        unsafe { self.post_send_checked(wrs, false) }
    }

    /// [`post_send`](Self::post_send); `scoped`: the caller is a posting scope, whose tags use
    /// the reserved `wr_id` bits.
    ///
    /// # Safety
    /// As `post_send`.
    #[inline]
    pub(crate) unsafe fn post_send_checked(&self, wrs: &mut [SendRequest<'_, '_>], scoped: bool) -> Result<()> {
        let device = self.inner.pd.context().name();
        let Some(first) =
            crate::wr::link_send(wrs, &self.inner.caps, T::QP_TYPE, self.inner.pd.as_raw(), device, scoped)?
        else {
            return Ok(());
        };
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: `first` heads a chain of valid requests inside `wrs`, which outlives the call;
        // every SGE names registered memory (the caller keeps it untouched, as documented).
        let rc = unsafe { ffi::ibv_post_send(self.inner.raw.as_ptr(), first, &mut bad) };
        if rc != 0 {
            let posted = crate::wr::index_of_send(wrs, bad);
            return Err(Error::PostFailed {
                verb: "ibv_post_send",
                device: Some(device.to_owned()),
                errno: rc,
                posted,
            });
        }
        Ok(())
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
        unsafe { self.post_recv_checked(wrs, false) }
    }

    /// [`post_recv`](Self::post_recv), for a posting scope when `scoped`.
    ///
    /// # Safety
    /// As `post_recv`.
    #[inline]
    pub(crate) unsafe fn post_recv_checked(&self, wrs: &mut [RecvRequest<'_, '_>], scoped: bool) -> Result<()> {
        let device = self.inner.pd.context().name();
        if self.inner.srq.is_some() {
            return Err(Error::invalid("ibv_post_recv", Some(device), "this QP takes its receives from an SRQ"));
        }
        let Some(first) = crate::wr::link_recv(wrs, self.inner.caps.max_recv_sge, "ibv_post_recv", device, scoped)?
        else {
            return Ok(());
        };
        let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: as in `post_send`.
        let rc = unsafe { ffi::ibv_post_recv(self.inner.raw.as_ptr(), first, &mut bad) };
        if rc != 0 {
            let posted = crate::wr::index_of_recv(wrs, bad);
            return Err(Error::PostFailed {
                verb: "ibv_post_recv",
                device: Some(device.to_owned()),
                errno: rc,
                posted,
            });
        }
        Ok(())
    }
}

/// The transitions with plain errors: the QP is dropped (destroyed) on failure, and `?` works
/// into any error type, `Box<dyn std::error::Error>` included. The `try_` forms give it back.
impl<'res, T: Transport, S: State> QueuePair<'res, T, S> {
    /// [`try_modify_with`](Self::try_modify_with), dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_modify_with`.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_with<N: State>(
        self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Result<QueuePair<'res, T, N>> {
        self.try_modify_with(attr, mask).map_err(Error::from)
    }
}

impl<'res, T: Transport> QueuePair<'res, T, Reset> {
    /// `Reset -> Init`: [`try_init`](Self::try_init), dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_init`.
    pub fn init(self, attr: InitAttr) -> Result<QueuePair<'res, T, Init>> {
        self.try_init(attr).map_err(Error::from)
    }
}

impl<'res, T: Connected> QueuePair<'res, T, Init> {
    /// `Init -> ReadyToReceive` for RC and UC: [`try_ready_to_receive`](Self::try_ready_to_receive),
    /// dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_ready_to_receive`.
    pub fn ready_to_receive(self, attr: &RtrAttr) -> Result<QueuePair<'res, T, ReadyToReceive>> {
        self.try_ready_to_receive(attr).map_err(Error::from)
    }
}

impl<'res, T: Connected> QueuePair<'res, T, ReadyToReceive> {
    /// `ReadyToReceive -> ReadyToSend` for RC and UC: [`try_ready_to_send`](Self::try_ready_to_send),
    /// dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_ready_to_send`.
    pub fn ready_to_send(self, attr: &RtsAttr) -> Result<QueuePair<'res, T, ReadyToSend>> {
        self.try_ready_to_send(attr).map_err(Error::from)
    }
}

impl<'res> QueuePair<'res, Ud, Init> {
    /// `Init -> ReadyToReceive` for UD: [`try_ready_to_receive`](Self::try_ready_to_receive),
    /// dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_ready_to_receive`.
    pub fn ready_to_receive(self) -> Result<QueuePair<'res, Ud, ReadyToReceive>> {
        self.try_ready_to_receive().map_err(Error::from)
    }
}

impl<'res> QueuePair<'res, Ud, ReadyToReceive> {
    /// `ReadyToReceive -> ReadyToSend` for UD: [`try_ready_to_send`](Self::try_ready_to_send),
    /// dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_ready_to_send`.
    pub fn ready_to_send(self, sq_psn: u32) -> Result<QueuePair<'res, Ud, ReadyToSend>> {
        self.try_ready_to_send(sq_psn).map_err(Error::from)
    }
}
