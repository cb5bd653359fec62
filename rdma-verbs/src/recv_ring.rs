//! Receives that stay posted: [`RecvRing`] and [`SlotMessage`].
//!
//! A ring posts `depth` slots of a [`SlotPool`] as receives once, and re-posts each slot when
//! the application releases the [`SlotMessage`] it arrived in. Between completion and release the
//! message owns its slot, so its bytes are a plain `&[u8]`: the NIC cannot write a slot that is
//! not posted, and a ring's pool is never remotely writable. A write-with-immediate consumes a
//! receive without data: its message has the immediate and no bytes.
//!
//! ```no_run
//! # use std::time::Duration;
//! # use rdma_verbs::*;
//! # fn f(qp: &QueuePair<'_, Rc, Init>, pool: SlotPool<'_>) -> Result<()> {
//! let mut ring = RecvRing::new(qp, pool, 64, Duration::from_secs(1))?; // 64 receives posted
//! // ... connect the QP; the receives stay posted through the transitions ...
//! let msg = ring.recv(Duration::from_secs(5))?;
//! msg.ok()?;
//! println!("{} bytes, imm {:?}", msg.bytes().len(), msg.imm());
//! ring.release(msg)?; // posted again
//! # Ok(()) }
//! ```

use std::fmt;
use std::io;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use crate::ffi;

use crate::cq::CompletionQueue;
use crate::cq_holder::CqHolder;
use crate::cq_owner::CqOwner;
use crate::error::{Error, Result};
use crate::mr::AccessFlags;
use crate::parent::Parent;
use crate::pool::{Slot, SlotPool};
use crate::post;
use crate::qp::quiesce;
use crate::qp::state::{CanPostRecv, Transport};
use crate::qp::{Inner, QueuePair};
use crate::send_queue::POLL_BATCH;
use crate::srq::{RingRefusal, SharedReceiveQueue};
use crate::wait::deadline::Deadline;
use crate::wait::{CqWaiter, WaitPolicy};
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};
use crate::wr_id::{next_generation, tag, untag, Space};

/// A receive that completed, owning the slot it arrived in until it is
/// [released](RecvRing::release) (posted again) or dropped (the slot returns to the pool).
pub struct SlotMessage<'pd> {
    slot: Slot<'pd>,
    /// Bytes that landed in the slot (0 for a write-with-immediate).
    byte_len: u32,
    /// The length of the peer's RDMA WRITE, for a write-with-immediate.
    write_len: u32,
    imm: Option<u32>,
    status: WcStatus,
    opcode: WcOpcode,
    qp_num: u32,
    src_qp: u32,
    vendor_err: u32,
    /// The whole completion (its `wr_id` the ring's own), for what the fields above leave out.
    wc: WorkCompletion,
}

impl fmt::Debug for SlotMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SlotMessage")
            .field("slot", &self.slot.index())
            .field("byte_len", &self.byte_len)
            .field("imm", &self.imm)
            .field("status", &self.status)
            .field("qp_num", &self.qp_num)
            .finish()
    }
}

impl<'pd> SlotMessage<'pd> {
    /// The bytes received (none for a write-with-immediate or a failed receive). For a UD QP
    /// they start with the 40-byte GRH.
    pub fn bytes(&self) -> &[u8] {
        // The ring's pool is never remotely writable, so `as_slice` cannot fail.
        self.slot.as_slice().map(|s| &s[..(self.byte_len as usize).min(s.len())]).unwrap_or_default()
    }

    /// The immediate data of a send or write with immediate.
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// Whether a write-with-immediate consumed this receive (no bytes landed in it).
    pub fn is_write_with_imm(&self) -> bool {
        self.opcode == WcOpcode::RecvRdmaWithImm
    }

    /// For a write-with-immediate, how many bytes the peer's WRITE placed in its target
    /// region (the completion's `byte_len`, which for this opcode does not describe the
    /// receive's own slot); 0 otherwise.
    pub fn write_len(&self) -> u32 {
        self.write_len
    }

    /// The receive's outcome.
    pub fn status(&self) -> WcStatus {
        self.status
    }

    /// `Ok` on success, else [`Error::WorkCompletion`] with the status.
    ///
    /// # Errors
    /// [`Error::WorkCompletion`] when the receive failed or was flushed.
    pub fn ok(&self) -> Result<()> {
        if self.status == WcStatus::Success {
            return Ok(());
        }
        Err(Error::WorkCompletion {
            wr_id: u64::from(self.slot.index()),
            status: self.status,
            vendor_err: self.vendor_err,
        })
    }

    /// The local QP it arrived on (tells connections apart on a shared receive queue).
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The sending QP, for UD.
    pub fn src_qp(&self) -> u32 {
        self.src_qp
    }

    /// The receive's whole completion, as the CQ gave it (its `wr_id` is the ring's own tag):
    /// with [`bytes`](Self::bytes), whose first [`GRH_LEN`](crate::GRH_LEN) bytes are the
    /// GRH on a UD QP, the address of a reply to the sender
    /// ([`AddressHandle::from_wc`](crate::AddressHandle::from_wc)).
    pub fn completion(&self) -> &WorkCompletion {
        &self.wc
    }

    /// The slot the message arrived in.
    pub fn slot(&self) -> &Slot<'pd> {
        &self.slot
    }

    /// Writes the received bytes to `file` at `file_offset` with `pwrite(2)` straight from the
    /// registered slot ([`Slot::write_file`]).
    ///
    /// # Errors
    /// As [`Slot::write_file`].
    pub fn write_file(&self, file: &impl AsFd, file_offset: u64) -> io::Result<()> {
        self.slot.write_file(file, file_offset, self.bytes().len())
    }

    /// Keeps the slot, out of the ring (which then has one receive fewer posted until
    /// [`RecvRing::refill`]).
    pub fn into_slot(self) -> Slot<'pd> {
        self.slot
    }
}

/// A ring of receives posted from a [`SlotPool`] to a QP's receive queue or to a shared receive
/// queue, re-posted as the application releases each [`SlotMessage`].
///
/// It owns the CQ its receives complete on (the QP's receive CQ; for an SRQ, the CQ given, which
/// every QP of the SRQ must use) and discards completions of other requests there. It holds its
/// QP or SRQ (no borrow), and is `Send`: with shared parents a thread can own it.
///
/// # When another layer resets the QP
/// A posting scope, a [`SendQueue`](crate::SendQueue) or another holder that resets the QP in
/// its drain removes this ring's receives without completions: their slots stay with the ring
/// (never handed out) and [`posted`](Self::posted) keeps counting them, so the ring receives no
/// more. Such a QP is a dead connection; drop the ring with it.
///
/// # Dropping
/// Receives still posted must be out of the device's reach before their slots return to the
/// pool. On a QP: if the ring is the QP's last holder, the QP is destroyed before the slots
/// return. Otherwise the QP is flushed (error state: the connection ends) and the ring waits
/// up to its `drain_timeout` for the flushed receives, then flushes again and waits at least
/// five seconds (the local device alone makes those completions). A slot returns only with its
/// completion: if some never come, the QP is reset and those slots are leaked, never reused.
/// On an SRQ: if the ring is its last holder, the SRQ is destroyed. Otherwise the receives stay
/// posted (an SRQ's receives cannot be flushed: its other QPs may still consume them) and the
/// SRQ takes their slots, returning them to the pool when it is destroyed, after its last
/// holder is dropped. No other ring may own that SRQ ([`Error::Busy`]), and the CQ stays owned
/// for good (direct polls and new owners get [`Error::Busy`], even after the SRQ is gone):
/// completions of those receives may be in it, and only an owner that posted them could tell
/// them apart.
/// Forgetting the ring leaks its posted slots (and their pool).
///
/// Completions the ring did not take are discarded from its CQ before the CQ can have another
/// owner, so none of them can ever be taken for a later owner's.
#[must_use = "dropping it at once releases what was just made"]
pub struct RecvRing<'res> {
    /// Dropped before `posted`: the QP or SRQ goes before the slots it may write.
    qp: Option<Arc<Inner<'res>>>,
    srq: Option<Arc<SharedReceiveQueue<'res>>>,
    cq: CqOwner<'res>,
    pool: SlotPool<'res>,
    generation: u64,
    depth: u32,
    /// Posted slots by position (`0..depth`, the low bits of their `wr_id`).
    posted: Box<[Option<Slot<'res>>]>,
    /// Positions with nothing posted.
    free_positions: Vec<u32>,
    posted_count: u32,
    wcs: [WorkCompletion; POLL_BATCH],
    wc_next: usize,
    wc_len: usize,
    drain_timeout: Duration,
    wait_policy: WaitPolicy,
}

impl fmt::Debug for RecvRing<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RecvRing")
            .field("depth", &self.depth)
            .field("posted", &self.posted_count)
            .field("slot_size", &self.pool.slot_size())
            .finish()
    }
}

impl<'res> RecvRing<'res> {
    /// Posts `depth` slots of `pool` as receives on `qp` (in `Init` or later: before or after
    /// the connection is established) and owns the QP's receive CQ.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the QP takes receives from an SRQ, the pool is remotely
    /// writable, lacks `LOCAL_WRITE` or belongs to another protection domain, or `depth` is 0
    /// or over the QP's `max_recv_wr` or the CQ's capacity; [`Error::QueueFull`] when the pool
    /// has fewer than `depth` free slots; [`Error::Busy`] when the CQ is owned already;
    /// [`Error::PostFailed`] when posting fails; the receives posted before it are then
    /// flushed (the QP goes to the error state) as the ring is dropped.
    ///
    /// With `drain_timeout` = [`Duration::MAX`], dropping the ring may wait without a deadline.
    pub fn new<T: Transport, S: CanPostRecv>(
        qp: &QueuePair<'res, T, S>,
        pool: SlotPool<'res>,
        depth: usize,
        drain_timeout: Duration,
    ) -> Result<Self> {
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        let inner = Arc::clone(qp.shared());
        let device = inner.device();
        if inner.has_srq() {
            return Err(Error::invalid("ibv_post_recv", Some(device), "this QP takes its receives from an SRQ"));
        }
        if !std::ptr::eq(pool.pd(), &*inner.pd) {
            return Err(Error::invalid("ibv_post_recv", Some(device), "the pool belongs to another protection domain"));
        }
        let limit = inner.caps.max_recv_wr.min(inner.recv_cq.cqe());
        check(&pool, depth, limit, device)?;
        let cq = CqOwner::claim(inner.recv_cq.clone(), CqHolder::RecvRing, "RecvRing::new")?;
        Self::start(Some(inner), None, cq, pool, depth, drain_timeout)
    }

    /// [`new`](Self::new), for a ring that will be awaited (`recv_async`, feature `tokio`):
    /// the QP's receive CQ must report to a completion channel, or an async wait could never
    /// sleep. Refused here, before any receive is posted, rather than at the first
    /// `recv_async`.
    ///
    /// # Errors
    /// As [`new`](Self::new); [`Error::InvalidArgument`] when the receive CQ has no completion
    /// channel (make it with [`Context::create_cq_with_channel`](crate::Context::create_cq_with_channel)).
    pub fn for_async<T: Transport, S: CanPostRecv>(
        qp: &QueuePair<'res, T, S>,
        pool: SlotPool<'res>,
        depth: usize,
        drain_timeout: Duration,
    ) -> Result<Self> {
        crate::cq::check_awaitable("RecvRing::for_async", qp.recv_cq())?;
        Self::new(qp, pool, depth, drain_timeout)
    }

    /// Posts `depth` slots of `pool` to the shared receive queue `srq` and owns it: every QP of
    /// the SRQ must deliver its receive completions to `cq` (the ring owns that CQ), which is
    /// checked both ways (QPs made before with another CQ refuse the ring; QPs made after with
    /// another CQ are refused). Messages tell their QP by [`SlotMessage::qp_num`].
    ///
    /// # Errors
    /// As [`new`](Self::new), with the SRQ's `max_wr` as the limit; [`Error::Busy`] when another
    /// ring owns the SRQ; [`Error::InvalidArgument`] when a QP of the SRQ uses another CQ, or the
    /// CQ is of another device context than the SRQ.
    pub fn with_srq(
        srq: Arc<SharedReceiveQueue<'res>>,
        cq: impl Into<Parent<'res, CompletionQueue<'res>>>,
        pool: SlotPool<'res>,
        depth: usize,
        drain_timeout: Duration,
    ) -> Result<Self> {
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        let cq = cq.into();
        let device = srq.device();
        if !std::ptr::eq(cq.context(), srq.pd().context()) {
            let reason = "the CQ belongs to another device context than the SRQ: no QP of the SRQ could use it";
            return Err(Error::invalid("ibv_post_srq_recv", Some(device), reason));
        }
        if !std::ptr::eq(pool.pd(), srq.pd()) {
            return Err(Error::invalid(
                "ibv_post_srq_recv",
                Some(device),
                "the pool belongs to another protection domain",
            ));
        }
        check(&pool, depth, srq.max_wr().min(cq.cqe()), device)?;
        let owner = CqOwner::claim(cq.clone(), CqHolder::RecvRing, "RecvRing::with_srq")?;
        match srq.attach_ring(cq.as_raw()) {
            Ok(()) => {}
            Err(RingRefusal::Busy) => {
                return Err(Error::Busy {
                    what: "RecvRing::with_srq",
                    holder: Some(CqHolder::RecvRing),
                    device: Some(device.to_owned()),
                })
            }
            Err(RingRefusal::OtherCq) => {
                let reason = "a QP of this SRQ delivers its receive completions to another CQ";
                return Err(Error::invalid("ibv_post_srq_recv", Some(device), reason));
            }
        }
        Self::start(None, Some(srq), owner, pool, depth, drain_timeout)
    }

    fn start(
        qp: Option<Arc<Inner<'res>>>,
        srq: Option<Arc<SharedReceiveQueue<'res>>>,
        cq: CqOwner<'res>,
        pool: SlotPool<'res>,
        depth: u32,
        drain_timeout: Duration,
    ) -> Result<Self> {
        let posted = (0..depth).map(|_| None).collect();
        let mut ring = RecvRing {
            qp,
            srq,
            cq,
            pool,
            generation: next_generation(),
            depth,
            posted,
            free_positions: (0..depth).rev().collect(),
            posted_count: 0,
            wcs: [WorkCompletion::default(); POLL_BATCH],
            wc_next: 0,
            wc_len: 0,
            drain_timeout,
            wait_policy: WaitPolicy::default(),
        };
        ring.refill()?;
        Ok(ring)
    }

    /// The number of receives the ring keeps posted.
    pub fn capacity(&self) -> usize {
        self.depth as usize
    }

    /// The number posted right now.
    pub fn posted(&self) -> usize {
        self.posted_count as usize
    }

    /// The CQ this ring owns, to [`arm`](crate::CompletionQueue::arm) it and wait on its
    /// [channel](crate::CompletionQueue::channel)'s file descriptor before calling
    /// [`try_recv`](Self::try_recv). Polling it directly is refused while the ring lives.
    pub fn cq(&self) -> &CompletionQueue<'res> {
        self.cq.cq()
    }

    /// The pool the slots come from.
    pub fn pool(&self) -> &SlotPool<'res> {
        &self.pool
    }

    /// Posts slots from the pool until [`capacity`](Self::capacity) receives are posted (after
    /// messages were dropped or kept with [`SlotMessage::into_slot`]). Returns how many it posted.
    ///
    /// # Errors
    /// [`Error::PostFailed`] when posting fails.
    pub fn refill(&mut self) -> Result<u32> {
        let mut n = 0;
        while self.posted_count < self.depth {
            let Some(slot) = self.pool.try_take() else { break };
            self.post(slot)?;
            n += 1;
        }
        Ok(n)
    }

    /// Posts the message's slot again: `ibv_post_recv()` (or `ibv_post_srq_recv()`); if
    /// [`capacity`](Self::capacity) receives are posted already (after a [`refill`](Self::refill)),
    /// the slot goes back to the pool instead. Allocates nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a message of another ring's pool (dropped);
    /// [`Error::PostFailed`] when posting fails (the slot returns to the pool).
    #[doc(alias = "ibv_post_recv")]
    pub fn release(&mut self, msg: SlotMessage<'res>) -> Result<()> {
        if !msg.slot.is_from(&self.pool) {
            return Err(Error::invalid(
                "ibv_post_recv",
                Some(self.device()),
                "the message is from another ring's pool",
            ));
        }
        self.post(msg.slot)
    }

    fn device(&self) -> &str {
        match (&self.qp, &self.srq) {
            (Some(qp), _) => qp.device(),
            (_, Some(srq)) => srq.device(),
            _ => "",
        }
    }

    fn post(&mut self, slot: Slot<'res>) -> Result<()> {
        if let Some(qp) = &self.qp {
            qp.check_postable("ibv_post_recv")?;
        }
        // Never more than `depth` posted: the CQ is sized for them.
        let Some(position) = self.free_positions.pop() else { return Ok(()) };
        let mut sge = ffi::ibv_sge { addr: slot.addr(), length: slot.len() as u32, lkey: slot.lkey() };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: tag(Space::Recv, self.generation, u64::from(position)),
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let head: *mut ffi::ibv_recv_wr = &mut wr;
        let named = |bad: *mut ffi::ibv_recv_wr| std::ptr::eq(bad, head).then_some(0);
        // SAFETY: one receive naming the slot's bytes, which move into `posted` below while it
        // may be posted, so no Rust code reaches them until the receive's completion gives the
        // slot back; the QP or SRQ is live (held by `self`).
        let (posted, verb) = unsafe {
            match (&self.qp, &self.srq) {
                (Some(qp), _) => (post::raw::post_recv(qp.raw(), head, 1, named), "ibv_post_recv"),
                (_, Some(srq)) => (post::raw::post_srq_recv(srq.as_raw(), head, 1, named), "ibv_post_srq_recv"),
                _ => {
                    self.free_positions.push(position);
                    return Err(Error::invalid("ibv_post_recv", None, "the ring has neither a QP nor an SRQ"));
                }
            }
        };
        // The slot stays posted while the device may use it (`post::raw`).
        if posted.in_flight() == 1 {
            self.posted[position as usize] = Some(slot);
            self.posted_count += 1;
        } else {
            self.free_positions.push(position);
        }
        posted.result(verb, || self.device()).map(drop)
    }

    /// The next message that arrived, without waiting: polls the CQ (`ibv_poll_cq()`) when the
    /// completions already taken are used up. Allocates nothing.
    ///
    /// # Errors
    /// [`Error::Verb`] when polling fails.
    #[doc(alias = "ibv_poll_cq")]
    pub fn try_recv(&mut self) -> Result<Option<SlotMessage<'res>>> {
        loop {
            if self.wc_next == self.wc_len {
                self.wc_next = 0;
                self.wc_len = self.cq.poll(&mut self.wcs)?.len();
                if self.wc_len == 0 {
                    return Ok(None);
                }
            }
            let wc = self.wcs[self.wc_next];
            self.wc_next += 1;
            if let Some(msg) = self.take(&wc) {
                return Ok(Some(msg));
            }
        }
    }

    /// Waits up to `timeout` for the next message ([`Duration::MAX`]: no deadline): polls,
    /// spinning for the ring's [`WaitPolicy`], then sleeps on the CQ's completion channel
    /// ([`CqWaiter`]). A ring whose CQ has no channel can only spin ([`can_sleep`](Self::can_sleep)).
    ///
    /// # Errors
    /// [`Error::Timeout`] when none came in time; [`Error::NothingToWaitFor`] at once when no
    /// receive is posted (every slot is out in a message, or kept with
    /// [`SlotMessage::into_slot`]): nothing can arrive until one is released or the ring
    /// [refilled](Self::refill); as [`try_recv`](Self::try_recv) and [`CqWaiter::idle`].
    ///
    /// On a QP in the error state its receives complete flushed (rxe needs the QP moved to error
    /// again for that: the ring does it when nothing came for 50 ms), so this wait ends there
    /// too.
    pub fn recv(&mut self, timeout: Duration) -> Result<SlotMessage<'res>> {
        let deadline = Deadline::after(timeout);
        let mut reflush = Reflush::new();
        if let Some(msg) = self.next_or_reflush(&mut reflush)? {
            return Ok(msg);
        }
        let cq = self.cq.handle();
        let mut waiter = CqWaiter::new(self.wait_policy);
        loop {
            let until = if self.qp.is_some() { deadline.min(reflush.at()) } else { deadline };
            if let Some(msg) = waiter.wait(&[&cq], until, || self.next_or_reflush(&mut reflush))? {
                return Ok(msg);
            }
            if deadline.has_passed() {
                return Err(Error::Timeout { what: "a received message", after: timeout });
            }
        }
    }

    /// Awaits the next message (feature `tokio`): [`recv`](Self::recv) for async code, with no
    /// timeout of its own (wrap it in `tokio::time::timeout`). The spin of the ring's
    /// [`WaitPolicy`] yields to the runtime; then the task sleeps until the CQ's completion
    /// channel, registered with the current runtime's reactor by the library for the wait, has
    /// an event.
    ///
    /// Cancellation-safe: a message is taken from the CQ only in a step that returns it at
    /// once, so a future dropped at any await (a `select!` branch that lost, a
    /// `tokio::time::timeout`) has taken nothing: the message stays for the next call, and no
    /// slot is held by the dropped future.
    ///
    /// # Errors
    /// As `recv` (but no timeout); [`Error::InvalidArgument`] when the CQ has no completion
    /// channel; [`Error::NoRuntime`] outside a tokio runtime.
    ///
    /// # Panics
    /// In a runtime without IO or time enabled, as tokio's own types.
    #[cfg(feature = "tokio")]
    pub async fn recv_async(&mut self) -> Result<SlotMessage<'res>> {
        let mut reflush = Reflush::new();
        if let Some(msg) = self.next_or_reflush(&mut reflush)? {
            return Ok(msg);
        }
        let cq = self.cq.handle();
        let mut waiter = CqWaiter::new(self.wait_policy);
        loop {
            let until = if self.qp.is_some() { reflush.at() } else { Deadline::never() };
            if let Some(msg) = waiter.wait_async(&[&cq], until, || self.next_or_reflush(&mut reflush)).await? {
                return Ok(msg);
            }
        }
    }

    /// One poll of a wait: the next message, or `None` after moving a QP in error to error
    /// again when `reflush` has passed (see [`recv`](Self::recv)).
    fn next_or_reflush(&mut self, reflush: &mut Reflush) -> Result<Option<SlotMessage<'res>>> {
        if let Some(msg) = self.try_recv()? {
            return Ok(Some(msg));
        }
        if self.posted_count == 0 {
            return Err(Error::NothingToWaitFor { what: "a received message" });
        }
        if reflush.due() {
            if let Some(qp) = &self.qp {
                qp.reflush_if_in_error();
            }
        }
        Ok(None)
    }

    /// How the ring's waits wait: spin budget, then sleep (see [`WaitPolicy`]).
    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait_policy
    }

    /// Sets how the ring's waits wait.
    pub fn set_wait_policy(&mut self, policy: WaitPolicy) {
        self.wait_policy = policy;
    }

    /// Whether the ring's waits can sleep: its CQ has a completion channel. Without one they
    /// can only spin, a core each until a message or the timeout.
    pub fn can_sleep(&self) -> bool {
        CqWaiter::can_sleep(&[self.cq.cq()])
    }

    /// The message of a completion that is one of this ring's receives.
    fn take(&mut self, wc: &WorkCompletion) -> Option<SlotMessage<'res>> {
        if let Some(qp) = &self.qp {
            if wc.qp_num() != qp.qp_num() {
                return None;
            }
        }
        let position = u32::try_from(untag(Space::Recv, wc.wr_id(), self.generation)?).ok()?;
        let slot = self.posted.get_mut(position as usize)?.take()?;
        self.free_positions.push(position);
        self.posted_count -= 1;
        let ok = wc.is_success();
        // For RECV_RDMA_WITH_IMM, `byte_len` is the length of the peer's WRITE (rxe and mlx5
        // both report it), not bytes in the receive buffer: the slot holds nothing new.
        let write = ok && wc.opcode() == WcOpcode::RecvRdmaWithImm;
        Some(SlotMessage {
            slot,
            byte_len: if ok && !write { wc.byte_len() } else { 0 },
            write_len: if write { wc.byte_len() } else { 0 },
            imm: if ok { wc.imm() } else { None },
            status: wc.status(),
            opcode: if ok { wc.opcode() } else { WcOpcode::Recv },
            qp_num: wc.qp_num(),
            src_qp: wc.src_qp(),
            vendor_err: wc.vendor_err(),
            wc: *wc,
        })
    }

    /// Takes every completion there is, dropping the messages (their slots return to the pool).
    fn discard_all(&mut self) {
        while let Ok(Some(_)) = self.try_recv() {}
    }

    /// Puts every posted receive out of the device's reach, or hands it to the SRQ that will
    /// be: see [`Released`].
    fn quiesce(&mut self) -> Released {
        if let Some(srq) = self.srq.take() {
            return match Arc::try_unwrap(srq) {
                // The last holder: destroyed (no QP uses it any more), it is done with every
                // receive. What completed and was not taken is still in the CQ: the CQ's
                // release discards it (`CqOwner`), after this and before anyone else owns it.
                Ok(srq) => match srq.destroy() {
                    Ok(()) => Released::Done,
                    Err(_) => Released::Failed,
                },
                // Others hold the SRQ, whose QPs may still consume these receives: they stay
                // posted, and the SRQ returns their slots when it is destroyed.
                Err(srq) => {
                    srq.adopt_orphans(self.posted.iter_mut().filter_map(Option::take));
                    self.posted_count = 0;
                    Released::HandedToSrq
                }
            };
        }
        let Some(qp) = &self.qp else { return Released::Done };
        let last = quiesce::is_last_handle(qp);
        let qp = Arc::clone(qp);
        if last {
            // `qp` is dropped before `posted`: the QP is destroyed before the slots return.
            quiesce::reset_before_destroy(&qp, || self.discard_all());
            return Released::Done;
        }
        let outcome = quiesce::quiesce(
            &qp,
            &[&qp.recv_cq],
            self.drain_timeout,
            true,
            || {
                self.discard_all();
                self.posted_count == 0
            },
            || false,
        );
        match outcome {
            quiesce::Quiesced::Completed | quiesce::Quiesced::Flushed => Released::Done,
            quiesce::Quiesced::Lost { .. } => {
                // Stop the device, but do not take its word for it: leak the slots.
                let _ = quiesce::reset(&qp);
                Released::Failed
            }
        }
    }
}

/// When a wait for receives checks whether its QP is in the error state, whose receives rxe
/// completes only when moved to error again (`reflush_if_in_error`): 50 ms after it began, then
/// after twice as long each time, up to a second, so that an idle wait costs a QP query a
/// second at most, and a dead connection's receives end within a second.
pub(crate) struct Reflush {
    at: Deadline,
    every: Duration,
}

impl Reflush {
    const FIRST: Duration = Duration::from_millis(50);
    const MOST: Duration = Duration::from_secs(1);

    pub(crate) fn new() -> Self {
        Reflush { at: Deadline::after(Self::FIRST), every: Self::FIRST }
    }

    /// The next check.
    pub(crate) fn at(&self) -> Deadline {
        self.at
    }

    /// Whether a check is due now; if so, the next is scheduled.
    pub(crate) fn due(&mut self) -> bool {
        if !self.at.has_passed() {
            return false;
        }
        self.every = (self.every * 2).min(Self::MOST);
        self.at = Deadline::after(self.every);
        true
    }
}

/// What dropping a ring did with the receives it had posted.
enum Released {
    /// The device is done with every one: their slots return to the pool.
    Done,
    /// The SRQ, still held by others, took them: it returns the slots when it is destroyed.
    /// Their completions may still come to the ring's CQ.
    HandedToSrq,
    /// Not proven done: the slots must be leaked, and their completions may still come.
    Failed,
}

fn check(pool: &SlotPool<'_>, depth: u32, limit: u32, device: &str) -> Result<()> {
    let bad = |reason: String| Err(Error::invalid("ibv_post_recv", Some(device), reason));
    let access = pool.access();
    if access.remotely_writable() {
        return bad("a receive ring's pool must not be remotely writable: its messages are read as slices".into());
    }
    if !access.contains(AccessFlags::LOCAL_WRITE) {
        return bad("a receive ring's pool needs LOCAL_WRITE".into());
    }
    if u32::try_from(pool.slot_size()).is_err() {
        return bad("slots over 4 GiB".into());
    }
    if depth == 0 || depth > limit || depth > pool.count() {
        return bad(format!("depth {depth}: the queue and its CQ take 1..={limit}, the pool has {}", pool.count()));
    }
    if pool.available() < depth as usize {
        return Err(Error::QueueFull {
            device: Some(device.to_owned()),
            queue: "slot pool",
            capacity: pool.count(),
            outstanding: pool.count() - pool.available() as u32,
        });
    }
    Ok(())
}

#[cfg(feature = "tokio")]
impl RecvRing<'static> {
    /// Drops the ring without blocking the runtime (feature `tokio`): when receives are posted
    /// and the ring is not its QP's or SRQ's last holder, the drop flushes the QP and waits for
    /// the flushed receives (see the type's docs); that part runs on tokio's blocking pool
    /// (`spawn_blocking`), awaited here. Otherwise the ring is dropped at once.
    ///
    /// Dropped before it finishes, the future drops the ring where it is: the plain drop.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime (the ring is dropped, blocking).
    pub async fn close_async(self) -> Result<()> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime { what: "RecvRing::close_async" });
        }
        let quick = self.posted_count == 0
            || self.qp.as_ref().is_some_and(quiesce::is_last_handle)
            || self.srq.as_ref().is_some_and(|srq| Arc::strong_count(srq) == 1);
        if quick {
            return Ok(());
        }
        crate::wait::reactor::drop_off_runtime(self).await
    }
}

impl Drop for RecvRing<'_> {
    fn drop(&mut self) {
        if self.posted_count == 0 {
            if let Some(srq) = &self.srq {
                srq.detach_ring();
            }
            return;
        }
        match self.quiesce() {
            Released::Done => {}
            Released::HandedToSrq => {
                // Their completions may still come: no later owner of the CQ may take them for
                // its own (the SRQ stays attached, so no later ring owns it either).
                self.cq.keep_forever();
            }
            Released::Failed => {
                for slot in self.posted.iter_mut().filter_map(Option::take) {
                    // The device may still write it: never hand it out again.
                    std::mem::forget(slot);
                }
                // As above: the CQ (and, kept attached, the SRQ) stays this ring's for good.
                self.cq.keep_forever();
            }
        }
    }
}
