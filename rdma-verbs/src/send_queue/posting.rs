//! How a [`SendQueue`] hands what was pushed to the device, at each
//! [`submit`](SendQueue::submit): [`Posting`].
//!
//! Both ways post the same requests with one doorbell, the last one signaled; they differ in
//! the calls, in what a refusal leaves posted, and in cost (instructions per request, counted
//! with callgrind by `examples/verbs-cost`: docs/results).

use crate::ffi;

use crate::batch::{set_request, Builders, SendOps};
use crate::error::{Error, Result};
use crate::request::Op;
use crate::wr_id::{tag, Space};

use super::{Held, SendQueue};
use crate::qp::state::Connected;

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

/// Inline data sent after the pushed requests: bytes, immediate data, `wr_id`.
pub(super) type Inline<'d> = Option<(&'d [u8], Option<u32>, u64)>;

const SIGNALED: u32 = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
const INLINE: u32 = ffi::ibv_send_flags::IBV_SEND_INLINE.0;

/// The operation a slot request or inline send posts, among an extended QP's.
fn send_op(op: Op, imm: bool) -> SendOps {
    match (op, imm) {
        (Op::Send, false) => SendOps::SEND,
        (Op::Send, true) => SendOps::SEND_WITH_IMM,
        (Op::Write, false) => SendOps::RDMA_WRITE,
        (Op::Write, true) => SendOps::RDMA_WRITE_WITH_IMM,
        (Op::Read, _) => SendOps::RDMA_READ,
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
            let inline_op = inline.map(|(_, imm, _)| send_op(Op::Send, imm.is_some()));
            if self.staged.iter().map(|r| send_op(r.op, r.imm.is_some())).chain(inline_op).all(|op| ops.contains(op)) {
                return self.post_batch(qpx.as_ptr(), inline);
            }
        }
        self.post_chain(inline)
    }

    /// One batch: `ibv_wr_start`, a builder and `ibv_wr_set_sge` (or `ibv_wr_set_inline_data`)
    /// per request, `ibv_wr_complete`. All or nothing.
    fn post_batch(&mut self, qpx: *mut ffi::ibv_qp_ex, inline: Inline<'_>) -> Result<usize> {
        let n = self.staged.len();
        let total = n + usize::from(inline.is_some());
        if total == 0 {
            return Ok(0);
        }
        // SAFETY: the QP is live (held by `self.qp`) and extended; the batch is completed or
        // aborted below, on this thread, before the function returns.
        unsafe { ffi::ibv_wr_start(qpx) };
        // SAFETY: as above; every operation built was among the QP's send ops
        // (`post_staged`); each slot named is owned by `staged` and moves into `held` on
        // success, so no Rust code reaches its bytes until its completion (or a later one) is
        // seen; inline data is copied by the call.
        let built = unsafe { self.build_batch(qpx, inline) };
        if let Err(builder) = built {
            // SAFETY: the batch opened above is still open on this thread.
            unsafe { ffi::ibv_wr_abort(qpx) };
            return Err(Error::unsupported(
                "ibv_wr_post",
                Some(self.qp.device()),
                format!("the provider has no {builder}"),
            ));
        }
        // SAFETY: the batch opened above is still open on this thread.
        let rc = unsafe { ffi::ibv_wr_complete(qpx) };
        // A refused batch may still be queued (rxe's provider stores the requests before its
        // doorbell is refused): every request counts as maybe posted, as a chain the provider
        // named no request of. Its slot returns with a completion, or when the queue is dropped.
        self.covered_upto = self.next_seq + total as u64;
        for (i, r) in self.staged.drain(..).enumerate() {
            self.held.push_back(Held { seq: self.next_seq + i as u64, wr_id: r.wr_id, slot: Some(r.slot) });
        }
        if let Some((_, _, wr_id)) = inline {
            self.held.push_back(Held { seq: self.next_seq + n as u64, wr_id, slot: None });
        }
        self.next_seq += total as u64;
        if rc != 0 {
            return Err(Error::post_failed("ibv_wr_complete", self.qp.device(), rc, total));
        }
        Ok(total)
    }

    /// The builders of one batch; on error, the name of a builder the provider lacks.
    ///
    /// # Safety
    /// A batch is open on the live extended QP `qpx`, by this thread, and every operation of
    /// the staged requests and `inline` is among the QP's send ops.
    unsafe fn build_batch(
        &self,
        qpx: *mut ffi::ibv_qp_ex,
        inline: Inline<'_>,
    ) -> std::result::Result<(), &'static str> {
        // SAFETY: the caller's contract: `qpx` is live.
        let b = unsafe { Builders::of(qpx) };
        let total = self.staged.len() + usize::from(inline.is_some());
        let set_sge = b.set_sge.ok_or("wr_set_sge")?;
        for (i, r) in self.staged.iter().enumerate() {
            let wr_id = tag(Space::Send, self.generation, self.next_seq + i as u64);
            let flags = if i + 1 == total || r.signaled { SIGNALED } else { 0 };
            let (rkey, addr) = (r.remote.rkey, r.remote.addr);
            let imm = r.imm.map(u32::to_be);
            // SAFETY: the caller's contract (this thread's batch is open on the live `qpx`, and
            // the operation is among the QP's); the builders get the checked request's fields.
            unsafe {
                set_request(qpx, wr_id, flags);
                match (r.op, imm) {
                    (Op::Send, None) => b.send.ok_or("wr_send")?(qpx),
                    (Op::Send, Some(imm)) => b.send_imm.ok_or("wr_send_imm")?(qpx, imm),
                    (Op::Write, None) => b.rdma_write.ok_or("wr_rdma_write")?(qpx, rkey, addr),
                    (Op::Write, Some(imm)) => b.rdma_write_imm.ok_or("wr_rdma_write_imm")?(qpx, rkey, addr, imm),
                    (Op::Read, _) => b.rdma_read.ok_or("wr_rdma_read")?(qpx, rkey, addr),
                }
                // Also for 0 bytes: some providers finish the entry in the data setter.
                set_sge(qpx, r.slot.lkey(), r.slot.addr(), r.len as u32);
            }
        }
        if let Some((data, imm, _)) = inline {
            let wr_id = tag(Space::Send, self.generation, self.next_seq + self.staged.len() as u64);
            let set_inline = b.set_inline_data.ok_or("wr_set_inline_data")?;
            // SAFETY: as above; the provider copies `data` during the call. IBV_SEND_INLINE
            // stays in the flags: rxe's kernel side reads inline data only with it.
            unsafe {
                set_request(qpx, wr_id, SIGNALED | INLINE);
                match imm {
                    None => b.send.ok_or("wr_send")?(qpx),
                    Some(imm) => b.send_imm.ok_or("wr_send_imm")?(qpx, imm.to_be()),
                }
                set_inline(qpx, data.as_ptr() as *mut libc::c_void, data.len());
            }
        }
        Ok(())
    }

    /// One `ibv_post_send` of a linked chain: the provider may take a prefix of it.
    fn post_chain(&mut self, inline: Inline<'_>) -> Result<usize> {
        const SIGNALED: u32 = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        const INLINE: u32 = ffi::ibv_send_flags::IBV_SEND_INLINE.0;
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
        if let Some((data, _, _)) = inline {
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
                if r.op != Op::Send {
                    wr.wr.rdma = ffi::rdma_t { remote_addr: r.remote.addr, rkey: r.remote.rkey };
                }
                if signaled || r.signaled {
                    wr.send_flags = SIGNALED;
                }
            } else if let Some((data, imm, _)) = inline {
                wr.num_sge = i32::from(!data.is_empty());
                wr.opcode = match imm {
                    Some(imm) => {
                        crate::ffi_compat::set_imm(&mut wr, imm.to_be());
                        ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
                    }
                    None => ffi::ibv_wr_opcode::IBV_WR_SEND,
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
        let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: a chain of `total` checked requests in `wrs`, each naming one SGE in `sges`;
        // every slot named is owned by `staged` and moves into `held` below, so no Rust code can
        // reach its bytes until its completion (or a later one) is seen; inline data is copied
        // by the call. The QP is live (held by `self.qp`).
        let rc = unsafe { ffi::ibv_post_send(self.qp.raw(), wrs, &mut bad) };
        let posted = if rc == 0 {
            total
        } else {
            // A NULL or unknown `bad` means the provider did not say: count all as maybe posted.
            (0..total).find(|&i| std::ptr::eq(wrs.wrapping_add(i), bad)).unwrap_or(total)
        };
        // Which of the posted requests the provider will report: up to the last signaled one.
        if let Some(last) = (0..posted).rev().find(|&i| self.wrs[i].send_flags & SIGNALED != 0) {
            self.covered_upto = self.next_seq + last as u64 + 1;
        }
        let from_staged = posted.min(n);
        for (i, r) in self.staged.drain(..from_staged).enumerate() {
            self.held.push_back(Held { seq: self.next_seq + i as u64, wr_id: r.wr_id, slot: Some(r.slot) });
        }
        if let Some((_, _, wr_id)) = inline.filter(|_| posted == total) {
            self.held.push_back(Held { seq: self.next_seq + n as u64, wr_id, slot: None });
        }
        self.next_seq += posted as u64;
        if rc != 0 {
            return Err(Error::post_failed("ibv_post_send", self.qp.device(), rc, posted));
        }
        Ok(posted)
    }
}
