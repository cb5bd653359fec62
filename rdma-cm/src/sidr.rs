//! The passive side of service ID resolution: a UD listener and the requests it answers with
//! its QP's number.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use rdma_verbs::ffi;
use rdma_verbs::{QueuePair, ReadyToSend, Reset, Ud};

use crate::conn_id::{ConnId, DONE};
use crate::error::{check, Error, Result};
use crate::event::RawEvent;
use crate::listener::{Incoming, Listener};
use crate::params::{check_private_data, ud_conn_param, MAX_SIDR_REPLY_PRIVATE_DATA};
use crate::ud::UdId;

/// A bound identifier of the UDP port space that listens for service ID resolutions
/// ([`UdId::resolve_peer`] on the peer's side): `rdma_bind_addr` then `rdma_listen` on an
/// `RDMA_PS_UDP` identifier, with its own event channel. Destroyed on drop.
///
/// As a [`Listener`] is for connections: `&UdListener` may be shared between threads, each
/// request goes to one receiver and has its own identifier.
///
/// # References
/// - [`rdma_listen(3)`](https://man7.org/linux/man-pages/man3/rdma_listen.3.html)
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct UdListener {
    inner: Listener,
}

/// A request's private data (`param.ud`).
fn ud_private_data(ev: &RawEvent) -> Vec<u8> {
    ev.ud(true).private_data
}

impl UdListener {
    pub(crate) fn new(inner: Listener) -> Self {
        UdListener { inner }
    }

    /// Creates a UD identifier, binds it to `addr` and listens: shorthand for
    /// [`UdId::new`]`()?.`[`listen`](UdId::listen)`(addr, backlog)`.
    ///
    /// # Errors
    /// As [`Listener::bind`].
    pub fn bind(addr: SocketAddr, backlog: u16) -> Result<Self> {
        UdId::new()?.listen(addr, backlog)
    }

    /// The address listened on, with the port the CM picked if 0 was asked for.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The RDMA device the listener is bound to; `None` on a wildcard address.
    pub fn device_name(&self) -> Option<&str> {
        self.inner.device_name()
    }

    /// Waits up to `timeout` for the next request (`rdma_get_cm_event()` for
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`, with `ud` parameters), and moves its identifier to an
    /// event channel of its own (`rdma_migrate_id()`).
    ///
    /// # Errors
    /// As [`Listener::recv_request`].
    #[doc(alias = "rdma_get_cm_event")]
    pub fn recv_request(&self, timeout: Duration) -> Result<UdRequest> {
        self.inner.recv_incoming(timeout, ud_private_data).map(UdRequest::from)
    }

    /// The next request if one is queued, without waiting.
    ///
    /// # Errors
    /// As [`recv_request`](Self::recv_request), except timeouts.
    #[doc(alias = "rdma_get_cm_event")]
    pub fn try_recv_request(&self) -> Result<Option<UdRequest>> {
        Ok(self.inner.try_recv_incoming(ud_private_data)?.map(UdRequest::from))
    }

    /// The async form of [`recv_request`](Self::recv_request), without a timeout
    /// (cancellation-safe, as [`Listener::recv_request_async`]).
    ///
    /// # Errors
    /// As [`recv_request`](Self::recv_request), without [`Error::Timeout`];
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    #[cfg(feature = "tokio")]
    #[doc(alias = "rdma_get_cm_event")]
    pub async fn recv_request_async(&self) -> Result<UdRequest> {
        self.inner.recv_incoming_async(ud_private_data).await.map(UdRequest::from)
    }

    /// The raw `struct rdma_cm_id *`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.inner.as_raw()
    }
}

impl AsRawFd for UdListener {
    /// The listener's event channel (non-blocking): readable when a request is queued.
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl std::os::fd::AsFd for UdListener {
    /// The listener's event channel (non-blocking): readable when a request is queued.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// A peer's service ID resolution request (`RDMA_CM_EVENT_CONNECT_REQUEST` on a
/// [`UdListener`]), with its own identifier. Answer it with [`accept`](Self::accept), which
/// sends a UD QP's number, or [`reject`](Self::reject); dropping it unanswered rejects it.
///
/// An answer is one datagram of the CM (a SIDR REP), not a handshake: nothing waits for the
/// peer, and if the answer is lost the peer's CM asks again, which arrives as a new request.
///
/// # References
/// - [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
/// - [`rdma_reject(3)`](https://man7.org/linux/man-pages/man3/rdma_reject.3.html)
#[derive(Debug)]
#[must_use = "a request is rejected when dropped: accept or reject it"]
pub struct UdRequest {
    conn: ConnId,
    private_data: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
    device: String,
}

impl From<Incoming<Vec<u8>>> for UdRequest {
    fn from(Incoming { conn, params, peer, local, device }: Incoming<Vec<u8>>) -> Self {
        UdRequest { conn, private_data: params, peer, local, device }
    }
}

impl UdRequest {
    /// The private data the peer sent (zero-padded to
    /// [`MAX_SIDR_REQUEST_PRIVATE_DATA`](crate::MAX_SIDR_REQUEST_PRIVATE_DATA) bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
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

    /// Opens a verbs context (`ibv_open_device`) on the device the request arrived on.
    ///
    /// # Errors
    /// [`Error::Verbs`]: opening the device failed.
    #[doc(alias = "ibv_open_device")]
    pub fn open_context(&self) -> Result<rdma_verbs::Context> {
        Ok(rdma_verbs::Context::open(&self.device)?)
    }

    /// Moves a new UD queue pair to `ReadyToSend` with the port, P_Key index and Q_Key of the
    /// request's identifier, as [`UdId::init_qp`] does.
    ///
    /// # Errors
    /// As [`UdId::init_qp`].
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp<'res>(&self, qp: QueuePair<'res, Ud, Reset>) -> Result<QueuePair<'res, Ud, ReadyToSend>> {
        self.conn.id.ready_ud_qp(qp, &self.device).map_err(|e| e.on_device(&self.device))
    }

    /// Answers with `qp`'s number and `private_data` (at most
    /// [`MAX_SIDR_REPLY_PRIVATE_DATA`] bytes): `rdma_accept()`, which sends the SIDR reply with
    /// the identifier's Q_Key (the one [`init_qp`](Self::init_qp) gives). Returns at once. The
    /// QP is ready to send, as `init_qp` leaves it: the reply tells the peer it can receive.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for too much private data (the request is then rejected);
    /// [`Error::DeviceMismatch`] for a QP on another device (rejected too); [`Error::Cm`] when
    /// the call fails. Each names the device.
    ///
    /// # References
    /// - [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
    #[doc(alias = "rdma_accept")]
    pub fn accept(self, qp: &QueuePair<'_, Ud, ReadyToSend>, private_data: &[u8]) -> Result<()> {
        const ACCEPT: &str = "rdma_accept";
        let on_device = |e: Error| e.on_device(&self.device);
        crate::raw_id::RawId::check_device(qp, &self.device)?;
        let mut raw =
            ud_conn_param(ACCEPT, private_data, MAX_SIDR_REPLY_PRIVATE_DATA, qp.qp_num()).map_err(on_device)?;
        // SAFETY: live identifier of an unanswered UD request; `raw` and its data live across
        // the call, which copies them. For a UD identifier librdmacm neither modifies a QP nor
        // waits (`rdma_accept`: `ucma_is_ud_qp`).
        let rc = unsafe { ffi::rdma_accept(self.conn.id.as_ptr(), &mut raw) };
        self.conn.set_phase(DONE);
        check(ACCEPT, rc).map_err(on_device)
    }

    /// Rejects the request: `rdma_reject()`, which sends a SIDR reply with status "rejected"
    /// and `private_data` (at most [`MAX_SIDR_REPLY_PRIVATE_DATA`] bytes). The peer's
    /// [`resolve_peer`](UdId::resolve_peer) fails with [`Error::Rejected`].
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for too much private data (the request is then rejected
    /// without any); [`Error::Cm`] when the call fails. Each names the device.
    ///
    /// # References
    /// - [`rdma_reject(3)`](https://man7.org/linux/man-pages/man3/rdma_reject.3.html)
    #[doc(alias = "rdma_reject")]
    pub fn reject(self, private_data: &[u8]) -> Result<()> {
        const REJECT: &str = "rdma_reject";
        check_private_data(REJECT, private_data, MAX_SIDR_REPLY_PRIVATE_DATA).map_err(|e| e.on_device(&self.device))?;
        let ptr = if private_data.is_empty() { std::ptr::null() } else { private_data.as_ptr().cast() };
        // SAFETY: live identifier of an unanswered request; the data lives across the call.
        let rc = unsafe { ffi::rdma_reject(self.conn.id.as_ptr(), ptr, private_data.len() as u8) };
        self.conn.set_phase(DONE);
        check(REJECT, rc).map_err(|e| e.on_device(&self.device))
    }

    /// The raw `struct rdma_cm_id *` of the request; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.conn.id.as_ptr()
    }
}

impl AsRawFd for UdRequest {
    /// The request's own event channel.
    fn as_raw_fd(&self) -> RawFd {
        self.conn.id.fd()
    }
}
