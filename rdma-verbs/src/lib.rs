//! Safe, RAII-owned wrappers over libibverbs.
//!
//! Every verbs resource is a Rust value that releases itself on drop and borrows the resource it
//! was made from, so the compiler rules out freeing a parent before its children:
//!
//! ```text
//! DeviceList -> Device    Context -> ProtectionDomain -> MemoryRegion, QueuePair, AddressHandle, SRQ
//!                                 -> CompletionChannel -> CompletionQueue -> QueuePair
//! ```
//!
//! Queue pairs carry their transport ([`Rc`], [`Uc`], [`Ud`]) and state ([`Reset`], [`Init`],
//! [`ReadyToReceive`], [`ReadyToSend`]) in their type: only a ready-to-send QP can post sends.
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_verbs::*;
//!
//! # fn main() -> rdma_verbs::Result<()> {
//! let ctx = Context::open("rxe0")?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(64, None)?;
//! let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
//! let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?.init(InitAttr::new(1))?;
//! let me = qp.endpoint(1, 0)?; // a loopback connection: the QP is its own peer
//! let qp = qp.ready_to_receive(&RtrAttr::new(me, 1, 1, Mtu::Mtu1024))?.ready_to_send(&RtsAttr::new(0))?;
//! mr.write_at(0, b"hello")?;
//! qp.scope(Duration::from_secs(1), |s| -> rdma_verbs::Result<()> {
//!     let (buf, msg) = ([mr.sge(2048..)?], [mr.sge(..5)?]);
//!     s.post_recv(&mut [RecvRequest::new(1, &buf)])?;
//!     s.post_send(&mut [SendRequest::send(2, &msg)])?;
//!     let mut wcs: [WorkCompletion; 2] = Default::default();
//!     for wc in s.wait(2, &mut wcs, Duration::from_secs(1))?.iter() {
//!         wc.ok()?;
//!     }
//!     Ok(())
//! })?;
//! let mut got = [0u8; 5];
//! mr.read_at(2048, &mut got)?;
//! assert_eq!(&got, b"hello");
//! # Ok(()) }
//! ```
//!
//! # Keeping resources together
//! Borrows make a struct that owns a context *and* its PD self-referential. Lend the stack
//! instead (build resources in `main` and pass references), or, for resources that live as long
//! as the process, leak the parents once and keep `'static` references in any struct:
//!
//! ```no_run
//! use rdma_verbs::*;
//!
//! struct Server {
//!     pd: &'static ProtectionDomain<'static>,
//!     cq: &'static CompletionQueue<'static>,
//!     qp: QueuePair<'static, Rc, Init>,
//!     buffer: MemoryRegion<'static>,
//! }
//!
//! fn server() -> rdma_verbs::Result<Server> {
//!     let ctx: &'static Context = Box::leak(Box::new(Context::open("rxe0")?));
//!     let pd: &'static ProtectionDomain<'static> = Box::leak(Box::new(ctx.alloc_pd()?));
//!     let cq: &'static CompletionQueue<'static> = Box::leak(Box::new(ctx.create_cq(256, None)?));
//!     let qp = pd.create_qp::<Rc>(QpCreateAttr::new(cq, cq))?.init(InitAttr::new(1))?;
//!     let buffer = pd.alloc_mr(1 << 20, AccessFlags::LOCAL_WRITE)?;
//!     Ok(Server { pd, cq, qp, buffer })
//! }
//! ```
//! `docs/safety.md` lists the options.
//!
//! # Memory the NIC writes
//! See [`mr`] and `docs/safety.md`: regions own their buffers and are read by copy, plain slices
//! exist only when no request or peer can write, and the safe [`QueuePair::scope`] keeps posted
//! regions borrowed until their requests complete. The raw `post_*` functions are `unsafe`.
//!
//! # Errors
//! Every fallible call returns [`Result`]; its [`Error`] names the verb that failed, the device
//! and the `errno`. Bad arguments (a port the device does not have, a queue over the device's
//! limits, an empty registration) are rejected before any verb is called.
//!
//! # Raw access
//! Each wrapper has `as_raw()`, and the bindings are re-exported as [`ffi`].
//!
//! # References
//! - [rdma-core's libibverbs man pages](https://github.com/linux-rdma/rdma-core/tree/master/libibverbs/man)

mod ah;
mod context;
mod cq;
mod deadline;
mod device;
mod device_attr;
mod error;
mod event;
mod ffi_ext;
mod gid;
pub mod mr;
mod pd;
mod port;
pub mod qp;
mod scope;
mod srq;
mod wc;
mod wr;

pub use ah::{AddressHandle, AddressVector};
pub use context::Context;
pub use cq::{CompletionChannel, CompletionEvent, CompletionQueue};
pub use deadline::Deadline;
pub use device::{Device, DeviceList, NodeType};
pub use device_attr::DeviceAttr;
pub use error::{Error, Result};
pub use event::{AsyncEvent, AsyncEvents};
pub use gid::{Gid, GidEntry, GidType};
pub use mr::{AccessFlags, AlignedBuffer, MemoryRegion, RegisteredBuffer, RemoteRegion, Sge};
pub use pd::ProtectionDomain;
pub use port::{LinkLayer, Mtu, PortAttr, PortState};
pub use qp::attr::{InitAttr, QpCaps, QpEndpoint, RtrAttr, RtsAttr};
pub use qp::state::{
    CanPostRecv, Connected, Init, QpState, Rc, ReadyToReceive, ReadyToSend, Reset, State, Transport, Uc, Ud,
};
pub use qp::{QpCreateAttr, QueuePair, TransitionError};
pub use scope::PostScope;
pub use srq::SharedReceiveQueue;
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvRequest, SendRequest, RESERVED_WR_ID_BITS};

/// The raw libibverbs bindings (the `rdma-sys` crate), for use with `as_raw()`.
pub use rdma_sys as ffi;
