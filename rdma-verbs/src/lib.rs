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
//! let cq = ctx.create_cq_with_channel(64)?; // waits sleep on its channel, or are awaited
//! let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
//! let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?.init(InitAttr::new(1))?;
//! let me = qp.endpoint(1, 0)?; // a loopback connection: the QP is its own peer
//! let qp = qp.handshake(me, 1, 0)?; // to RTS: GID index 1, the PSN `me` announced
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
//! # Keeping resources together: borrow or share
//! Every resource holds its parent through a [`Parent`]: a **borrow** (the compile-time ties
//! above, no run-time cost) or an **`Arc`** (the parent lives as long as its children), chosen
//! by what the constructor is given. Shared parents give `'static` resources that a thread or a
//! task can own and one struct can store:
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use rdma_verbs::*;
//!
//! /// One connection, owned: no borrow ties it to a stack frame.
//! struct Connection {
//!     sends: SendQueue<'static, Rc>,
//!     receives: RecvRing<'static>,
//!     slots: SlotPool<'static>,
//! }
//!
//! fn connect(ctx: &Arc<Context>, pd: &Arc<ProtectionDomain<'static>>, peer: QpEndpoint) -> Result<Connection> {
//!     let t = Duration::from_secs(1);
//!     let send_cq = Arc::new(CompletionQueue::new(ctx.clone(), 256, None)?);
//!     let recv_cq = Arc::new(CompletionQueue::new(ctx.clone(), 256, None)?);
//!     let qp = QueuePair::<Rc, Reset>::create(pd.clone(), QpCreateAttr::new(send_cq, recv_cq))?
//!         .init(InitAttr::new(1))?;
//!     // Receives posted before the connection is up stay posted through it.
//!     let receives = RecvRing::new(&qp, SlotPool::new(pd.clone(), 4096, 64, AccessFlags::LOCAL_WRITE)?, 64, t)?;
//!     let qp = qp.handshake(peer, 1, 0)?;
//!     let sends = SendQueue::new(&qp, t)?; // holds the QP: `qp` may go
//!     let slots = SlotPool::new(pd.clone(), 1 << 20, 64, AccessFlags::LOCAL_WRITE)?;
//!     Ok(Connection { sends, receives, slots })
//! }
//!
//! fn serve(peer: QpEndpoint) -> Result<()> {
//!     let ctx = Arc::new(Context::open("rxe0")?);
//!     let pd = Arc::new(ProtectionDomain::new(ctx.clone())?);
//!     let conn = connect(&ctx, &pd, peer)?;
//!     std::thread::spawn(move || {
//!         let Connection { mut sends, mut receives, slots } = conn; // the thread owns it all
//! #       let _ = (&mut sends, &mut receives, slots);
//!     });
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! [`std::thread::scope`] lends borrowed resources to threads too. Every wrapper is `Send`, and
//! `Sync` where libibverbs is thread-safe; a [`MemoryRegion`] is `Send` but not `Sync` (its bytes
//! are copied through `&self`), so it moves into the thread that uses it.
//!
//! # Pipelines: slots that travel
//! A [`SlotPool`] carves one registered region into slots. Posting through a [`SendQueue`] moves
//! each [`Slot`] into its [`SlotRequest`]; the request's [`SlotCompletion`] gives it back (one signaled
//! completion per doorbell returns every slot before it). A [`RecvRing`] keeps receives posted
//! and hands each arrival over as a [`SlotMessage`] that owns its slot until it is released. While
//! the application holds a slot, nothing else can touch it, so it is a plain `&mut [u8]`;
//! [`Slot::read_file`] and [`Slot::write_file`] move file data with `pread`/`pwrite` straight
//! into and out of registered memory. Nothing is allocated per request.
//!
//! # Safety model
//! A NIC (and, with a remote key, a peer) writes registered memory behind the compiler's back.
//! No safe call of this crate lets that happen to bytes Rust code holds a reference to:
//! - **Regions own their memory** ([`mr`]). [`MemoryRegion::read_at`] and
//!   [`MemoryRegion::write_at`] copy through raw pointers and are always sound;
//!   [`MemoryRegion::as_mut_slice`] needs `&mut` (no scope is using the region) and refuses a
//!   remotely writable region. Dropping a region deregisters it before freeing the memory, so a
//!   request still in flight fails instead of writing freed memory. `Debug` never reads the
//!   bytes.
//! - **Posting is `unsafe`; two safe layers sit on it.** [`QueuePair::post_send`] and
//!   friends state their contract. [`QueuePair::scope`] keeps every region its requests name
//!   borrowed until it has seen each of *its* requests complete (it tags their `wr_id`s and
//!   owns the QP's CQs while it runs), on return and on panic, flushing and finally resetting
//!   the QP if the device does not answer in time. See [`PostScope`]. [`SendQueue`] and
//!   [`RecvRing`] *move* owned [`Slot`]s into the requests and back out with the completions;
//!   dropping them mid-flight quiesces the QP (or leaks the slots the device may still reach),
//!   never hands such a slot out again.
//! - **Forgetting is sound.** A forgotten value leaks memory, never frees it under the device.
//!   With borrowed parents, the verbs objects of forgotten wrappers are destroyed when their
//!   context closes; with shared parents, a forgotten value that holds a count keeps its
//!   context (and all it holds) open until the process exits.
//! - **Requests are checked before the provider sees them**: opcode against transport (UD:
//!   sends with an address handle; UC: sends and writes; RC: everything), inline data only on
//!   sends and writes and within the QP's limit, RDMA lengths within the [`RemoteRegion`],
//!   SGE counts, and `wr_id`s below 2^62 ([`RESERVED_WR_ID_BITS`]).
//! - **Typestates tell the truth about transitions**: a transition's mask must change the
//!   state. The device may still move a QP on its own (to the error state), and a posting
//!   layer's last resort (a drain that resets the QP) leaves the typed handle as it was:
//!   [`QueuePair::state`] tells. Posting then fails or flushes; it is never unsound.
//! - **Waits end**: every wait takes a timeout, [`Duration::MAX`](std::time::Duration::MAX)
//!   meaning none ([`Deadline`]); event fds are non-blocking.
//! - **A hostile peer** holding an rkey can change a remotely writable region at any moment, and
//!   nothing else: such regions are only ever copied from.
//!
//! The full argument, with the measured rxe behaviour behind each rule, is in the repository's
//! [safety model](https://github.com/rdma-rs/rdma-rs/blob/main/docs/safety.md).
//!
//! # Waiting: one vocabulary
//! Every call that can wait takes a `timeout` ([`Duration::MAX`](std::time::Duration::MAX):
//! none, see [`Deadline`]), and has a form that never blocks. Across this crate and `rdma-cm`:
//!
//! | to | blocking (up to `timeout`) | never blocking |
//! |---|---|---|
//! | take the next item of a stream: a ring's message, a channel's event, a device's async event, a CM event or connection request | `recv(timeout)`, `recv_*(timeout)` | `try_recv()`, `try_recv_*()` |
//! | take completions of requests one posted | `wait(timeout, ..)`: until at least one (a scope: `n`) | `poll(..)` |
//! | see every request one posted complete | `drain(timeout, ..)` | |
//!
//! A wait that nothing can end (nothing posted or outstanding) returns
//! [`Error::NothingToWaitFor`] at once.
//!
//! **How a blocking call waits** ([`CqWaiter`]): it polls, spinning for its [`WaitPolicy`]'s
//! budget (50 µs by default; `set_wait_policy` on a ring, queue or scope), then arms the CQ,
//! polls once more, and sleeps on the CQ's completion channel until an event or its deadline.
//! An idle connection costs no CPU. A CQ created without a channel can only spin: the ring or
//! queue on it says so ([`RecvRing::can_sleep`]).
//!
//! **Async** (feature `tokio`): each wait has an `_async` form that takes no timeout (bound it
//! with `wait::timeout_at`, a `timerfd` on the reactor that needs no tokio time driver, or
//! with `tokio::time::timeout`): `RecvRing::recv_async`, `SendQueue::wait_async` /
//! `drain_async` / `ready_async` (room to post), `CompletionQueue::poll_async`,
//! `Context::recv_async_event_async`. The library registers the channel's file descriptor
//! with the reactor of the runtime each wait runs on; no `unsafe` is needed, and no thread is
//! started. Every async
//! wait is cancellation-safe: it takes a completion only in the step that returns it, so a
//! dropped future loses nothing ([`docs/safety.md`, "Waiting and cancellation"](https://github.com/rdma-rs/rdma-rs/blob/main/docs/safety.md#waiting-and-cancellation)). Dropping a
//! queue or ring may wait for the device: `close_async` does that on tokio's blocking pool.
//!
//! | to | blocks the thread | never blocks | awaits (feature `tokio`) |
//! |---|---|---|---|
//! | next message of a ring | `recv(timeout)` | `try_recv()` | `recv_async()` |
//! | completions of a send queue | `wait(timeout, f)` | `poll(f)` | `wait_async(f)` |
//! | all in flight done | `drain(timeout, f)` | | `drain_async(f)` |
//! | room to post | | `room()` | `ready_async(n, f)` |
//! | completions of a CQ | `poll_wait(out, timeout, policy)` | `poll(out)` (an extended CQ's waits up to 10 ms for another thread's poll) | `poll_async(out, policy)` |
//! | a device's async event | `recv_async_event(timeout)` | `try_recv_async_event()` | `recv_async_event_async()` |
//!
//! # Errors
//! Every fallible call returns [`Result`]; its [`Error`] names the verb that failed (only ever a
//! libibverbs function: [`Error::verb`]), the device where one is known, and the `errno`
//! ([`Error::errno`]). Bad arguments (a port the device does not have, a queue over the
//! device's limits, an empty registration, a request the QP cannot carry) are rejected before
//! any verb is called. The error converts with `?` into `Box<dyn std::error::Error + Send +
//! Sync>`, `anyhow::Error` and `rdma_cm::Error`.
//!
//! # Raw access
//! Each wrapper has `as_raw()`, and the bindings are re-exported as [`ffi`].
//!
//! # References
//! - [rdma-core's libibverbs man pages](https://github.com/linux-rdma/rdma-core/tree/master/libibverbs/man)

mod ah;
mod batch;
mod buffer;
mod completion_channel;
mod context;
mod cq;
mod cq_ex;
mod cq_holder;
mod cq_owner;
mod device;
mod device_attr;
mod device_attr_ex;
mod dmabuf;
mod error;
mod event;
#[doc(hidden)]
pub mod ffi_compat;
mod ffi_ext;
mod gid;
pub mod mr;
mod mw;
mod odp;
pub mod parent;
mod pd;
pub mod pool;
mod port;
mod post;
pub mod qp;
mod recv_ring;
mod registry;
mod request;
mod scope;
mod send_queue;
mod srq;
pub mod wait;
mod wc;
mod wr;
mod wr_id;

pub use ah::{AddressHandle, AddressVector, GRH_LEN};
pub use batch::WrBatch;
pub use completion_channel::{CompletionChannel, CompletionEvent};
pub use context::Context;
pub use cq::CompletionQueue;
pub use cq_ex::{LazyCompletion, WcFields};
pub use cq_holder::CqHolder;
pub use device::{Device, DeviceList, NodeType};
pub use device_attr::DeviceAttr;
pub use device_attr_ex::{DeviceAttrEx, DeviceCapabilities, OdpCapabilities, OdpOperations, RtValues};
pub use dmabuf::DmaBufRegion;
pub use error::{Error, Result};
pub use event::{AsyncEvent, AsyncEvents};
pub use gid::{Gid, GidEntry, GidType};
pub use mr::{
    AccessFlags, AlignedBuffer, HugePageBuffer, HugePageSize, MemoryRegion, RegisteredBuffer, RemoteRegion, Sge,
};
pub use mw::{BoundWindow, MemoryWindow, WindowType};
pub use odp::MrAdvice;
pub use parent::Parent;
pub use pd::ProtectionDomain;
pub use pool::{Slot, SlotPool};
pub use port::{LinkLayer, Mtu, PortAttr, PortState};
pub use post::SendOps;
pub use qp::attr::{InitAttr, QpCaps, QpEndpoint, RtrAttr, RtsAttr};
pub use qp::state::{
    CanPostRecv, Connected, Init, QpState, Rc, ReadyToReceive, ReadyToSend, Reset, Transport, TypeState, Uc, Ud,
};
pub use qp::{MulticastAttachment, QpCreateAttr, QueuePair, TransitionError};
pub use recv_ring::{RecvRing, SlotMessage};
pub use request::{PostError, Rejected, SlotCompletion, SlotRequest};
pub use scope::PostScope;
pub use send_queue::{Posting, SendQueue};
pub use srq::SharedReceiveQueue;
pub use wait::{CqWaiter, Deadline, Idle, WaitPolicy, SHARED_CHANNEL_SLICE};
pub use wc::{WcOpcode, WcStatus, WorkCompletion};
pub use wr::{RecvRequest, SendRequest};
pub use wr_id::RESERVED_WR_ID_BITS;

/// The raw bindings: `rdma-sys` 0.3.0 (the `rdma-sys` feature is on).
#[cfg(feature = "rdma-sys")]
pub use rdma_sys as ffi;
/// The raw libibverbs bindings (the `rdma-sys` crate), for use with `as_raw()`.
/// The raw bindings: [`rdma_verbs_sys`] by default, or `rdma-sys` 0.3.0 with the `rdma-sys` feature
/// (so that code written against rdma-sys's types takes this crate's `as_raw()` pointers).
#[cfg(not(feature = "rdma-sys"))]
pub use rdma_verbs_sys as ffi;

/// The memmap2 crate this one implements [`RegisteredBuffer`] for (feature `memmap2`), for
/// building the mapping with the same version: `rdma_verbs::memmap2::MmapMut::map_anon(len)`.
#[cfg(feature = "memmap2")]
pub use memmap2;
