//! Work requests: [`SendRequest`], [`RecvRequest`].
//!
//! A request borrows two things for two lifetimes: its SGE array and inline data for `'a`, only
//! while it is posted (the provider copies them into the queue), and the memory regions its SGEs
//! name for `'mr`, which the safe posting scope extends until the request completed.

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;

use crate::ffi;

use crate::ah::AddressHandle;
use crate::error::{Error, Result};
use crate::mr::{RemoteRegion, Sge};
use crate::post::op::{Data, SendOp};
use crate::post::raw::{self, Builders};
use crate::qp::attr::QpCaps;
use crate::wr_id::RESERVED_WR_ID_BITS;

/// A send-queue work request (`struct ibv_send_wr`): send, RDMA WRITE/READ, atomics.
///
/// Built with one constructor per operation, then adjusted:
/// ```no_run
/// # use rdma_verbs::*;
/// # fn f(mr: &MemoryRegion<'_>, peer: RemoteRegion) -> Result<()> {
/// let sges = [mr.sge(0..4096)?];
/// let wr = SendRequest::write(7, &sges, peer).with_imm(42).unsignaled();
/// # Ok(()) }
/// ```
///
/// # References
/// - [`ibv_post_send(3)`](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html)
#[doc(alias = "ibv_send_wr")]
#[must_use = "a request does nothing until it is posted"]
pub struct SendRequest<'a, 'mr> {
    raw: ffi::ibv_send_wr,
    /// Storage for the one SGE of inline data given as a plain slice.
    inline_sge: ffi::ibv_sge,
    /// The length of that slice, in full (the SGE's length is 32 bits).
    inline_slice_len: usize,
    uses_inline_sge: bool,
    /// The length of the remote region of an RDMA or atomic request.
    remote_len: u64,
    /// The value an atomic write writes (`ibv_wr_atomic_write` copies it when building).
    atomic_value: [u8; 8],
    /// The protection domain (`struct ibv_pd *`, as an address) of the address handle `.to()`
    /// gave, 0 without one: ibv_post_send(3) requires it to be the QP's.
    ah_pd: usize,
    _borrows: PhantomData<(&'a [u8], Sge<'mr>)>,
}

// SAFETY: the raw pointers inside point at data borrowed for 'a/'mr ([Sge], [u8], an AH), all
// of which are Sync; the request itself is plain data.
unsafe impl Send for SendRequest<'_, '_> {}

impl fmt::Debug for SendRequest<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SendRequest")
            .field("wr_id", &self.raw.wr_id)
            .field("opcode", &self.raw.opcode)
            .field("num_sge", &self.raw.num_sge)
            .field("send_flags", &self.raw.send_flags)
            .finish()
    }
}

impl<'a, 'mr> SendRequest<'a, 'mr> {
    fn blank(wr_id: u64, opcode: ffi::ibv_wr_opcode::Type) -> Self {
        // SAFETY: `ibv_send_wr` is integers, raw pointers and unions of them: all-zero is valid.
        let mut raw: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        raw.wr_id = wr_id;
        raw.opcode = opcode;
        raw.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        SendRequest {
            raw,
            inline_sge: ffi::ibv_sge { addr: 0, length: 0, lkey: 0 },
            inline_slice_len: 0,
            uses_inline_sge: false,
            remote_len: 0,
            atomic_value: [0; 8],
            ah_pd: 0,
            _borrows: PhantomData,
        }
    }

    fn new(wr_id: u64, opcode: ffi::ibv_wr_opcode::Type, sges: &'a [Sge<'mr>]) -> Self {
        let mut wr = Self::blank(wr_id, opcode);
        // `Sge` is `repr(transparent)` over `ibv_sge`; the provider only reads the list.
        wr.raw.sg_list = sges.as_ptr() as *mut ffi::ibv_sge;
        wr.raw.num_sge = sges.len() as libc::c_int;
        wr
    }

    /// A send of the bytes `sges` name, consuming a receive at the peer.
    pub fn send(wr_id: u64, sges: &'a [Sge<'mr>]) -> Self {
        Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_SEND, sges)
    }

    /// A send of `data`, copied into the queue when posted (`IBV_SEND_INLINE`): no memory region
    /// needed, and `data` may be reused as soon as the post returns.
    pub fn send_inline(wr_id: u64, data: &'a [u8]) -> Self {
        let mut wr = Self::blank(wr_id, ffi::ibv_wr_opcode::IBV_WR_SEND);
        // The length is checked in full at post time; over u32 it is refused, never truncated.
        wr.inline_sge = ffi::ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 };
        wr.inline_slice_len = data.len();
        wr.uses_inline_sge = true;
        wr.raw.num_sge = 1;
        wr.raw.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        wr
    }

    /// An RDMA WRITE of the bytes `sges` name into `remote` (RC and UC). Posting refuses it if
    /// the bytes are more than `remote.len`.
    pub fn write(wr_id: u64, sges: &'a [Sge<'mr>], remote: RemoteRegion) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE, sges);
        wr.raw.wr.rdma = ffi::rdma_t { remote_addr: remote.addr, rkey: remote.rkey };
        wr.remote_len = remote.len;
        wr
    }

    /// An RDMA READ of `remote` into the bytes `sges` name (RC only). Posting refuses it if the
    /// bytes are more than `remote.len`.
    pub fn read(wr_id: u64, sges: &'a [Sge<'mr>], remote: RemoteRegion) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_READ, sges);
        wr.raw.wr.rdma = ffi::rdma_t { remote_addr: remote.addr, rkey: remote.rkey };
        wr.remote_len = remote.len;
        wr
    }

    /// An atomic compare-and-swap on the 8 bytes at `remote`: if they equal `compare` they
    /// become `swap`. The old value lands in `result` (an 8-byte SGE).
    pub fn compare_swap(wr_id: u64, result: &'a [Sge<'mr>; 1], remote: RemoteRegion, compare: u64, swap: u64) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, result);
        wr.raw.wr.atomic = ffi::atomic_t { remote_addr: remote.addr, compare_add: compare, swap, rkey: remote.rkey };
        wr.remote_len = remote.len;
        wr
    }

    /// An atomic fetch-and-add of `add` to the 8 bytes at `remote`. The old value lands in
    /// `result` (an 8-byte SGE).
    pub fn fetch_add(wr_id: u64, result: &'a [Sge<'mr>; 1], remote: RemoteRegion, add: u64) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, result);
        wr.raw.wr.atomic = ffi::atomic_t { remote_addr: remote.addr, compare_add: add, swap: 0, rkey: remote.rkey };
        wr.remote_len = remote.len;
        wr
    }

    /// A send of the bytes `sges` name that also invalidates the memory window (or region) with
    /// key `rkey` at the peer (`IBV_WR_SEND_WITH_INV`; RC and UC). The peer's receive completes
    /// with the key in [`WorkCompletion::invalidated_rkey`](crate::WorkCompletion::invalidated_rkey).
    #[doc(alias = "IBV_WR_SEND_WITH_INV")]
    pub fn send_with_invalidate(wr_id: u64, sges: &'a [Sge<'mr>], rkey: u32) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_INV, sges);
        crate::ffi_compat::set_invalidate_rkey(&mut wr.raw, rkey);
        wr
    }

    /// Invalidates the local memory window (type 2) or region with key `rkey`
    /// (`IBV_WR_LOCAL_INV`; RC and UC): peer requests after it that use the key fail.
    /// [`PostScope::invalidate_window`](crate::PostScope::invalidate_window) revokes a
    /// [`BoundWindow`](crate::BoundWindow) without it, safely, and gives the window back.
    ///
    /// # Safety
    /// If `rkey` names a type 2 window of this device, that window must be bound when the
    /// request runs: not allocated and never bound, and not already invalidated (by an earlier
    /// local invalidate, or by a peer's send with invalidate). rxe's invalidation of a type 2
    /// window that is not bound dereferences a null pointer in the kernel (Linux 6.1 and 6.12:
    /// `rxe_invalidate_mw`, an oops in `__rxe_put`), which kills the machine.
    ///
    /// ```compile_fail
    /// # use rdma_verbs::*;
    /// let wr = SendRequest::local_invalidate(1, 0x100); // error: call to unsafe function
    /// ```
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    pub unsafe fn local_invalidate(wr_id: u64, rkey: u32) -> Self {
        let mut wr = Self::blank(wr_id, ffi::ibv_wr_opcode::IBV_WR_LOCAL_INV);
        crate::ffi_compat::set_invalidate_rkey(&mut wr.raw, rkey);
        wr
    }

    /// A bind of the type 2 window `mw` (`IBV_WR_BIND_MW`), giving it key `rkey`. Only the
    /// posting scope makes one: its `BoundWindow` borrows the region `info` names.
    pub(crate) fn bind_window(wr_id: u64, mw: *mut ffi::ibv_mw, rkey: u32, info: ffi::ibv_mw_bind_info) -> Self {
        let mut wr = Self::blank(wr_id, ffi::ibv_wr_opcode::IBV_WR_BIND_MW);
        crate::ffi_compat::set_bind_mw(&mut wr.raw, mw, rkey, info);
        wr
    }

    /// An RDMA atomic write of `value` to the 8 bytes at `remote` (RC): the peer sees all 8
    /// bytes change at once, or none (`ibv_wr_atomic_write`). It posts only through a
    /// [`WrBatch`](crate::WrBatch) of a QP created with
    /// [`SendOps::ATOMIC_WRITE`](crate::SendOps::ATOMIC_WRITE), on a device that advertises
    /// [`DeviceCapabilities::ATOMIC_WRITE`](crate::DeviceCapabilities::ATOMIC_WRITE) (rxe from
    /// Linux 6.2). `remote` must be 8-byte aligned.
    #[doc(alias = "ibv_wr_atomic_write")]
    #[doc(alias = "IBV_WR_ATOMIC_WRITE")]
    pub fn atomic_write(wr_id: u64, remote: RemoteRegion, value: [u8; 8]) -> Self {
        let mut wr = Self::blank(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_WRITE);
        wr.raw.wr.rdma = ffi::rdma_t { remote_addr: remote.addr, rkey: remote.rkey };
        wr.remote_len = remote.len;
        wr.atomic_value = value;
        wr
    }

    /// Adds immediate data: a send becomes send-with-immediate, a write becomes
    /// write-with-immediate (which consumes a receive at the peer). Other operations are
    /// unchanged.
    pub fn with_imm(mut self, imm: u32) -> Self {
        use ffi::ibv_wr_opcode::*;
        self.raw.opcode = match self.raw.opcode {
            IBV_WR_SEND => IBV_WR_SEND_WITH_IMM,
            IBV_WR_RDMA_WRITE => IBV_WR_RDMA_WRITE_WITH_IMM,
            _ => return self,
        };
        crate::ffi_compat::set_imm(&mut self.raw, imm.to_be());
        self
    }

    /// Copies the data into the queue at post time (`IBV_SEND_INLINE`), up to the QP's
    /// `max_inline_data`. Only sends and RDMA WRITEs carry inline data (`ibv_post_send(3)`):
    /// posting refuses it on READs and atomics.
    pub fn inline(mut self) -> Self {
        self.raw.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        self
    }

    /// No completion on success (`IBV_SEND_SIGNALED` cleared); a later signaled request's
    /// completion implies this one's. Errors still complete.
    pub fn unsignaled(mut self) -> Self {
        self.raw.send_flags &= !ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        self
    }

    /// Raises a solicited event at the peer (`IBV_SEND_SOLICITED`).
    pub fn solicited(mut self) -> Self {
        self.raw.send_flags |= ffi::ibv_send_flags::IBV_SEND_SOLICITED.0;
        self
    }

    /// Waits for earlier READs and atomics to complete before starting (`IBV_SEND_FENCE`).
    pub fn fence(mut self) -> Self {
        self.raw.send_flags |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        self
    }

    /// Addresses a UD send: through `ah`, to QP `remote_qpn` with Q_Key `qkey`. Every send on a
    /// UD QP needs it; posting refuses it on RC and UC QPs (their peer is fixed), and refuses an
    /// `ah` made in another protection domain than the QP's (or on another device), as
    /// `ibv_post_send(3)` requires (rxe would report such a send as successful and drop it).
    pub fn to(mut self, ah: &'a AddressHandle<'_>, remote_qpn: u32, qkey: u32) -> Self {
        self.raw.wr.ud = ffi::ud_t { ah: ah.as_raw(), remote_qpn, remote_qkey: qkey };
        self.remote_len = 0;
        self.ah_pd = ah.pd_raw() as usize;
        self
    }

    fn has_ah(&self) -> bool {
        self.ah_pd != 0
    }

    /// Whether it asks for a completion on success.
    pub fn is_signaled(&self) -> bool {
        self.raw.send_flags & ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 != 0
    }

    pub(crate) fn set_signaled(&mut self) {
        self.raw.send_flags |= ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    }

    /// The `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    pub(crate) fn set_wr_id(&mut self, wr_id: u64) {
        self.raw.wr_id = wr_id;
    }

    fn sges(&self) -> &[ffi::ibv_sge] {
        if self.uses_inline_sge {
            std::slice::from_ref(&self.inline_sge)
        } else if self.raw.num_sge > 0 {
            // SAFETY: `sg_list` points at `num_sge` entries borrowed for 'a (see `new`).
            unsafe { std::slice::from_raw_parts(self.raw.sg_list, self.raw.num_sge as usize) }
        } else {
            &[]
        }
    }

    /// The bytes the request sends, writes or reads, in full.
    fn byte_len(&self) -> u64 {
        if self.uses_inline_sge {
            self.inline_slice_len as u64
        } else {
            self.sges().iter().map(|s| u64::from(s.length)).sum()
        }
    }

    /// Refuses an address handle of another protection domain than the QP's `pd` (or of
    /// another device, whose PDs are all others).
    fn check_ah_pd(&self, pd: *mut ffi::ibv_pd) -> std::result::Result<(), String> {
        if self.has_ah() && self.ah_pd != pd as usize {
            let id = self.raw.wr_id;
            return Err(format!(
                "request with wr_id {id}: its address handle belongs to another protection domain (or device) than the QP"
            ));
        }
        Ok(())
    }

    /// Why the QP would refuse this request, or what the device would do wrong with it.
    fn check(&self, caps: &QpCaps, qp_type: ffi::ibv_qp_type::Type, scoped: bool) -> std::result::Result<(), String> {
        use ffi::ibv_wr_opcode::*;
        let id = self.raw.wr_id;
        let op = self.raw.opcode;
        if !scoped && id & RESERVED_WR_ID_BITS != 0 {
            return Err(format!("wr_id {id:#x} uses bits 62-63, which are reserved to posting scopes"));
        }
        let name = opcode_name(op);
        let local = op == IBV_WR_LOCAL_INV || op == IBV_WR_BIND_MW;
        if op == IBV_WR_ATOMIC_WRITE {
            let addr = self.rdma_target().0;
            if qp_type != ffi::ibv_qp_type::IBV_QPT_RC {
                return Err(format!("request with wr_id {id}: an atomic write is available on an RC QP only"));
            }
            if self.raw.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
                return Err(format!("request with wr_id {id}: an atomic write carries its value, not inline data"));
            }
            if self.remote_len < 8 || addr % 8 != 0 {
                return Err(format!(
                    "request with wr_id {id}: an atomic write needs 8 remote bytes at an 8-byte aligned address (got {} at {addr:#x})",
                    self.remote_len
                ));
            }
            return Ok(());
        }
        let (sends, rdma, atomic) = (
            op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_SEND_WITH_INV,
            op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM || op == IBV_WR_RDMA_READ,
            op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD,
        );
        let transport_ok = match qp_type {
            ffi::ibv_qp_type::IBV_QPT_UD => op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM,
            ffi::ibv_qp_type::IBV_QPT_UC => {
                sends || local || op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM
            }
            _ => sends || rdma || atomic || local,
        };
        let transport = match qp_type {
            ffi::ibv_qp_type::IBV_QPT_UD => "UD",
            ffi::ibv_qp_type::IBV_QPT_UC => "UC",
            _ => "RC",
        };
        if !transport_ok {
            return Err(format!("request with wr_id {id}: {name} is not available on a {transport} QP"));
        }
        if qp_type == ffi::ibv_qp_type::IBV_QPT_UD && !self.has_ah() {
            return Err(format!("request with wr_id {id}: a send on a UD QP needs an address (`.to(ah, qpn, qkey)`)"));
        }
        if qp_type != ffi::ibv_qp_type::IBV_QPT_UD && self.has_ah() {
            return Err(format!("request with wr_id {id}: `.to()` addresses UD sends; a {transport} QP has one peer"));
        }
        if !self.uses_inline_sge && self.raw.num_sge as u32 > caps.max_send_sge {
            return Err(format!(
                "request with wr_id {id} has {} SGEs; the QP takes {}",
                self.raw.num_sge, caps.max_send_sge
            ));
        }
        let len = self.byte_len();
        if self.uses_inline_sge || self.raw.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0 {
            if !(sends || op == IBV_WR_RDMA_WRITE || op == IBV_WR_RDMA_WRITE_WITH_IMM) {
                return Err(format!("request with wr_id {id}: {name} cannot carry inline data"));
            }
            if len > u64::from(caps.max_inline_data) {
                return Err(format!(
                    "request with wr_id {id} has {len} inline bytes; the QP takes {}",
                    caps.max_inline_data
                ));
            }
        }
        if rdma && len > self.remote_len {
            return Err(format!(
                "request with wr_id {id}: {name} of {len} bytes does not fit its remote region of {}",
                self.remote_len
            ));
        }
        if atomic && (len != 8 || self.remote_len < 8) {
            return Err(format!(
                "request with wr_id {id}: {name} needs an 8-byte local SGE and remote region (got {len} and {})",
                self.remote_len
            ));
        }
        Ok(())
    }
}

impl SendRequest<'_, '_> {
    /// The operation this request is, with its operands (`None` for an opcode no builder
    /// takes).
    pub(crate) fn send_op(&self) -> Option<SendOp> {
        use ffi::ibv_wr_opcode::*;
        let w = &self.raw;
        let key = crate::ffi_compat::imm_or_invalidate_rkey(w);
        Some(match w.opcode {
            IBV_WR_SEND => SendOp::Send,
            IBV_WR_SEND_WITH_IMM => SendOp::SendImm { imm: key },
            IBV_WR_SEND_WITH_INV => SendOp::SendInv { rkey: key },
            IBV_WR_RDMA_WRITE => {
                let (addr, rkey) = self.rdma_target();
                SendOp::Write { rkey, addr }
            }
            IBV_WR_RDMA_WRITE_WITH_IMM => {
                let (addr, rkey) = self.rdma_target();
                SendOp::WriteImm { rkey, addr, imm: key }
            }
            IBV_WR_RDMA_READ => {
                let (addr, rkey) = self.rdma_target();
                SendOp::Read { rkey, addr }
            }
            IBV_WR_ATOMIC_CMP_AND_SWP => {
                let a = self.atomic_target();
                SendOp::CompareSwap { rkey: a.rkey, addr: a.remote_addr, compare: a.compare_add, swap: a.swap }
            }
            IBV_WR_ATOMIC_FETCH_AND_ADD => {
                let a = self.atomic_target();
                SendOp::FetchAdd { rkey: a.rkey, addr: a.remote_addr, add: a.compare_add }
            }
            IBV_WR_LOCAL_INV => SendOp::LocalInv { rkey: key },
            IBV_WR_ATOMIC_WRITE => {
                let (addr, rkey) = self.rdma_target();
                SendOp::AtomicWrite { rkey, addr, value: self.atomic_value }
            }
            IBV_WR_BIND_MW => {
                let (mw, rkey, info) = crate::ffi_compat::bind_mw_of(w);
                SendOp::BindMw { mw, rkey, info }
            }
            _ => return None,
        })
    }

    /// Adds this request, already checked (`check`), to the batch open on `qpx` as `op` (its
    /// [`send_op`](Self::send_op)) and `wr_id`, signaled as it says or when `signaled`. If the
    /// provider lacks a setter it needs, nothing is added and its name is returned.
    ///
    /// # Safety
    /// As [`raw::build`]: a batch is open on the live extended QP `qpx` (whose builders `b`
    /// are), by this thread, and `op` is among its send ops.
    pub(crate) unsafe fn build_ex(
        &self,
        qpx: NonNull<ffi::ibv_qp_ex>,
        b: &Builders,
        op: &SendOp,
        wr_id: u64,
        signaled: bool,
    ) -> std::result::Result<(), &'static str> {
        let w = &self.raw;
        let sges = self.sges();
        let inline = self.uses_inline_sge || w.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0;
        const MAX_INLINE_BUFS: usize = 32;
        if inline && sges.len() > MAX_INLINE_BUFS {
            return Err("wr_set_inline_data_list (more than 32 buffers)");
        }
        // The inline send of one plain slice keeps its full length beside the SGE.
        let inline_len =
            |s: &ffi::ibv_sge| if self.uses_inline_sge { self.inline_slice_len } else { s.length as usize };
        // Filled only for several inline buffers: most requests have one.
        let mut bufs: [ffi::ibv_data_buf; MAX_INLINE_BUFS];
        let data = match (inline, sges) {
            (true, [s]) => Data::Inline(ffi::ibv_data_buf { addr: s.addr as *mut libc::c_void, length: inline_len(s) }),
            (true, _) => {
                bufs = [ffi::ibv_data_buf { addr: std::ptr::null_mut(), length: 0 }; MAX_INLINE_BUFS];
                for (b, s) in bufs.iter_mut().zip(sges) {
                    *b = ffi::ibv_data_buf { addr: s.addr as *mut libc::c_void, length: inline_len(s) };
                }
                Data::InlineList(&bufs[..sges.len()])
            }
            // An operation that carries data gets its data setter even for no bytes: some
            // providers finish the queue entry there (mlx5), and without it the request is
            // overwritten by the next one or left out of the doorbell.
            (false, []) if op.carries_data() => Data::Sge(ffi::ibv_sge { addr: 0, length: 0, lkey: 0 }),
            (false, []) => Data::None,
            (false, [s]) => Data::Sge(*s),
            (false, _) => Data::SgeList(sges),
        };
        let ud = self.has_ah().then(|| {
            // SAFETY: `to` set the `ud` member whole (`has_ah`).
            let ud = unsafe { w.wr.ud };
            (ud.ah, ud.remote_qpn, ud.remote_qkey)
        });
        let signal = if signaled { ffi::ibv_send_flags::IBV_SEND_SIGNALED.0 } else { 0 };
        // IBV_SEND_INLINE stays when the data is inline: rxe's kernel side reads the data from
        // the entry only with it (without it, LocalQpOperationError on rdma-core 44).
        let inline_flag = if inline { ffi::ibv_send_flags::IBV_SEND_INLINE.0 } else { 0 };
        let flags = (w.send_flags & !ffi::ibv_send_flags::IBV_SEND_INLINE.0) | signal | inline_flag;
        // SAFETY: the caller's contract; the operands are the request's own, which `check`
        // accepted, and its buffers are borrowed by the caller's posting layer.
        unsafe { raw::build(qpx, b, wr_id, flags, *op, ud, data) }
    }

    /// Refuses what only a batch can post: an atomic write carries its value in the request,
    /// which `ibv_post_send` has no field for.
    fn check_classic(&self) -> std::result::Result<(), String> {
        if self.raw.opcode == ffi::ibv_wr_opcode::IBV_WR_ATOMIC_WRITE {
            return Err(format!(
                "request with wr_id {}: an atomic write posts through a batch (PostScope::batch on an extended QP)",
                self.raw.wr_id
            ));
        }
        Ok(())
    }

    /// How many SGEs or inline buffers it names.
    pub(crate) fn buffers(&self) -> usize {
        self.sges().len()
    }

    /// The remote address and key of an RDMA or atomic-write request (only those: another
    /// request's union member may leave `rdma`'s padding uninitialised).
    fn rdma_target(&self) -> (u64, u32) {
        // SAFETY: `wr` is a union of plain integers and pointers; read as `rdma` only for RDMA
        // and atomic-write opcodes, whose constructors set it whole.
        let r = unsafe { self.raw.wr.rdma };
        (r.remote_addr, r.rkey)
    }

    /// The remote target and operands of an atomic request (only those).
    fn atomic_target(&self) -> ffi::atomic_t {
        // SAFETY: as `rdma_target`, for the compare-and-swap and fetch-and-add opcodes, whose
        // constructors set `atomic` whole.
        unsafe { self.raw.wr.atomic }
    }
}

/// The verbs name of a send opcode, for messages.
fn opcode_name(op: ffi::ibv_wr_opcode::Type) -> &'static str {
    use ffi::ibv_wr_opcode::*;
    match op {
        IBV_WR_SEND => "SEND",
        IBV_WR_SEND_WITH_IMM => "SEND with immediate",
        IBV_WR_RDMA_WRITE => "RDMA WRITE",
        IBV_WR_RDMA_WRITE_WITH_IMM => "RDMA WRITE with immediate",
        IBV_WR_RDMA_READ => "RDMA READ",
        IBV_WR_ATOMIC_CMP_AND_SWP => "atomic compare-and-swap",
        IBV_WR_ATOMIC_FETCH_AND_ADD => "atomic fetch-and-add",
        IBV_WR_SEND_WITH_INV => "SEND with invalidate",
        IBV_WR_LOCAL_INV => "local invalidate",
        IBV_WR_BIND_MW => "memory window bind",
        IBV_WR_ATOMIC_WRITE => "atomic write",
        _ => "this opcode",
    }
}

/// A receive-queue work request (`struct ibv_recv_wr`): where an incoming send lands.
///
/// # References
/// - [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
#[doc(alias = "ibv_recv_wr")]
#[must_use = "a request does nothing until it is posted"]
pub struct RecvRequest<'a, 'mr> {
    raw: ffi::ibv_recv_wr,
    _borrows: PhantomData<(&'a [u8], Sge<'mr>)>,
}

// SAFETY: as for `SendRequest`.
unsafe impl Send for RecvRequest<'_, '_> {}

impl fmt::Debug for RecvRequest<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvRequest").field("wr_id", &self.raw.wr_id).field("num_sge", &self.raw.num_sge).finish()
    }
}

impl<'a, 'mr> RecvRequest<'a, 'mr> {
    /// A receive into the bytes `sges` name (none: only for zero-length messages or
    /// write-with-immediate).
    pub fn new(wr_id: u64, sges: &'a [Sge<'mr>]) -> Self {
        let raw = ffi::ibv_recv_wr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: sges.as_ptr() as *mut ffi::ibv_sge,
            num_sge: sges.len() as libc::c_int,
        };
        RecvRequest { raw, _borrows: PhantomData }
    }

    /// The `wr_id`.
    pub fn wr_id(&self) -> u64 {
        self.raw.wr_id
    }

    pub(crate) fn set_wr_id(&mut self, wr_id: u64) {
        self.raw.wr_id = wr_id;
    }
}

/// Checks the requests against the QP (transport, sizes) and links them into one chain, in
/// place. `scoped`: the caller is a posting scope, whose tags may use the reserved `wr_id` bits.
/// The checks `link_send` makes of one request, for a batch that builds it another way.
pub(crate) fn check_send<'a>(
    wr: &SendRequest<'_, '_>,
    caps: &QpCaps,
    qp_type: ffi::ibv_qp_type::Type,
    pd: *mut ffi::ibv_pd,
    device: impl FnOnce() -> &'a str,
) -> Result<()> {
    wr.check(caps, qp_type, true)
        .and_then(|()| wr.check_ah_pd(pd))
        .map_err(|reason| Error::invalid("ibv_wr_post", Some(device()), reason))
}

pub(crate) fn link_send(
    wrs: &mut [SendRequest<'_, '_>],
    caps: &QpCaps,
    qp_type: ffi::ibv_qp_type::Type,
    pd: *mut ffi::ibv_pd,
    device: &str,
    scoped: bool,
) -> Result<Option<*mut ffi::ibv_send_wr>> {
    for wr in wrs.iter() {
        wr.check(caps, qp_type, scoped)
            .and_then(|()| wr.check_ah_pd(pd))
            .and_then(|()| wr.check_classic())
            .map_err(|reason| Error::invalid("ibv_post_send", Some(device), reason))?;
    }
    let n = wrs.len();
    for i in 0..n {
        let next = if i + 1 < n { &mut wrs[i + 1].raw as *mut ffi::ibv_send_wr } else { std::ptr::null_mut() };
        let wr = &mut wrs[i];
        if wr.uses_inline_sge {
            wr.raw.sg_list = &mut wr.inline_sge;
        }
        wr.raw.next = next;
    }
    Ok(wrs.first_mut().map(|w| &mut w.raw as *mut _))
}

pub(crate) fn link_recv(
    wrs: &mut [RecvRequest<'_, '_>],
    max_sge: u32,
    verb: &'static str,
    device: &str,
    scoped: bool,
) -> Result<Option<*mut ffi::ibv_recv_wr>> {
    let n = wrs.len();
    for wr in wrs.iter() {
        let reason = if wr.raw.num_sge as u32 > max_sge {
            format!("request with wr_id {} has {} SGEs; the queue takes {max_sge}", wr.wr_id(), wr.raw.num_sge)
        } else if !scoped && wr.raw.wr_id & RESERVED_WR_ID_BITS != 0 {
            format!("wr_id {:#x} uses bits 62-63, which are reserved to posting scopes", wr.raw.wr_id)
        } else {
            continue;
        };
        return Err(Error::invalid(verb, Some(device), reason));
    }
    for i in 0..n {
        let next = if i + 1 < n { &mut wrs[i + 1].raw as *mut ffi::ibv_recv_wr } else { std::ptr::null_mut() };
        wrs[i].raw.next = next;
    }
    Ok(wrs.first_mut().map(|w| &mut w.raw as *mut _))
}

/// The position in `wrs`, a linked chain, of the request `bad` points at; `None` when it points
/// at none of them (NULL included: what that means is `post::raw`'s rule).
pub(crate) fn index_of_send(wrs: &[SendRequest<'_, '_>], bad: *mut ffi::ibv_send_wr) -> Option<usize> {
    wrs.iter().position(|w| std::ptr::eq(&w.raw, bad))
}

/// As [`index_of_send`], for receives.
pub(crate) fn index_of_recv(wrs: &[RecvRequest<'_, '_>], bad: *mut ffi::ibv_recv_wr) -> Option<usize> {
    wrs.iter().position(|w| std::ptr::eq(&w.raw, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ffi::ibv_qp_type::{IBV_QPT_RC as RC, IBV_QPT_UC as UC, IBV_QPT_UD as UD};

    const CAPS: QpCaps =
        QpCaps { max_send_wr: 8, max_recv_wr: 8, max_send_sge: 2, max_recv_sge: 2, max_inline_data: 64 };

    /// Every opcode the builders make, with the transports that may carry it.
    fn every_opcode<'a>(
        sges: &'a [Sge<'a>],
        result: &'a [Sge<'a>; 1],
    ) -> Vec<(&'static str, SendRequest<'a, 'a>, [bool; 3])> {
        let remote = RemoteRegion { addr: 0x1000, rkey: 1, len: 4096 };
        //                                                                          RC     UC     UD
        vec![
            ("send", SendRequest::send(1, sges), [true, true, true]),
            ("send with imm", SendRequest::send(2, sges).with_imm(7), [true, true, true]),
            ("write", SendRequest::write(3, sges, remote), [true, true, false]),
            ("write with imm", SendRequest::write(4, sges, remote).with_imm(7), [true, true, false]),
            ("read", SendRequest::read(5, sges, remote), [true, false, false]),
            ("compare-swap", SendRequest::compare_swap(6, result, remote, 0, 1), [true, false, false]),
            ("fetch-add", SendRequest::fetch_add(7, result, remote, 1), [true, false, false]),
        ]
    }

    /// An SGE of `len` bytes at a made-up address (the checks never dereference it).
    fn sge(len: u32) -> Sge<'static> {
        Sge::unregistered(len)
    }

    #[test]
    fn only_valid_opcode_and_transport_pairs_reach_the_device() {
        let (sges, result) = ([sge(8)], [sge(8)]);
        for (name, wr, allowed) in every_opcode(&sges, &result) {
            for (i, qp_type) in [RC, UC, UD].into_iter().enumerate() {
                let mut wr_ud = SendRequest { ah_pd: 0x1000, ..clone_wr(&wr) };
                wr_ud.raw.wr.ud.remote_qpn = 1;
                // UD needs an address, and only UD takes one.
                let (with_ah, without_ah) = (wr_ud.check(&CAPS, qp_type, false), wr.check(&CAPS, qp_type, false));
                if qp_type == UD {
                    assert_eq!(with_ah.is_ok(), allowed[i], "{name} with an AH on UD: {with_ah:?}");
                    assert!(without_ah.is_err(), "{name} without an AH on UD was accepted");
                } else {
                    assert_eq!(without_ah.is_ok(), allowed[i], "{name} on {i}: {without_ah:?}");
                    assert!(with_ah.is_err(), "{name} with an AH on a connected QP was accepted");
                }
            }
        }
    }

    #[test]
    fn inline_only_on_sends_and_writes_and_within_the_limit() {
        let (sges, result) = ([sge(8)], [sge(8)]);
        for (name, wr, _) in every_opcode(&sges, &result) {
            let carries = ["send", "send with imm", "write", "write with imm"].contains(&name);
            let r = wr.inline().check(&CAPS, RC, false);
            assert_eq!(r.is_ok(), carries, "inline {name}: {r:?}");
        }
        let big = [sge(65)];
        assert!(SendRequest::send(1, &big).inline().check(&CAPS, RC, false).is_err(), "over max_inline_data");
    }

    #[test]
    fn rdma_must_fit_its_remote_region_and_atomics_are_8_bytes() {
        let (sges, small) = ([sge(100)], RemoteRegion { addr: 0x1000, rkey: 1, len: 99 });
        assert!(SendRequest::write(1, &sges, small).check(&CAPS, RC, false).is_err());
        assert!(SendRequest::read(1, &sges, small).check(&CAPS, RC, false).is_err());
        assert!(SendRequest::write(1, &sges, RemoteRegion { len: 100, ..small }).check(&CAPS, RC, false).is_ok());
        let wide = [sge(16)];
        let remote = RemoteRegion { addr: 0x1000, rkey: 1, len: 8 };
        assert!(SendRequest::fetch_add(1, &wide, remote, 1).check(&CAPS, RC, false).is_err());
        let short = RemoteRegion { len: 4, ..remote };
        assert!(SendRequest::fetch_add(1, &[sge(8)], short, 1).check(&CAPS, RC, false).is_err());
    }

    #[test]
    fn an_address_handle_must_share_the_qps_protection_domain() {
        let sges = [sge(8)];
        let wr = SendRequest { ah_pd: 0x1000, ..clone_wr(&SendRequest::send(1, &sges)) };
        assert!(wr.check_ah_pd(0x1000 as *mut _).is_ok());
        assert!(wr.check_ah_pd(0x2000 as *mut _).is_err(), "an AH of another PD was accepted");
        assert!(SendRequest::send(1, &sges).check_ah_pd(0x2000 as *mut _).is_ok(), "no AH: nothing to check");
    }

    #[test]
    fn atomic_writes_need_rc_eight_aligned_bytes_and_a_batch() {
        let at = |addr, len| RemoteRegion { addr, rkey: 1, len };
        assert!(SendRequest::atomic_write(1, at(0x1000, 8), [1; 8]).check(&CAPS, RC, false).is_ok());
        assert!(SendRequest::atomic_write(1, at(0x1004, 8), [1; 8]).check(&CAPS, RC, false).is_err());
        assert!(SendRequest::atomic_write(1, at(0x1000, 4), [1; 8]).check(&CAPS, RC, false).is_err());
        assert!(SendRequest::atomic_write(1, at(0x1000, 8), [1; 8]).inline().check(&CAPS, RC, false).is_err());
        assert!(SendRequest::atomic_write(1, at(0x1000, 8), [1; 8]).check(&CAPS, UC, false).is_err());
        assert!(SendRequest::atomic_write(1, at(0x1000, 8), [1; 8]).check_classic().is_err());
        assert!(SendRequest::write(1, &[], at(0x1000, 8)).check_classic().is_ok());
    }

    #[test]
    fn reserved_wr_id_bits_are_refused_outside_scopes() {
        let sges = [sge(8)];
        let wr = SendRequest::send(1 << 62, &sges);
        assert!(wr.check(&CAPS, RC, false).is_err());
        assert!(wr.check(&CAPS, RC, true).is_ok(), "a scope's own tags pass");
    }

    fn clone_wr<'a>(wr: &SendRequest<'a, 'a>) -> SendRequest<'a, 'a> {
        SendRequest {
            // SAFETY: `ibv_send_wr` is plain data (integers, pointers, unions of them).
            raw: unsafe { std::ptr::read(&wr.raw) },
            inline_sge: wr.inline_sge,
            inline_slice_len: wr.inline_slice_len,
            uses_inline_sge: wr.uses_inline_sge,
            remote_len: wr.remote_len,
            atomic_value: wr.atomic_value,
            ah_pd: wr.ah_pd,
            _borrows: PhantomData,
        }
    }

    #[test]
    fn a_bad_wr_is_found_only_among_the_chains_requests() {
        let sges: [crate::mr::Sge<'_>; 0] = [];
        let wrs = [SendRequest::send(1, &sges), SendRequest::send(2, &sges)];
        // The provider may leave bad_wr NULL (rxe does when the doorbell fails after queueing).
        assert_eq!(index_of_send(&wrs, std::ptr::null_mut()), None);
        assert_eq!(index_of_send(&wrs, &wrs[1].raw as *const _ as *mut _), Some(1));
    }
}
