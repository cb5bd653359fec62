//! The raw names that differ between the two bindings [`ffi`](crate::ffi) can be: bindgen's
//! names for anonymous unions and enum shapes in `rdma-verbs-sys` (the default), and rdma-sys
//! 0.3.0's hand-written ones (the `rdma-sys` feature). Everything else is spelled alike, so the
//! rest of the crate compiles against either; only this file knows which one it has.
//!
//! What rdma-cm needs of it is public but hidden (`rdma_verbs::ffi_compat`): Cargo unifies the
//! feature for rdma-verbs alone, so rdma-cm must ask this crate which bindings `ffi` is rather
//! than test a feature of its own.

use crate::ffi;

/// Sets the immediate data (network byte order) of a send request.
#[inline]
pub(crate) fn set_imm(wr: &mut ffi::ibv_send_wr, imm_be: u32) {
    #[cfg(not(feature = "rdma-sys"))]
    {
        wr.__bindgen_anon_1.imm_data = imm_be;
    }
    #[cfg(feature = "rdma-sys")]
    {
        wr.imm_data_invalidated_rkey_union.imm_data = imm_be;
    }
}

/// Where `struct ibv_wc` keeps its immediate data (a union with `invalidated_rkey`).
#[cfg(not(feature = "rdma-sys"))]
pub(crate) const WC_IMM_OFFSET: usize = std::mem::offset_of!(ffi::ibv_wc, __bindgen_anon_1);
/// Where `struct ibv_wc` keeps its immediate data (a union with `invalidated_rkey`).
#[cfg(feature = "rdma-sys")]
pub(crate) const WC_IMM_OFFSET: usize = std::mem::offset_of!(ffi::ibv_wc, imm_data_invalidated_rkey_union);

/// The union in `struct ibv_async_event` that names what the event is about.
#[cfg(not(feature = "rdma-sys"))]
pub(crate) type AsyncEventElement = ffi::ibv_async_event__bindgen_ty_1;
/// The union in `struct ibv_async_event` that names what the event is about.
#[cfg(feature = "rdma-sys")]
pub(crate) type AsyncEventElement = ffi::ibv_async_event_element_t;

/// A value of `enum ibv_event_type` (a module of constants here, a Rust enum in rdma-sys: both
/// are compared as `u32`, so an unknown value is never an invalid enum).
#[cfg(not(feature = "rdma-sys"))]
pub(crate) type EventType = ffi::ibv_event_type::Type;
/// A value of `enum ibv_event_type` (a Rust enum in rdma-sys: compared as `u32`, so an unknown
/// value is never read as the enum).
#[cfg(feature = "rdma-sys")]
pub(crate) type EventType = ffi::ibv_event_type;

/// An `enum ibv_event_type` value as the `u32` the verb reports.
#[inline]
pub(crate) fn event_type_value(e: EventType) -> u32 {
    // A no-op here, the enum's discriminant with rdma-sys.
    #[allow(clippy::unnecessary_cast)]
    let v = e as u32;
    v
}

/// `enum ibv_gid_type`'s values.
#[cfg(not(feature = "rdma-sys"))]
pub(crate) use ffi::ibv_gid_type::{IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2};
/// `enum ibv_gid_type`'s values.
#[cfg(feature = "rdma-sys")]
pub(crate) use ffi::{IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2};

/// Where `struct rdma_addr` keeps its source address union (a `sockaddr_storage`, which
/// `rdma_get_local_addr()` reads): bindgen names it `__bindgen_anon_1`, rdma-sys by hand.
#[cfg(not(feature = "rdma-sys"))]
pub const RDMA_ADDR_SRC: usize = std::mem::offset_of!(ffi::rdma_addr, __bindgen_anon_1);
/// Where `struct rdma_addr` keeps its destination address union (`rdma_get_peer_addr()`).
#[cfg(not(feature = "rdma-sys"))]
pub const RDMA_ADDR_DST: usize = std::mem::offset_of!(ffi::rdma_addr, __bindgen_anon_2);
/// Where `struct rdma_addr` keeps its source address union (a `sockaddr_storage`, which
/// `rdma_get_local_addr()` reads): bindgen names it `__bindgen_anon_1`, rdma-sys by hand.
#[cfg(feature = "rdma-sys")]
pub const RDMA_ADDR_SRC: usize = std::mem::offset_of!(ffi::rdma_addr, src_addr_union);
/// Where `struct rdma_addr` keeps its destination address union (`rdma_get_peer_addr()`).
#[cfg(feature = "rdma-sys")]
pub const RDMA_ADDR_DST: usize = std::mem::offset_of!(ffi::rdma_addr, dst_addr_union);

/// `ibv_alloc_mw()`: null on error with `errno` set (rdma-sys's returns an `Option`).
///
/// # Safety
/// `pd` is a live protection domain.
#[inline]
pub(crate) unsafe fn alloc_mw(pd: *mut ffi::ibv_pd, kind: ffi::ibv_mw_type::Type) -> *mut ffi::ibv_mw {
    // SAFETY: the caller's contract.
    #[cfg(not(feature = "rdma-sys"))]
    let mw = unsafe { ffi::ibv_alloc_mw(pd, kind) };
    // SAFETY: the caller's contract.
    #[cfg(feature = "rdma-sys")]
    let mw = unsafe { ffi::ibv_alloc_mw(pd, kind) }.unwrap_or(std::ptr::null_mut());
    mw
}

/// Sets the key a send with invalidate or a local invalidate names (the union it shares with
/// the immediate data).
#[inline]
pub(crate) fn set_invalidate_rkey(wr: &mut ffi::ibv_send_wr, rkey: u32) {
    #[cfg(not(feature = "rdma-sys"))]
    {
        wr.__bindgen_anon_1.invalidate_rkey = rkey;
    }
    #[cfg(feature = "rdma-sys")]
    {
        wr.imm_data_invalidated_rkey_union.invalidated_rkey = rkey;
    }
}

/// Sets the window, new key and range of an `IBV_WR_BIND_MW` request.
#[inline]
pub(crate) fn set_bind_mw(wr: &mut ffi::ibv_send_wr, mw: *mut ffi::ibv_mw, rkey: u32, info: ffi::ibv_mw_bind_info) {
    #[cfg(not(feature = "rdma-sys"))]
    {
        wr.__bindgen_anon_2.bind_mw = ffi::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 { mw, rkey, bind_info: info };
    }
    #[cfg(feature = "rdma-sys")]
    {
        wr.bind_mw_tso_union.bind_mw = ffi::bind_mw_t { mw, rkey, bind_info: info };
    }
}

/// `ibv_inc_rkey()`: the key with its 8-bit tag incremented, wrapping. rdma-sys's version is
/// `unsafe` and overflows on `u32::MAX`, so with it this is the header's arithmetic.
#[inline]
pub(crate) fn inc_rkey(rkey: u32) -> u32 {
    #[cfg(not(feature = "rdma-sys"))]
    let next = ffi::ibv_inc_rkey(rkey);
    #[cfg(feature = "rdma-sys")]
    let next = (rkey & !0xff) | (rkey.wrapping_add(1) & 0xff);
    next
}

/// The immediate data (network byte order) or the key to invalidate of a send request (one
/// union).
#[inline]
pub(crate) fn imm_or_invalidate_rkey(wr: &ffi::ibv_send_wr) -> u32 {
    // SAFETY: both members are a `u32`; every bit pattern is valid.
    #[cfg(not(feature = "rdma-sys"))]
    let v = unsafe { wr.__bindgen_anon_1.imm_data };
    // SAFETY: as above.
    #[cfg(feature = "rdma-sys")]
    let v = unsafe { wr.imm_data_invalidated_rkey_union.imm_data };
    v
}

/// The window, new key and range of an `IBV_WR_BIND_MW` request.
#[inline]
pub(crate) fn bind_mw_of(wr: &ffi::ibv_send_wr) -> (*mut ffi::ibv_mw, u32, ffi::ibv_mw_bind_info) {
    // SAFETY: read only for a request built by `set_bind_mw` (the opcode says so); the member
    // is a pointer and integers.
    #[cfg(not(feature = "rdma-sys"))]
    let b = unsafe { wr.__bindgen_anon_2.bind_mw };
    // SAFETY: as above.
    #[cfg(feature = "rdma-sys")]
    let b = unsafe { wr.bind_mw_tso_union.bind_mw };
    (b.mw, b.rkey, b.bind_info)
}

/// `ibv_create_qp_ex()`: null on error with `errno` set (rdma-sys's returns an `Option`).
///
/// # Safety
/// As `ibv_create_qp_ex`.
#[inline]
pub(crate) unsafe fn create_qp_ex(ctx: *mut ffi::ibv_context, attr: *mut ffi::ibv_qp_init_attr_ex) -> *mut ffi::ibv_qp {
    // SAFETY: the caller's contract.
    #[cfg(not(feature = "rdma-sys"))]
    let qp = unsafe { ffi::ibv_create_qp_ex(ctx, attr) };
    // SAFETY: the caller's contract.
    #[cfg(feature = "rdma-sys")]
    let qp = unsafe { ffi::ibv_create_qp_ex(ctx, attr) }.unwrap_or(std::ptr::null_mut());
    qp
}

/// `ibv_create_cq_ex()`: null on error with `errno` set (rdma-sys's returns an `Option`).
///
/// # Safety
/// As `ibv_create_cq_ex`.
#[inline]
pub(crate) unsafe fn create_cq_ex(
    ctx: *mut ffi::ibv_context,
    attr: *mut ffi::ibv_cq_init_attr_ex,
) -> *mut ffi::ibv_cq_ex {
    // SAFETY: the caller's contract.
    #[cfg(not(feature = "rdma-sys"))]
    let cq = unsafe { ffi::ibv_create_cq_ex(ctx, attr) };
    // SAFETY: the caller's contract.
    #[cfg(feature = "rdma-sys")]
    let cq = unsafe { ffi::ibv_create_cq_ex(ctx, attr) }.unwrap_or(std::ptr::null_mut());
    cq
}
