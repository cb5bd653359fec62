//! What a [`SendQueue`](crate::SendQueue) takes and gives back: [`SlotRequest`] (a request that
//! owns its slot), [`Rejected`] and [`PostError`] (a request refused, given back), and
//! [`SlotCompletion`] (a request done, with its slot).

use crate::ffi;

use crate::error::{Error, Result};
use crate::mr::RemoteRegion;
use crate::pool::Slot;
use crate::post::op::SendOp;
use crate::wc::WcStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Send,
    Write,
    Read,
}

/// A send-queue request that owns its [`Slot`]: SEND, RDMA WRITE (either with immediate data)
/// or RDMA READ of the slot's first `len` bytes.
///
/// Pushed into a [`SendQueue`](crate::SendQueue); the slot comes back in the request's [`SlotCompletion`].
#[derive(Debug)]
#[must_use = "a request does nothing until it is posted; dropped, its slot goes back to the pool"]
pub struct SlotRequest<'pd> {
    pub(crate) op: Op,
    pub(crate) slot: Slot<'pd>,
    pub(crate) len: usize,
    pub(crate) remote: RemoteRegion,
    pub(crate) imm: Option<u32>,
    pub(crate) wr_id: u64,
    pub(crate) signaled: bool,
    pub(crate) unsignaled: bool,
}

impl<'pd> SlotRequest<'pd> {
    fn new(op: Op, slot: Slot<'pd>, len: usize, remote: RemoteRegion) -> Self {
        SlotRequest { op, slot, len, remote, imm: None, wr_id: 0, signaled: false, unsignaled: false }
    }

    /// A send of the slot's first `len` bytes, consuming a receive at the peer.
    pub fn send(slot: Slot<'pd>, len: usize) -> Self {
        Self::new(Op::Send, slot, len, RemoteRegion { addr: 0, rkey: 0, len: 0 })
    }

    /// An RDMA WRITE of the slot's first `len` bytes to `remote` (at most `remote.len` bytes).
    pub fn write(slot: Slot<'pd>, len: usize, remote: RemoteRegion) -> Self {
        Self::new(Op::Write, slot, len, remote)
    }

    /// An RDMA READ of `len` bytes from `remote` into the start of the slot (RC only; the pool
    /// needs `LOCAL_WRITE`).
    pub fn read(slot: Slot<'pd>, len: usize, remote: RemoteRegion) -> Self {
        Self::new(Op::Read, slot, len, remote)
    }

    /// Adds immediate data (a send or write with immediate; a write with immediate consumes a
    /// receive at the peer). Ignored on a READ, which cannot carry it.
    pub fn with_imm(mut self, imm: u32) -> Self {
        self.imm = Some(imm);
        self
    }

    /// Sets the `wr_id` the request's [`SlotCompletion`] carries (any 64 bits).
    pub fn with_wr_id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Asks for a completion even if the request is not the last of its batch.
    pub fn signaled(mut self) -> Self {
        self.signaled = true;
        self
    }

    /// Asks for no completion even when the request is the last of its batch: its slot comes
    /// back with the next signaled completion of the queue (a later request's), or when the
    /// queue is dropped; a failure still completes it. For messages whose completion nobody
    /// waits for: each signaled completion can wake a sleeping thread. While every request in
    /// flight was posted so, the queue's [`wait`](crate::SendQueue::wait) and
    /// [`drain`](crate::SendQueue::drain) have nothing to wait for
    /// ([`Error::NothingToWaitFor`]): post a signaled one before the pool runs dry.
    /// [`signaled`](Self::signaled) overrides it.
    pub fn unsignaled(mut self) -> Self {
        self.unsignaled = true;
        self
    }

    /// Whether the request asks for a completion as the last of its batch.
    #[inline(always)]
    pub(crate) fn signaled_as_last(&self) -> bool {
        self.signaled || !self.unsignaled
    }

    /// Gives the slot back, unposted.
    pub fn into_slot(self) -> Slot<'pd> {
        self.slot
    }

    /// The operation it posts, with its operands.
    #[inline(always)]
    pub(crate) fn send_op(&self) -> SendOp {
        let (rkey, addr) = (self.remote.rkey, self.remote.addr);
        match (self.op, self.imm.map(u32::to_be)) {
            (Op::Send, None) => SendOp::Send,
            (Op::Send, Some(imm)) => SendOp::SendImm { imm },
            (Op::Write, None) => SendOp::Write { rkey, addr },
            (Op::Write, Some(imm)) => SendOp::WriteImm { rkey, addr, imm },
            (Op::Read, _) => SendOp::Read { rkey, addr },
        }
    }

    pub(crate) fn opcode(&self) -> ffi::ibv_wr_opcode::Type {
        use ffi::ibv_wr_opcode::*;
        match (self.op, self.imm.is_some()) {
            (Op::Send, false) => IBV_WR_SEND,
            (Op::Send, true) => IBV_WR_SEND_WITH_IMM,
            (Op::Write, false) => IBV_WR_RDMA_WRITE,
            (Op::Write, true) => IBV_WR_RDMA_WRITE_WITH_IMM,
            (Op::Read, _) => IBV_WR_RDMA_READ,
        }
    }
}

/// A request [`SendQueue::push`](crate::SendQueue::push) refused, given back with the reason.
///
/// `?` converts it into [`Error`], dropping the request (its slot returns to the pool).
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejected<'pd> {
    /// Why it was refused.
    #[source]
    pub error: Error,
    /// The request, unposted, with its slot.
    pub request: SlotRequest<'pd>,
}

impl From<Rejected<'_>> for Error {
    fn from(r: Rejected<'_>) -> Error {
        r.error
    }
}

/// Why [`SendQueue::post`](crate::SendQueue::post) failed.
#[derive(Debug, thiserror::Error)]
pub enum PostError<'pd> {
    /// Not posted: the request is given back.
    #[error(transparent)]
    Rejected(Rejected<'pd>),
    /// The provider failed without naming the request: it may be posted, and stays in flight.
    #[error(transparent)]
    MaybePosted(Error),
}

impl From<PostError<'_>> for Error {
    fn from(e: PostError<'_>) -> Error {
        match e {
            PostError::Rejected(r) => r.error,
            PostError::MaybePosted(e) => e,
        }
    }
}

/// A request that completed, with its slot back.
#[derive(Debug)]
pub struct SlotCompletion<'pd> {
    /// The `wr_id` it was pushed with.
    pub wr_id: u64,
    /// Its outcome. A request covered by a later signaled completion succeeded (a failed
    /// request always completes on its own).
    pub status: WcStatus,
    /// The slot it owned; `None` for inline data.
    pub slot: Option<Slot<'pd>>,
    pub(crate) vendor_err: u32,
}

impl SlotCompletion<'_> {
    /// `Ok` on success, else [`Error::WorkCompletion`] with the status.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`] when the request failed (or was flushed).
    pub fn ok(&self) -> Result<()> {
        if self.status == WcStatus::Success {
            return Ok(());
        }
        Err(Error::WorkCompletion { wr_id: self.wr_id, status: self.status, vendor_err: self.vendor_err })
    }
}
