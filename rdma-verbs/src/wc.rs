//! Work completions: [`WorkCompletion`], [`WcStatus`], [`WcOpcode`].

use std::fmt;

use crate::ffi;

use crate::error::{Error, Result};

/// One completed work request (`struct ibv_wc`).
///
/// `repr(transparent)` over `ibv_wc`: [`CompletionQueue::poll`](crate::CompletionQueue::poll)
/// writes completions straight into a caller's `[WorkCompletion]`, with no copy or allocation.
#[doc(alias = "ibv_wc")]
#[derive(Clone, Copy, Default)]
#[repr(transparent)]
pub struct WorkCompletion(RawWc);

/// `struct ibv_wc`, field for field, as plain `Copy` data (rdma-sys's has a union that is not
/// `Copy`): `ibv_poll_cq` writes it, and [`WorkCompletion::as_raw`] views it as `ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct RawWc {
    wr_id: u64,
    status: ffi::ibv_wc_status::Type,
    opcode: ffi::ibv_wc_opcode::Type,
    vendor_err: u32,
    byte_len: u32,
    /// `imm_data` (network byte order) or `invalidated_rkey`.
    imm_data: u32,
    qp_num: u32,
    src_qp: u32,
    wc_flags: libc::c_uint,
    pkey_index: u16,
    slid: u16,
    sl: u8,
    dlid_path_bits: u8,
}

// The layouts must agree for `ibv_poll_cq` to write `RawWc`s.
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(size_of::<RawWc>() == size_of::<ffi::ibv_wc>());
    assert!(align_of::<RawWc>() == align_of::<ffi::ibv_wc>());
    assert!(offset_of!(RawWc, imm_data) == crate::ffi_compat::WC_IMM_OFFSET);
    assert!(offset_of!(RawWc, qp_num) == offset_of!(ffi::ibv_wc, qp_num));
    assert!(offset_of!(RawWc, wc_flags) == offset_of!(ffi::ibv_wc, wc_flags));
    assert!(offset_of!(RawWc, dlid_path_bits) == offset_of!(ffi::ibv_wc, dlid_path_bits));
};

impl WorkCompletion {
    /// A completion read field by field from an extended CQ's lazy poll.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_fields(
        wr_id: u64,
        status: ffi::ibv_wc_status::Type,
        opcode: ffi::ibv_wc_opcode::Type,
        vendor_err: u32,
        byte_len: u32,
        imm_data: u32,
        qp_num: u32,
        src_qp: u32,
        wc_flags: libc::c_uint,
    ) -> Self {
        WorkCompletion(RawWc {
            wr_id,
            status,
            opcode,
            vendor_err,
            byte_len,
            imm_data,
            qp_num,
            src_qp,
            wc_flags,
            ..RawWc::default()
        })
    }

    /// The `wr_id` of the request that completed.
    pub fn wr_id(&self) -> u64 {
        self.0.wr_id
    }

    pub(crate) fn set_wr_id(&mut self, wr_id: u64) {
        self.0.wr_id = wr_id;
    }

    /// Whether it succeeded, or why not.
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.0.status)
    }

    /// Whether it succeeded.
    pub fn is_success(&self) -> bool {
        self.0.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// `Ok(self)` on success, else [`Error::WorkCompletion`] carrying the status.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`] when the request failed.
    pub fn ok(&self) -> Result<&Self> {
        if self.is_success() {
            Ok(self)
        } else {
            Err(Error::WorkCompletion { wr_id: self.wr_id(), status: self.status(), vendor_err: self.0.vendor_err })
        }
    }

    /// What kind of request completed. Only meaningful on success (libibverbs leaves it
    /// undefined for failed requests).
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(self.0.opcode)
    }

    /// Bytes received (receives) or transferred (RDMA READ, atomics: 8).
    pub fn byte_len(&self) -> u32 {
        self.0.byte_len
    }

    /// The immediate data of a send or write with immediate, in host byte order.
    pub fn imm(&self) -> Option<u32> {
        (self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0)
            // With IBV_WC_WITH_IMM the field holds the immediate (network byte order).
            .then(|| u32::from_be(self.0.imm_data))
    }

    /// The key of the local memory window (or region) a peer's send with invalidate
    /// invalidated (`IBV_WC_WITH_INV`).
    ///
    /// rxe (rdma-core 44, Linux 6.1 and 6.12) sets the kernel's flag instead
    /// (`IB_WC_WITH_INVALIDATE`, bit 2, which libibverbs calls `IBV_WC_IP_CSUM_OK`), so this is
    /// `None` there; [`BoundWindow::invalidated_by`](crate::BoundWindow::invalidated_by)
    /// understands both.
    pub fn invalidated_rkey(&self) -> Option<u32> {
        // With IBV_WC_WITH_INV the field holds the key, in host byte order.
        (self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_INV.0 != 0).then_some(self.0.imm_data)
    }

    /// Whether this is a successful receive whose send with invalidate invalidated `rkey`: as
    /// libibverbs reports it (`IBV_WC_WITH_INV`), or as rxe does (the kernel's
    /// `IB_WC_WITH_INVALIDATE`, bit 2, on a receive without immediate data, the key in the same
    /// field). Seen on rxe in the device test `device_memory_windows`.
    pub(crate) fn invalidates(&self, rkey: u32) -> bool {
        const KERNEL_WITH_INVALIDATE: u32 = 1 << 2;
        let flags = self.0.wc_flags;
        let receive = self.opcode() == WcOpcode::Recv && flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 == 0;
        self.is_success()
            && (self.invalidated_rkey() == Some(rkey)
                || (receive && flags & KERNEL_WITH_INVALIDATE != 0 && self.0.imm_data == rkey))
    }

    /// The number of the local QP the request belonged to.
    pub fn qp_num(&self) -> u32 {
        self.0.qp_num
    }

    /// The remote QP number a receive came from (UD).
    pub fn src_qp(&self) -> u32 {
        self.0.src_qp
    }

    /// Whether a GRH precedes a UD receive's payload (always on RoCE: 40 bytes).
    pub fn has_grh(&self) -> bool {
        self.0.wc_flags & ffi::ibv_wc_flags::IBV_WC_GRH.0 != 0
    }

    /// The provider's own error code, for failed requests.
    pub fn vendor_err(&self) -> u32 {
        self.0.vendor_err
    }

    /// The `struct ibv_wc`.
    pub fn as_raw(&self) -> &ffi::ibv_wc {
        // SAFETY: `RawWc` has `ibv_wc`'s layout (checked above), and every bit pattern is a
        // valid `ibv_wc` (integers and a union of integers).
        unsafe { &*(self as *const Self).cast::<ffi::ibv_wc>() }
    }
}

impl fmt::Debug for WorkCompletion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("WorkCompletion");
        d.field("wr_id", &self.wr_id()).field("status", &self.status());
        if self.is_success() {
            d.field("opcode", &self.opcode()).field("byte_len", &self.byte_len());
            if let Some(imm) = self.imm() {
                d.field("imm", &imm);
            }
        }
        d.field("qp_num", &self.qp_num()).finish()
    }
}

macro_rules! raw_enum {
    ($(#[$m:meta])* $name:ident : $module:ident { $($(#[$vm:meta])* $variant:ident = $raw:ident,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum $name {
            $($(#[$vm])* $variant,)*
            /// A value this crate does not know.
            Other(u32),
        }

        impl $name {
            pub(crate) fn from_raw(raw: ffi::$module::Type) -> Self {
                match raw {
                    $(ffi::$module::$raw => $name::$variant,)*
                    other => $name::Other(other),
                }
            }
        }
    };
}

raw_enum! {
    /// The outcome of a work request (`enum ibv_wc_status`).
    ///
    /// # References
    /// - [`ibv_poll_cq(3)`](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html)
    WcStatus: ibv_wc_status {
        /// It succeeded.
        Success = IBV_WC_SUCCESS,
        /// A receive buffer was too small, or a send too long.
        LocalLengthError = IBV_WC_LOC_LEN_ERR,
        /// An internal QP consistency error.
        LocalQpOperationError = IBV_WC_LOC_QP_OP_ERR,
        /// A local memory key was wrong or the access not allowed.
        LocalProtectionError = IBV_WC_LOC_PROT_ERR,
        /// The QP went to the error state before the request was done.
        WrFlushError = IBV_WC_WR_FLUSH_ERR,
        /// A memory window bind failed.
        MemoryWindowBindError = IBV_WC_MW_BIND_ERR,
        /// The responder answered unexpectedly.
        BadResponseError = IBV_WC_BAD_RESP_ERR,
        /// A local access error on the responder's data.
        LocalAccessError = IBV_WC_LOC_ACCESS_ERR,
        /// The responder found the request invalid.
        RemoteInvalidRequestError = IBV_WC_REM_INV_REQ_ERR,
        /// The remote key, address or access rights did not allow the access.
        RemoteAccessError = IBV_WC_REM_ACCESS_ERR,
        /// The responder could not complete the operation.
        RemoteOperationError = IBV_WC_REM_OP_ERR,
        /// No acknowledgement after the retry count.
        RetryExceeded = IBV_WC_RETRY_EXC_ERR,
        /// The responder had no receive posted, past the RNR retry count.
        RnrRetryExceeded = IBV_WC_RNR_RETRY_EXC_ERR,
        /// The responder aborted the operation.
        RemoteAbortError = IBV_WC_REM_ABORT_ERR,
        /// A fatal device error.
        FatalError = IBV_WC_FATAL_ERR,
        /// The response timed out.
        ResponseTimeoutError = IBV_WC_RESP_TIMEOUT_ERR,
        /// Any other error.
        GeneralError = IBV_WC_GENERAL_ERR,
    }
}

raw_enum! {
    /// What kind of work request completed (`enum ibv_wc_opcode`).
    WcOpcode: ibv_wc_opcode {
        /// A send (with or without immediate).
        Send = IBV_WC_SEND,
        /// An RDMA WRITE (with or without immediate).
        RdmaWrite = IBV_WC_RDMA_WRITE,
        /// An RDMA READ.
        RdmaRead = IBV_WC_RDMA_READ,
        /// An atomic compare-and-swap.
        CompareSwap = IBV_WC_COMP_SWAP,
        /// An atomic fetch-and-add.
        FetchAdd = IBV_WC_FETCH_ADD,
        /// An RDMA atomic write.
        AtomicWrite = IBV_WC_ATOMIC_WRITE,
        /// A memory window bind.
        BindMw = IBV_WC_BIND_MW,
        /// A local invalidate.
        LocalInvalidate = IBV_WC_LOCAL_INV,
        /// A receive consumed by a send.
        Recv = IBV_WC_RECV,
        /// A receive consumed by an RDMA WRITE with immediate.
        RecvRdmaWithImm = IBV_WC_RECV_RDMA_WITH_IMM,
    }
}
