//! Raw bindings to rdma-core's `libibverbs` and `librdmacm`: every type, constant and exported
//! function of `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`, plus the data-path calls that
//! those headers define as `static inline` functions ([`ibv_post_send`], [`ibv_post_recv`],
//! [`ibv_post_srq_recv`], [`ibv_poll_cq`], [`ibv_req_notify_cq`], [`___ibv_query_port`],
//! [`ibv_query_device_ex`], [`ibv_alloc_mw`], [`ibv_dealloc_mw`], [`ibv_bind_mw`], [`ibv_inc_rkey`]),
//! written in Rust against the provider's ops table exactly as the headers write them in C.
//!
//! The bindings are generated ahead of time (`scripts/gen-bindings`, bindgen with a pinned
//! version, from rdma-core 44's headers) and checked in for `x86_64` and `aarch64` Linux, so
//! building needs neither libclang nor the headers: only the libraries to link (found with
//! pkg-config; `build.rs` names the packages when they are missing, and links nothing on
//! docs.rs). libibverbs keeps its ABI across releases (structures only grow at the end, behind
//! `comp_mask` bits), so bindings of rdma-core 44 work with any later library.
//!
//! Shapes:
//! - a C enum is a module of constants with a `Type` alias (`ibv_qp_state::IBV_QPS_RTS`), since
//!   a C enum may hold values a Rust enum could not; flag enums (`*_flags`, `*_mask`, ...) are
//!   bitfield newtypes (`ibv_send_flags::IBV_SEND_SIGNALED.0`);
//! - socket addresses, `in6_addr`, `timespec` and the pthread types are `libc`'s;
//! - anonymous unions and structs keep bindgen's names (`ibv_send_wr::wr`, of type
//!   `ibv_send_wr__bindgen_ty_2`); [`rdma_t`], [`atomic_t`] and [`ud_t`] name the members of
//!   `ibv_send_wr::wr`.
//!
//! Everything here is `unsafe` to call and follows the C API's rules; the safe layer is the
//! `rdma-verbs` crate.
//!
//! # References
//! - [libibverbs(7)](https://man7.org/linux/man-pages/man7/libibverbs.7.html) and the `ibv_*(3)` pages
//! - [rdma-core](https://github.com/linux-rdma/rdma-core)
#![no_std]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks)]

pub use libc::{
    in6_addr, in_addr, in_port_t, pthread_cond_t, pthread_mutex_t, sa_family_t, sockaddr, sockaddr_in, sockaddr_in6,
    sockaddr_storage, socklen_t, timespec,
};

#[cfg(target_arch = "x86_64")]
include!("bindings/x86_64.rs");
#[cfg(target_arch = "aarch64")]
include!("bindings/aarch64.rs");
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("rdma-verbs-sys has bindings for x86_64 and aarch64 Linux only (scripts/gen-bindings makes more)");

mod inline;
pub use inline::*;

/// The member of `ibv_send_wr::wr` an RDMA READ or WRITE uses.
pub type rdma_t = ibv_send_wr__bindgen_ty_2__bindgen_ty_1;
/// The member of `ibv_send_wr::wr` an atomic uses.
pub type atomic_t = ibv_send_wr__bindgen_ty_2__bindgen_ty_2;
/// The member of `ibv_send_wr::wr` a UD send uses.
pub type ud_t = ibv_send_wr__bindgen_ty_2__bindgen_ty_3;
