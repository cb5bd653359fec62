//! How a [`SendQueue`] hands what was pushed to the device, at each
//! [`submit`](SendQueue::submit): [`Posting`].
//!
//! Both ways post the same requests with one doorbell, the last one signaled, through
//! `post::raw`; they differ in the calls, in what a refusal leaves posted (`post::raw`'s rule),
//! and in cost (instructions per request, counted with callgrind by `examples/verbs-cost`).

use std::ptr::NonNull;

use crate::ffi;

use crate::error::{Error, Result};
use crate::post::op::{Data, SendOp, SendOps};
use crate::post::raw::{self, Builders, Posted};
use crate::qp::state::Connected;
use crate::wr_id::{tag, Space};

use super::{Held, SendQueue};

/// How a [`SendQueue`] posts: set with [`SendQueue::set_posting`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Posting {
    /// One `ibv_post_send()` of a linked chain of work requests. Works on every QP. When the
    /// provider refuses a request, those before it are posted.
    #[doc(alias = "ibv_post_send")]
    Chain,
    /// One batch of `ibv_wr_*` builders ended by `ibv_wr_complete()`, on an extended QP
    /// ([`QpCreateAttr::send_ops`](crate::QpCreateAttr::send_ops)). When the provider refuses
    /// the batch, every request in it counts as maybe posted (a provider may have queued them
    /// already). Requests whose operation the QP was not created with go by [`Chain`](Self::Chain).
    #[doc(alias = "ibv_wr_complete")]
    Batch,
}

/// What a submit posts after the pushed requests, signaled and without a slot: its `wr_id` is
/// the caller's.
#[derive(Clone, Copy)]
pub(super) enum Tail<'d> {
    /// Inline data sent, with optional immediate data ([`SendQueue::send_inline`]).
    Send { data: &'d [u8], imm: Option<u32>, wr_id: u64 },
    /// A zero-length RDMA WRITE with no key and no address ([`SendQueue::probe`]).
    Probe { wr_id: u64 },
}

impl Tail<'_> {
    fn wr_id(&self) -> u64 {
        match *self {
            Tail::Send { wr_id, .. } | Tail::Probe { wr_id } => wr_id,
        }
    }

    /// Its operation. A probe names no key and no address: the responder checks neither for a
    /// zero-length WRITE (IBA C9-88).
    fn op(&self) -> SendOp {
        match *self {
            Tail::Send { imm, .. } => inline_send(imm),
            Tail::Probe { .. } => SendOp::Write { rkey: 0, addr: 0 },
        }
    }

    /// Its bytes, copied into the queue entry: none for a probe.
    fn data(&self) -> &[u8] {
        match *self {
            Tail::Send { data, .. } => data,
            Tail::Probe { .. } => &[],
        }
    }
}

/// The tail of one submit, if any.
pub(super) type Inline<'d> = Option<Tail<'d>>;

const SIGNALED: u32 = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
const INLINE: u32 = ffi::ibv_send_flags::IBV_SEND_INLINE.0;

/// The operation of the inline send a submit ends with.
fn inline_send(imm: Option<u32>) -> SendOp {
    match imm {
        None => SendOp::Send,
        Some(imm) => SendOp::SendImm { imm: imm.to_be() },
    }
}

impl<T: Connected> SendQueue<'_, T> {
    /// How [`submit`](Self::submit) posts (see [`Posting`]). A queue on an extended QP starts
    /// with [`Posting::Batch`], the cheaper of the two there (on rxe, 226 instructions per
    /// 8-byte WRITE against 297 for the chain, counted by `examples/verbs-cost`: docs/results);
    /// on any other QP with [`Posting::Chain`], the only one it has.
    pub fn posting(&self) -> Posting {
        self.posting
    }

    /// Chooses how [`submit`](Self::submit) posts.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for [`Posting::Batch`] on a QP made without
    /// [`QpCreateAttr::send_ops`](crate::QpCreateAttr::send_ops).
    pub fn set_posting(&mut self, posting: Posting) -> Result<()> {
        if posting == Posting::Batch && self.qp.extended.is_none() {
            let reason = "Posting::Batch needs an extended QP (QpCreateAttr::send_ops)";
            return Err(Error::invalid("ibv_wr_start", Some(self.qp.device()), reason));
        }
        self.posting = posting;
        Ok(())
    }

    /// Posts everything staged, and `inline` after it, the way [`posting`](Self::posting) says.
    pub(super) fn post_staged(&mut self, inline: Inline<'_>) -> Result<usize> {
        if !self.staged.is_empty() || inline.is_some() {
            self.qp.check_postable(if self.posting == Posting::Batch { "ibv_wr_start" } else { "ibv_post_send" })?;
        }
        if let (Posting::Batch, Some((qpx, ops))) = (self.posting, self.qp.extended) {
            // The operations of all of them, gathered without stopping at the first the QP
            // lacks: the common case, a batch, looks at every request anyway.
            let inline_ops = inline.map_or(SendOps::empty(), |t| t.op().send_ops());
            let all = self.staged.iter().fold(inline_ops, |all, r| all | r.send_op().send_ops());
            if ops.contains(all) {
                return self.post_batch(qpx, inline);
            }
        }
        self.post_chain(inline)
    }

    /// One batch: `ibv_wr_start`, a builder and `ibv_wr_set_sge` (or `ibv_wr_set_inline_data`)
    /// per request, `ibv_wr_complete`.
    fn post_batch(&mut self, qpx: NonNull<ffi::ibv_qp_ex>, inline: Inline<'_>) -> Result<usize> {
        let total = self.staged.len() + usize::from(inline.is_some());
        if total == 0 {
            return Ok(0);
        }
        // SAFETY: the QP is live (held by `self.qp`) and extended; the batch is completed or
        // aborted below, on this thread, before the function returns.
        unsafe { raw::start(qpx) };
        // SAFETY: as above; every operation built was among the QP's send ops
        // (`post_staged`); each slot named is owned by `staged` and moves into `held` when
        // posted (`settle`), so no Rust code reaches its bytes until its completion (or a later
        // one) is seen; inline data is copied by the call.
        let built = unsafe { self.build_batch(qpx, inline) };
        if let Err(builder) = built {
            // SAFETY: the batch opened above is still open on this thread.
            unsafe { raw::abort(qpx) };
            return Err(Error::unsupported(
                "ibv_wr_post",
                Some(self.qp.device()),
                format!("the provider has no {builder}"),
            ));
        }
        // SAFETY: the batch opened above is still open on this thread; its buffers as above.
        let posted = unsafe { raw::complete(qpx, total) };
        self.settle(posted, inline, "ibv_wr_complete")
    }

    /// The builders of one batch; on error, the name of a builder the provider lacks.
    ///
    /// # Safety
    /// A batch is open on the live extended QP `qpx`, by this thread, and every operation of
    /// the staged requests and `inline` is among the QP's send ops.
    unsafe fn build_batch(
        &self,
        qpx: NonNull<ffi::ibv_qp_ex>,
        inline: Inline<'_>,
    ) -> std::result::Result<(), &'static str> {
        // SAFETY: the caller's contract: `qpx` is live.
        let b = unsafe { Builders::of(qpx) };
        let total = self.staged.len() + usize::from(inline.is_some());
        if !self.staged.is_empty() {
            // Every staged request is one slot: its setter is looked up once, for all of them.
            let set_sge = b.sge_setter()?;
            for (i, r) in self.staged.iter().enumerate() {
                let wr_id = tag(Space::Send, self.generation, self.next_seq + i as u64);
                let flags = if (i + 1 == total && r.signaled_as_last()) || r.signaled { SIGNALED } else { 0 };
                let sge = ffi::ibv_sge { addr: r.slot.addr(), length: r.len as u32, lkey: r.slot.lkey() };
                // SAFETY: the caller's contract (this thread's batch is open on the live `qpx`,
                // and the operation is among the QP's); the slot stays the queue's (see
                // `post_batch`).
                unsafe { raw::build_sge(qpx, &b, set_sge, wr_id, flags, r.send_op(), sge) }?;
            }
        }
        if let Some(t) = inline {
            let wr_id = tag(Space::Send, self.generation, self.next_seq + self.staged.len() as u64);
            let data = t.data();
            let bytes = ffi::ibv_data_buf { addr: data.as_ptr() as *mut libc::c_void, length: data.len() };
            // SAFETY: as above; the provider copies `data` during the call. IBV_SEND_INLINE
            // stays in the flags: rxe's kernel side reads inline data only with it.
            unsafe { raw::build(qpx, &b, wr_id, SIGNALED | INLINE, t.op(), None, Data::Inline(bytes)) }?;
        }
        Ok(())
    }

    /// One `ibv_post_send` of a linked chain: the provider may take a prefix of it.
    fn post_chain(&mut self, inline: Inline<'_>) -> Result<usize> {
        let n = self.staged.len();
        let total = n + usize::from(inline.is_some());
        if total == 0 {
            return Ok(0);
        }
        self.sges.clear();
        self.wrs.clear();
        for r in &self.staged {
            self.sges.push(ffi::ibv_sge { addr: r.slot.addr(), length: r.len as u32, lkey: r.slot.lkey() });
        }
        if let Some(t) = inline {
            let data = t.data();
            self.sges.push(ffi::ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 });
        }
        let sges = self.sges.as_mut_ptr();
        for i in 0..total {
            // SAFETY: `ibv_send_wr` is integers, raw pointers and unions of them: zero is valid.
            let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = tag(Space::Send, self.generation, self.next_seq + i as u64);
            // SAFETY: `i < total == sges.len()`.
            wr.sg_list = unsafe { sges.add(i) };
            let signaled = i + 1 == total;
            if let Some(r) = self.staged.get(i) {
                wr.num_sge = i32::from(r.len > 0);
                wr.opcode = r.opcode();
                if let Some(imm) = r.imm {
                    crate::ffi_compat::set_imm(&mut wr, imm.to_be());
                }
                if r.op != crate::request::Op::Send {
                    wr.wr.rdma = ffi::rdma_t { remote_addr: r.remote.addr, rkey: r.remote.rkey };
                }
                if (signaled && r.signaled_as_last()) || r.signaled {
                    wr.send_flags = SIGNALED;
                }
            } else if let Some(t) = inline {
                wr.num_sge = i32::from(!t.data().is_empty());
                wr.opcode = match t {
                    Tail::Send { imm: Some(imm), .. } => {
                        crate::ffi_compat::set_imm(&mut wr, imm.to_be());
                        ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
                    }
                    Tail::Send { imm: None, .. } => ffi::ibv_wr_opcode::IBV_WR_SEND,
                    // `wr.rdma` stays zero: no key, no address (`Tail::op`).
                    Tail::Probe { .. } => ffi::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                };
                wr.send_flags = SIGNALED | INLINE;
            }
            self.wrs.push(wr);
        }
        let wrs = self.wrs.as_mut_ptr();
        for i in 0..total - 1 {
            // SAFETY: both indices are inside `wrs`, which is not resized until the next chain.
            unsafe { (*wrs.add(i)).next = wrs.add(i + 1) };
        }
        // SAFETY: a chain of `total` checked requests in `wrs`, each naming one SGE in `sges`;
        // every slot named is owned by `staged` and moves into `held` when posted (`settle`), so
        // no Rust code can reach its bytes until its completion (or a later one) is seen; inline
        // data is copied by the call. The QP is live (held by `self.qp`).
        let posted = unsafe {
            raw::post_send(self.qp.raw(), wrs, total, |bad| {
                (0..total).find(|&i| std::ptr::eq(wrs.wrapping_add(i), bad))
            })
        };
        self.settle(posted, inline, "ibv_post_send")
    }

    /// Moves the staged requests (and `inline`, last) that `posted` counts in flight into
    /// `held`, where each slot stays until a completion covers it: those that may have been
    /// posted too (`post::raw`), as the device may still use their bytes. The others stay
    /// staged, for the next submit or to be given back.
    fn settle(&mut self, posted: Posted, inline: Inline<'_>, verb: &'static str) -> Result<usize> {
        let n = self.staged.len();
        let total = n + usize::from(inline.is_some());
        let in_flight = posted.in_flight();
        // Which of them the provider will report: up to the last signaled one (the last of the
        // post is, unless it asked not to be; an inline send always is).
        let signaled = |i: usize| match self.staged.get(i) {
            Some(r) => r.signaled || (i + 1 == total && r.signaled_as_last()),
            None => true,
        };
        if let Some(last) = (0..in_flight).rev().find(|&i| signaled(i)) {
            self.covered_upto = self.next_seq + last as u64 + 1;
        }
        for (i, r) in self.staged.drain(..in_flight.min(n)).enumerate() {
            let device_writes = r.op == crate::request::Op::Read;
            self.held.push_back(Held {
                seq: self.next_seq + i as u64,
                wr_id: r.wr_id,
                slot: Some(r.slot),
                device_writes,
                probe: false,
            });
        }
        if let Some(t) = inline.filter(|_| in_flight == total) {
            let wr_id = t.wr_id();
            let probe = matches!(t, Tail::Probe { .. });
            self.held.push_back(Held { seq: self.next_seq + n as u64, wr_id, slot: None, device_writes: false, probe });
        }
        self.next_seq += in_flight as u64;
        posted.result(verb, || self.qp.device())
    }
}
