//! The passive side: a listening identifier and the connection requests it receives.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

use parking_lot::Mutex;
use rdma_verbs::ffi;
use rdma_verbs::{AccessFlags, Deadline, Init, QueuePair, Rc, ReadyToSend, Reset};

use crate::conn_id::{ConnId, CONNECTED, DONE, REQUESTED};
use crate::connection::Connection;
use crate::error::{check, Error, Result};
use crate::event::{Event, EventKind, PeerParams, RawEvent};
use crate::id::CmId;
use crate::params::{ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};
use crate::pending::{block_on, Accepting, OwnedParams, Waiting};
use crate::raw_id::RawId;

/// The call and the state accepting names in its errors.
const ACCEPT: &str = "rdma_accept";
const ACCEPTING: &str = "accepting";

/// What a wait for a request names in its errors.
const RECV_REQUEST: &str = "waiting for a connection request";

/// A bound, listening identifier (`rdma_bind_addr` then `rdma_listen`), with its own event
/// channel. Destroyed (`rdma_destroy_id`) on drop; requests already handed out as
/// [`ConnectRequest`]s live on independently.
///
/// `&Listener` may be shared between threads: each [`recv_request`](Self::recv_request) returns a
/// different request, and every request and connection has an event channel of its own, so
/// connections can be accepted and served concurrently.
///
/// # References
/// - [`rdma_listen(3)`](https://man7.org/linux/man-pages/man3/rdma_listen.3.html)
/// - [`rdma_migrate_id(3)`](https://man7.org/linux/man-pages/man3/rdma_migrate_id.3.html)
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct Listener {
    id: RawId,
    /// The bound address, read once when binding.
    local: SocketAddr,
    /// The device, for an address that is not a wildcard.
    device: Option<String>,
    /// Held while an event is read and, for a request, its new identifier moved to a channel of
    /// its own, so that no other reader can take that identifier's events meanwhile.
    reading: Mutex<()>,
}

impl Listener {
    pub(crate) fn new(id: RawId, local: SocketAddr, device: Option<String>) -> Self {
        Listener { id, local, device, reading: Mutex::new(()) }
    }

    /// Names the listener's device, if it has one, in `e`.
    pub(crate) fn on_device(&self, e: Error) -> Error {
        match &self.device {
            Some(d) => e.on_device(d),
            None => e,
        }
    }

    /// Creates an identifier, binds it to `addr` and listens (`rdma_create_id()`,
    /// `rdma_bind_addr()`, `rdma_listen()`): shorthand for
    /// [`CmId::new`]`()?.`[`listen`](CmId::listen)`(addr, backlog)`.
    ///
    /// # Errors
    /// Those of the two calls.
    pub fn bind(addr: SocketAddr, backlog: u16) -> Result<Self> {
        CmId::new()?.listen(addr, backlog)
    }

    /// The address listened on, with the port the CM picked if 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The RDMA device the listener is bound to; `None` when it listens on a wildcard address
    /// (`0.0.0.0`, `::`), where requests may come through any device (each
    /// [`ConnectRequest::device_name`] tells which).
    pub fn device_name(&self) -> Option<&str> {
        self.device.as_deref()
    }

    /// Waits up to `timeout` for the next connection request (`rdma_get_cm_event()` for
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`), and moves the request's identifier to an event channel
    /// of its own (`rdma_migrate_id()`).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::DeviceRemoved`]; [`Error::UnexpectedEvent`] for an event a
    /// listener cannot get; [`Error::Cm`] when the request's identifier cannot be moved to a
    /// channel of its own; [`Error::Incomplete`] when librdmacm reports no device or address for
    /// the request (it is then rejected).
    #[doc(alias = "rdma_get_cm_event")]
    #[doc(alias = "rdma_migrate_id")]
    pub fn recv_request(&self, timeout: Duration) -> Result<ConnectRequest> {
        self.recv_incoming(timeout, conn_params).map(ConnectRequest::from)
    }

    /// Returns the next connection request if one is queued, without waiting
    /// (`rdma_get_cm_event()` on the non-blocking channel, then `rdma_migrate_id()`), for
    /// callers that poll the listener's fd themselves.
    ///
    /// # Errors
    /// As [`recv_request`](Self::recv_request), except timeouts.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_recv_request(&self) -> Result<Option<ConnectRequest>> {
        Ok(self.try_recv_incoming(conn_params)?.map(ConnectRequest::from))
    }

    /// The next request, parsed by `parse`, waiting up to `timeout` (what
    /// [`recv_request`](Self::recv_request) and a UD listener's receive share).
    pub(crate) fn recv_incoming<P>(&self, timeout: Duration, parse: fn(&RawEvent) -> P) -> Result<Incoming<P>> {
        self.id
            .wait_for(Deadline::after(timeout), RECV_REQUEST, || self.request_step(parse))
            .map_err(|e| self.on_device(e))
    }

    /// The next request if one is queued, parsed by `parse`.
    pub(crate) fn try_recv_incoming<P>(&self, parse: fn(&RawEvent) -> P) -> Result<Option<Incoming<P>>> {
        let Some(reading) = self.reading.try_lock() else { return Ok(None) };
        self.take_queued(reading, parse).map_err(|e| self.on_device(e))
    }

    /// The step every wait for a request takes: the next request if one is queued, `None` once
    /// the channel is empty. The lock is held only while events are read and a request is
    /// migrated, never across a wait, so blocking and async waiters can share the listener.
    fn request_step<P>(&self, parse: fn(&RawEvent) -> P) -> Result<Option<Incoming<P>>> {
        self.take_queued(self.reading.lock(), parse)
    }

    /// Reads events under the lock until a request (migrated to its own channel before the lock
    /// goes) or an empty channel.
    fn take_queued<P>(
        &self,
        _reading: parking_lot::MutexGuard<'_, ()>,
        parse: fn(&RawEvent) -> P,
    ) -> Result<Option<Incoming<P>>> {
        while let Some(ev) = self.id.try_event()? {
            if let Some(request) = self.take(ev, parse)? {
                return Ok(Some(request));
            }
        }
        Ok(None)
    }

    /// Turns a listener event into a request, its parameters read by `parse`; `None` for events
    /// to skip.
    fn take<P>(&self, ev: RawEvent, parse: fn(&RawEvent) -> P) -> Result<Option<Incoming<P>>> {
        match ev.kind() {
            EventKind::ConnectRequest => {
                let child = NonNull::new(ev.id());
                let params = parse(&ev);
                // Acknowledge before migrating: rdma_migrate_id waits for the identifier's
                // events to be acknowledged.
                drop(ev);
                let Some(child) = child else { return Ok(None) };
                // SAFETY: librdmacm created `child` for this request and hands it to us.
                let id = unsafe { RawId::adopt(child) }?;
                // Owned from here: an early return drops it, which rejects the request.
                let conn = ConnId::new(id, REQUESTED);
                const CALL: &str = "RDMA_CM_EVENT_CONNECT_REQUEST";
                let device = conn.id.require_device(CALL)?;
                let on_device = |e: Error| e.on_device(&device);
                let peer = conn.id.require_peer_addr(CALL).map_err(on_device)?;
                let local = conn.id.require_local_addr(CALL).map_err(on_device)?;
                Ok(Some(Incoming { conn, params, peer, local, device }))
            }
            EventKind::DeviceRemoval => Err(Error::DeviceRemoved { device: None }),
            EventKind::AddressChange | EventKind::TimewaitExit => Ok(None),
            // An event of another identifier than the listener cannot arrive here (requests are
            // migrated under the lock); skip it rather than fail the listener.
            _ if ev.id() != self.id.as_ptr() => Ok(None),
            kind => Err(Error::UnexpectedEvent { state: "listening", device: None, event: kind, errno: ev.errno() }),
        }
    }

    /// The raw `struct rdma_cm_id *`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }
}

impl AsRawFd for Listener {
    /// The listener's event channel (non-blocking): readable when a request is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.id.fd()
    }
}

impl std::os::fd::AsFd for Listener {
    /// The listener's event channel (non-blocking): readable when a request is queued, for a
    /// `poll(2)` or reactor wait of one's own that also waits for other things. Take the
    /// requests with [`try_recv_request`](Self::try_recv_request).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.id.as_fd()
    }
}

/// A request taken off a listener, its identifier migrated to a channel of its own (dropping it
/// rejects), with the parameters its port space's parser read.
pub(crate) struct Incoming<P> {
    pub(crate) conn: ConnId,
    pub(crate) params: P,
    pub(crate) peer: SocketAddr,
    pub(crate) local: SocketAddr,
    pub(crate) device: String,
}

/// A connection request's parameters (`param.conn`).
fn conn_params(ev: &RawEvent) -> PeerParams {
    match ev.to_event() {
        Event::ConnectRequest(p) => p,
        _ => PeerParams::default(),
    }
}

impl From<Incoming<PeerParams>> for ConnectRequest {
    fn from(Incoming { conn, params, peer, local, device }: Incoming<PeerParams>) -> Self {
        ConnectRequest { conn, params, peer, local, device }
    }
}

/// A peer's request to connect (`RDMA_CM_EVENT_CONNECT_REQUEST`), with its own identifier and
/// event channel. Answer it with [`accept`](Self::accept) or [`reject`](Self::reject); dropping
/// it unanswered rejects it (`rdma_reject`).
///
/// # References
/// - [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
/// - [`rdma_reject(3)`](https://man7.org/linux/man-pages/man3/rdma_reject.3.html)
#[derive(Debug)]
#[must_use = "a connect request is rejected when dropped: accept or reject it"]
pub struct ConnectRequest {
    conn: ConnId,
    params: PeerParams,
    peer: SocketAddr,
    local: SocketAddr,
    device: String,
}

impl ConnectRequest {
    /// The private data the peer sent (zero-padded to 56 bytes by the InfiniBand CM).
    pub fn private_data(&self) -> &[u8] {
        &self.params.private_data
    }

    /// Everything the peer sent with its request.
    pub fn peer_params(&self) -> &PeerParams {
        &self.params
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The local address the request came to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The RDMA device the request arrived on.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// The device port the request arrived on.
    pub fn port(&self) -> u8 {
        self.conn.id.port()
    }

    /// Opens a verbs context (`ibv_open_device`) on the device the request arrived on.
    ///
    /// # Errors
    /// [`Error::Verbs`]: opening the device failed.
    #[doc(alias = "ibv_open_device")]
    pub fn open_context(&self) -> Result<rdma_verbs::Context> {
        Ok(rdma_verbs::Context::open(&self.device)?)
    }

    /// The raw `struct rdma_cm_id *` of the request; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.conn.id.as_ptr()
    }

    /// Moves a new RC queue pair to `Init` for this connection (`rdma_init_qp_attr()`, then
    /// `ibv_modify_qp()`), granting the peer `access`. Receives can be posted from here on,
    /// before [`accept`](Self::accept).
    ///
    /// # Errors
    /// As [`CmId::init_qp`].
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp<'res>(
        &self,
        qp: QueuePair<'res, Rc, Reset>,
        access: AccessFlags,
    ) -> Result<QueuePair<'res, Rc, Init>> {
        self.conn.id.init_qp(qp, access, &self.device).map_err(|e| e.on_device(&self.device))
    }

    /// Accepts with `qp`: moves it to `ReadyToSend` with the path, peer QP and PSNs from the
    /// request, calls `rdma_accept()`, and waits for `RDMA_CM_EVENT_ESTABLISHED`: an
    /// [`Accepting`] to [`wait`](crate::Pending::wait) for or `.await`. Nothing is done before then.
    ///
    /// # Errors
    /// When waited for: [`Error::InvalidArgument`] for more than [`MAX_ACCEPT_PRIVATE_DATA`]
    /// bytes of private data; [`Error::Timeout`]; [`Error::ConnectError`] or
    /// [`Error::Rejected`] when the peer gave up meanwhile, [`Error::PeerDisconnected`] when it
    /// left; [`Error::DeviceMismatch`], [`Error::Verbs`], [`Error::Cm`]. Each names the device.
    /// On error the identifier and the QP are destroyed (the peer is told), as on drop.
    ///
    /// # References
    /// - [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
    #[doc(alias = "rdma_accept")]
    pub fn accept<'res>(self, qp: QueuePair<'res, Rc, Init>, params: &ConnParams<'_>) -> Accepting<'res> {
        Accepting { req: self, qp, params: OwnedParams::new(params) }
    }

    /// `accept`'s first step: the QP to `ReadyToSend`, then `rdma_accept()`. The request is
    /// answered from here on: dropping what this returns only destroys the identifier.
    fn start_accept<'res>(
        self,
        qp: QueuePair<'res, Rc, Init>,
        params: &ConnParams<'_>,
    ) -> Result<(QueuePair<'res, Rc, ReadyToSend>, ConnectRequest)> {
        let on_device = |e: Error| e.on_device(&self.device);
        let ack_timeout = params.checked_ack_timeout(ACCEPT).map_err(on_device)?;
        let (qp, resp, init) = self
            .conn
            .id
            .ready_qp(qp, params.responder_resources, params.initiator_depth, ack_timeout, &self.device)
            .map_err(on_device)?;
        let mut raw = params.to_raw(ACCEPT, MAX_ACCEPT_PRIVATE_DATA, resp, init, qp.qp_num()).map_err(on_device)?;
        // SAFETY: live identifier of a connection request; `raw` and its private data live across
        // the call, which copies them.
        check(ACCEPT, unsafe { ffi::rdma_accept(self.conn.id.as_ptr(), &mut raw) }).map_err(on_device)?;
        self.conn.set_phase(DONE);
        Ok((qp, self))
    }

    /// `accept`'s last step, with what the wait for `RDMA_CM_EVENT_ESTABLISHED` gave.
    fn finish<'res>(
        self,
        qp: QueuePair<'res, Rc, ReadyToSend>,
        established: Result<crate::event::RawEvent>,
    ) -> Result<Connection<'res>> {
        let ConnectRequest { conn, params: peer_params, peer, local, device } = self;
        drop(established.map_err(|e| e.on_device(&device))?);
        conn.set_phase(CONNECTED);
        Ok(Connection::from_conn(qp, conn, peer, local, device, peer_params))
    }

    /// Rejects the request: `rdma_reject()`, sending `private_data` (at most
    /// [`MAX_REJECT_PRIVATE_DATA`] bytes) with reason "consumer defined".
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for too much private data (the request is then rejected
    /// without any); [`Error::Cm`] when the call fails. Each names the device.
    #[doc(alias = "rdma_reject")]
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        crate::params::check_private_data("rdma_reject", private_data, MAX_REJECT_PRIVATE_DATA)
            .map_err(|e| e.on_device(&self.device))?;
        let ptr = if private_data.is_empty() { std::ptr::null() } else { private_data.as_ptr().cast() };
        // SAFETY: live identifier of an unanswered request; the data lives across the call.
        let rc = unsafe { ffi::rdma_reject(self.conn.id.as_ptr(), ptr, private_data.len() as u8) };
        self.conn.set_phase(DONE);
        check("rdma_reject", rc).map_err(|e| e.on_device(&self.device))
    }
}

impl AsRawFd for ConnectRequest {
    /// The request's own event channel.
    fn as_raw_fd(&self) -> RawFd {
        self.conn.id.fd()
    }
}

/// The async front (feature `tokio`).
#[cfg(feature = "tokio")]
impl Listener {
    /// The async form of [`recv_request`](Self::recv_request): awaits the next connection
    /// request (`rdma_get_cm_event()` for `RDMA_CM_EVENT_CONNECT_REQUEST`) and moves it to an
    /// event channel of its own (`rdma_migrate_id()`). No timeout: bound it with
    /// `rdma_verbs::wait::timeout_at` (no time driver needed) or `tokio::time::timeout`.
    ///
    /// Cancellation-safe: a request is read and migrated in one synchronous step and returned at
    /// once, so dropping the future (in `tokio::select!`, or when a timeout fires) loses no
    /// request; the next call gets it. Any number of tasks (and blocking
    /// [`recv_request`](Self::recv_request) callers) may wait on one listener; each request goes
    /// to one of them.
    ///
    /// # Errors
    /// As [`recv_request`](Self::recv_request), without [`Error::Timeout`];
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    #[doc(alias = "rdma_get_cm_event")]
    #[doc(alias = "rdma_migrate_id")]
    pub async fn recv_request_async(&self) -> Result<ConnectRequest> {
        self.recv_incoming_async(conn_params).await.map(ConnectRequest::from)
    }

    /// The async form of [`recv_incoming`](Self::recv_incoming). Cancellation-safe.
    pub(crate) async fn recv_incoming_async<P>(&self, parse: fn(&RawEvent) -> P) -> Result<Incoming<P>> {
        self.id
            .wait_for_async(Deadline::never(), Duration::MAX, RECV_REQUEST, || self.request_step(parse))
            .await
            .map_err(|e| self.on_device(e))
    }
}

impl<'res> Accepting<'res> {
    /// The device the request came in on ([`ConnectRequest::device_name`]).
    pub fn device_name(&self) -> &str {
        self.req.device_name()
    }

    /// [`wait`](crate::Pending::wait), giving up as soon as `keep_waiting` says no: it is asked each
    /// time the wait for `RDMA_CM_EVENT_ESTABLISHED` wakes without it, at least every
    /// `check_every` (1 ms at the least). For a server that may take back a connection's place
    /// before it is established (the peer never completed it, and a newer request has its
    /// place). `until` is a timeout from now or a [`Deadline`].
    ///
    /// # Errors
    /// As [`ConnectRequest::accept`], and [`Error::Cancelled`] once `keep_waiting` gave
    /// `false`. On error the identifier and the QP are destroyed (the peer is told).
    pub fn wait_while(
        self,
        until: impl Into<Deadline>,
        check_every: Duration,
        keep_waiting: impl FnMut() -> bool,
    ) -> Result<Connection<'res>> {
        block_on(self.run_while(&Waiting::blocking(until.into()), check_every, keep_waiting))
    }

    /// [`wait_while`](Self::wait_while) on the current Tokio runtime (feature `tokio`): the
    /// deadline and the checks are `timerfd`s on the reactor (no tokio timer: a runtime built
    /// without its time driver works).
    ///
    /// # Errors
    /// As [`wait_while`](Self::wait_while); [`Error::NoRuntime`] outside a runtime, before
    /// any librdmacm call.
    #[cfg(feature = "tokio")]
    pub async fn wait_while_async(
        self,
        until: impl Into<Deadline>,
        check_every: Duration,
        keep_waiting: impl FnMut() -> bool,
    ) -> Result<Connection<'res>> {
        let until = until.into();
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(Error::NoRuntime { what: ACCEPT });
        }
        self.run_while(&crate::pending::Waiting::on_runtime(until), check_every, keep_waiting).await
    }

    pub(crate) async fn run(self, how: &Waiting) -> Result<Connection<'res>> {
        self.run_while(how, Duration::MAX, || true).await
    }

    /// `rdma_accept()`, then the wait for `RDMA_CM_EVENT_ESTABLISHED`, asking `keep_waiting`
    /// on each wake of a blocking wait.
    async fn run_while(
        self,
        how: &Waiting,
        check_every: Duration,
        mut keep_waiting: impl FnMut() -> bool,
    ) -> Result<Connection<'res>> {
        let Accepting { req, qp, params } = self;
        // A wait already over accepts nothing: the request is rejected (on drop) rather than
        // accepted and torn down at once.
        if how.has_passed() {
            return Err(how.timed_out(ACCEPT));
        }
        // `accepted` declared after the QP, so dropped first (a dropped future destroys the
        // identifier, then the QP, as an error does).
        let (qp, accepted) = req.start_accept(qp, &params.get())?;
        let (id, peer) = (&accepted.conn.id, accepted.peer);
        let check_every = check_every.max(Duration::from_millis(1));
        let waited = id
            .wait_as(how, check_every, ACCEPT, || match id.expect_step(EventKind::Established, ACCEPTING, peer)? {
                Some(event) => Ok(Some(event)),
                None if keep_waiting() => Ok(None),
                None => Err(Error::Cancelled { what: ACCEPT, device: None }),
            })
            .await;
        accepted.finish(qp, waited)
    }
}
