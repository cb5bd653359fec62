//! libibverbs entry points that rdma-sys 0.3.0 does not bind (rdma-verbs-sys does: with it,
//! they are its own).
//!
//! `ibv_query_gid_ex` and `ibv_query_gid_table` are inline functions in `<infiniband/verbs.h>`;
//! they call these exported symbols (libibverbs `IBVERBS_1.11`, rdma-core 32 and later), passing
//! the size of the caller's entry struct.

#[cfg(not(feature = "rdma-sys"))]
pub(crate) use crate::ffi::{_ibv_query_gid_ex, _ibv_query_gid_table};

#[cfg(feature = "rdma-sys")]
use crate::ffi::{ibv_context, ibv_gid_entry};

#[cfg(feature = "rdma-sys")]
extern "C" {
    pub(crate) fn _ibv_query_gid_ex(
        context: *mut ibv_context,
        port_num: u32,
        gid_index: u32,
        entry: *mut ibv_gid_entry,
        flags: u32,
        entry_size: usize,
    ) -> libc::c_int;

    pub(crate) fn _ibv_query_gid_table(
        context: *mut ibv_context,
        entries: *mut ibv_gid_entry,
        max_entries: usize,
        flags: u32,
        entry_size: usize,
    ) -> libc::ssize_t;
}
