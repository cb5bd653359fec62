//! The calls `<infiniband/verbs.h>` defines as `static inline` functions, which no library
//! exports: each calls the provider's function through the context's ops table, as the header
//! does. Same names and signatures as in C.

use crate::*;

/// `ibv_post_send()`: posts a chain of send requests.
///
/// # Safety
/// As in C: `qp` is a live QP, `wr` heads a valid chain, `bad_wr` is writable. See
/// [ibv_post_send(3)](https://man7.org/linux/man-pages/man3/ibv_post_send.3.html).
#[inline]
pub unsafe fn ibv_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> libc::c_int {
    // SAFETY: the caller's contract; every provider fills this op.
    unsafe { ((*(*qp).context).ops.post_send.unwrap_unchecked())(qp, wr, bad_wr) }
}

/// `ibv_post_recv()`: posts a chain of receive requests.
///
/// # Safety
/// As in C: `qp` is a live QP, `wr` heads a valid chain, `bad_wr` is writable. See
/// [ibv_post_recv(3)](https://man7.org/linux/man-pages/man3/ibv_post_recv.3.html).
#[inline]
pub unsafe fn ibv_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> libc::c_int {
    // SAFETY: the caller's contract; every provider fills this op.
    unsafe { ((*(*qp).context).ops.post_recv.unwrap_unchecked())(qp, wr, bad_wr) }
}

/// `ibv_post_srq_recv()`: posts a chain of receive requests to a shared receive queue.
///
/// # Safety
/// As in C: `srq` is a live SRQ, `wr` heads a valid chain, `bad_wr` is writable. See
/// [ibv_post_srq_recv(3)](https://man7.org/linux/man-pages/man3/ibv_post_srq_recv.3.html).
#[inline]
pub unsafe fn ibv_post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> libc::c_int {
    // SAFETY: the caller's contract; a provider that supports SRQs fills this op (creating
    // the SRQ would have failed otherwise).
    unsafe { ((*(*srq).context).ops.post_srq_recv.unwrap_unchecked())(srq, wr, bad_wr) }
}

/// `ibv_poll_cq()`: takes up to `num_entries` completions into `wc`; returns how many, or a
/// negative value on error.
///
/// # Safety
/// As in C: `cq` is a live CQ and `wc` has room for `num_entries`. See
/// [ibv_poll_cq(3)](https://man7.org/linux/man-pages/man3/ibv_poll_cq.3.html).
#[inline]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: libc::c_int, wc: *mut ibv_wc) -> libc::c_int {
    // SAFETY: the caller's contract; every provider fills this op.
    unsafe { ((*(*cq).context).ops.poll_cq.unwrap_unchecked())(cq, num_entries, wc) }
}

/// `ibv_req_notify_cq()`: asks for a completion event on the CQ's channel.
///
/// # Safety
/// As in C: `cq` is a live CQ. See
/// [ibv_req_notify_cq(3)](https://man7.org/linux/man-pages/man3/ibv_req_notify_cq.3.html).
#[inline]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: libc::c_int) -> libc::c_int {
    // SAFETY: the caller's contract; every provider fills this op.
    unsafe { ((*(*cq).context).ops.req_notify_cq.unwrap_unchecked())(cq, solicited_only) }
}

/// The extended context around `ctx`, if it has one (`verbs_get_ctx()`).
///
/// # Safety
/// `ctx` is a live context.
#[inline]
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> *mut verbs_context {
    // `__VERBS_ABI_IS_EXTENDED`: every bit set.
    // SAFETY: the caller's contract.
    if unsafe { (*ctx).abi_compat } as usize != usize::MAX {
        return core::ptr::null_mut();
    }
    // container_of: `ctx` is the `context` member of a `verbs_context`.
    ctx.cast::<u8>().wrapping_sub(core::mem::offset_of!(verbs_context, context)).cast()
}

/// `ibv_query_port()` as `<infiniband/verbs.h>` defines it (a macro over this inline function):
/// the extended query when the provider has one, else the original call on a zeroed struct.
///
/// # Safety
/// As in C: `context` is live and `port_attr` writable. See
/// [ibv_query_port(3)](https://man7.org/linux/man-pages/man3/ibv_query_port.3.html).
#[inline]
pub unsafe fn ___ibv_query_port(context: *mut ibv_context, port_num: u8, port_attr: *mut ibv_port_attr) -> libc::c_int {
    // SAFETY: the caller's contract; `verbs_context::sz` says how much of the extended context
    // this library has (the op is used only if it lies inside it), as `verbs_get_ctx_op` checks.
    unsafe {
        let vctx = verbs_get_ctx(context);
        let reach = core::mem::size_of::<verbs_context>() - core::mem::offset_of!(verbs_context, query_port);
        match vctx.as_ref().and_then(|v| if v.sz >= reach { v.query_port } else { None }) {
            Some(query) => query(context, port_num, port_attr, core::mem::size_of::<ibv_port_attr>()),
            None => {
                core::ptr::write_bytes(port_attr, 0, 1);
                ibv_query_port(context, port_num, port_attr.cast())
            }
        }
    }
}

/// `ibv_query_device_ex()`: the device's extended attributes. The provider's extended query when
/// it has one (and answers), else `ibv_query_device()` into a zeroed `attr` (the extended fields
/// then stay zero). Returns 0 or an `errno` value (`EINVAL` for an `input` with a `comp_mask`).
///
/// # Safety
/// As in C: `context` is live, `input` is null or readable, `attr` writable. See
/// [ibv_query_device_ex(3)](https://man7.org/linux/man-pages/man3/ibv_query_device_ex.3.html).
#[inline]
pub unsafe fn ibv_query_device_ex(
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> libc::c_int {
    // SAFETY: the caller's contract; the op is used only if it lies inside the library's
    // extended context (`verbs_get_ctx_op`), as in `___ibv_query_port`.
    unsafe {
        if input.as_ref().is_some_and(|i| i.comp_mask != 0) {
            return libc::EINVAL;
        }
        let vctx = verbs_get_ctx(context);
        let reach = core::mem::size_of::<verbs_context>() - core::mem::offset_of!(verbs_context, query_device_ex);
        if let Some(query) = vctx.as_ref().and_then(|v| if v.sz >= reach { v.query_device_ex } else { None }) {
            let rc = query(context, input, attr, core::mem::size_of::<ibv_device_attr_ex>());
            if rc != libc::EOPNOTSUPP && rc != libc::ENOSYS {
                return rc;
            }
        }
        core::ptr::write_bytes(attr, 0, 1);
        ibv_query_device(context, core::ptr::addr_of_mut!((*attr).orig_attr))
    }
}

/// `ibv_query_rt_values_ex()`: the device's current real-time values (`values.comp_mask` says
/// which are wanted and, on return, which were read); `EOPNOTSUPP` when the provider has no
/// such query.
///
/// # Safety
/// As in C: `context` is live, `values` writable. See
/// [ibv_query_rt_values_ex(3)](https://man7.org/linux/man-pages/man3/ibv_query_rt_values_ex.3.html).
#[inline]
pub unsafe fn ibv_query_rt_values_ex(context: *mut ibv_context, values: *mut ibv_values_ex) -> libc::c_int {
    // SAFETY: the caller's contract; the op is used only if it lies inside the library's
    // extended context (`verbs_get_ctx_op`).
    unsafe {
        let vctx = verbs_get_ctx(context);
        let reach = core::mem::size_of::<verbs_context>() - core::mem::offset_of!(verbs_context, query_rt_values);
        match vctx.as_ref().and_then(|v| if v.sz >= reach { v.query_rt_values } else { None }) {
            Some(query) => query(context, values),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_alloc_mw()`: allocates a memory window of `type_` (`enum ibv_mw_type`). Null on error,
/// with `errno` set (`EOPNOTSUPP` when the provider has no memory windows).
///
/// # Safety
/// As in C: `pd` is live. See
/// [ibv_alloc_mw(3)](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html).
#[inline]
pub unsafe fn ibv_alloc_mw(pd: *mut ibv_pd, type_: ibv_mw_type::Type) -> *mut ibv_mw {
    // SAFETY: the caller's contract.
    unsafe {
        match (*(*pd).context).ops.alloc_mw {
            Some(alloc) => alloc(pd, type_),
            None => {
                *libc::__errno_location() = libc::EOPNOTSUPP;
                core::ptr::null_mut()
            }
        }
    }
}

/// `ibv_dealloc_mw()`: frees a memory window (invalidating it if bound). Returns 0 or an `errno`
/// value.
///
/// # Safety
/// As in C: `mw` is live and not used after. See
/// [ibv_alloc_mw(3)](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html).
#[inline]
pub unsafe fn ibv_dealloc_mw(mw: *mut ibv_mw) -> libc::c_int {
    // SAFETY: the caller's contract; a provider that allocated the window fills this op.
    unsafe { ((*(*mw).context).ops.dealloc_mw.unwrap_unchecked())(mw) }
}

/// `ibv_inc_rkey()`: `rkey` with its low 8 bits (the key's tag) incremented, wrapping.
#[inline]
pub fn ibv_inc_rkey(rkey: u32) -> u32 {
    (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff)
}

/// `ibv_bind_mw()`: posts a bind of the type 1 window `mw` on `qp`'s send queue. Returns 0 or
/// an `errno` value (`EINVAL` for a type 2 window or an address without a region, `EPERM` for
/// a region of another protection domain). On success the provider has set `mw->rkey` to the
/// key the bind gives.
///
/// # Safety
/// As in C: `qp`, `mw` and the region `mw_bind` names are live, and `mw_bind` is readable. See
/// [ibv_bind_mw(3)](https://man7.org/linux/man-pages/man3/ibv_bind_mw.3.html).
#[inline]
pub unsafe fn ibv_bind_mw(qp: *mut ibv_qp, mw: *mut ibv_mw, mw_bind: *mut ibv_mw_bind) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe {
        let info = &(*mw_bind).bind_info;
        if (*mw).type_ != ibv_mw_type::IBV_MW_TYPE_1 {
            return libc::EINVAL;
        }
        if info.mr.is_null() && (info.addr != 0 || info.length != 0) {
            return libc::EINVAL;
        }
        if !info.mr.is_null() && (*mw).pd != (*info.mr).pd {
            return libc::EPERM;
        }
        match (*(*mw).context).ops.bind_mw {
            Some(bind) => bind(qp, mw, mw_bind),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_create_qp_ex()`: creates a QP from extended attributes. With only
/// `IBV_QP_INIT_ATTR_PD` in `comp_mask` it is `ibv_create_qp()`; otherwise the provider's
/// extended create, or null with `errno` `EOPNOTSUPP` when it has none.
///
/// # Safety
/// As in C: `context` is live, `qp_init_attr_ex` is valid and names live objects of it. See
/// [ibv_create_qp_ex(3)](https://man7.org/linux/man-pages/man3/ibv_create_qp_ex.3.html).
#[inline]
pub unsafe fn ibv_create_qp_ex(context: *mut ibv_context, qp_init_attr_ex: *mut ibv_qp_init_attr_ex) -> *mut ibv_qp {
    // SAFETY: the caller's contract; `ibv_qp_init_attr_ex` begins with `ibv_qp_init_attr`'s
    // fields, as the header's cast assumes; the op is used only inside the library's context.
    unsafe {
        if (*qp_init_attr_ex).comp_mask == ibv_qp_init_attr_mask::IBV_QP_INIT_ATTR_PD.0 {
            return ibv_create_qp((*qp_init_attr_ex).pd, qp_init_attr_ex.cast());
        }
        let vctx = verbs_get_ctx(context);
        let reach = core::mem::size_of::<verbs_context>() - core::mem::offset_of!(verbs_context, create_qp_ex);
        match vctx.as_ref().and_then(|v| if v.sz >= reach { v.create_qp_ex } else { None }) {
            Some(create) => create(context, qp_init_attr_ex),
            None => {
                *libc::__errno_location() = libc::EOPNOTSUPP;
                core::ptr::null_mut()
            }
        }
    }
}

/// `ibv_wr_start()`: opens a batch of work requests on an extended QP (the provider takes the
/// send queue's lock until `ibv_wr_complete()` or `ibv_wr_abort()`).
///
/// # Safety
/// As in C: `qp` is a live extended QP. See
/// [ibv_wr_post(3)](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html).
#[inline]
pub unsafe fn ibv_wr_start(qp: *mut ibv_qp_ex) {
    // SAFETY: the caller's contract; every provider with extended QPs fills this op.
    unsafe { ((*qp).wr_start.unwrap_unchecked())(qp) }
}

/// `ibv_wr_complete()`: posts the batch; 0, or an `errno` value and nothing posted.
///
/// # Safety
/// As in C: a batch is open on `qp`. See
/// [ibv_wr_post(3)](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html).
#[inline]
pub unsafe fn ibv_wr_complete(qp: *mut ibv_qp_ex) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe { ((*qp).wr_complete.unwrap_unchecked())(qp) }
}

/// `ibv_wr_abort()`: discards the batch.
///
/// # Safety
/// As in C: a batch is open on `qp`. See
/// [ibv_wr_post(3)](https://man7.org/linux/man-pages/man3/ibv_wr_post.3.html).
#[inline]
pub unsafe fn ibv_wr_abort(qp: *mut ibv_qp_ex) {
    // SAFETY: the caller's contract.
    unsafe { ((*qp).wr_abort.unwrap_unchecked())(qp) }
}

/// `ibv_advise_mr()`: advice on the pages of on-demand-paging regions that `sg_list` names
/// (prefetch them). Returns 0 or an `errno` value (`EOPNOTSUPP` when the provider takes no
/// advice).
///
/// # Safety
/// As in C: `pd` is live and `sg_list` holds `num_sge` entries naming its regions. See
/// [ibv_advise_mr(3)](https://man7.org/linux/man-pages/man3/ibv_advise_mr.3.html).
#[inline]
pub unsafe fn ibv_advise_mr(
    pd: *mut ibv_pd,
    advice: ib_uverbs_advise_mr_advice::Type,
    flags: u32,
    sg_list: *mut ibv_sge,
    num_sge: u32,
) -> libc::c_int {
    // SAFETY: the caller's contract; the op is used only inside the library's context.
    unsafe {
        let vctx = verbs_get_ctx((*pd).context);
        let reach = core::mem::size_of::<verbs_context>() - core::mem::offset_of!(verbs_context, advise_mr);
        match vctx.as_ref().and_then(|v| if v.sz >= reach { v.advise_mr } else { None }) {
            Some(advise) => advise(pd, advice, flags, sg_list, num_sge),
            None => libc::EOPNOTSUPP,
        }
    }
}

/// `ibv_create_cq_ex()`: creates a CQ from extended attributes (the fields its completions
/// carry, `wc_flags`). Null with `errno` `EOPNOTSUPP` when the provider has no extended CQs.
///
/// # Safety
/// As in C: `context` is live and `cq_attr` valid. See
/// [ibv_create_cq_ex(3)](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html).
#[inline]
pub unsafe fn ibv_create_cq_ex(context: *mut ibv_context, cq_attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    // SAFETY: the caller's contract; the op is used only inside the library's context.
    unsafe {
        let vctx = verbs_get_ctx(context);
        let reach = core::mem::size_of::<verbs_context>() - core::mem::offset_of!(verbs_context, create_cq_ex);
        match vctx.as_ref().and_then(|v| if v.sz >= reach { v.create_cq_ex } else { None }) {
            Some(create) => create(context, cq_attr),
            None => {
                *libc::__errno_location() = libc::EOPNOTSUPP;
                core::ptr::null_mut()
            }
        }
    }
}

/// `ibv_cq_ex_to_cq()`: the classic view of an extended CQ (`struct ibv_cq_ex` begins with
/// `struct ibv_cq`'s fields), for `ibv_req_notify_cq`, events and `ibv_destroy_cq`.
#[inline]
pub fn ibv_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    cq.cast()
}

/// `ibv_start_poll()`: starts a lazy poll at the first completion. 0 (then `ibv_end_poll` must
/// follow), `ENOENT` when the CQ is empty (no `ibv_end_poll`), or another `errno` value.
///
/// # Safety
/// As in C: `cq` is a live extended CQ with no poll in progress. See
/// [ibv_create_cq_ex(3)](https://man7.org/linux/man-pages/man3/ibv_create_cq_ex.3.html).
#[inline]
pub unsafe fn ibv_start_poll(cq: *mut ibv_cq_ex, attr: *mut ibv_poll_cq_attr) -> libc::c_int {
    // SAFETY: the caller's contract; every extended CQ has this op.
    unsafe { ((*cq).start_poll.unwrap_unchecked())(cq, attr) }
}

/// `ibv_next_poll()`: moves the lazy poll to the next completion; `ENOENT` when there is none.
///
/// # Safety
/// As in C: a poll is in progress on `cq`.
#[inline]
pub unsafe fn ibv_next_poll(cq: *mut ibv_cq_ex) -> libc::c_int {
    // SAFETY: the caller's contract.
    unsafe { ((*cq).next_poll.unwrap_unchecked())(cq) }
}

/// `ibv_end_poll()`: ends the lazy poll, giving the completions read back to the CQ.
///
/// # Safety
/// As in C: a poll is in progress on `cq`.
#[inline]
pub unsafe fn ibv_end_poll(cq: *mut ibv_cq_ex) {
    // SAFETY: the caller's contract.
    unsafe { ((*cq).end_poll.unwrap_unchecked())(cq) }
}
