//! Extended completion queues (`ibv_create_cq_ex`) and their lazy polls: [`WcFields`],
//! [`LazyCompletion`], [`CompletionQueue::poll_each`].
//!
//! An extended CQ is a [`CompletionQueue`] like any other: QPs, posting scopes, send queues,
//! receive rings and every wait use it unchanged, and each of their polls is a lazy poll
//! (`ibv_start_poll`, `ibv_end_poll`, one per completion: see `LazyCq::each` for why not
//! `ibv_next_poll`) that reads the fields a [`WorkCompletion`] has. [`CompletionQueue::poll_each`] reads only what the caller asks,
//! including what `ibv_poll_cq` cannot give (completion timestamps). Each completion is lent
//! to the caller's closure for the length of the call, inside the poll, so none outlives it:
//!
//! ```compile_fail
//! # use rdma_verbs::*;
//! # fn f(cq: &CompletionQueue<'_>) -> Result<()> {
//! let mut kept = None;
//! cq.poll_each(16, |wc| kept = Some(wc))?; // error: the completion does not outlive the poll
//! # Ok(()) }
//! ```
//!
//! One thread polls an extended CQ at a time: a poll started while another thread's runs
//! waits for it (yielding, then sleeping) up to 10 ms, then gives up with [`Error::Busy`] (a
//! poll never blocks for longer: keep `poll_each`'s closure short); a poll started from inside
//! `poll_each`'s closure is refused at once with [`Error::Busy`] (the provider's lock is held;
//! it would never be released).
//!
//! # References
//! - [`ibv_create_cq_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html)

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi;

use crate::completion_channel::CompletionChannel;
use crate::context::Context;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::wc::{WcOpcode, WcStatus, WorkCompletion};

bitflags::bitflags! {
    /// Fields an extended CQ's completions carry besides those of a [`WorkCompletion`], which
    /// it always carries (`IBV_WC_STANDARD_FLAGS`): `enum ibv_create_cq_wc_flags`.
    #[doc(alias = "ibv_create_cq_wc_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct WcFields: u64 {
        /// The device's clock when the completion was made (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`).
        const COMPLETION_TIMESTAMP = 1 << 7;
        /// The completion time in nanoseconds of wall-clock time
        /// (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK`).
        const COMPLETION_TIMESTAMP_WALLCLOCK = 1 << 11;
    }
}

/// `IBV_WC_STANDARD_FLAGS`: byte length, immediate, QP number, source QP, SLID, SL, DLID path
/// bits.
const STANDARD: u64 = 0x7f;

/// How many turns a poll yields to another thread's poll of the same extended CQ before it
/// sleeps.
const POLLER_SPINS: u32 = 64;
/// How long a poll waits for another thread's poll of the same extended CQ (one completion,
/// and that thread's `poll_each` closure) before it gives up with [`Error::Busy`].
const POLLER_WAIT: std::time::Duration = std::time::Duration::from_millis(10);

/// An extended CQ's view (`struct ibv_cq_ex`), what it was asked to carry, and its poller.
pub(crate) struct LazyCq {
    ex: NonNull<ffi::ibv_cq_ex>,
    fields: WcFields,
    /// The token of the thread whose lazy poll is in progress, 0 when none.
    poller: AtomicUsize,
}

impl fmt::Debug for LazyCq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyCq").field("fields", &self.fields).finish()
    }
}

thread_local! {
    /// A per-thread address: the token a thread polls an extended CQ under.
    static POLLER: u8 = const { 0 };
}

/// A lazy poll in progress: ends it (`ibv_end_poll`, when one was started) and lets the next
/// poller in when dropped, also on unwind.
struct Session<'a> {
    cq: &'a LazyCq,
    started: bool,
}

impl Drop for Session<'_> {
    fn drop(&mut self) {
        if self.started {
            // SAFETY: `ibv_start_poll` returned 0 on this CQ and the poll was not ended.
            unsafe { ffi::ibv_end_poll(self.cq.ex.as_ptr()) };
        }
        self.cq.poller.store(0, Ordering::Release);
    }
}

impl LazyCq {
    /// Becomes the CQ's poller: waits for another thread's poll to end, yielding for a few
    /// turns, then sleeping, for at most [`POLLER_WAIT`]; refuses a poll nested in this
    /// thread's own.
    fn enter(&self, device: &str) -> Result<Session<'_>> {
        let me = POLLER.with(|t| t as *const u8 as usize);
        let busy = |what| Error::Busy { what, holder: None, device: Some(device.to_owned()) };
        let mut deadline = None;
        let mut nap = std::time::Duration::from_micros(10);
        let mut turn = 0u32;
        loop {
            turn = turn.saturating_add(1);
            match self.poller.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
                Ok(_) => return Ok(Session { cq: self, started: false }),
                Err(now) if now == me => return Err(busy("a poll of an extended CQ inside its own poll")),
                Err(_) if turn <= POLLER_SPINS => std::thread::yield_now(),
                Err(_) => {
                    let deadline = *deadline.get_or_insert_with(|| std::time::Instant::now() + POLLER_WAIT);
                    if std::time::Instant::now() >= deadline {
                        return Err(busy("a poll of an extended CQ that another thread's poll kept busy"));
                    }
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(std::time::Duration::from_millis(1));
                }
            }
        }
    }

    /// Runs `f` on each completion, up to `max`; returns how many.
    ///
    /// Each completion is a poll of its own (`ibv_start_poll`, then `ibv_end_poll`), never
    /// `ibv_next_poll`: rdma-core's rxe provider before version 55 advanced past the last
    /// completion, and unlocked the CQ, in an `ibv_next_poll` that found none, and then again in
    /// the `ibv_end_poll` the man page requires: the CQ's consumer index ran ahead of its
    /// producer (later polls read stale entries) and its lock was released twice (rdma-core
    /// commits b78b414e0 and 5e7aa4102; Debian 12 ships rdma-core 44). Seen here as a receive
    /// ring reading a zeroed message.
    fn each(&self, device: &str, max: usize, mut f: impl FnMut(&LazyCompletion<'_>)) -> Result<usize> {
        let ex = self.ex.as_ptr();
        let mut n = 0;
        while n < max {
            let mut session = match self.enter(device) {
                Ok(session) => session,
                // What was taken is the caller's: report it, and the refusal on the next poll.
                Err(_) if n > 0 => break,
                Err(e) => return Err(e),
            };
            let mut attr = ffi::ibv_poll_cq_attr { comp_mask: 0 };
            // SAFETY: a live extended CQ with no poll in progress (this thread is its poller).
            let rc = unsafe { ffi::ibv_start_poll(ex, &mut attr) };
            match rc {
                0 => session.started = true,
                libc::ENOENT => break,
                _ if n > 0 => break,
                _ => return Err(Error::from_errno("ibv_start_poll", Some(device), rc)),
            }
            f(&LazyCompletion { ex: self.ex, fields: self.fields, _poll: PhantomData });
            n += 1;
        }
        Ok(n)
    }

    /// A lazy poll into `WorkCompletion`s, for every poll of the crate on this CQ.
    pub(crate) fn poll_into<'o>(
        &self,
        device: &str,
        out: &'o mut [WorkCompletion],
    ) -> Result<&'o mut [WorkCompletion]> {
        let mut i = 0;
        let n = self.each(device, out.len(), |wc| {
            out[i] = wc.to_work_completion();
            i += 1;
        })?;
        Ok(&mut out[..n])
    }
}

/// One completion of a lazy poll, lent to [`CompletionQueue::poll_each`]'s closure. Each
/// field is read from the device's entry when asked (`ibv_wc_read_*`).
///
/// # References
/// - [`ibv_create_cq_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html)
pub struct LazyCompletion<'p> {
    ex: NonNull<ffi::ibv_cq_ex>,
    fields: WcFields,
    /// Borrowed from the poll: it cannot be kept past the closure.
    _poll: PhantomData<&'p mut ()>,
}

impl fmt::Debug for LazyCompletion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LazyCompletion").field("wr_id", &self.wr_id()).field("status", &self.status()).finish()
    }
}

/// Calls the read op `$op` of the poll's CQ.
macro_rules! read {
    ($self:ident, $op:ident) => {{
        let ex = $self.ex.as_ptr();
        // SAFETY: the poll is in progress (the completion is lent inside it), and the CQ was
        // created carrying this field; a provider with extended CQs fills every read op.
        unsafe { ((*ex).$op.unwrap_unchecked())(ex) }
    }};
}

impl LazyCompletion<'_> {
    /// The `wr_id` of the request that completed.
    pub fn wr_id(&self) -> u64 {
        // SAFETY: the poll is in progress; `wr_id` is set by start/next_poll.
        unsafe { (*self.ex.as_ptr()).wr_id }
    }

    /// Whether it succeeded, or why not.
    pub fn status(&self) -> WcStatus {
        WcStatus::from_raw(self.raw_status())
    }

    fn raw_status(&self) -> ffi::ibv_wc_status::Type {
        // SAFETY: as `wr_id`.
        unsafe { (*self.ex.as_ptr()).status }
    }

    /// Whether it succeeded.
    pub fn is_success(&self) -> bool {
        self.raw_status() == ffi::ibv_wc_status::IBV_WC_SUCCESS
    }

    /// What kind of request completed (`ibv_wc_read_opcode`); only meaningful on success.
    #[doc(alias = "ibv_wc_read_opcode")]
    pub fn opcode(&self) -> WcOpcode {
        WcOpcode::from_raw(read!(self, read_opcode))
    }

    /// The provider's own error code (`ibv_wc_read_vendor_err`).
    #[doc(alias = "ibv_wc_read_vendor_err")]
    pub fn vendor_err(&self) -> u32 {
        read!(self, read_vendor_err)
    }

    /// Bytes received or transferred (`ibv_wc_read_byte_len`).
    #[doc(alias = "ibv_wc_read_byte_len")]
    pub fn byte_len(&self) -> u32 {
        read!(self, read_byte_len)
    }

    /// The immediate data, in host byte order, when the request carried one
    /// (`ibv_wc_read_imm_data`).
    #[doc(alias = "ibv_wc_read_imm_data")]
    pub fn imm(&self) -> Option<u32> {
        let flags = read!(self, read_wc_flags);
        (flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0).then(|| u32::from_be(read!(self, read_imm_data)))
    }

    /// The local QP's number (`ibv_wc_read_qp_num`).
    #[doc(alias = "ibv_wc_read_qp_num")]
    pub fn qp_num(&self) -> u32 {
        read!(self, read_qp_num)
    }

    /// The remote QP a UD receive came from (`ibv_wc_read_src_qp`).
    #[doc(alias = "ibv_wc_read_src_qp")]
    pub fn src_qp(&self) -> u32 {
        read!(self, read_src_qp)
    }

    /// The device's clock when the completion was made, if the CQ was created with
    /// [`WcFields::COMPLETION_TIMESTAMP`] (`ibv_wc_read_completion_ts`).
    #[doc(alias = "ibv_wc_read_completion_ts")]
    pub fn completion_timestamp(&self) -> Option<u64> {
        self.fields.contains(WcFields::COMPLETION_TIMESTAMP).then(|| read!(self, read_completion_ts))
    }

    /// The completion time in wall-clock nanoseconds, if the CQ was created with
    /// [`WcFields::COMPLETION_TIMESTAMP_WALLCLOCK`] (`ibv_wc_read_completion_wallclock_ns`).
    #[doc(alias = "ibv_wc_read_completion_wallclock_ns")]
    pub fn completion_wallclock_ns(&self) -> Option<u64> {
        self.fields
            .contains(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK)
            .then(|| read!(self, read_completion_wallclock_ns))
    }

    /// The fields a [`WorkCompletion`] holds, read now (a failed completion's: `wr_id`,
    /// status, vendor error and QP number, the fields valid for it).
    pub fn to_work_completion(&self) -> WorkCompletion {
        let status = self.raw_status();
        if status != ffi::ibv_wc_status::IBV_WC_SUCCESS {
            let (vendor, qpn) = (self.vendor_err(), self.qp_num());
            return WorkCompletion::from_fields(self.wr_id(), status, 0, vendor, 0, 0, qpn, 0, 0);
        }
        let flags = read!(self, read_wc_flags);
        WorkCompletion::from_fields(
            self.wr_id(),
            status,
            read!(self, read_opcode),
            0,
            self.byte_len(),
            read!(self, read_imm_data),
            self.qp_num(),
            self.src_qp(),
            flags,
        )
    }
}

impl Context {
    /// Creates an extended completion queue with room for at least `entries` completions,
    /// optionally reporting to `channel`, whose completions also carry `fields`:
    /// `ibv_create_cq_ex()`. See [`CompletionQueue::new_ex`].
    ///
    /// # Errors
    /// As [`CompletionQueue::new_ex`].
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn create_cq_ex<'a>(
        &'a self,
        entries: u32,
        channel: Option<&'a CompletionChannel<'a>>,
        fields: WcFields,
    ) -> Result<CompletionQueue<'a>> {
        CompletionQueue::new_ex(self, entries, channel.map(Parent::from), fields)
    }
}

impl<'ctx> CompletionQueue<'ctx> {
    /// Creates an extended completion queue (`ibv_create_cq_ex`): every completion carries the
    /// fields of a [`WorkCompletion`] and `fields`. It is used like any CQ; its polls are lazy
    /// polls, and [`poll_each`](Self::poll_each) reads fields one by one.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] as [`new`](Self::new); [`Error::Unsupported`] for a
    /// timestamp the device does not keep (`completion_timestamp_mask` 0, or no core clock for
    /// wall-clock time; rxe on Linux 6.1 and 6.12) or a provider without extended CQs;
    /// [`Error::Verb`] when creation fails.
    ///
    /// # References
    /// - [`ibv_create_cq_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html)
    #[doc(alias = "ibv_create_cq_ex")]
    pub fn new_ex(
        ctx: impl Into<Parent<'ctx, Context>>,
        entries: u32,
        channel: Option<Parent<'ctx, CompletionChannel<'ctx>>>,
        fields: WcFields,
    ) -> Result<Self> {
        const VERB: &str = "ibv_create_cq_ex";
        let ctx = ctx.into();
        let device = Some(ctx.name());
        let max = ctx.attr().max_cqe;
        if entries == 0 || entries > max {
            return Err(Error::invalid(VERB, device, format!("{entries} entries: the device allows 1..={max}")));
        }
        if channel.as_ref().is_some_and(|c| !std::ptr::eq(c.context(), &*ctx)) {
            return Err(Error::invalid(VERB, device, "the channel belongs to another context"));
        }
        if !fields.is_empty() {
            let ex = ctx.query_device_ex()?;
            if ex.completion_timestamp_mask == 0
                || (fields.contains(WcFields::COMPLETION_TIMESTAMP_WALLCLOCK) && ex.hca_core_clock_khz == 0)
            {
                let reason = format!(
                    "the device keeps no completion timestamps (completion_timestamp_mask {:#x}, core clock {} kHz)",
                    ex.completion_timestamp_mask, ex.hca_core_clock_khz
                );
                return Err(Error::unsupported(VERB, device, reason));
            }
        }
        // SAFETY: `ibv_cq_init_attr_ex` is integers and pointers: all-zero is valid.
        let mut attr: ffi::ibv_cq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.cqe = entries;
        attr.channel = channel.as_ref().map_or(std::ptr::null_mut(), |c| c.as_raw());
        attr.wc_flags = STANDARD | fields.bits();
        // SAFETY: open context; the channel is NULL or live and held by the CQ.
        let ex = unsafe { crate::ffi_compat::create_cq_ex(ctx.as_raw(), &mut attr) };
        let Some(ex) = NonNull::new(ex) else {
            let e = Error::last_os_error(VERB, device);
            return Err(match e.errno() {
                Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                    verb: VERB,
                    device: device.map(str::to_owned),
                    reason: "the provider has no extended CQs with these fields".into(),
                    errno: Some(errno),
                },
                _ => e,
            });
        };
        // `struct ibv_cq_ex` begins with `struct ibv_cq`'s fields (`ibv_cq_ex_to_cq`).
        let raw = ex.cast::<ffi::ibv_cq>();
        let lazy = LazyCq { ex, fields, poller: AtomicUsize::new(0) };
        Ok(Self::created(raw, ctx, channel, entries, Some(lazy)))
    }

    /// Whether this is an extended CQ ([`new_ex`](Self::new_ex)).
    pub fn is_extended(&self) -> bool {
        self.lazy.is_some()
    }

    /// Runs `f` on each completion of this extended CQ, up to `max`, each in a lazy poll of its
    /// own (`ibv_start_poll`, `ibv_end_poll`), and returns how many it took. Each
    /// completion is lent for the call: it reads only the fields `f` asks for, and cannot be
    /// kept. Never allocates. It waits for another thread's poll of this CQ to end, at most
    /// 10 ms, as [`poll`](Self::poll) does.
    ///
    /// `f` runs inside the provider's poll, which holds the CQ's lock: keep it short, and do not
    /// destroy a QP of this CQ in it (mlx5's `ibv_destroy_qp` takes that lock and would wait
    /// for ever; rxe's does not). A panic in `f` ends the poll.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a CQ made with `ibv_create_cq`; [`Error::Busy`] while an
    /// owner holds the CQ (as [`poll`](Self::poll)), when another thread's poll kept the CQ
    /// for 10 ms, or when called inside `f`; [`Error::Verb`] when the poll fails.
    #[doc(alias = "ibv_start_poll")]
    #[doc(alias = "ibv_end_poll")]
    pub fn poll_each(&self, max: usize, f: impl FnMut(&LazyCompletion<'_>)) -> Result<usize> {
        let Some(lazy) = &self.lazy else {
            return Err(Error::invalid(
                "ibv_start_poll",
                Some(self.context().name()),
                "the CQ is not extended (new_ex)",
            ));
        };
        self.poll_directly("ibv_start_poll", || lazy.each(self.context().name(), max, f))
    }
}
