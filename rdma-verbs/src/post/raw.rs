//! The calls that hand requests to the provider, and only here: a batch of `ibv_wr_post(3)`
//! (`ibv_wr_start`, the `ibv_wr_*` builders and data setters, `ibv_wr_complete` or
//! `ibv_wr_abort`), and the chains of `ibv_post_send(3)`, `ibv_post_recv(3)` and
//! `ibv_post_srq_recv(3)`. Each post returns a [`Posted`].
//!
//! # What a refused post leaves posted
//! A request counts as posted unless the provider said it was not. After a refusal, the
//! requests a chain's `bad_wr` names (it and those after it) were not posted; every other one
//! may have been: all of a refused batch (`ibv_wr_complete` names none), and all of a chain
//! whose `bad_wr` is NULL or names none of its requests. rxe's provider does queue requests
//! before the doorbell that it then reports as failed, leaving `bad_wr` NULL, so such a
//! request may still be executed and the NIC may still read or write its buffers. Its buffers
//! are therefore not handed out again, nor their borrows ended, until a completion, a flush or
//! a reset of the QP says the device is done with them: every posting layer counts
//! [`Posted::in_flight`] as outstanding, and waits for those requests as for any other.

use std::ptr::NonNull;

use crate::error::{Error, Result};
use crate::ffi;

use super::op::{Data, SendOp};

/// What a post left with the device: how many requests it certainly took, and how many after
/// those it may have taken as well (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "the requests it counts are in flight: their buffers stay with the device"]
pub(crate) struct Posted {
    /// Requests the provider took: all of them, or those before the one it refused.
    pub(crate) certain: usize,
    /// Requests after those that it may have taken too: the rest of the post when it refused
    /// without naming a request, else 0.
    pub(crate) maybe: usize,
    /// The provider's error number; 0 when it took every request.
    errno: i32,
}

impl Posted {
    /// A post the provider took whole, of `n` requests (0: nothing was handed to it).
    pub(crate) fn all(n: usize) -> Self {
        Posted { certain: n, maybe: 0, errno: 0 }
    }

    /// The outcome of a post of `total` requests that returned `rc`, the provider naming the
    /// refused request at `named` (`None`: it named none of them).
    fn of(rc: libc::c_int, total: usize, named: impl FnOnce() -> Option<usize>) -> Self {
        if rc == 0 {
            return Posted::all(total);
        }
        match named() {
            Some(i) => Posted { certain: i, maybe: 0, errno: rc },
            None => Posted { certain: 0, maybe: total, errno: rc },
        }
    }

    /// The requests to treat as posted, whose buffers stay with the device until it is done
    /// with them: the certain ones and those that may have been posted.
    #[inline]
    pub(crate) fn in_flight(&self) -> usize {
        self.certain + self.maybe
    }

    /// `Ok` with the number posted when the provider took everything, else
    /// [`Error::PostFailed`] of `verb` on the device `device` names, counting
    /// [`in_flight`](Self::in_flight) as posted.
    #[inline]
    pub(crate) fn result<'d>(self, verb: &'static str, device: impl FnOnce() -> &'d str) -> Result<usize> {
        if self.errno == 0 {
            Ok(self.certain)
        } else {
            Err(Error::post_failed(verb, device(), self.errno, self.in_flight()))
        }
    }
}

/// Posts the chain headed by `head`, of `total` send requests: `ibv_post_send()`.
/// `index_of` gives the position in the chain of the request the provider names as refused,
/// `None` for a pointer that is none of them.
///
/// # Safety
/// `qp` is a live QP; `head` heads a well-formed chain of `total` requests, each naming memory
/// that stays registered and that no Rust reference reaches until the device is done with it
/// (see the module docs: [`Posted::in_flight`]). Inline data is copied during the call.
#[inline]
pub(crate) unsafe fn post_send(
    qp: *mut ffi::ibv_qp,
    head: *mut ffi::ibv_send_wr,
    total: usize,
    index_of: impl FnOnce(*mut ffi::ibv_send_wr) -> Option<usize>,
) -> Posted {
    let mut bad: *mut ffi::ibv_send_wr = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    let rc = unsafe { ffi::ibv_post_send(qp, head, &mut bad) };
    Posted::of(rc, total, || index_of(bad))
}

/// Posts the chain headed by `head`, of `total` receive requests: `ibv_post_recv()`.
///
/// # Safety
/// As [`post_send`], for receives of the live QP `qp`.
#[inline]
pub(crate) unsafe fn post_recv(
    qp: *mut ffi::ibv_qp,
    head: *mut ffi::ibv_recv_wr,
    total: usize,
    index_of: impl FnOnce(*mut ffi::ibv_recv_wr) -> Option<usize>,
) -> Posted {
    let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    let rc = unsafe { ffi::ibv_post_recv(qp, head, &mut bad) };
    Posted::of(rc, total, || index_of(bad))
}

/// Posts the chain headed by `head`, of `total` receive requests, to a shared receive queue:
/// `ibv_post_srq_recv()`.
///
/// # Safety
/// As [`post_send`], for receives of the live SRQ `srq`.
#[inline]
pub(crate) unsafe fn post_srq_recv(
    srq: *mut ffi::ibv_srq,
    head: *mut ffi::ibv_recv_wr,
    total: usize,
    index_of: impl FnOnce(*mut ffi::ibv_recv_wr) -> Option<usize>,
) -> Posted {
    let mut bad: *mut ffi::ibv_recv_wr = std::ptr::null_mut();
    // SAFETY: the caller's contract.
    let rc = unsafe { ffi::ibv_post_srq_recv(srq, head, &mut bad) };
    Posted::of(rc, total, || index_of(bad))
}

/// Opens a batch on the extended QP `qpx`: `ibv_wr_start()`. The provider holds the QP's
/// send-queue lock until [`complete`] or [`abort`].
///
/// # Safety
/// `qpx` is a live extended QP with no batch open, and the batch is completed or aborted on
/// this thread before the QP is used otherwise by it.
#[inline]
pub(crate) unsafe fn start(qpx: NonNull<ffi::ibv_qp_ex>) {
    // SAFETY: the caller's contract.
    unsafe { ffi::ibv_wr_start(qpx.as_ptr()) };
}

/// Posts the batch open on `qpx`, of `n` requests: `ibv_wr_complete()`. A refused batch names
/// no request, so all `n` may have been posted.
///
/// # Safety
/// This thread opened the batch on the live `qpx` ([`start`]); every request built into it
/// names memory as [`post_send`] requires.
#[inline]
pub(crate) unsafe fn complete(qpx: NonNull<ffi::ibv_qp_ex>, n: usize) -> Posted {
    // SAFETY: the caller's contract.
    let rc = unsafe { ffi::ibv_wr_complete(qpx.as_ptr()) };
    Posted::of(rc, n, || None)
}

/// Discards the batch open on `qpx`: `ibv_wr_abort()`. Nothing of it is posted.
///
/// # Safety
/// This thread opened the batch on the live `qpx` ([`start`]).
#[inline]
pub(crate) unsafe fn abort(qpx: NonNull<ffi::ibv_qp_ex>) {
    // SAFETY: the caller's contract.
    unsafe { ffi::ibv_wr_abort(qpx.as_ptr()) };
}

/// Type of a builder with no argument but the QP.
type Builder0 = Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex)>;
/// Type of a builder of an RDMA operation (key, address).
type RdmaBuilder = Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64)>;

/// The builders of an extended QP (`struct ibv_qp_ex`'s `wr_*` members), copied out of it.
///
/// No reference to the `ibv_qp_ex` is ever made: the provider reads and writes it during every
/// builder call, and `ibv_modify_qp` on another thread writes its `qp_base`. Its members are
/// read and written through the pointer only: [`Builders::of`], [`build`].
#[derive(Clone, Copy)]
pub(crate) struct Builders {
    send: Builder0,
    send_imm: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32)>,
    send_inv: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32)>,
    rdma_write: RdmaBuilder,
    rdma_write_imm: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32)>,
    rdma_read: RdmaBuilder,
    atomic_cmp_swp: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u64, u64)>,
    atomic_fetch_add: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u64)>,
    atomic_write: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, *const libc::c_void)>,
    local_inv: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32)>,
    bind_mw: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut ffi::ibv_mw, u32, *const ffi::ibv_mw_bind_info)>,
    set_ud_addr: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut ffi::ibv_ah, u32, u32)>,
    set_inline_data: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, *mut libc::c_void, usize)>,
    set_inline_data_list: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, usize, *const ffi::ibv_data_buf)>,
    set_sge: Option<SetSgeFn>,
    set_sge_list: Option<unsafe extern "C" fn(*mut ffi::ibv_qp_ex, usize, *const ffi::ibv_sge)>,
}

impl Builders {
    /// The builders of the extended QP `qpx`, each member read by value through the pointer.
    ///
    /// # Safety
    /// `qpx` is a live extended QP.
    #[inline]
    pub(crate) unsafe fn of(qpx: NonNull<ffi::ibv_qp_ex>) -> Self {
        let qpx = qpx.as_ptr();
        // SAFETY: the caller's contract; each member is a plain function pointer the provider
        // set at creation, read by value (no reference to the struct is made).
        unsafe {
            Builders {
                send: (*qpx).wr_send,
                send_imm: (*qpx).wr_send_imm,
                send_inv: (*qpx).wr_send_inv,
                rdma_write: (*qpx).wr_rdma_write,
                rdma_write_imm: (*qpx).wr_rdma_write_imm,
                rdma_read: (*qpx).wr_rdma_read,
                atomic_cmp_swp: (*qpx).wr_atomic_cmp_swp,
                atomic_fetch_add: (*qpx).wr_atomic_fetch_add,
                atomic_write: (*qpx).wr_atomic_write,
                local_inv: (*qpx).wr_local_inv,
                bind_mw: (*qpx).wr_bind_mw,
                set_ud_addr: (*qpx).wr_set_ud_addr,
                set_inline_data: (*qpx).wr_set_inline_data,
                set_inline_data_list: (*qpx).wr_set_inline_data_list,
                set_sge: (*qpx).wr_set_sge,
                set_sge_list: (*qpx).wr_set_sge_list,
            }
        }
    }

    /// The setter of one registered buffer, for [`build_sge`]: `ibv_wr_set_sge`, or, when the
    /// provider has only `ibv_wr_set_sge_list`, that with a list of one. On error, the name of
    /// the setter the provider lacks.
    #[inline]
    pub(crate) fn sge_setter(&self) -> std::result::Result<SetSge, &'static str> {
        match (self.set_sge, self.set_sge_list) {
            (Some(set_sge), _) => Ok(SetSge(set_sge)),
            (None, Some(_)) => Ok(SetSge(set_sge_via_list)),
            (None, None) => Err("wr_set_sge"),
        }
    }
}

/// Type of `ibv_wr_set_sge`.
type SetSgeFn = unsafe extern "C" fn(*mut ffi::ibv_qp_ex, u32, u64, u32);

/// The setter of one registered buffer of an extended QP ([`Builders::sge_setter`]), looked up
/// once for a batch of such requests ([`build_sge`]).
#[derive(Clone, Copy)]
pub(crate) struct SetSge(SetSgeFn);

/// `ibv_wr_set_sge` of a provider that has only `ibv_wr_set_sge_list`: a list of one.
///
/// # Safety
/// As `ibv_wr_set_sge` on `qpx`, whose provider set `wr_set_sge_list` ([`Builders::sge_setter`]
/// gives it only then).
unsafe extern "C" fn set_sge_via_list(qpx: *mut ffi::ibv_qp_ex, lkey: u32, addr: u64, length: u32) {
    let sge = ffi::ibv_sge { addr, length, lkey };
    // SAFETY: the caller's contract; the member is a plain function pointer the provider set at
    // creation, read by value; the list is read during the call.
    unsafe {
        if let Some(set_sge_list) = (*qpx).wr_set_sge_list {
            set_sge_list(qpx, 1, &sge);
        }
    }
}

/// Adds one request to the batch open on `qpx`: its `wr_id` and `flags`, the builder of `op`,
/// the UD address `ud` (address handle, QP number, Q_Key) when given, and the setter of `data`.
/// The data and address setters are looked up first: when the provider lacks one, nothing is
/// written and its name is returned. A missing operation builder is named too, after `wr_id`
/// and flags were written: the next request's builder writes them again, so the batch stays
/// usable.
///
/// # Safety
/// This thread opened a batch on the live extended QP `qpx` ([`start`]), whose builders `b`
/// are; `op` is among the QP's send ops; `data` names memory as [`post_send`] requires (inline
/// data is copied during the call).
#[inline(always)]
pub(crate) unsafe fn build(
    qpx: NonNull<ffi::ibv_qp_ex>,
    b: &Builders,
    wr_id: u64,
    flags: u32,
    op: SendOp,
    ud: Option<(*mut ffi::ibv_ah, u32, u32)>,
    data: Data<'_>,
) -> std::result::Result<(), &'static str> {
    let set_ud_addr = match ud {
        Some(_) => Some(b.set_ud_addr.ok_or("wr_set_ud_addr")?),
        None => None,
    };
    match data {
        Data::None => (),
        Data::Sge(_) if b.set_sge.is_some() => (),
        Data::Sge(_) => {
            b.set_sge_list.ok_or("wr_set_sge")?;
        }
        Data::SgeList(_) => {
            b.set_sge_list.ok_or("wr_set_sge_list")?;
        }
        Data::Inline(_) => {
            b.set_inline_data.ok_or("wr_set_inline_data")?;
        }
        Data::InlineList(_) => {
            b.set_inline_data_list.ok_or("wr_set_inline_data_list")?;
        }
    }
    let q = qpx.as_ptr();
    // SAFETY: the caller's contract (this thread's batch is open on the live `qpx`, and the
    // operation is among the QP's); the two members are plain data the provider reads in the
    // next builder, written through the pointer (no reference to the struct is made); the
    // builders get the checked request's operands; every setter used below was looked up
    // above, which the `unwrap_unchecked`s rely on.
    unsafe {
        (*q).wr_id = wr_id;
        (*q).wr_flags = flags;
        match op {
            SendOp::Send => b.send.ok_or("wr_send")?(q),
            SendOp::SendImm { imm } => b.send_imm.ok_or("wr_send_imm")?(q, imm),
            SendOp::SendInv { rkey } => b.send_inv.ok_or("wr_send_inv")?(q, rkey),
            SendOp::Write { rkey, addr } => b.rdma_write.ok_or("wr_rdma_write")?(q, rkey, addr),
            SendOp::WriteImm { rkey, addr, imm } => b.rdma_write_imm.ok_or("wr_rdma_write_imm")?(q, rkey, addr, imm),
            SendOp::Read { rkey, addr } => b.rdma_read.ok_or("wr_rdma_read")?(q, rkey, addr),
            SendOp::CompareSwap { rkey, addr, compare, swap } => {
                b.atomic_cmp_swp.ok_or("wr_atomic_cmp_swp")?(q, rkey, addr, compare, swap)
            }
            SendOp::FetchAdd { rkey, addr, add } => {
                b.atomic_fetch_add.ok_or("wr_atomic_fetch_add")?(q, rkey, addr, add)
            }
            SendOp::LocalInv { rkey } => b.local_inv.ok_or("wr_local_inv")?(q, rkey),
            SendOp::AtomicWrite { rkey, addr, value } => {
                b.atomic_write.ok_or("wr_atomic_write")?(q, rkey, addr, value.as_ptr().cast())
            }
            SendOp::BindMw { mw, rkey, info } => b.bind_mw.ok_or("wr_bind_mw")?(q, mw, rkey, &info),
        }
        if let (Some(set_ud_addr), Some((ah, qpn, qkey))) = (set_ud_addr, ud) {
            set_ud_addr(q, ah, qpn, qkey);
        }
        match data {
            Data::None => (),
            Data::Sge(s) => match b.set_sge {
                // One buffer: the single-SGE setter, which copies no list.
                Some(set_sge) => set_sge(q, s.lkey, s.addr, s.length),
                None => b.set_sge_list.unwrap_unchecked()(q, 1, &s),
            },
            Data::SgeList(sges) => b.set_sge_list.unwrap_unchecked()(q, sges.len(), sges.as_ptr()),
            Data::Inline(d) => b.set_inline_data.unwrap_unchecked()(q, d.addr, d.length),
            Data::InlineList(bufs) => b.set_inline_data_list.unwrap_unchecked()(q, bufs.len(), bufs.as_ptr()),
        }
    }
    Ok(())
}

/// [`build`] of a request whose bytes are one registered buffer, `sge`, with no UD address:
/// the setter `set_sge` was looked up once for the batch ([`Builders::sge_setter`]). A
/// missing operation builder is named; the batch must then be aborted, as its `wr_id` and
/// flags were set.
///
/// # Safety
/// As [`build`], `set_sge` being of the same QP's builders `b`.
#[inline(always)]
pub(crate) unsafe fn build_sge(
    qpx: NonNull<ffi::ibv_qp_ex>,
    b: &Builders,
    set_sge: SetSge,
    wr_id: u64,
    flags: u32,
    op: SendOp,
    sge: ffi::ibv_sge,
) -> std::result::Result<(), &'static str> {
    // SAFETY: the caller's contract; `build` without data sets the `wr_id`, the flags and the
    // operation; the setter is the QP's own, called also for 0 bytes (some providers finish
    // the queue entry in the data setter).
    unsafe {
        build(qpx, b, wr_id, flags, op, None, Data::None)?;
        (set_sge.0)(qpx.as_ptr(), sge.lkey, sge.addr, sge.length);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_refused_at_a_named_request_posted_those_before_it() {
        let p = Posted::of(libc::ENOMEM, 4, || Some(1));
        assert_eq!((p.certain, p.maybe, p.in_flight()), (1, 0, 1));
        assert!(matches!(p.result("ibv_post_send", || "dev"), Err(Error::PostFailed { posted: 1, .. })));
    }

    #[test]
    fn a_refusal_that_names_no_request_leaves_every_request_maybe_posted() {
        let p = Posted::of(libc::ENOMEM, 4, || None);
        assert_eq!((p.certain, p.maybe, p.in_flight()), (0, 4, 4));
        assert!(matches!(p.result("ibv_wr_complete", || "dev"), Err(Error::PostFailed { posted: 4, .. })));
    }

    #[test]
    fn a_provider_without_the_single_sge_setter_gets_the_list_setter_with_a_list_of_one() {
        use std::cell::Cell;
        thread_local! { static SEEN: Cell<Option<(usize, u32, u64, u32)>> = const { Cell::new(None) } }
        unsafe extern "C" fn list(_: *mut ffi::ibv_qp_ex, n: usize, sges: *const ffi::ibv_sge) {
            // SAFETY: the setter gets at least one SGE.
            let s = unsafe { *sges };
            SEEN.with(|c| c.set(Some((n, s.lkey, s.addr, s.length))));
        }
        unsafe extern "C" fn one(_: *mut ffi::ibv_qp_ex, _: u32, _: u64, _: u32) {}
        // SAFETY: `ibv_qp_ex` is integers, raw pointers and optional function pointers: zero is
        // valid, a QP with no builder.
        let mut qpx: ffi::ibv_qp_ex = unsafe { std::mem::zeroed() };
        // SAFETY: `qpx` is a live struct; only its members are read.
        let b = unsafe { Builders::of(NonNull::from(&mut qpx)) };
        assert_eq!(b.sge_setter().err(), Some("wr_set_sge"), "no setter at all is named");

        qpx.wr_set_sge_list = Some(list);
        let p = NonNull::from(&mut qpx);
        // SAFETY: as above.
        let set = unsafe { Builders::of(p) }.sge_setter().expect("the list setter stands in");
        // SAFETY: the stand-in reads `wr_set_sge_list` of `p`, the test's setter above.
        unsafe { (set.0)(p.as_ptr(), 7, 0x1000, 8) };
        assert_eq!(SEEN.with(Cell::get), Some((1, 7, 0x1000, 8)), "one SGE with the request's key, address, length");

        qpx.wr_set_sge = Some(one);
        // SAFETY: as above.
        let set = unsafe { Builders::of(NonNull::from(&mut qpx)) }.sge_setter().expect("the provider's setter");
        assert_eq!(set.0 as *const (), one as *const (), "the single-SGE setter is used when the provider has it");
    }

    #[test]
    fn a_post_taken_whole_is_certain() {
        let p = Posted::of(0, 3, || unreachable!("no request is named when the post succeeded"));
        assert_eq!((p.certain, p.maybe), (3, 0));
        assert_eq!(p.result("ibv_post_send", || "dev").unwrap(), 3);
    }
}
