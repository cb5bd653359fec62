//! An established connection: its queue pair, its identifier, and how it ends.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use rdma_verbs::ffi;
use rdma_verbs::{QueuePair, Rc, ReadyToSend};

use crate::conn_id::{ConnId, CONNECTED, DONE};
use crate::error::{Error, Result};
use crate::event::{Event, EventKind, PeerParams};
use crate::raw_id::RawId;

/// An established RC connection: an `rdma-verbs` queue pair in `ReadyToSend` on the caller's PD
/// and CQs, and the identifier that set it up.
///
/// Post work with [`qp`](Self::qp) (e.g. [`QueuePair::scope`]). End it with
/// [`disconnect`](Self::disconnect) (this side leaves) or
/// [`wait_disconnected`](Self::wait_disconnected) (the peer leaves); both return a
/// [`ClosedConnection`]. Dropping it disconnects (`rdma_disconnect`), then destroys the
/// identifier and its channel, then the queue pair.
///
/// # References
/// - [`rdma_disconnect(3)`](https://man7.org/linux/man-pages/man3/rdma_disconnect.3.html)
#[derive(Debug)]
pub struct Connection<'res> {
    // Declared first: dropped (disconnect, destroy) before the QP.
    conn: ConnId,
    qp: QueuePair<'res, Rc, ReadyToSend>,
    peer: SocketAddr,
    local: SocketAddr,
    device: String,
    params: PeerParams,
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
        Connection { conn, qp, peer, local, device, params }
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

    /// True once the peer's disconnect has been seen (by [`recv_event`](Self::recv_event) or
    /// [`try_recv_event`](Self::try_recv_event)).
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

    /// Waits up to `timeout` for the connection's next event (`rdma_get_cm_event()`; usually
    /// [`Event::Disconnected`]).
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::Cm`] when reading fails. Each names the device.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn recv_event(&self, timeout: Duration) -> Result<Event> {
        let ev = self.conn.id.wait(timeout, "waiting for a connection event").map_err(|e| self.on_device(e))?;
        Ok(self.note(ev.to_event()))
    }

    /// Returns the next event if one is queued, without waiting (`rdma_get_cm_event()` on the
    /// non-blocking channel).
    ///
    /// # Errors
    /// [`Error::Cm`] when reading fails; it names the device.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_recv_event(&self) -> Result<Option<Event>> {
        Ok(self.conn.id.try_event().map_err(|e| self.on_device(e))?.map(|ev| self.note(ev.to_event())))
    }

    fn on_device(&self, e: Error) -> Error {
        e.on_device(&self.device)
    }

    /// Disconnects: moves the QP to the error state (flushing outstanding requests), calls
    /// `rdma_disconnect()`, and waits up to `timeout` for `RDMA_CM_EVENT_DISCONNECTED` (the
    /// peer's reply, or the CM giving up on it).
    ///
    /// # Which side disconnects
    /// A receive completion here does not mean the peer's send has completed: the ACK may not
    /// have left yet (rxe posts the receive completion first, then sends the ACK), and once the
    /// QP is in the error state the ACK is dropped, so the peer's send retries and fails. The side
    /// that sends the last message should disconnect, after that send's completion; a peer that
    /// disconnects right after a receive must be one whose last send may fail.
    ///
    /// # Errors
    /// [`Error::Timeout`]; [`Error::UnexpectedEvent`]; [`Error::Cm`]; [`Error::Verbs`] when the
    /// QP cannot be flushed. Each names the device. The identifier is destroyed either way.
    ///
    /// # References
    /// [`rdma_disconnect(3)`](https://man7.org/linux/man-pages/man3/rdma_disconnect.3.html)
    #[doc(alias = "rdma_disconnect")]
    pub fn disconnect(self, timeout: Duration) -> Result<ClosedConnection<'res>> {
        let Connection { conn, qp, peer, device, .. } = self;
        let on_device = |e: Error| e.on_device(&device);
        qp.flush()?;
        if conn.phase() == DONE {
            return Ok(ClosedConnection { qp, peer });
        }
        // SAFETY: live, connected identifier.
        let rc = unsafe { ffi::rdma_disconnect(conn.id.as_ptr()) };
        conn.set_phase(DONE);
        crate::error::check("rdma_disconnect", rc).map_err(on_device)?;
        conn.id
            .expect(EventKind::Disconnected, timeout, "rdma_disconnect", "disconnecting", peer)
            .map_err(on_device)?;
        Ok(ClosedConnection { qp, peer })
    }

    /// Waits up to `timeout` for the peer to disconnect (`RDMA_CM_EVENT_DISCONNECTED`), then
    /// completes the disconnect on this side (`rdma_disconnect()`, flushing the QP).
    ///
    /// # Errors
    /// [`Error::Timeout`] when the peer stays; [`Error::UnexpectedEvent`]; [`Error::Verbs`]
    /// when the QP cannot be flushed. Each names the device.
    #[doc(alias = "rdma_disconnect")]
    pub fn wait_disconnected(self, timeout: Duration) -> Result<ClosedConnection<'res>> {
        if self.conn.phase() != DONE {
            let ev = self
                .conn
                .id
                .expect(EventKind::Disconnected, timeout, "waiting for the peer to disconnect", "connected", self.peer)
                .map_err(|e| self.on_device(e))?;
            self.note(ev.to_event());
        }
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

/// A connection that has ended, as [`Connection::disconnect`] and
/// [`Connection::wait_disconnected`] return it. Its identifier is destroyed (`rdma_destroy_id`);
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
