//! Unreliable datagrams through the CM: identifiers in the UDP port space (`RDMA_PS_UDP`), the
//! UD queue pairs they ready, and service ID resolution (SIDR), which gives the address, QP
//! number and Q_Key of a peer's UD QP.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};

use rdma_verbs::ffi;
use rdma_verbs::{AddressHandle, ProtectionDomain, QueuePair, ReadyToSend, Reset, Ud};

use crate::error::{check, Error, RejectReason, Result};
use crate::event::{EventKind, RawEvent, UdParams};
use crate::id::{AddressResolved, Bound, CmId, IdState, Idle, RouteResolved};
use crate::params::{ud_conn_param, MAX_SIDR_REQUEST_PRIVATE_DATA};
use crate::pending::{Joining, ResolvingAddress, ResolvingPeer, ResolvingRoute, UdResolving, Waiting};
use crate::raw_id::{PortSpace, RawId};
use crate::sidr::UdListener;

/// A connection-manager identifier in the UDP port space (`rdma_create_id` with
/// `RDMA_PS_UDP`), in state `S`, with its own event channel. Destroyed (`rdma_destroy_id`, then
/// the channel) on drop.
///
/// ```text
/// UdId<Idle> --resolve_addr--> UdId<AddressResolved> --resolve_route--> UdId<RouteResolved>
///     |                              | join(group, qp)                       | resolve_peer
///     +--listen--> UdListener        v                                       v
///                                Membership (leaves on drop)              UdPeer
/// ```
///
/// Its QPs are UD queue pairs: [`init_qp`](Self::init_qp) moves one to `ReadyToSend` with the
/// port, P_Key and Q_Key the CM gives (what `rdma_create_qp` does in C). A datagram needs the
/// peer's address handle, QP number and Q_Key: [`resolve_peer`](UdId::resolve_peer) asks the
/// peer's CM for them (service ID resolution, answered by a [`UdListener`]), and
/// [`join`](UdId::join) gives a multicast group's.
///
/// # References
/// - [`rdma_create_id(3)`](https://man7.org/linux/man-pages/man3/rdma_create_id.3.html) (`RDMA_PS_UDP`)
/// - [`rdma_cm(7)`](https://man7.org/linux/man-pages/man7/rdma_cm.7.html), "UD QP"
#[doc(alias = "RDMA_PS_UDP")]
#[must_use = "dropping it at once releases what was just made"]
pub struct UdId<S: IdState> {
    pub(crate) inner: CmId<S>,
}

impl<S: IdState> std::fmt::Debug for UdId<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("UdId").field(&self.inner).finish()
    }
}

impl<S: IdState> UdId<S> {
    pub(crate) fn from_cm(inner: CmId<S>) -> Self {
        UdId { inner }
    }

    pub(crate) fn raw_id(&self) -> &RawId {
        &self.inner.id
    }

    /// The raw `struct rdma_cm_id *`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.inner.as_raw()
    }
}

impl<S: IdState> AsRawFd for UdId<S> {
    /// The identifier's own event channel (non-blocking).
    fn as_raw_fd(&self) -> RawFd {
        self.inner.as_raw_fd()
    }
}

impl UdId<Idle> {
    /// Creates an identifier in the UDP port space (`RDMA_PS_UDP`), with an event channel of its
    /// own: `rdma_create_event_channel()` then `rdma_create_id()`.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without RDMA (no `/dev/infiniband/rdma_cm`: the message says what to
    /// load); [`Error::Cm`] when the channel or identifier cannot be created otherwise.
    ///
    /// # References
    /// - [`rdma_create_id(3)`](https://man7.org/linux/man-pages/man3/rdma_create_id.3.html)
    #[doc(alias = "rdma_create_id")]
    pub fn new() -> Result<Self> {
        Ok(UdId { inner: CmId::new_in(PortSpace::Udp)? })
    }

    /// Resolves `dst` to a local RDMA device and port, leaving from `src` if given, as
    /// [`CmId::resolve_addr`] does: a pending value to `.wait(timeout)` for or `.await`.
    ///
    /// `dst` may be a multicast group (leave from `src`, the address of the port that joins),
    /// for [`join`](UdId::join).
    ///
    /// # Errors
    /// As [`CmId::resolve_addr`].
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(self, src: Option<SocketAddr>, dst: SocketAddr) -> UdResolving<ResolvingAddress> {
        UdResolving(self.inner.resolve_addr(src, dst))
    }

    /// [`resolve_addr`](Self::resolve_addr) then [`resolve_route`](UdId::resolve_route), both
    /// within one wait, as [`CmId::resolve`] does.
    ///
    /// # Errors
    /// As [`CmId::resolve`].
    pub fn resolve(self, src: Option<SocketAddr>, dst: SocketAddr) -> UdResolving<crate::Resolving> {
        UdResolving(self.inner.resolve(src, dst))
    }

    /// Binds to `addr` and listens for service ID resolutions (`rdma_bind_addr()` then
    /// `rdma_listen()`), as [`CmId::listen`] does.
    ///
    /// # Errors
    /// As [`CmId::listen`].
    #[doc(alias = "rdma_bind_addr")]
    #[doc(alias = "rdma_listen")]
    pub fn listen(self, addr: SocketAddr, backlog: u16) -> Result<UdListener> {
        Ok(UdListener::new(self.inner.listen(addr, backlog)?))
    }
}

impl UdId<AddressResolved> {
    /// Resolves the route to the destination (`rdma_resolve_route()`), as
    /// [`CmId::resolve_route`] does.
    ///
    /// # Errors
    /// As [`CmId::resolve_route`].
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(self) -> UdResolving<ResolvingRoute> {
        UdResolving(self.inner.resolve_route())
    }

    /// Joins the multicast group `group` and attaches `qp` to it: `rdma_join_multicast()`,
    /// the wait for `RDMA_CM_EVENT_MULTICAST_JOIN`, then `ibv_attach_mcast()` with the group's
    /// GID and LID from the event. A [`Joining`] to `.wait(timeout)` for or `.await`; nothing is
    /// done before then. The [`Membership`](crate::Membership) it gives leaves the group when
    /// dropped, and has the group's address vector and Q_Key for sends to it.
    ///
    /// The kernel's CM joins only from an identifier whose address is resolved (or bound), not
    /// one whose route is: hence this state. Resolve the group itself from the local port's
    /// address, `resolve_addr(Some(local), group)`, as rdma-core's `mckey` does.
    ///
    /// One group at a time per identifier (the membership borrows it exclusively): join more
    /// groups through more identifiers. `qp` must be a UD QP on the identifier's device whose
    /// Q_Key is the group's (a QP readied by [`init_qp`](UdId::init_qp) has it), or datagrams to
    /// the group are dropped at it.
    ///
    /// # Errors
    /// When waited for: [`Error::DeviceMismatch`] for a QP on another device;
    /// [`Error::Unsupported`] when the kernel refuses the join as unsupported: an IPv6 group on a
    /// RoCE v2 port (`ENOTSUPP`, tested on rxe); [`Error::Multicast`] when the call, the CM's
    /// answer or the attach fails otherwise; [`Error::Timeout`]. Each names the device. On error
    /// nothing stays joined.
    ///
    /// # References
    /// - [`rdma_join_multicast(3)`](https://man7.org/linux/man-pages/man3/rdma_join_multicast.3.html)
    /// - [`ibv_attach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
    #[doc(alias = "rdma_join_multicast")]
    #[doc(alias = "ibv_attach_mcast")]
    pub fn join<'a>(&'a mut self, group: SocketAddr, qp: &'a QueuePair<'a, Ud, ReadyToSend>) -> Joining<'a> {
        Joining { id: self, qp, group }
    }
}

impl<S: Bound> UdId<S> {
    /// The name of the RDMA device the address resolved to (e.g. `"rxe0"`).
    pub fn device_name(&self) -> &str {
        self.inner.device_name()
    }

    /// The device port the address resolved to.
    pub fn port(&self) -> u8 {
        self.inner.port()
    }

    /// The local address (with the source port the CM picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The destination.
    pub fn peer_addr(&self) -> SocketAddr {
        self.inner.peer_addr()
    }

    /// Opens a verbs context (`ibv_open_device`) on the device the address resolved to, as
    /// [`CmId::open_context`] does.
    ///
    /// # Errors
    /// [`Error::Verbs`]: opening the device failed.
    #[doc(alias = "ibv_open_device")]
    pub fn open_context(&self) -> Result<rdma_verbs::Context> {
        self.inner.open_context()
    }

    /// Moves a new UD queue pair to `ReadyToSend` for this identifier: `Init` with the port,
    /// P_Key index and Q_Key the CM gives (`rdma_init_qp_attr()`, then `ibv_modify_qp()`), then
    /// `ReadyToReceive` and `ReadyToSend` (send PSN 0), which need nothing more. The Q_Key is
    /// the UDP port space's, `RDMA_UDP_QKEY` (`0x01234567`): what a peer's resolution and a
    /// multicast group answer with.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when the QP's context is on another device than
    /// [`device_name`](Self::device_name); [`Error::Cm`] from `rdma_init_qp_attr`;
    /// [`Error::Verbs`] when a transition fails (the QP is destroyed). Each names the device.
    ///
    /// # References
    /// - [`rdma_init_qp_attr(3)`](https://man7.org/linux/man-pages/man3/rdma_init_qp_attr.3.html)
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp<'res>(&self, qp: QueuePair<'res, Ud, Reset>) -> Result<QueuePair<'res, Ud, ReadyToSend>> {
        let device = self.device_name();
        self.raw_id().ready_ud_qp(qp, device).map_err(|e| e.on_device(device))
    }
}

/// The call and the state a resolution of the peer names in its errors.
const RESOLVE_PEER: &str = "rdma_connect";
const RESOLVING_PEER: &str = "resolving the peer's QP (SIDR)";

impl UdId<RouteResolved> {
    /// Asks the peer's CM for its UD QP (service ID resolution, SIDR): `rdma_connect()` on the
    /// UD identifier, sending `private_data` (at most [`MAX_SIDR_REQUEST_PRIVATE_DATA`] bytes),
    /// then the wait for `RDMA_CM_EVENT_ESTABLISHED`, whose `ud` parameters are the peer's QP
    /// number, Q_Key and the address vector to it. A [`ResolvingPeer`] to `.wait(timeout)` for
    /// or `.await`; nothing is sent before then. The identifier is destroyed once it answered:
    /// the [`UdPeer`] it gives is plain values.
    ///
    /// # Errors
    /// When waited for:
    /// - [`Error::NoListener`]: the peer's CM answered that nothing listens on the port (SIDR
    ///   status 1, `IB_SIDR_UNSUPPORTED`).
    /// - [`Error::Rejected`] with [`RejectReason::ConsumerDefined`]: the peer rejected
    ///   ([`UdRequest::reject`](crate::UdRequest::reject), or dropped the request), with its
    ///   private data (SIDR status 2, `IB_SIDR_REJECT`); [`RejectReason::NoResources`] for
    ///   status 3 (`IB_SIDR_NO_QP`); [`RejectReason::Other`] with the status for the others.
    /// - [`Error::Unreachable`] (`ETIMEDOUT`): the peer's CM never answered.
    /// - [`Error::Timeout`]: no answer within the wait's `timeout`.
    /// - [`Error::InvalidArgument`]: too much private data.
    ///
    /// Each names the device.
    ///
    /// # References
    /// - [`rdma_connect(3)`](https://man7.org/linux/man-pages/man3/rdma_connect.3.html), "UD"
    #[doc(alias = "rdma_connect")]
    #[doc(alias = "SIDR")]
    pub fn resolve_peer(self, private_data: &[u8]) -> ResolvingPeer {
        ResolvingPeer { id: self, private_data: private_data.to_vec() }
    }

    /// `rdma_connect()` with `private_data`: the SIDR request.
    fn start_resolve_peer(&self, private_data: &[u8]) -> Result<()> {
        let mut raw = ud_conn_param(RESOLVE_PEER, private_data, MAX_SIDR_REQUEST_PRIVATE_DATA, 0)?;
        // SAFETY: live identifier with a resolved route; `raw` and the data it points to live
        // across the call, which copies them.
        check(RESOLVE_PEER, unsafe { ffi::rdma_connect(self.as_raw(), &mut raw) })
    }
}

/// What a resolution's `UNREACHABLE` means: the kernel reports the SIDR reply's non-zero
/// status as the event's (positive) status (`cma_sidr_rep_handler`), and a request that was
/// never answered as `-ETIMEDOUT` (left to [`failure`](crate::raw_id::failure)).
fn sidr_refusal(ev: &RawEvent, addr: SocketAddr) -> Option<Error> {
    if ev.kind() != EventKind::Unreachable || ev.status() <= 0 {
        return None;
    }
    let device = None;
    let private_data = ev.ud(true).private_data;
    Some(match ev.status() {
        1 => Error::NoListener { addr, device },
        2 => Error::Rejected { addr, device, reason: RejectReason::ConsumerDefined, private_data },
        3 => Error::Rejected { addr, device, reason: RejectReason::NoResources, private_data },
        status => Error::Rejected { addr, device, reason: RejectReason::Other(status), private_data },
    })
}

impl ResolvingPeer {
    /// `rdma_connect()`, then the wait for the peer's answer.
    pub(crate) async fn run(self, how: &Waiting) -> Result<UdPeer> {
        let ResolvingPeer { id, private_data } = self;
        let (peer, device) = (id.peer_addr(), id.device_name().to_owned());
        let on_device = |e: Error| e.on_device(&device);
        if how.has_passed() {
            return Err(how.timed_out(RESOLVE_PEER).on_device(&device));
        }
        id.start_resolve_peer(&private_data).map_err(on_device)?;
        let ev = id
            .raw_id()
            .expect_as_or(how, EventKind::Established, (RESOLVE_PEER, RESOLVING_PEER), peer, |ev| {
                sidr_refusal(ev, peer)
            })
            .await
            .map_err(on_device)?;
        let params = ev.ud(true);
        Ok(UdPeer { params, peer, device })
    }
}

/// A peer's UD QP, as its CM answered a service ID resolution ([`UdId::resolve_peer`]): where to
/// send datagrams ([`create_ah`](Self::create_ah)), to which QP number and with which Q_Key.
///
/// Plain values (the identifier that asked is gone): a peer's QP number and Q_Key are only
/// numbers its CM sent, and a datagram to a wrong one is dropped by the network, not by this
/// process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdPeer {
    params: UdParams,
    peer: SocketAddr,
    device: String,
}

impl UdPeer {
    /// Everything the answer carried.
    pub fn params(&self) -> &UdParams {
        &self.params
    }

    /// The peer's QP number (the `remote_qpn` of the sends).
    pub fn qp_num(&self) -> u32 {
        self.params.qp_num
    }

    /// The Q_Key the peer's QP takes (the `remote_qkey` of the sends).
    pub fn qkey(&self) -> u32 {
        self.params.qkey
    }

    /// The private data the peer sent with its answer (zero-padded to
    /// [`MAX_SIDR_REPLY_PRIVATE_DATA`](crate::MAX_SIDR_REPLY_PRIVATE_DATA) bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.params.private_data
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The local RDMA device the address vector leaves from.
    pub fn device_name(&self) -> &str {
        &self.device
    }

    /// Creates the address handle of sends to the peer in `pd` (`ibv_create_ah()` with the
    /// answer's address vector). It borrows `pd`, so it cannot outlive it.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `pd` is on another device than
    /// [`device_name`](Self::device_name) (the vector's port and GID index are that device's);
    /// [`Error::Verbs`] when `ibv_create_ah` fails.
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah<'pd>(&self, pd: &'pd ProtectionDomain<'_>) -> Result<AddressHandle<'pd>> {
        create_ah(&self.params, &self.device, pd)
    }
}

/// An address handle for `params`' address vector in `pd`, which must be on `device`.
pub(crate) fn create_ah<'pd>(
    params: &UdParams,
    device: &str,
    pd: &'pd ProtectionDomain<'_>,
) -> Result<AddressHandle<'pd>> {
    let pd_device = pd.context().name();
    if pd_device != device {
        return Err(Error::DeviceMismatch { cm_device: device.to_owned(), qp_device: pd_device.to_owned() });
    }
    Ok(pd.create_ah(&params.address)?)
}
