//! The RDMA connection manager (librdmacm's `rdma_cm`) as a typed state machine, on top of
//! `rdma-verbs`.
//!
//! Connection setup is where RDMA programs fail first and explain least. Here every state is a
//! type, every event a variant, every failure a distinct [`Error`], and every wait takes a
//! timeout ([`Duration::MAX`](std::time::Duration::MAX) waits without a deadline). Each wrapper's
//! documentation names the librdmacm call it makes.
//!
//! # States
//!
//! ```text
//! active:  CmId<Idle> -resolve_addr-> CmId<AddressResolved> -resolve_route-> CmId<RouteResolved>
//!          -init_qp, connect-> Connection -disconnect-> ClosedConnection
//! passive: CmId<Idle> -listen-> Listener -recv_request-> ConnectRequest
//!          -init_qp, accept-> Connection -peer_disconnect-> ClosedConnection
//!                                 ConnectRequest -reject-> ()
//! UD:      UdId<Idle> -resolve-> UdId<RouteResolved> -init_qp, resolve_peer-> UdPeer (AH, QPN, Q_Key)
//!          UdId<Idle> -resolve_addr(local, group)-> UdId<AddressResolved> -join(group, &qp)-> Membership
//!          UdId<Idle> -listen-> UdListener -recv_request-> UdRequest -accept(&qp) / reject-> ()
//! ```
//!
//! Each transition consumes its input and gives the next state, or an [`Error`] after
//! destroying what it consumed (identifier, then QP); destroying an identifier mid-handshake
//! tells the peer's CM (a REJ or a DREQ). A transition that waits for an event returns a
//! [pending value](pending) first, which does nothing until it is finished one of two ways:
//! `.wait(timeout)` blocks the thread, and (feature `tokio`) `.await` waits on the runtime:
//!
//! ```no_run
//! # fn f() -> rdma_cm::Result<()> {
//! # let (src, dst, t) = (None, "10.77.0.1:7471".parse().unwrap(), std::time::Duration::from_secs(2));
//! let id = rdma_cm::CmId::new()?.resolve(src, dst).wait(t)?;
//! # Ok(()) }
//! # #[cfg(feature = "tokio")]
//! # async fn g() -> rdma_cm::Result<()> {
//! # let (src, dst) = (None, "10.77.0.1:7471".parse().unwrap());
//! let id = rdma_cm::CmId::new()?.resolve(src, dst).await?;
//! # Ok(()) }
//! ```
//!
//! The connection's queue pair is an ordinary `rdma-verbs` [`QueuePair`](rdma_verbs::QueuePair)
//! created by the caller on a context, PD and CQs of their choosing (open the context on the
//! device the CM resolved with [`CmId::open_context`] or [`ConnectRequest::open_context`]); the
//! CM only computes its attributes (`rdma_init_qp_attr`) and the state types follow it from
//! `Reset` to `ReadyToSend`. A QP on another device is refused ([`Error::DeviceMismatch`]).
//! Work is posted with `rdma-verbs`' safe [`QueuePair::scope`].
//!
//! [`QueuePair::scope`]: rdma_verbs::QueuePair::scope
//!
//! # Which call waits for which event
//!
//! | call | librdmacm | waits for | failure events become |
//! |---|---|---|---|
//! | [`CmId::resolve_addr`] | `rdma_resolve_addr` | `ADDR_RESOLVED` | `ADDR_ERROR`: [`Error::AddressResolution`] |
//! | [`CmId::resolve_route`] | `rdma_resolve_route` | `ROUTE_RESOLVED` | `ROUTE_ERROR`: [`Error::RouteResolution`] |
//! | [`CmId::connect`] | `rdma_connect`, then `rdma_establish` | `CONNECT_RESPONSE` | `REJECTED` reason 8: [`Error::NoListener`]; other `REJECTED`: [`Error::Rejected`]; `UNREACHABLE`: [`Error::Unreachable`]; `CONNECT_ERROR`: [`Error::ConnectError`] |
//! | [`Listener::recv_request`] | `rdma_get_cm_event`, `rdma_migrate_id` | `CONNECT_REQUEST` | |
//! | [`ConnectRequest::accept`] | `rdma_accept` | `ESTABLISHED` | `CONNECT_ERROR`, `REJECTED`; `DISCONNECTED`: [`Error::PeerDisconnected`] |
//! | [`Connection::disconnect`] | `rdma_disconnect` | `DISCONNECTED` (the peer's reply) | |
//! | [`Connection::peer_disconnect`] | `rdma_disconnect` once the event came | `DISCONNECTED` (the peer leaving) | |
//! | [`UdId::resolve_peer`] | `rdma_connect` (UD: a SIDR REQ) | `ESTABLISHED` with `ud` parameters | `UNREACHABLE` with SIDR status 1: [`Error::NoListener`]; 2 and others: [`Error::Rejected`]; `-ETIMEDOUT`: [`Error::Unreachable`] |
//! | [`UdListener::recv_request`] | `rdma_get_cm_event`, `rdma_migrate_id` | `CONNECT_REQUEST` (UD) | |
//! | [`UdRequest::accept`] | `rdma_accept` (UD: a SIDR REP) | nothing | |
//! | [`UdId::join`] | `rdma_join_multicast`, then `ibv_attach_mcast` | `MULTICAST_JOIN` | `MULTICAST_ERROR`: [`Error::Multicast`] |
//!
//! Each pending value's `.await` (feature `tokio`) runs the same body as its `.wait(timeout)`,
//! with only the wait swapped; the receives have `recv_*_async` forms (`Listener::recv_request_async`,
//! `Connection::recv_event_async`). See [Async](#async-feature-tokio).
//!
//! In every wait, `ADDR_CHANGE` and `TIMEWAIT_EXIT` are skipped, `DEVICE_REMOVAL` becomes
//! [`Error::DeviceRemoved`], any other event [`Error::UnexpectedEvent`], and no event before the
//! deadline [`Error::Timeout`]. [`Error::is_timeout`] is also true when the kernel's own timer
//! fired first (`ETIMEDOUT`). [`Connection::recv_event`] and [`Connection::try_recv_event`] return
//! the typed [`Event`] for callers that watch a connection.
//!
//! # Addresses and devices
//!
//! Accessors never make a value up. Where the state guarantees an address or a device, it is
//! read from librdmacm once, by the transition that establishes it, and returned plainly
//! (`SocketAddr`, `&str`); if librdmacm has none, that transition fails with
//! [`Error::Incomplete`]:
//! - [`CmId<AddressResolved>`](CmId) and [`CmId<RouteResolved>`](CmId): `local_addr`,
//!   `peer_addr`, `device_name`, from [`CmId::resolve_addr`];
//! - [`Listener::local_addr`], from [`CmId::listen`];
//! - [`ConnectRequest`] and [`Connection`]: `local_addr`, `peer_addr`, `device_name`, from the
//!   request (passive side) or address resolution (active side).
//!
//! Where it may legitimately be missing, the accessor returns an `Option`:
//! [`CmId<Idle>::local_addr`](CmId::local_addr) (an idle identifier is bound to nothing) and
//! [`Listener::device_name`] (a wildcard address such as `0.0.0.0` binds no device).
//!
//! # Errors, and mixing with `rdma-verbs`
//!
//! [`Error`] follows `rdma-verbs`' [`Error`](rdma_verbs::Error): every `errno` is positive (a
//! CM event's negative `status` is negated) and shows as [`std::io::Error`] shows it, and the
//! error names the RDMA device once it is known. A rejection's status is not an `errno` but a
//! [`RejectReason`].
//!
//! **When a function uses both crates, return [`rdma_cm::Result`](Result)**: every
//! `rdma_verbs::Error` converts into [`Error::Verbs`] with `?` (get it back with
//! [`Error::as_verbs`]), including in a posting scope's closure, whose error type is any type
//! an `rdma_verbs::Error` converts into. Both error types are `Send + Sync + 'static`, so
//! `Box<dyn std::error::Error + Send + Sync>` (or `anyhow::Error`) takes either, for
//! applications that mix in other errors too.
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_verbs::{AccessFlags, SendRequest, WorkCompletion};
//!
//! /// Sends `msg` on `conn` and waits for its completion.
//! fn send(conn: &rdma_cm::Connection<'_>, pd: &rdma_verbs::ProtectionDomain<'_>, msg: &[u8]) -> rdma_cm::Result<()> {
//!     let t = Duration::from_secs(2);
//!     let mr = pd.alloc_mr(msg.len(), AccessFlags::LOCAL_WRITE)?; // rdma_verbs::Error
//!     mr.write_at(0, msg)?;
//!     conn.qp().scope(t, |s| -> rdma_cm::Result<()> {
//!         let sge = [mr.sge(..)?];
//!         s.post_send(&mut [SendRequest::send(1, &sge)])?;
//!         let mut wc = [WorkCompletion::default(); 1];
//!         s.wait(1, &mut wc, t)?;
//!         if conn.peer_disconnected() {
//!             return Err(rdma_cm::Error::PeerDisconnected {
//!                 addr: conn.peer_addr(),
//!                 device: Some(conn.device_name().to_owned()),
//!             });
//!         }
//!         Ok(())
//!     })
//! }
//! ```
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
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let t = Duration::from_secs(2);
//! let id = CmId::new()?.resolve(None, "10.77.0.1:7471".parse()?).wait(t)?;
//! let ctx = id.open_context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16, None)?;
//! let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?;
//! let qp = id.init_qp(qp, AccessFlags::empty())?;
//! let conn = id.connect(qp, &ConnParams::new().private_data(b"hello")).wait(t)?;
//!
//! let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! mr.write_at(0, b"ping")?;
//! conn.qp().scope(t, |s| -> rdma_cm::Result<()> {
//!     let sge = [mr.sge(..4)?];
//!     s.post_send(&mut [SendRequest::send(1, &sge)])?;
//!     let mut wc = [rdma_verbs::WorkCompletion::default(); 1];
//!     s.wait(1, &mut wc, t)?;
//!     Ok(())
//! })?;
//! conn.disconnect().wait(t)?;
//! # Ok(())
//! # }
//! ```
//!
//! # A server (the passive side)
//!
//! One connection: wait for a request, accept it with private data, take one message, and wait
//! for the client to leave (the client is the example above).
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_cm::{ConnParams, Listener};
//! use rdma_verbs::{AccessFlags, QpCreateAttr, Rc, RecvRequest, WorkCompletion};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let t = Duration::from_secs(2);
//! let listener = Listener::bind("10.77.0.1:7471".parse()?, 16)?;
//! let req = listener.recv_request(Duration::MAX)?; // no deadline
//! println!("{} asks, sending {:?}", req.peer_addr(), &req.private_data()[..5]);
//! let ctx = req.open_context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16, None)?;
//! let qp = req.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?, AccessFlags::empty())?;
//! let conn = req.accept(qp, &ConnParams::new().private_data(b"welcome")).wait(t)?;
//!
//! let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! conn.qp().scope(t, |s| -> rdma_cm::Result<()> {
//!     let sge = [mr.sge(..)?];
//!     s.post_recv(&mut [RecvRequest::new(1, &sge)])?;
//!     let mut wc = [WorkCompletion::default(); 1];
//!     s.wait(1, &mut wc, t)?;
//!     Ok(())
//! })?;
//! conn.peer_disconnect().wait(t)?;
//! # Ok(())
//! # }
//! ```
//!
//! The same server with the `tokio` feature: a task per connection, each step awaited, a
//! transition bounded by its `wait_async(timeout)` (a `timerfd` on the reactor: the runtime
//! needs no time driver).
//!
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn serve() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use std::time::Duration;
//! use rdma_cm::{ConnParams, Listener};
//! use rdma_verbs::{AccessFlags, QpCreateAttr, Rc};
//!
//! let t = Duration::from_secs(2);
//! let listener = Listener::bind("10.77.0.1:7471".parse()?, 16)?;
//! loop {
//!     let req = listener.recv_request_async().await?; // cancellation-safe: fine in select!
//!     tokio::spawn(async move {
//!         let ctx = req.open_context()?;
//!         let pd = ctx.alloc_pd()?;
//!         let cq = ctx.create_cq(16, None)?;
//!         let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?;
//!         let qp = req.init_qp(qp, AccessFlags::empty())?;
//!         let params = ConnParams::new().private_data(b"welcome");
//!         let conn = req.accept(qp, &params).wait_async(t).await?;
//!         // ... work on conn.qp() ...
//!         conn.peer_disconnect().await?;
//!         Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
//!     });
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! # Unreliable datagrams and multicast (`RDMA_PS_UDP`)
//!
//! A [`UdId`] is an identifier of the UDP port space. Its QP is a UD queue pair that
//! [`UdId::init_qp`] readies with the CM's port, P_Key and Q_Key. A datagram needs an address
//! handle, a QP number and a Q_Key. [`UdId::resolve_peer`] gets them from a [`UdListener`]'s
//! [`UdRequest::accept`] (service ID resolution). [`UdId::join`] gets a multicast group's, and
//! the [`Membership`] it gives leaves the group when dropped:
//!
//! ```no_run
//! use std::time::Duration;
//! use rdma_cm::UdId;
//! use rdma_verbs::{AccessFlags, QpCreateAttr, SendRequest, Ud, WorkCompletion};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let t = Duration::from_secs(2);
//! let id = UdId::new()?.resolve(None, "10.77.0.1:7471".parse()?).wait(t)?;
//! let ctx = id.open_context()?;
//! let pd = ctx.alloc_pd()?;
//! let cq = ctx.create_cq(16, None)?;
//! let qp = id.init_qp(pd.create_qp::<Ud>(QpCreateAttr::new(&cq, &cq))?)?;
//! let peer = id.resolve_peer(b"hello").wait(t)?; // the peer's QP number, Q_Key and route
//! let ah = peer.create_ah(&pd)?;
//! let mr = pd.alloc_mr(64, AccessFlags::LOCAL_WRITE)?;
//! mr.write_at(0, b"ping")?;
//! qp.scope(t, |s| -> rdma_cm::Result<()> {
//!     let sge = [mr.sge(..4)?];
//!     s.post_send(&mut [SendRequest::send(1, &sge).to(&ah, peer.qp_num(), peer.qkey())])?;
//!     let mut wc = [WorkCompletion::default(); 1];
//!     s.wait(1, &mut wc, t)?;
//!     Ok(())
//! })?;
//! # Ok(())
//! # }
//! ```
//!
//! # Waiting
//! As in `rdma-verbs` (its crate docs, "Waiting: one vocabulary"): `recv_*(timeout)` waits up to
//! `timeout` for the next event or request, `try_recv_*()` never blocks, and (feature `tokio`)
//! `*_async()` awaits without a timeout of its own. A transition is a [`Pending`] value:
//! `.wait(timeout)` (a timeout or a [`Deadline`](rdma_verbs::Deadline)), `.wait_async(timeout)`,
//! or `.await` (no deadline).
//!
//! # Async (feature `tokio`)
//!
//! The feature gives every pending value `wait_async(timeout)` beside `wait(timeout)`, makes it
//! awaitable without a deadline ([`IntoFuture`](std::future::IntoFuture)), and adds
//! `recv_x_async()` beside `recv_x(timeout)` and `try_recv_x()`. Each is the blocking call with
//! only its wait swapped: the same librdmacm calls, the same event, the same errors (a
//! [`Error::Timeout`] naming the call waited for). A deadline is rdma-verbs' `timerfd` on the
//! reactor (`rdma_verbs::wait::timeout_at`), as for every async wait of rdma-verbs and
//! rdma-proto: a runtime built without tokio's time driver works. The `recv_x_async()` calls
//! take **no timeout**: bound them with `rdma_verbs::wait::timeout_at`, `tokio::time::timeout`
//! or a `tokio::select!` arm. Each wait registers a duplicate
//! of the identifier's event-channel fd with the reactor of the runtime it runs on (tokio's
//! `AsyncFd`) and deregisters it when it ends, so an identifier is bound to no runtime: it may
//! be used from one, then another. Outside a Tokio runtime an async call fails with
//! [`Error::NoRuntime`] before any librdmacm call. The runtime must have I/O enabled (tokio
//! panics otherwise, as for any of its I/O types).
//!
//! **Cancellation.** Every async call may be dropped at any await without losing an event or
//! leaking anything. Events are only ever taken from a channel in synchronous steps that
//! return them at once (or record them: a peer's disconnect is kept in the connection's state),
//! so:
//! - `Listener::recv_request_async`, `Connection::recv_event_async`,
//!   `Connection::disconnected_async` and `Events::next` (from `Connection::events`) are
//!   cancellation-safe in the `tokio::select!` sense: a dropped future took nothing, the next
//!   call gets what it would have got;
//! - the transitions (awaited pending values: `resolve*`, `connect`, `accept`, `disconnect`,
//!   `peer_disconnect`) drop their input when dropped, which is what an error does: the identifier is destroyed, which tells the peer's CM, and the QP is destroyed.
//!
//! Several tasks (and threads) may wait on one listener or one connection: each request or event
//! goes to one of them, and a peer's disconnect is seen by all (`disconnected_async`,
//! `Events::next`, [`Connection::peer_disconnected`]).
//!
//! **Teardown does not block the runtime.** Dropping any identifier makes a bounded number of
//! system calls and waits for no peer: `rdma_reject` or `rdma_disconnect` (which send a REJ or a
//! DREQ and return), `rdma_destroy_id` (which waits only for unacknowledged events, and this crate
//! acknowledges each one as it reads it), closing the channel, and `ibv_destroy_qp`. So dropping
//! a [`Connection`] inside a task is fine; `disconnect().await` is the graceful close, for a
//! caller that wants the peer's reply.
//!
//! # Events and file descriptors
//!
//! Each identifier ([`CmId`], [`Listener`], [`ConnectRequest`], [`Connection`]) owns an event
//! channel, so its events never mix with another's, and its non-blocking fd
//! ([`AsRawFd`](std::os::fd::AsRawFd)) can be handed to `poll`/`epoll` or an async reactor. The
//! blocking calls poll that fd with their timeout; [`Listener::try_recv_request`] and
//! [`Connection::try_recv_event`] are the non-blocking steps an async front drives. A request is
//! moved off the listener's channel (`rdma_migrate_id`) under the listener's lock, so
//! `&Listener` can be shared between threads, and [`ConnectRequest`] and [`Connection`] are
//! `Send`.
//!
//! # Release order
//!
//! - An identifier is destroyed (`rdma_destroy_id`) before its event channel.
//! - Dropping a [`ConnectRequest`] unanswered rejects it; dropping a [`Connection`] disconnects
//!   it; after `rdma_accept` or `rdma_reject` nothing more is sent.
//! - A [`Connection`] drops its identifier before its queue pair; a [`ClosedConnection`] keeps
//!   only the queue pair.
//! - Every event is acknowledged (`rdma_ack_cm_event`) as soon as it has been copied, so
//!   `rdma_destroy_id` never waits for one.
//!
//! # Measured on Soft-RoCE (rxe, Linux 6.1 and 6.12)
//!
//! - **Private data arrives zero-padded** to the InfiniBand CM message's fixed size: 56 bytes in
//!   a request ([`MAX_CONNECT_PRIVATE_DATA`]), 196 in an acceptance
//!   ([`MAX_ACCEPT_PRIVATE_DATA`]), 148 in a rejection ([`MAX_REJECT_PRIVATE_DATA`]). A protocol
//!   that needs the exact length must carry it; longer data is [`Error::InvalidArgument`]
//!   before anything is sent.
//! - **No listener on the port is an immediate `REJECTED`** with reason 8 (invalid service ID):
//!   [`Error::NoListener`], not a timeout.
//! - **An address without an RDMA device is `ENODEV`**, for a source address on such an
//!   interface and for a destination routed through one: [`Error::AddressResolution`].
//! - **The first address resolution to a fresh neighbour can stall** for the kernel's whole
//!   timer when the ARP reply beats the request; [`CmId::resolve_addr`] therefore asks in 250 ms
//!   attempts until its own timeout.
//! - **librdmacm keeps one verbs context per device open until the process exits** (`ctx` +1
//!   and 2 fds per device in `rdma resource show`): a fixed cost, not a leak.
//! - **Receives posted to a QP already in the error state are not flushed** until it is moved
//!   to the error state again: code that polls a [`ClosedConnection`]'s queue pair by hand calls
//!   [`QueuePair::flush`](rdma_verbs::QueuePair::flush) after posting (a posting scope's drain
//!   does it).
//! - Each identifier's own event channel costs one open of `/dev/infiniband/rdma_cm` (about
//!   200 µs under emulation).
//!
//! # References
//! - [`rdma_cm(7)`](https://man7.org/linux/man-pages/man7/rdma_cm.7.html)
//! - The long version of the above, with the full state diagram and how each fact was measured:
//!   [`docs/rdma-cm.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/rdma-cm.md) in the
//!   repository.

mod addr;
mod channel;
mod conn_id;
mod connection;
mod error;
mod event;
mod id;
mod listener;
mod multicast;
mod params;
pub mod pending;
mod raw_id;
mod sidr;
mod ud;

#[cfg(feature = "tokio")]
pub use connection::Events;
pub use connection::{ClosedConnection, Connection};
pub use error::{Error, RejectReason, Result};
pub use event::{Event, EventKind, PeerParams, UdParams};
pub use id::{AddressResolved, Bound, CmId, IdState, Idle, RouteResolved};
pub use listener::{ConnectRequest, Listener};
pub use multicast::Membership;
pub use params::{
    ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
    MAX_SIDR_REPLY_PRIVATE_DATA, MAX_SIDR_REQUEST_PRIVATE_DATA,
};
#[cfg(feature = "tokio")]
pub use pending::PendingFuture;
pub use pending::{
    Accepting, Connecting, Disconnecting, Joining, PeerDisconnect, Pending, Resolving, ResolvingAddress, ResolvingPeer,
    ResolvingRoute, UdResolving,
};
pub use sidr::{UdListener, UdRequest};
pub use ud::{UdId, UdPeer};

/// The `rdma-verbs` crate this crate's queue pairs come from.
pub use rdma_verbs as verbs;
