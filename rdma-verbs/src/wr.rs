//! Work requests: [`SendRequest`], [`RecvRequest`].
//!
//! A request borrows two things for two lifetimes: its SGE array and inline data for `'a`, only
//! while it is posted (the provider copies them into the queue), and the memory regions its SGEs
//! name for `'mr`, which the safe posting scope extends until the request completed.

use std::fmt;
use std::marker::PhantomData;

use rdma_sys as ffi;

use crate::ah::AddressHandle;
use crate::context::Context;
use crate::error::{Error, Result};
use crate::mr::{RemoteRegion, Sge};
use crate::qp::attr::QpCaps;

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
pub struct SendRequest<'a, 'mr> {
    raw: ffi::ibv_send_wr,
    /// Storage for the one SGE of inline data given as a plain slice.
    inline_sge: ffi::ibv_sge,
    uses_inline_sge: bool,
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
            uses_inline_sge: false,
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
        wr.inline_sge = ffi::ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 };
        wr.uses_inline_sge = true;
        wr.raw.num_sge = 1;
        wr.raw.send_flags |= ffi::ibv_send_flags::IBV_SEND_INLINE.0;
        wr
    }

    /// An RDMA WRITE of the bytes `sges` name into `remote`.
    pub fn write(wr_id: u64, sges: &'a [Sge<'mr>], remote: RemoteRegion) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE, sges);
        wr.raw.wr.rdma = ffi::rdma_t { remote_addr: remote.addr, rkey: remote.rkey };
        wr
    }

    /// An RDMA READ of `remote` into the bytes `sges` name.
    pub fn read(wr_id: u64, sges: &'a [Sge<'mr>], remote: RemoteRegion) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_RDMA_READ, sges);
        wr.raw.wr.rdma = ffi::rdma_t { remote_addr: remote.addr, rkey: remote.rkey };
        wr
    }

    /// An atomic compare-and-swap on the 8 bytes at `remote`: if they equal `compare` they
    /// become `swap`. The old value lands in `result` (an 8-byte SGE).
    pub fn compare_swap(wr_id: u64, result: &'a [Sge<'mr>; 1], remote: RemoteRegion, compare: u64, swap: u64) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP, result);
        wr.raw.wr.atomic = ffi::atomic_t { remote_addr: remote.addr, compare_add: compare, swap, rkey: remote.rkey };
        wr
    }

    /// An atomic fetch-and-add of `add` to the 8 bytes at `remote`. The old value lands in
    /// `result` (an 8-byte SGE).
    pub fn fetch_add(wr_id: u64, result: &'a [Sge<'mr>; 1], remote: RemoteRegion, add: u64) -> Self {
        let mut wr = Self::new(wr_id, ffi::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, result);
        wr.raw.wr.atomic = ffi::atomic_t { remote_addr: remote.addr, compare_add: add, swap: 0, rkey: remote.rkey };
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
        self.raw.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        self
    }

    /// Copies the data into the queue at post time (`IBV_SEND_INLINE`), up to the QP's
    /// `max_inline_data`.
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

    /// Addresses a UD send: through `ah`, to QP `remote_qpn` with Q_Key `qkey`.
    pub fn to(mut self, ah: &'a AddressHandle<'_>, remote_qpn: u32, qkey: u32) -> Self {
        self.raw.wr.ud = ffi::ud_t { ah: ah.as_raw(), remote_qpn, remote_qkey: qkey };
        self
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

    fn inline_len(&self) -> u64 {
        let sges: &[ffi::ibv_sge] = if self.uses_inline_sge {
            std::slice::from_ref(&self.inline_sge)
        } else if self.raw.num_sge > 0 {
            // SAFETY: `sg_list` points at `num_sge` entries borrowed for 'a (see `new`).
            unsafe { std::slice::from_raw_parts(self.raw.sg_list, self.raw.num_sge as usize) }
        } else {
            &[]
        };
        sges.iter().map(|s| u64::from(s.length)).sum()
    }
}

/// A receive-queue work request (`struct ibv_recv_wr`): where an incoming send lands.
///
/// # References
/// - [`ibv_post_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html)
#[doc(alias = "ibv_recv_wr")]
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
}

/// Checks the requests against the QP's sizes and links them into one chain, in place.
pub(crate) fn link_send(
    wrs: &mut [SendRequest<'_, '_>],
    caps: &QpCaps,
    ctx: &Context,
) -> Result<Option<*mut ffi::ibv_send_wr>> {
    for wr in wrs.iter() {
        if !wr.uses_inline_sge && wr.raw.num_sge as u32 > caps.max_send_sge {
            let reason =
                format!("request {} has {} SGEs; the QP takes {}", wr.wr_id(), wr.raw.num_sge, caps.max_send_sge);
            return Err(Error::invalid("ibv_post_send", Some(ctx.name()), reason));
        }
        if wr.raw.send_flags & ffi::ibv_send_flags::IBV_SEND_INLINE.0 != 0
            && wr.inline_len() > u64::from(caps.max_inline_data)
        {
            let reason = format!(
                "request {} has {} inline bytes; the QP takes {}",
                wr.wr_id(),
                wr.inline_len(),
                caps.max_inline_data
            );
            return Err(Error::invalid("ibv_post_send", Some(ctx.name()), reason));
        }
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

pub(crate) fn link_recv(wrs: &mut [RecvRequest<'_, '_>], max_sge: u32) -> Result<Option<*mut ffi::ibv_recv_wr>> {
    let n = wrs.len();
    if let Some(wr) = wrs.iter().find(|w| w.raw.num_sge as u32 > max_sge) {
        let reason = format!("request {} has {} SGEs; the queue takes {max_sge}", wr.wr_id(), wr.raw.num_sge);
        return Err(Error::invalid("ibv_post_recv", None, reason));
    }
    for i in 0..n {
        let next = if i + 1 < n { &mut wrs[i + 1].raw as *mut ffi::ibv_recv_wr } else { std::ptr::null_mut() };
        wrs[i].raw.next = next;
    }
    Ok(wrs.first_mut().map(|w| &mut w.raw as *mut _))
}

pub(crate) fn index_of_send(wrs: &[SendRequest<'_, '_>], bad: *mut ffi::ibv_send_wr) -> usize {
    wrs.iter().position(|w| std::ptr::eq(&w.raw, bad)).unwrap_or(0)
}

pub(crate) fn index_of_recv(wrs: &[RecvRequest<'_, '_>], bad: *mut ffi::ibv_recv_wr) -> usize {
    wrs.iter().position(|w| std::ptr::eq(&w.raw, bad)).unwrap_or(0)
}
