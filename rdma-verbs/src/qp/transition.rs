//! Moving a queue pair between states (`ibv_modify_qp()`): each transition consumes the typed
//! handle and returns it in its new state. Two forms of each: `try_*`, which gives the QP back
//! in [`TransitionError`] on failure, and the plain one, which drops it and returns the
//! [`Error`] (so that `?` works into any error type).

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;

use crate::ffi;

use super::attr::{InitAttr, RtrAttr, RtsAttr};
use super::state::{Connected, Init, ReadyToReceive, ReadyToSend, Reset, Transport, TypeState, Ud};
use super::QueuePair;
use crate::error::{Error, Result};

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

impl<'res, T: Transport, S: TypeState> QueuePair<'res, T, S> {
    pub(super) fn modify(&self, attr: &mut ffi::ibv_qp_attr, mask: ffi::ibv_qp_attr_mask) -> Result<()> {
        // SAFETY: live QP; `attr` holds every field `mask` names.
        let rc = unsafe { ffi::ibv_modify_qp(self.inner.raw.as_ptr(), attr, mask.0 as libc::c_int) };
        Error::check("ibv_modify_qp", Some(self.inner.pd.context().name()), rc)?;
        // A typed transition brought the QP out of a drain's reset (or never was in one).
        self.inner.set_reset_by_drain(false);
        Ok(())
    }

    fn transition<N: TypeState>(
        self,
        attr: &mut ffi::ibv_qp_attr,
        mask: ffi::ibv_qp_attr_mask,
    ) -> Transition<'res, T, S, N> {
        match self.modify(attr, mask) {
            Ok(()) => Ok(QueuePair { inner: self.inner, _type: PhantomData }),
            Err(error) => Err(TransitionError { qp: self, error }),
        }
    }

    fn reject<N: TypeState>(self, reason: String) -> Transition<'res, T, S, N> {
        let error = Error::invalid("ibv_modify_qp", Some(self.inner.pd.context().name()), reason);
        Err(TransitionError { qp: self, error })
    }
}

pub(crate) fn zeroed_attr(state: ffi::ibv_qp_state::Type) -> ffi::ibv_qp_attr {
    // SAFETY: `ibv_qp_attr` is plain integers and structs of them: all-zero is valid.
    let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
    attr.qp_state = state;
    attr
}

impl<'res, T: Transport, S: TypeState> QueuePair<'res, T, S> {
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
    pub fn try_modify_with<N: TypeState>(
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

/// The transitions with plain errors: the QP is dropped (destroyed) on failure, and `?` works
/// into any error type, `Box<dyn std::error::Error>` included. The `try_` forms give it back.
impl<'res, T: Transport, S: TypeState> QueuePair<'res, T, S> {
    /// [`try_modify_with`](Self::try_modify_with), dropping the QP on failure.
    ///
    /// # Errors
    /// As `try_modify_with`.
    #[doc(alias = "ibv_modify_qp")]
    pub fn modify_with<N: TypeState>(
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
    /// Connects the QP to `peer` in one call, `Init -> ReadyToReceive -> ReadyToSend` with the
    /// usual attributes ([`RtrAttr::new`], [`RtsAttr::new`]): the path from the QP's port (set
    /// by `init`) and its local GID at `gid_index`, the port's active MTU, and `psn`, the PSN
    /// this side announced in the [`QpEndpoint`](super::attr::QpEndpoint) it gave the peer
    /// ([`endpoint`](QueuePair::endpoint)). For other attributes, chain
    /// [`ready_to_receive`](Self::ready_to_receive) and
    /// [`ready_to_send`](QueuePair::ready_to_send).
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(qp: QueuePair<'_, Rc, Init>, peer: QpEndpoint) -> Result<()> {
    /// let qp = qp.handshake(peer, 1, 0)?; // GID index 1 (RoCE v2 on Soft-RoCE), PSN 0
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`ready_to_receive`](Self::ready_to_receive) and
    /// [`ready_to_send`](QueuePair::ready_to_send); [`Error::Verb`] when the port cannot be
    /// queried. The QP is dropped on failure.
    pub fn handshake(
        self,
        peer: super::attr::QpEndpoint,
        gid_index: u8,
        psn: u32,
    ) -> Result<QueuePair<'res, T, ReadyToSend>> {
        self.handshake_with(peer, gid_index, psn, |rtr, rts| (rtr, rts))
    }

    /// [`handshake`](Self::handshake) with attributes of one's own: `tune` gets the usual ones
    /// (already naming the path, the MTU and the PSN) and returns those to use.
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(qp: QueuePair<'_, Rc, Init>, peer: QpEndpoint) -> Result<()> {
    /// // A short RNR timer, and 4 READs in flight each way.
    /// let tune = |rtr: RtrAttr, rts: RtsAttr| (rtr.min_rnr_timer(1).max_dest_rd_atomic(4), rts.max_rd_atomic(4));
    /// let qp = qp.handshake_with(peer, 1, 0, tune)?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`handshake`](Self::handshake).
    pub fn handshake_with(
        self,
        peer: super::attr::QpEndpoint,
        gid_index: u8,
        psn: u32,
        tune: impl FnOnce(RtrAttr, RtsAttr) -> (RtrAttr, RtsAttr),
    ) -> Result<QueuePair<'res, T, ReadyToSend>> {
        let port = self.port();
        let mtu = self.inner.pd.context().query_port(port)?.active_mtu;
        let (rtr, rts) = tune(RtrAttr::new(peer, port, gid_index, mtu), RtsAttr::new(psn));
        self.ready_to_receive(&rtr)?.ready_to_send(&rts)
    }

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
