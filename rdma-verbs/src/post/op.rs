//! The operations a send queue posts, as plain data: [`SendOp`] (an operation with its
//! operands), [`Data`] (where its bytes are) and [`SendOps`] (the operations an extended QP was
//! created with). [`SendOp::send_ops`] is the one map from an operation to the flag its QP
//! needs; [`raw::build`](super::raw::build) is the one map from an operation to its builder.
//!
//! Nothing here calls into the provider, and this module uses no other of the crate: every
//! request type ([`SendRequest`](crate::SendRequest), [`SlotRequest`](crate::SlotRequest)) is
//! described in these terms, and every posting layer posts through them.

use crate::ffi;

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

/// One send-queue operation with its operands, as the builders of `ibv_wr_post(3)` take them.
/// Keys and addresses are the peer's (or, for the invalidations, the key to revoke); immediate
/// data is in network byte order, as it goes on the wire.
#[derive(Clone, Copy)]
pub(crate) enum SendOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendImm { imm: u32 },
    /// `IBV_WR_SEND_WITH_INV`.
    SendInv { rkey: u32 },
    /// `IBV_WR_RDMA_WRITE`.
    Write { rkey: u32, addr: u64 },
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    WriteImm { rkey: u32, addr: u64, imm: u32 },
    /// `IBV_WR_RDMA_READ`.
    Read { rkey: u32, addr: u64 },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap { rkey: u32, addr: u64, compare: u64, swap: u64 },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd { rkey: u32, addr: u64, add: u64 },
    /// `IBV_WR_LOCAL_INV`.
    LocalInv { rkey: u32 },
    /// `IBV_WR_ATOMIC_WRITE`: the 8 bytes are copied by the builder.
    AtomicWrite { rkey: u32, addr: u64, value: [u8; 8] },
    /// `IBV_WR_BIND_MW` of the type 2 window `mw`, giving it key `rkey`.
    BindMw { mw: *mut ffi::ibv_mw, rkey: u32, info: ffi::ibv_mw_bind_info },
}

impl SendOp {
    /// Whether the operation moves bytes named by a data setter (`ibv_wr_set_sge*`,
    /// `ibv_wr_set_inline_data*`): every one but the invalidation, the bind and the atomic
    /// write (whose 8 bytes are the builder's).
    #[inline(always)]
    pub(crate) fn carries_data(&self) -> bool {
        !matches!(self, SendOp::LocalInv { .. } | SendOp::BindMw { .. } | SendOp::AtomicWrite { .. })
    }

    /// The flag an extended QP must have been created with to post this operation.
    #[inline(always)]
    pub(crate) fn send_ops(&self) -> SendOps {
        match self {
            SendOp::Send => SendOps::SEND,
            SendOp::SendImm { .. } => SendOps::SEND_WITH_IMM,
            SendOp::SendInv { .. } => SendOps::SEND_WITH_INV,
            SendOp::Write { .. } => SendOps::RDMA_WRITE,
            SendOp::WriteImm { .. } => SendOps::RDMA_WRITE_WITH_IMM,
            SendOp::Read { .. } => SendOps::RDMA_READ,
            SendOp::CompareSwap { .. } => SendOps::ATOMIC_CMP_AND_SWP,
            SendOp::FetchAdd { .. } => SendOps::ATOMIC_FETCH_AND_ADD,
            SendOp::LocalInv { .. } => SendOps::LOCAL_INV,
            SendOp::AtomicWrite { .. } => SendOps::ATOMIC_WRITE,
            SendOp::BindMw { .. } => SendOps::BIND_MW,
        }
    }
}

/// Where the bytes of one request are, as the data setters of `ibv_wr_post(3)` take them.
#[derive(Clone, Copy)]
pub(crate) enum Data<'a> {
    /// No setter call: the operations that carry no data ([`SendOp::carries_data`]).
    None,
    /// One registered buffer (`ibv_wr_set_sge`), set also when it is 0 bytes long: some
    /// providers finish the queue entry in the data setter.
    Sge(ffi::ibv_sge),
    /// Several registered buffers (`ibv_wr_set_sge_list`).
    SgeList(&'a [ffi::ibv_sge]),
    /// Bytes copied into the queue entry (`ibv_wr_set_inline_data`).
    Inline(ffi::ibv_data_buf),
    /// Several runs of bytes copied into the entry (`ibv_wr_set_inline_data_list`).
    InlineList(&'a [ffi::ibv_data_buf]),
}
