//! The RDMA connection manager (librdmacm's `rdma_cm`) as a typed state machine, on top of
//! `rdma-verbs`.
//!
//! Connection setup is where RDMA programs fail first and explain least. Here every state is a
//! type, every event a variant, every failure a distinct [`Error`], and every wait takes a
//! timeout:
//!
//! ```text
//! active:  CmId<Idle> -resolve_addr-> CmId<AddressResolved> -resolve_route-> CmId<RouteResolved>
//!          -init_qp, connect-> Connection -disconnect-> Disconnected
//! passive: CmId<Idle> -listen-> Listener -get_request-> ConnectRequest
//!          -accept-> Connection -wait_disconnected-> Disconnected
//!                                 ConnectRequest -reject-> ()
//! ```
//!
//! The connection's queue pair is an ordinary `rdma-verbs` [`QueuePair`](rdma_verbs::QueuePair)
//! created by the caller on a context, PD and CQs of their choosing (open the context on the
//! device the CM resolved with [`CmId::open_context`] or [`ConnectRequest::open_context`]); the
//! CM only computes its attributes (`rdma_init_qp_attr`) and the state types follow it from
//! `Reset` to `ReadyToSend`. Work is posted with `rdma-verbs`' safe [`QueuePair::scope`].
//!
//! [`QueuePair::scope`]: rdma_verbs::QueuePair::scope
//!
//! # Example
//!
//! A client that sends 5 bytes of private data and one message (the server side is in the
//! crate's tests and in the workspace's `examples/`):
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_cm::{CmId, ConnParams};
//! use rdma_verbs::{AccessFlags, QpCreateAttr, Rc, SendRequest};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let t = Duration::from_secs(2);
//! let id = CmId::new()?.resolve(None, "10.77.0.1:7471".parse()?, t)?;
//! let ctx = id.open_context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16, None)?;
//! let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?;
//! let qp = id.init_qp(qp, AccessFlags::empty())?;
//! let conn = id.connect(qp, &ConnParams::new().private_data(b"hello"), t)?;
//!
//! let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! mr.write_at(0, b"ping")?;
//! conn.qp().scope(t, |s| {
//!     let sge = [mr.sge(..4)?];
//!     s.post_send(&mut [SendRequest::send(1, &sge)])?;
//!     let mut wc = [rdma_verbs::WorkCompletion::default(); 1];
//!     s.wait(1, &mut wc, t)?;
//!     Ok::<_, rdma_verbs::Error>(())
//! })?;
//! conn.disconnect(t)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Events and file descriptors
//!
//! Each identifier ([`CmId`], [`Listener`], [`ConnectRequest`], [`Connection`]) owns an event
//! channel, so its events never mix with another's, and its non-blocking fd
//! ([`AsRawFd`](std::os::fd::AsRawFd)) can be handed to `poll`/`epoll` or an async reactor. The
//! blocking calls poll that fd with their timeout; [`Listener::try_get_request`] and
//! [`Connection::try_event`] are the non-blocking steps an async front drives.
//!
//! # References
//! - [`rdma_cm(7)`](https://man7.org/linux/man-pages/man7/rdma_cm.7.html)
//! - The workspace's `docs/rdma-cm.md`: the state diagram and the events of each state.

mod addr;
mod channel;
mod conn_id;
mod connection;
mod error;
mod event;
mod id;
mod listener;
mod params;
mod raw_id;

pub use channel::EventChannel;
pub use connection::{Connection, Disconnected};
pub use error::{Error, RejectReason, Result};
pub use event::{Event, EventKind, PeerParams};
pub use id::{AddressResolved, Bound, CmId, IdState, Idle, RouteResolved};
pub use listener::{ConnectRequest, Listener};
pub use params::{ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};

/// The `rdma-verbs` crate this crate's queue pairs come from.
pub use rdma_verbs as verbs;
