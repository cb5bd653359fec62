//! Queue-pair states and transports as types.
//!
//! A [`QueuePair`](super::QueuePair)'s type says which transitions and posts it allows:
//! `Reset -> Init -> ReadyToReceive -> ReadyToSend`. Receives can be posted from `Init` on; sends
//! only in `ReadyToSend`. The error state is entered by the device at run time (a failed request,
//! a fatal event), so it is not a type: [`QueuePair::state`](super::QueuePair::state) reads it.

use crate::ffi;

mod sealed {
    pub trait Sealed {}
}

/// A queue-pair state known at compile time. Sealed.
pub trait TypeState: sealed::Sealed + 'static {
    /// The `enum ibv_qp_state` value.
    const QP_STATE: ffi::ibv_qp_state::Type;
}

/// States in which receives may be posted: `Init`, `ReadyToReceive`, `ReadyToSend`. Sealed.
pub trait CanPostRecv: TypeState {}

/// `IBV_QPS_RESET`: just created.
#[derive(Debug)]
pub enum Reset {}
/// `IBV_QPS_INIT`: port and access set; receives may be posted.
#[derive(Debug)]
pub enum Init {}
/// `IBV_QPS_RTR`: ready to receive (connected transports know their peer).
#[derive(Debug)]
pub enum ReadyToReceive {}
/// `IBV_QPS_RTS`: ready to send.
#[derive(Debug)]
pub enum ReadyToSend {}

impl sealed::Sealed for Reset {}
impl sealed::Sealed for Init {}
impl sealed::Sealed for ReadyToReceive {}
impl sealed::Sealed for ReadyToSend {}
impl TypeState for Reset {
    const QP_STATE: ffi::ibv_qp_state::Type = ffi::ibv_qp_state::IBV_QPS_RESET;
}
impl TypeState for Init {
    const QP_STATE: ffi::ibv_qp_state::Type = ffi::ibv_qp_state::IBV_QPS_INIT;
}
impl TypeState for ReadyToReceive {
    const QP_STATE: ffi::ibv_qp_state::Type = ffi::ibv_qp_state::IBV_QPS_RTR;
}
impl TypeState for ReadyToSend {
    const QP_STATE: ffi::ibv_qp_state::Type = ffi::ibv_qp_state::IBV_QPS_RTS;
}
impl CanPostRecv for Init {}
impl CanPostRecv for ReadyToReceive {}
impl CanPostRecv for ReadyToSend {}

/// A transport service. Sealed.
pub trait Transport: sealed::Sealed + 'static {
    /// The `enum ibv_qp_type` value.
    const QP_TYPE: ffi::ibv_qp_type::Type;
    /// The name, for messages.
    const NAME: &'static str;
}

/// Transports with one fixed peer per QP: [`Rc`] and [`Uc`]. Sealed.
pub trait Connected: Transport {}

/// Reliable connected (`IBV_QPT_RC`): every verb, acknowledged and ordered.
#[derive(Debug)]
pub enum Rc {}
/// Unreliable connected (`IBV_QPT_UC`): sends and RDMA WRITE, no acknowledgements.
#[derive(Debug)]
pub enum Uc {}
/// Unreliable datagram (`IBV_QPT_UD`): sends to any QP through an address handle, one MTU at most.
#[derive(Debug)]
pub enum Ud {}

impl sealed::Sealed for Rc {}
impl sealed::Sealed for Uc {}
impl sealed::Sealed for Ud {}
impl Transport for Rc {
    const QP_TYPE: ffi::ibv_qp_type::Type = ffi::ibv_qp_type::IBV_QPT_RC;
    const NAME: &'static str = "RC";
}
impl Transport for Uc {
    const QP_TYPE: ffi::ibv_qp_type::Type = ffi::ibv_qp_type::IBV_QPT_UC;
    const NAME: &'static str = "UC";
}
impl Transport for Ud {
    const QP_TYPE: ffi::ibv_qp_type::Type = ffi::ibv_qp_type::IBV_QPT_UD;
    const NAME: &'static str = "UD";
}
impl Connected for Rc {}
impl Connected for Uc {}

/// A queue pair's state as the device reports it (`enum ibv_qp_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum QpState {
    /// `IBV_QPS_RESET`.
    Reset,
    /// `IBV_QPS_INIT`.
    Init,
    /// `IBV_QPS_RTR`.
    ReadyToReceive,
    /// `IBV_QPS_RTS`.
    ReadyToSend,
    /// `IBV_QPS_SQD`: send queue drained.
    SendQueueDrained,
    /// `IBV_QPS_SQE`: send queue error (UC, UD).
    SendQueueError,
    /// `IBV_QPS_ERR`: the error state; posted requests complete with `WrFlushError`.
    Error,
    /// Any other value.
    Other(u32),
}

impl QpState {
    pub(crate) fn from_raw(raw: ffi::ibv_qp_state::Type) -> Self {
        use ffi::ibv_qp_state::*;
        match raw {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::ReadyToReceive,
            IBV_QPS_RTS => QpState::ReadyToSend,
            IBV_QPS_SQD => QpState::SendQueueDrained,
            IBV_QPS_SQE => QpState::SendQueueError,
            IBV_QPS_ERR => QpState::Error,
            other => QpState::Other(other),
        }
    }
}
