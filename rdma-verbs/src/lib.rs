//! Safe, RAII-owned wrappers over libibverbs.
//!
//! Every verbs resource is a Rust value that releases itself on drop, and borrows the resource
//! it was made from, so the compiler rules out freeing a parent before its children:
//!
//! ```text
//! DeviceList -> Device -> Context -> (protection domains, completion queues, ...)
//! ```
//!
//! This release covers the device layer: listing devices, opening one, and querying the device,
//! its ports and their GID tables. Protection domains, memory regions, completion queues and
//! queue pairs follow.
//!
//! ```no_run
//! use rdma_verbs::{Context, DeviceList};
//!
//! # fn main() -> rdma_verbs::Result<()> {
//! for device in DeviceList::available()?.iter() {
//!     println!("{} (GUID {:016x})", device.name(), device.guid());
//! }
//! let ctx = Context::open("rxe0")?;
//! for gid in ctx.gid_table()? {
//!     println!("port {} GID[{}] = {} ({:?})", gid.port, gid.index, gid.gid, gid.gid_type);
//! }
//! # Ok(()) }
//! ```
//!
//! # Errors
//! Every fallible call returns [`Result`]; its [`Error`] names the verb that failed, the device,
//! and the `errno`. Bad arguments (a port the device does not have, a GID index past the table)
//! are rejected before any verb is called.
//!
//! # Raw access
//! Each wrapper has `as_raw()`, and the bindings are re-exported as [`ffi`], for verbs this crate
//! does not wrap yet.
//!
//! # References
//! - [rdma-core's libibverbs man pages](https://github.com/linux-rdma/rdma-core/tree/master/libibverbs/man)

mod context;
mod device;
mod device_attr;
mod error;
mod ffi_ext;
mod gid;
mod port;

pub use context::Context;
pub use device::{Device, DeviceList, NodeType};
pub use device_attr::DeviceAttr;
pub use error::{Error, Result};
pub use gid::{Gid, GidEntry, GidType};
pub use port::{LinkLayer, Mtu, PortAttr, PortState};

/// The raw libibverbs bindings (the `rdma-sys` crate), for use with `as_raw()`.
pub use rdma_sys as ffi;
