//! An established connection: its queue pair, its identifier, and how it ends.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use rdma_verbs::ffi;
use rdma_verbs::{Deadline, QueuePair, Rc, ReadyToSend};

use parking_lot::Mutex;

use crate::conn_id::{ConnId, CONNECTED, DONE};
use crate::error::{Error, Result};
use crate::event::{Event, EventKind, PeerParams};
use crate::pending::{Disconnecting, PeerDisconnect, Waiting};
use crate::raw_id::RawId;

/// What waits and errors on a connection name.
const RECV_EVENT: &str = "waiting for a connection event";
const WAIT_DISCONNECTED: &str = "waiting for the peer to disconnect";
const CONNECTED_STATE: &str = "connected";
const DISCONNECT: &str = "rdma_disconnect";
const DISCONNECTING: &str = "disconnecting";

/// Where a disconnect stands after its first step.
enum Leave<'res> {
    /// The peer had left already: nothing to wait for.
    Closed(ClosedConnection<'res>),
    /// `rdma_disconnect()` was called: the peer's reply is awaited.
    Waiting(Leaving<'res>),
}

/// A connection that called `rdma_disconnect()` and waits for the peer's reply.
struct Leaving<'res> {
    // Declared first: dropped (destroyed) before the QP.
    conn: ConnId,
    qp: QueuePair<'res, Rc, ReadyToSend>,
    peer: SocketAddr,
    device: String,
}

impl<'res> Leaving<'res> {
    /// With what the wait for `RDMA_CM_EVENT_DISCONNECTED` gave: the closed connection (the
    /// identifier is destroyed either way).
    fn finish(self, replied: Result<crate::event::RawEvent>) -> Result<ClosedConnection<'res>> {
        let Leaving { conn, qp, peer, device } = self;
        drop(replied.map_err(|e| e.on_device(&device))?);
        drop(conn);
        Ok(ClosedConnection { qp, peer })
    }
}

/// An established RC connection: an `rdma-verbs` queue pair in `ReadyToSend` on the caller's PD
/// and CQs, and the identifier that set it up.
///
/// Post work with [`qp`](Self::qp) (e.g. [`QueuePair::scope`]). End it with
/// [`disconnect`](Self::disconnect) (this side leaves) or
/// [`peer_disconnect`](Self::peer_disconnect) (the peer leaves); both end in a
/// [`ClosedConnection`]. Dropping it disconnects (`rdma_disconnect`), then destroys the
/// identifier and its channel, then the queue pair.
///
/// # References
/// - [`rdma_disconnect(3)`](https://man7.org/linux/man-pages/man3/rdma_disconnect.3.html)
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct Connection<'res> {
    // Declared first: dropped (disconnect, destroy) before the QP.
    conn: ConnId,
    qp: QueuePair<'res, Rc, ReadyToSend>,
    peer: SocketAddr,
    local: SocketAddr,
    device: String,
    params: PeerParams,
    /// Held while an event is read and noted ([`note`](Self::note)), so that a reader that finds
    /// the channel empty and the peer not gone cannot have missed a disconnect another reader
    /// was taking (see [`disconnected_step`](Self::disconnected_step)).
    reading: Mutex<()>,
}

impl<'res> Connection<'res> {
    pub(crate) fn new(
        qp: QueuePair<'res, Rc, ReadyToSend>,
        id: RawId,
        peer: SocketAddr,
        local: SocketAddr,
        device: String,
        params: PeerParams,
    ) -> Self {
        Self::from_conn(qp, ConnId::new(id, CONNECTED), peer, local, device, params)
    }

    pub(crate) fn from_conn(
        qp: QueuePair<'res, Rc, ReadyToSend>,
        conn: ConnId,
        peer: SocketAddr,
        local: SocketAddr,
        device: String,
        params: PeerParams,
    ) -> Self {
        Connection { conn, qp, peer, local, device, params, reading: Mutex::new(()) }
    }

    /// The connection's queue pair, for posting work.
    pub fn qp(&self) -> &QueuePair<'res, Rc, ReadyToSend> {
        &self.qp
    }

    /// The private data the peer sent: with its acceptance (active side) or its request
    /// (passive side); zero-padded to the CM message's fixed size.
    pub fn private_data(&self) -> &[u8] {
        &self.params.private_data
    }

    /// Everything the peer sent with its acceptance or request.
    pub fn peer_params(&self) -> &PeerParams {
        &self.params
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The RDMA device the connection runs on.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// True once the peer's disconnect has been seen (by [`recv_event`](Self::recv_event),
    /// [`try_recv_event`](Self::try_recv_event), or their async forms).
    pub fn peer_disconnected(&self) -> bool {
        self.conn.phase() == DONE
    }

    fn note(&self, event: Event) -> Event {
        if event.kind() == EventKind::Disconnected {
            // The peer left: answer its DREQ now, so it does not wait for a timeout.
            // SAFETY: live identifier.
            unsafe { ffi::rdma_disconnect(self.conn.id.as_ptr()) };
            self.conn.set_phase(DONE);
        }
        event
    }

    /// The step every read of the connection's events takes: the next event, noted, or `None`
    /// once the channel is empty.
    fn event_step(&self) -> Result<Option<Event>> {
        let _reading = self.reading.lock();
        self.take_event()
    }

    /// The next event, noted; the caller holds the read lock.
    fn take_event(&self) -> Result<Option<Event>> {
        Ok(self.conn.id.try_event()?.map(|ev| self.note(ev.to_event())))
    }

    /// The step of waiting for the peer to leave: `Some` at once if its disconnect was seen
    /// (by any reader), else the next event, which must be `RDMA_CM_EVENT_DISCONNECTED`
    /// (benign events skipped); `None` once the channel is empty.
    fn disconnected_step(&self) -> Result<Option<()>> {
        let _reading = self.reading.lock();
        if self.peer_disconnected() {
            return Ok(Some(()));
        }
        let ev = self.conn.id.expect_step(EventKind::Disconnected, CONNECTED_STATE, self.peer)?;
        Ok(ev.map(|ev| drop(self.note(ev.to_event()))))
    }

    /// Waits up to `timeout` for the connection's next event (`rdma_get_cm_event()`; usually
    /// [`Event::Disconnected`]).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Cm`] when reading fails. Each names the device.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn recv_event(&self, timeout: Duration) -> Result<Event> {
        self.conn.id.wait_for(Deadline::after(timeout), RECV_EVENT, || self.event_step()).map_err(|e| self.on_device(e))
    }

    /// Returns the next event if one is queued, without waiting (`rdma_get_cm_event()` on the
    /// non-blocking channel).
    ///
    /// # Errors
    /// [`Error::Cm`] when reading fails; it names the device.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_recv_event(&self) -> Result<Option<Event>> {
        self.event_step().map_err(|e| self.on_device(e))
    }

    fn on_device(&self, e: Error) -> Error {
        e.on_device(&self.device)
    }

    /// Disconnects: moves the QP to the error state (flushing outstanding requests), calls
    /// `rdma_disconnect()`, and waits for `RDMA_CM_EVENT_DISCONNECTED` (the peer's reply, or the
    /// CM giving up on it): a [`Disconnecting`] to [`wait`](crate::Pending::wait) for or `.await`.
    /// Nothing is done before then; dropping it disconnects without waiting, as dropping the
    /// connection does.
    ///
    /// # Which side disconnects
    /// A receive completion here does not mean the peer's send has completed: the ACK may not
    /// have left yet (rxe posts the receive completion first, then sends the ACK), and once the
    /// QP is in the error state the ACK is dropped, so the peer's send retries and fails. The side
    /// that sends the last message should disconnect, after that send's completion; a peer that
    /// disconnects right after a receive must be one whose last send may fail.
    ///
    /// # Errors
    /// When waited for: [`Error::Timeout`]; [`Error::UnexpectedEvent`]; [`Error::Cm`];
    /// [`Error::Verbs`] when the QP cannot be flushed. Each names the device. The identifier is
    /// destroyed either way.
    ///
    /// # References
    /// [`rdma_disconnect(3)`](https://man7.org/linux/man-pages/man3/rdma_disconnect.3.html)
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(self) -> Disconnecting<'res> {
        Disconnecting { conn: self }
    }

    /// `disconnect`'s first step: flushes the QP and, unless the peer has left already, calls
    /// `rdma_disconnect()`.
    fn start_disconnect(self) -> Result<Leave<'res>> {
        let Connection { conn, qp, peer, device, .. } = self;
        qp.flush()?;
        if conn.phase() == DONE {
            return Ok(Leave::Closed(ClosedConnection { qp, peer }));
        }
        // SAFETY: live, connected identifier.
        let rc = unsafe { ffi::rdma_disconnect(conn.id.as_ptr()) };
        conn.set_phase(DONE);
        crate::error::check(DISCONNECT, rc).map_err(|e| e.on_device(&device))?;
        Ok(Leave::Waiting(Leaving { conn, qp, peer, device }))
    }

    /// Waits for the peer to disconnect (`RDMA_CM_EVENT_DISCONNECTED`), then completes the
    /// disconnect on this side (`rdma_disconnect()`, flushing the QP): a [`PeerDisconnect`] to
    /// [`wait`](crate::Pending::wait) for or `.await`.
    ///
    /// # Errors
    /// When waited for: [`Error::Timeout`] when the peer stays; [`Error::UnexpectedEvent`];
    /// [`Error::Verbs`] when the QP cannot be flushed. Each names the device.
    #[doc(alias = "rdma_disconnect")]
    pub fn peer_disconnect(self) -> PeerDisconnect<'res> {
        PeerDisconnect { conn: self }
    }

    /// After the peer's disconnect: the QP flushed, the identifier destroyed.
    fn into_closed(self) -> Result<ClosedConnection<'res>> {
        let Connection { qp, peer, .. } = self;
        qp.flush()?;
        Ok(ClosedConnection { qp, peer })
    }

    /// The raw `struct rdma_cm_id *`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.conn.id.as_ptr()
    }
}

impl AsRawFd for Connection<'_> {
    /// The connection's own event channel (non-blocking).
    fn as_raw_fd(&self) -> RawFd {
        self.conn.id.fd()
    }
}

impl std::os::fd::AsFd for Connection<'_> {
    /// The connection's own event channel (non-blocking): readable when an event (the peer's
    /// disconnect, say) is queued, for a `poll(2)` or reactor wait of one's own that also
    /// waits for other things. Read the events with [`try_recv_event`](Self::try_recv_event).
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.conn.id.as_fd()
    }
}

/// A connection that has ended, what [`Connection::disconnect`] and
/// [`Connection::peer_disconnect`] end in. Its identifier is destroyed (`rdma_destroy_id`);
/// the queue pair, now in the error state, is kept so that flushed completions can still be
/// polled from its CQs.
///
/// (Not to be confused with [`Event::Disconnected`], the `RDMA_CM_EVENT_DISCONNECTED` event, nor
/// with [`Error::PeerDisconnected`], the peer leaving while an answer was awaited.)
#[derive(Debug)]
pub struct ClosedConnection<'res> {
    qp: QueuePair<'res, Rc, ReadyToSend>,
    peer: SocketAddr,
}

impl<'res> ClosedConnection<'res> {
    /// The queue pair (in the error state: anything posted completes with a flush error).
    pub fn qp(&self) -> &QueuePair<'res, Rc, ReadyToSend> {
        &self.qp
    }

    /// Takes the queue pair out.
    pub fn into_qp(self) -> QueuePair<'res, Rc, ReadyToSend> {
        self.qp
    }

    /// Who the connection was with.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
}

/// The async front (feature `tokio`): awaiting a connection's events on the runtime.
///
/// Several tasks (and blocking callers) may wait on one connection's events at once: each
/// event goes to one of them, and whichever takes the peer's disconnect records it, so
/// [`disconnected_async`](Connection::disconnected_async), [`Events`] and
/// [`peer_disconnected`](Connection::peer_disconnected) see it whoever took it.
#[cfg(feature = "tokio")]
impl<'res> Connection<'res> {
    /// The async form of [`recv_event`](Self::recv_event): awaits the connection's next event
    /// (`rdma_get_cm_event()`; usually [`Event::Disconnected`], which is answered with
    /// `rdma_disconnect()` and recorded as [`try_recv_event`](Self::try_recv_event) does). No
    /// timeout: bound it with `rdma_verbs::wait::timeout_at` (no time driver needed) or `tokio::time::timeout`.
    ///
    /// Cancellation-safe: an event is read and returned in one synchronous step, so dropping
    /// the future loses none.
    ///
    /// # Errors
    /// [`Error::Cm`] when reading fails; [`Error::NoRuntime`] outside a Tokio runtime. Each
    /// names the device.
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn recv_event_async(&self) -> Result<Event> {
        self.conn
            .id
            .wait_for_async(Deadline::never(), Duration::MAX, RECV_EVENT, || self.event_step())
            .await
            .map_err(|e| self.on_device(e))
    }

    /// [`Events::next`]'s step: `Some(None)` once the peer's disconnect was seen (checked under
    /// the read lock, as [`disconnected_step`](Self::disconnected_step) does), else the next
    /// event, or `None` once the channel is empty.
    fn events_step(&self) -> Result<Option<Option<Event>>> {
        let _reading = self.reading.lock();
        if self.peer_disconnected() {
            return Ok(Some(None));
        }
        Ok(self.take_event()?.map(Some))
    }

    /// The connection's events, for a loop or a `tokio::select!` arm (see [`Events`]).
    pub fn events(&self) -> Events<'_, 'res> {
        Events { conn: self }
    }

    /// Resolves once the peer has disconnected: at once if its disconnect was already seen (by
    /// any reader), else when `RDMA_CM_EVENT_DISCONNECTED` comes (answered with
    /// `rdma_disconnect()`). The connection stays usable meanwhile (`&self`), which makes this
    /// the arm of a `tokio::select!` that ends a loop of work when the peer leaves:
    ///
    /// ```no_run
    /// # async fn serve(conn: &rdma_cm::Connection<'_>) -> rdma_cm::Result<()> {
    /// let mut ticks = tokio::time::interval(std::time::Duration::from_millis(100));
    /// loop {
    ///     tokio::select! {
    ///         gone = conn.disconnected_async() => return gone,
    ///         _ = ticks.tick() => { /* post work, poll completions... */ }
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// No timeout: bound it with `rdma_verbs::wait::timeout_at` (no time driver needed) or `tokio::time::timeout`. Cancellation-safe: dropping the
    /// future loses no event (a disconnect it read is recorded before it returns).
    ///
    /// # Errors
    /// [`Error::UnexpectedEvent`] for another event (benign ones are skipped), which is then
    /// consumed; [`Error::DeviceRemoved`]; [`Error::Cm`]; [`Error::NoRuntime`] outside a Tokio
    /// runtime. Each names the device.
    #[doc(alias = "rdma_disconnect")]
    pub async fn disconnected_async(&self) -> Result<()> {
        self.conn
            .id
            .wait_for_async(Deadline::never(), Duration::MAX, WAIT_DISCONNECTED, || self.disconnected_step())
            .await
            .map_err(|e| self.on_device(e))
    }
}

impl<'res> Disconnecting<'res> {
    /// Flushes the QP, `rdma_disconnect()`, then the wait for the peer's answer.
    pub(crate) async fn run(self, how: &Waiting) -> Result<ClosedConnection<'res>> {
        match self.conn.start_disconnect()? {
            Leave::Closed(closed) => Ok(closed),
            Leave::Waiting(leaving) => {
                let (id, peer) = (&leaving.conn.id, leaving.peer);
                let waited = id.expect_as(how, EventKind::Disconnected, DISCONNECT, DISCONNECTING, peer).await;
                leaving.finish(waited)
            }
        }
    }
}

impl<'res> PeerDisconnect<'res> {
    /// The wait for the peer's disconnect, then this side closed.
    pub(crate) async fn run(self, how: &Waiting) -> Result<ClosedConnection<'res>> {
        let conn = self.conn;
        let step = || conn.disconnected_step();
        conn.conn.id.wait_as(how, Duration::MAX, WAIT_DISCONNECTED, step).await.map_err(|e| conn.on_device(e))?;
        conn.into_closed()
    }
}

/// A connection's events, one [`next`](Events::next) at a time: what
/// [`Connection::events`] returns (feature `tokio`).
///
/// `next` is cancellation-safe, so it can be an arm of `tokio::select!` in a loop, beside the
/// data path: an event is read and returned in one synchronous step, and a future dropped
/// because another arm won loses nothing. The events end (`None`) once the peer's disconnect
/// has been seen, by this stream (which yields [`Event::Disconnected`] first) or by any other
/// reader of the connection.
///
/// ```no_run
/// # async fn watch(conn: &rdma_cm::Connection<'_>) -> rdma_cm::Result<()> {
/// let mut events = conn.events();
/// let mut ticks = tokio::time::interval(std::time::Duration::from_millis(100));
/// loop {
///     tokio::select! {
///         ev = events.next() => match ev {
///             Some(ev) => println!("{:?}", ev?),
///             None => break, // the peer left
///         },
///         _ = ticks.tick() => { /* post work on conn.qp(), poll its completions... */ }
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[cfg(feature = "tokio")]
#[derive(Debug)]
pub struct Events<'c, 'res> {
    conn: &'c Connection<'res>,
}

#[cfg(feature = "tokio")]
impl Events<'_, '_> {
    /// The connection's next event, `None` once the peer's disconnect has been seen. No
    /// timeout: bound it with `rdma_verbs::wait::timeout_at` (no time driver needed) or `tokio::time::timeout`. Cancellation-safe.
    ///
    /// # Errors
    /// `Some(Err(_))` as [`Connection::recv_event_async`] fails; the events go on after one.
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn next(&mut self) -> Option<Result<Event>> {
        let conn = self.conn;
        conn.conn
            .id
            .wait_for_async(Deadline::never(), Duration::MAX, RECV_EVENT, || conn.events_step())
            .await
            .map_err(|e| conn.on_device(e))
            .transpose()
    }
}
