//! The active side: an identifier whose state is its type, from creation to `connect`.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Duration;

use rdma_verbs::ffi;
use rdma_verbs::{AccessFlags, Init, QueuePair, Rc, ReadyToSend, Reset};

use crate::addr::RawAddr;
use crate::connection::Connection;
use crate::error::{check, Error, Result};
use crate::event::{EventKind, RawEvent};
use crate::listener::Listener;
use crate::params::{ConnParams, MAX_CONNECT_PRIVATE_DATA};
use crate::pending::{Connecting, OwnedParams, Resolving, ResolvingAddress, ResolvingRoute, Waiting};
use crate::raw_id::RawId;

mod sealed {
    use std::net::SocketAddr;

    /// What a state knows about its identifier, captured by the step that entered it.
    pub trait Sealed {
        type Known: std::fmt::Debug + Send + Sync;
    }

    /// What address resolution establishes: the identifier's device, its local address (with
    /// the source port the CM picked) and the destination.
    #[derive(Debug)]
    pub struct Resolved {
        pub(crate) device: String,
        pub(crate) local: SocketAddr,
        pub(crate) peer: SocketAddr,
    }
}

use sealed::Resolved;

/// A state of a [`CmId`]. Sealed.
pub trait IdState: sealed::Sealed + 'static {
    /// The state's name, for messages.
    const NAME: &'static str;
}

/// States in which the identifier is bound to a device: [`AddressResolved`], [`RouteResolved`].
/// Sealed.
pub trait Bound: IdState + sealed::Sealed<Known = Resolved> {}

/// Just created: bound to nothing.
#[derive(Debug)]
pub enum Idle {}
/// `rdma_resolve_addr` succeeded: bound to a local device and port, destination known.
#[derive(Debug)]
pub enum AddressResolved {}
/// `rdma_resolve_route` succeeded: ready to create a QP and connect.
#[derive(Debug)]
pub enum RouteResolved {}

impl sealed::Sealed for Idle {
    type Known = ();
}
impl sealed::Sealed for AddressResolved {
    type Known = Resolved;
}
impl sealed::Sealed for RouteResolved {
    type Known = Resolved;
}
impl IdState for Idle {
    const NAME: &'static str = "idle";
}
impl IdState for AddressResolved {
    const NAME: &'static str = "address resolved";
}
impl IdState for RouteResolved {
    const NAME: &'static str = "route resolved";
}
impl Bound for AddressResolved {}
impl Bound for RouteResolved {}

/// A connection-manager identifier (`struct rdma_cm_id`, from `rdma_create_id`) on the active
/// side, in state `S`, with its own event channel. Destroyed (`rdma_destroy_id`, then the
/// channel) on drop.
///
/// ```text
/// CmId<Idle> --resolve_addr--> CmId<AddressResolved> --resolve_route--> CmId<RouteResolved>
///     |                                                                     | init_qp, connect
///     +--listen--> Listener                                                 v
///                                                                      Connection
/// ```
///
/// Each step consumes the identifier and returns it in its next state, or an error (the
/// identifier is then destroyed). A step that waits for the CM returns a
/// [pending value](crate::pending) first: `.wait(timeout)` or `.await` it.
///
/// # References
/// - [`rdma_create_id(3)`](https://man7.org/linux/man-pages/man3/rdma_create_id.3.html)
/// - [`rdma_cm(7)`](https://man7.org/linux/man-pages/man7/rdma_cm.7.html)
#[doc(alias = "rdma_cm_id")]
#[must_use = "dropping it at once releases what was just made"]
pub struct CmId<S: IdState> {
    pub(crate) id: RawId,
    known: <S as sealed::Sealed>::Known,
    _state: PhantomData<S>,
}

impl<S: IdState> std::fmt::Debug for CmId<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId").field("state", &S::NAME).field("known", &self.known).finish()
    }
}

impl<S: IdState> CmId<S> {
    /// The raw `struct rdma_cm_id *`; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::rdma_cm_id {
        self.id.as_ptr()
    }
}

impl<S: IdState> AsRawFd for CmId<S> {
    /// The identifier's own event channel (non-blocking).
    fn as_raw_fd(&self) -> RawFd {
        self.id.fd()
    }
}

/// How long each `rdma_resolve_addr` attempt may take (see [`CmId::resolve_addr`]).
const RESOLVE_ATTEMPT: Duration = Duration::from_millis(250);

/// A timeout as librdmacm's milliseconds: at least 1 ms, and at most `c_int::MAX` (a longer
/// one, such as `Duration::MAX`, is "no deadline" for our own wait; see [`Deadline`](rdma_verbs::Deadline)).
fn timeout_ms(verb: &'static str, timeout: Duration) -> Result<libc::c_int> {
    match libc::c_int::try_from(timeout.as_millis()) {
        Ok(0) => Err(Error::invalid(verb, format!("timeout {timeout:?}: must be at least 1 ms"))),
        Ok(ms) => Ok(ms),
        Err(_) => Ok(libc::c_int::MAX),
    }
}

/// The call and the state address resolution names in its errors.
const RESOLVE_ADDR: &str = "rdma_resolve_addr";
const RESOLVING_ADDR: &str = "resolving an address";

/// The addresses of an address resolution, laid out for C once for all its attempts.
struct AddrQuery {
    src: Option<RawAddr>,
    dst: RawAddr,
    src_addr: Option<SocketAddr>,
    dst_addr: SocketAddr,
}

impl AddrQuery {
    fn new(src: Option<SocketAddr>, dst: SocketAddr) -> Self {
        AddrQuery { src: src.map(RawAddr::new), dst: RawAddr::new(dst), src_addr: src, dst_addr: dst }
    }
}

/// What a failed address-resolution attempt means: `Ok` to ask again when the kernel's own
/// timer fired (`ETIMEDOUT`: see [`CmId::resolve_addr`]), the error otherwise.
fn retry_resolution(e: Error) -> Result<()> {
    if e.is_timeout() {
        Ok(())
    } else {
        Err(e)
    }
}

impl CmId<Idle> {
    /// Creates an identifier in the reliable-connected port space (`RDMA_PS_TCP`), with an
    /// event channel of its own: `rdma_create_event_channel()` then `rdma_create_id()`.
    ///
    /// # Errors
    /// [`Error::NoDevice`] without RDMA (no `/dev/infiniband/rdma_cm`: the message says what to
    /// load); [`Error::Cm`] when the channel or identifier cannot be created otherwise.
    #[doc(alias = "rdma_create_id")]
    pub fn new() -> Result<Self> {
        Ok(CmId { id: RawId::create()?, known: (), _state: PhantomData })
    }

    /// An identifier in port space `space` (a [`UdId`](crate::UdId) wraps one of `Udp`).
    pub(crate) fn new_in(space: crate::raw_id::PortSpace) -> Result<Self> {
        Ok(CmId { id: RawId::create_in(space)?, known: (), _state: PhantomData })
    }

    /// The local address, if the identifier has one: an idle identifier is bound to nothing,
    /// so this is `None` unless librdmacm reports otherwise (the state does not guarantee an
    /// address; see the crate docs on addresses and devices).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.id.local_addr()
    }

    /// Resolves `dst` to a local RDMA device and port, leaving from `src` if given:
    /// `rdma_resolve_addr()`, then waits for `RDMA_CM_EVENT_ADDR_RESOLVED`: a
    /// [`ResolvingAddress`] to `.wait(timeout)` for or `.await`; nothing is done before then. The
    /// device and local address it binds the identifier to are read once, then.
    ///
    /// # Errors
    /// When waited for: [`Error::SourceAddress`] when `src` cannot be used (its port in use, not
    /// an address of this host);
    /// [`Error::AddressResolution`] with the `errno` the CM reported, from the call or its event:
    /// `ENODEV` when `src`, or the interface the route to `dst` leaves through, has no RDMA
    /// device; `EADDRNOTAVAIL` for a `src` that is not local; `ENETUNREACH` without a route.
    /// [`Error::Timeout`] when the neighbour did not answer within the wait's `timeout` (an
    /// awaited resolution asks again until its future is dropped).
    /// [`Error::Incomplete`] if librdmacm resolved the address but reports no device or local
    /// address for it.
    ///
    /// The kernel is asked in attempts of 250 ms, repeated until the wait ends: Linux only re-reads
    /// its neighbour table when a resolution's own timer fires if the ARP reply came before the
    /// request was queued, which would otherwise stall the first resolution to a fresh neighbour
    /// for the whole timeout.
    ///
    /// # References
    /// - [`rdma_resolve_addr(3)`](https://man7.org/linux/man-pages/man3/rdma_resolve_addr.3.html)
    #[doc(alias = "rdma_resolve_addr")]
    pub fn resolve_addr(self, src: Option<SocketAddr>, dst: SocketAddr) -> ResolvingAddress {
        ResolvingAddress { id: self, src, dst }
    }

    /// `rdma_resolve_addr()` for one attempt of `attempt`: its event comes within it, an
    /// `ETIMEDOUT` failure if the neighbour did not answer.
    fn start_resolve_addr(&self, addrs: &mut AddrQuery, attempt: Duration) -> Result<()> {
        let ms = timeout_ms(RESOLVE_ADDR, attempt)?;
        let src = addrs.src.as_mut().map_or(std::ptr::null_mut(), RawAddr::as_mut_ptr);
        // SAFETY: live identifier; the addresses are valid sockaddrs librdmacm copies.
        let rc = unsafe { ffi::rdma_resolve_addr(self.id.as_ptr(), src, addrs.dst.as_mut_ptr(), ms) };
        if rc != 0 {
            return Err(match (Error::last_os_error(RESOLVE_ADDR).errno(), addrs.src_addr) {
                // The identifier is bound to the source first: these are the source's.
                (Some(errno @ (libc::EADDRINUSE | libc::EADDRNOTAVAIL)), Some(src)) => {
                    Error::SourceAddress { src, dst: addrs.dst_addr, errno }
                }
                (Some(errno), _) => Error::AddressResolution { addr: addrs.dst_addr, errno },
                (None, _) => Error::Cm { verb: RESOLVE_ADDR, device: None, errno: libc::EIO },
            });
        }
        Ok(())
    }

    /// The resolved identifier, once `RDMA_CM_EVENT_ADDR_RESOLVED` came: its device and local
    /// address read once, here.
    fn address_resolved(self, dst: SocketAddr) -> Result<CmId<AddressResolved>> {
        let device = self.id.require_device(RESOLVE_ADDR)?;
        let local = self.id.require_local_addr(RESOLVE_ADDR).map_err(|e| e.on_device(&device))?;
        Ok(CmId { id: self.id, known: Resolved { device, local, peer: dst }, _state: PhantomData })
    }

    /// [`resolve_addr`](Self::resolve_addr) then [`resolve_route`](CmId::resolve_route), both
    /// within one wait: a [`Resolving`] to [`wait`](crate::Pending::wait) for or `.await`.
    ///
    /// # Errors
    /// Those of the two steps, when waited for.
    pub fn resolve(self, src: Option<SocketAddr>, dst: SocketAddr) -> Resolving {
        Resolving { addr: self.resolve_addr(src, dst) }
    }

    /// Binds to `addr` and listens: `rdma_bind_addr()` then `rdma_listen()`. Port 0 picks a
    /// free port ([`Listener::local_addr`] tells which). The bound address (and device, for an
    /// address that is not a wildcard) is read once, here.
    ///
    /// # Errors
    /// [`Error::Bind`] naming `addr`: `EADDRINUSE`, `EADDRNOTAVAIL` (not a local address),
    /// `ENODEV`; [`Error::Cm`] when `rdma_listen` fails.
    /// [`Error::Incomplete`] if librdmacm bound the identifier but reports no address for it.
    ///
    /// # References
    /// - [`rdma_bind_addr(3)`](https://man7.org/linux/man-pages/man3/rdma_bind_addr.3.html)
    /// - [`rdma_listen(3)`](https://man7.org/linux/man-pages/man3/rdma_listen.3.html)
    #[doc(alias = "rdma_bind_addr")]
    #[doc(alias = "rdma_listen")]
    pub fn listen(self, addr: SocketAddr, backlog: u16) -> Result<Listener> {
        let mut raw = RawAddr::new(addr);
        // SAFETY: live identifier; a valid sockaddr librdmacm copies.
        check("rdma_bind_addr", unsafe { ffi::rdma_bind_addr(self.id.as_ptr(), raw.as_mut_ptr()) })
            .map_err(|e| Error::Bind { addr, errno: e.errno().unwrap_or(libc::EIO) })?;
        // A wildcard address binds no device; a specific one binds its device.
        let device = self.id.device_name();
        let on_device = |e: Error| match &device {
            Some(d) => e.on_device(d),
            None => e,
        };
        let local = self.id.require_local_addr("rdma_bind_addr").map_err(on_device)?;
        // SAFETY: live, bound identifier.
        check("rdma_listen", unsafe { ffi::rdma_listen(self.id.as_ptr(), backlog.into()) }).map_err(on_device)?;
        Ok(Listener::new(self.id, local, device))
    }
}

/// The call and the state route resolution names in its errors.
const RESOLVE_ROUTE: &str = "rdma_resolve_route";
const RESOLVING_ROUTE: &str = "resolving a route";

impl CmId<AddressResolved> {
    /// Resolves the route to the destination: `rdma_resolve_route()`, then waits for
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`: a [`ResolvingRoute`] to `.wait(timeout)` for or
    /// `.await`; nothing is done before then.
    ///
    /// # Errors
    /// When waited for: [`Error::RouteResolution`]; [`Error::Timeout`]. Each names the device.
    ///
    /// # References
    /// - [`rdma_resolve_route(3)`](https://man7.org/linux/man-pages/man3/rdma_resolve_route.3.html)
    #[doc(alias = "rdma_resolve_route")]
    pub fn resolve_route(self) -> ResolvingRoute {
        ResolvingRoute { id: self }
    }

    /// `rdma_resolve_route()`, the kernel's own timer set to `timeout` (what is left of the wait).
    fn start_resolve_route(&self, timeout: Duration) -> Result<()> {
        let on_device = |e: Error| e.on_device(&self.known.device);
        let ms = timeout_ms(RESOLVE_ROUTE, timeout).map_err(on_device)?;
        // SAFETY: live identifier with a resolved address.
        check(RESOLVE_ROUTE, unsafe { ffi::rdma_resolve_route(self.id.as_ptr(), ms) }).map_err(on_device)
    }

    /// The identifier in its next state, once `RDMA_CM_EVENT_ROUTE_RESOLVED` came.
    fn route_resolved(self) -> CmId<RouteResolved> {
        CmId { id: self.id, known: self.known, _state: PhantomData }
    }
}

impl<S: Bound> CmId<S> {
    /// The name of the RDMA device the address resolved to (e.g. `"rxe0"`).
    pub fn device_name(&self) -> &str {
        &self.known.device
    }

    /// The device port the address resolved to.
    pub fn port(&self) -> u8 {
        self.id.port()
    }

    /// The local address (with the source port the CM picked).
    pub fn local_addr(&self) -> SocketAddr {
        self.known.local
    }

    /// The destination.
    pub fn peer_addr(&self) -> SocketAddr {
        self.known.peer
    }

    /// Opens a verbs context (`ibv_open_device`) on the device the address resolved to, for the
    /// PD, CQs and QP of the connection. (librdmacm's own context for the device is not lent
    /// out, so that every verbs object here is owned by `rdma-verbs` and its lifetimes.)
    ///
    /// # Errors
    /// [`Error::Verbs`]: opening the device failed.
    #[doc(alias = "ibv_open_device")]
    pub fn open_context(&self) -> Result<rdma_verbs::Context> {
        Ok(rdma_verbs::Context::open(&self.known.device)?)
    }
}

impl CmId<RouteResolved> {
    /// Moves a new RC queue pair to `Init` with the port and P_Key the CM resolved
    /// (`rdma_init_qp_attr()`, then `ibv_modify_qp()`), and the remote `access` this side grants
    /// (e.g. `REMOTE_WRITE | REMOTE_READ`). Receives can be posted from here on, before
    /// [`connect`](Self::connect).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when the QP's context is on another device than
    /// [`device_name`](CmId::device_name); [`Error::Cm`] from `rdma_init_qp_attr`;
    /// [`Error::Verbs`] when the transition fails (the QP is destroyed).
    ///
    /// # References
    /// - [`rdma_init_qp_attr(3)`](https://man7.org/linux/man-pages/man3/rdma_init_qp_attr.3.html)
    #[doc(alias = "rdma_init_qp_attr")]
    pub fn init_qp<'res>(
        &self,
        qp: QueuePair<'res, Rc, Reset>,
        access: AccessFlags,
    ) -> Result<QueuePair<'res, Rc, Init>> {
        self.id.init_qp(qp, access, &self.known.device).map_err(|e| e.on_device(&self.known.device))
    }

    /// Connects with `qp`: `rdma_connect()`, then on the peer's acceptance
    /// (`RDMA_CM_EVENT_CONNECT_RESPONSE`) moves the QP to `ReadyToSend` with the path, peer QP
    /// and PSNs the CM negotiated, and completes the handshake with `rdma_establish()`.
    ///
    /// A [`Connecting`] to `.wait(timeout)` for (the whole exchange within `timeout`) or
    /// `.await`; nothing is sent before then.
    ///
    /// # Errors
    /// When waited for:
    /// - [`Error::NoListener`]: the peer's CM answered that nothing listens on the port.
    /// - [`Error::Rejected`]: the peer rejected, with its reason and private data.
    /// - [`Error::Unreachable`], [`Error::ConnectError`]: the CM gave up.
    /// - [`Error::PeerDisconnected`]: the peer left during the handshake.
    /// - [`Error::Timeout`]: no answer within the wait's `timeout`.
    /// - [`Error::InvalidArgument`]: more than [`MAX_CONNECT_PRIVATE_DATA`] bytes of private
    ///   data, retry counts over 7, or an ACK timeout outside 1..=31.
    /// - [`Error::DeviceMismatch`], [`Error::Verbs`], [`Error::Cm`] as for
    ///   [`init_qp`](Self::init_qp).
    ///
    /// Each names the device. On every error the identifier is destroyed, which tells the
    /// peer's CM (a REJ or DREQ), and the QP is destroyed.
    ///
    /// # References
    /// - [`rdma_connect(3)`](https://man7.org/linux/man-pages/man3/rdma_connect.3.html)
    /// - [`rdma_establish(3)`](https://man7.org/linux/man-pages/man3/rdma_establish.3.html)
    #[doc(alias = "rdma_connect")]
    #[doc(alias = "rdma_establish")]
    pub fn connect<'res>(self, qp: QueuePair<'res, Rc, Init>, params: &ConnParams<'_>) -> Connecting<'res> {
        Connecting { id: self, qp, params: OwnedParams::new(params) }
    }

    /// `rdma_connect()` with `qp`'s number and `params`.
    fn start_connect(id: &RawId, qp: &QueuePair<'_, Rc, Init>, params: &ConnParams<'_>) -> Result<()> {
        let (max_resp, max_init) = crate::raw_id::device_depths(qp.pd().context());
        let resp = params.responder_resources.unwrap_or(max_resp);
        let init = params.initiator_depth.unwrap_or(max_init);
        let mut raw = params.to_raw(CONNECT, MAX_CONNECT_PRIVATE_DATA, resp, init, qp.qp_num())?;
        // SAFETY: live identifier with a resolved route; `raw` and the private data it points to
        // live across the call, which copies them.
        check(CONNECT, unsafe { ffi::rdma_connect(id.as_ptr(), &mut raw) })
    }

    /// On the peer's acceptance `ev`: the QP to `ReadyToSend`, then `rdma_establish()`.
    fn finish_connect<'res>(
        id: &RawId,
        known: &Resolved,
        qp: QueuePair<'res, Rc, Init>,
        params: &ConnParams<'_>,
        ev: RawEvent,
    ) -> Result<(QueuePair<'res, Rc, ReadyToSend>, crate::PeerParams)> {
        let peer_params = match ev.to_event() {
            crate::Event::ConnectResponse(p) => p,
            _ => Default::default(),
        };
        drop(ev);
        let (qp, _, _) = id.ready_qp(qp, None, None, params.ack_timeout, &known.device)?;
        // SAFETY: live identifier that received a connect response and has no librdmacm QP.
        check("rdma_establish", unsafe { ffi::rdma_establish(id.as_ptr()) })?;
        Ok((qp, peer_params))
    }
}

/// The call and the state connecting names in its errors.
const CONNECT: &str = "rdma_connect";
const CONNECTING: &str = "connecting";

impl ResolvingAddress {
    /// The resolution, in attempts of [`RESOLVE_ATTEMPT`] until the address resolves, fails
    /// otherwise, or the wait ends.
    pub(crate) async fn run(self, how: &Waiting) -> Result<CmId<AddressResolved>> {
        let ResolvingAddress { id, src, dst } = self;
        // A wait already over (a timeout of zero) asks nothing: librdmacm's timers count whole
        // milliseconds, and the answer could not be waited for.
        if how.has_passed() {
            return Err(how.timed_out(RESOLVE_ADDR));
        }
        let mut addrs = AddrQuery::new(src, dst);
        loop {
            // The kernel re-checks the neighbour table only when its own timer fires if the ARP
            // reply beat the request onto its queue (a race veth hits on the first resolution),
            // so ask for short attempts and repeat them until our deadline.
            let attempt = how.remaining().min(RESOLVE_ATTEMPT).max(Duration::from_millis(1));
            id.start_resolve_addr(&mut addrs, attempt)?;
            // A little past the deadline: the attempt's own timeout comes first.
            let wait = how.extended(Duration::from_millis(50));
            match id.id.expect_as(&wait, EventKind::AddressResolved, RESOLVE_ADDR, RESOLVING_ADDR, dst).await {
                Ok(_) => return id.address_resolved(dst),
                // Our wait's own timeout, as it was built; the kernel's (ETIMEDOUT) past our
                // deadline is the same end of the wait.
                Err(e @ Error::Timeout { .. }) => return Err(e),
                Err(e) if e.is_timeout() && how.has_passed() => return Err(how.timed_out(RESOLVE_ADDR)),
                Err(e) => retry_resolution(e)?,
            }
        }
    }
}

impl ResolvingRoute {
    /// `rdma_resolve_route()`, then the wait for `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    pub(crate) async fn run(self, how: &Waiting) -> Result<CmId<RouteResolved>> {
        let id = self.id;
        let (dst, device) = (id.known.peer, &id.known.device);
        if how.has_passed() {
            return Err(how.timed_out(RESOLVE_ROUTE).on_device(device));
        }
        id.start_resolve_route(how.remaining().max(Duration::from_millis(1)))?;
        id.id
            .expect_as(how, EventKind::RouteResolved, RESOLVE_ROUTE, RESOLVING_ROUTE, dst)
            .await
            .map_err(|e| e.on_device(device))?;
        Ok(id.route_resolved())
    }
}

impl<'res> Connecting<'res> {
    /// `rdma_connect()`, the wait for the peer's acceptance, the QP to `ReadyToSend`,
    /// `rdma_establish()`.
    pub(crate) async fn run(self, how: &Waiting) -> Result<Connection<'res>> {
        let Connecting { id, qp, params } = self;
        // Declared after the QP, so dropped first (a dropped future destroys the identifier,
        // then the QP, as an error does).
        let CmId { id, known, .. } = id;
        if how.has_passed() {
            // Nothing sent: the peer could not be waited for.
            return Err(how.timed_out(CONNECT).on_device(&known.device));
        }
        let params = params.get();
        let on_device = |e: Error| e.on_device(&known.device);
        CmId::<RouteResolved>::start_connect(&id, &qp, &params).map_err(on_device)?;
        let ev =
            id.expect_as(how, EventKind::ConnectResponse, CONNECT, CONNECTING, known.peer).await.map_err(on_device)?;
        let (qp, peer_params) =
            CmId::<RouteResolved>::finish_connect(&id, &known, qp, &params, ev).map_err(on_device)?;
        Ok(Connection::new(qp, id, known.peer, known.local, known.device, peer_params))
    }
}
