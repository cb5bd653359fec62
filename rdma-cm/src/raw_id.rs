//! The owned `struct rdma_cm_id` underneath every typed identifier.

use std::ffi::CStr;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::time::Duration;

use rdma_verbs::ffi;
// Where `struct rdma_addr` keeps its address unions: bindgen and rdma-sys name them
// differently, and rdma-verbs knows which bindings `ffi` is.
use rdma_verbs::ffi_compat::{RDMA_ADDR_DST, RDMA_ADDR_SRC};
use rdma_verbs::{
    AccessFlags, Deadline, Init, QueuePair, Rc, ReadyToReceive, ReadyToSend, Reset, Transport, TypeState, Ud,
};

use crate::addr;
use crate::channel::EventChannel;
use crate::error::{check, Error, Result};
use crate::event::RawEvent;

/// An identifier and the channel its events arrive on. Drop destroys the identifier, then the
/// channel.
pub(crate) struct RawId {
    raw: NonNull<ffi::rdma_cm_id>,
    channel: EventChannel,
}

// SAFETY: librdmacm's calls on an identifier may come from any thread; this type only reads the
// identifier's fields (written by librdmacm during calls this type serialises by `&mut`/by value).
unsafe impl Send for RawId {}
// SAFETY: `&RawId` only reads fields and reads events from the channel, both thread-safe.
unsafe impl Sync for RawId {}

impl std::fmt::Debug for RawId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawId").field("local", &self.local_addr()).field("peer", &self.peer_addr()).finish()
    }
}

/// The port space an identifier is created in: which transport its QP has, and what
/// `rdma_connect` means for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connections (RC), the connection handshake.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagrams (UD), service ID resolution and multicast.
    Udp,
}

impl RawId {
    /// `rdma_create_id()` on a fresh channel, in the reliable-connected port space.
    pub(crate) fn create() -> Result<Self> {
        Self::create_in(PortSpace::Tcp)
    }

    /// `rdma_create_id()` on a fresh channel, in port space `space`.
    pub(crate) fn create_in(space: PortSpace) -> Result<Self> {
        let channel = EventChannel::new()?;
        let mut raw = std::ptr::null_mut();
        let ps = match space {
            PortSpace::Tcp => ffi::rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => ffi::rdma_port_space::RDMA_PS_UDP,
        };
        // SAFETY: live channel; `raw` is a valid out-pointer; no context pointer is attached.
        let rc = unsafe { ffi::rdma_create_id(channel.as_raw(), &mut raw, std::ptr::null_mut(), ps) };
        check("rdma_create_id", rc)?;
        let raw = NonNull::new(raw).ok_or(Error::Cm { verb: "rdma_create_id", device: None, errno: libc::EIO })?;
        Ok(RawId { raw, channel })
    }

    /// Takes ownership of the identifier a connection request created, moving it to a channel of
    /// its own. Its request event must already be acknowledged.
    ///
    /// # Safety
    /// `raw` is a live identifier nothing else owns.
    pub(crate) unsafe fn adopt(raw: NonNull<ffi::rdma_cm_id>) -> Result<Self> {
        let channel = match EventChannel::new() {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: we own `raw`; nothing else will destroy it.
                unsafe { ffi::rdma_destroy_id(raw.as_ptr()) };
                return Err(e);
            }
        };
        // SAFETY: live identifier and channel; its events so far are acknowledged, so this does
        // not block.
        let rc = unsafe { ffi::rdma_migrate_id(raw.as_ptr(), channel.as_raw()) };
        if let Err(e) = check("rdma_migrate_id", rc) {
            // SAFETY: as above.
            unsafe { ffi::rdma_destroy_id(raw.as_ptr()) };
            return Err(e);
        }
        Ok(RawId { raw, channel })
    }

    pub(crate) fn as_ptr(&self) -> *mut ffi::rdma_cm_id {
        self.raw.as_ptr()
    }

    fn id(&self) -> &ffi::rdma_cm_id {
        // SAFETY: live identifier; librdmacm writes its fields only during calls we make.
        unsafe { self.raw.as_ref() }
    }

    /// The RDMA device the identifier is bound to, once an address is (read from librdmacm
    /// each time: the typed identifiers capture it once, with [`require_device`](Self::require_device)).
    pub(crate) fn device_name(&self) -> Option<String> {
        let verbs = self.id().verbs;
        if verbs.is_null() {
            return None;
        }
        // SAFETY: librdmacm keeps the context (and its device) open while an identifier uses it.
        let name = unsafe { ffi::ibv_get_device_name((*verbs).device) };
        // SAFETY: a NUL-terminated name owned by the device.
        (!name.is_null()).then(|| unsafe { CStr::from_ptr(name) }.to_string_lossy().into_owned())
    }

    pub(crate) fn port(&self) -> u8 {
        self.id().port_num
    }

    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the source union is a whole `sockaddr_storage` inside the identifier.
        unsafe { addr::from_raw(std::ptr::addr_of!(self.id().route.addr).cast::<u8>().add(RDMA_ADDR_SRC).cast()) }
    }

    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the destination union is a whole `sockaddr_storage` inside the identifier.
        unsafe { addr::from_raw(std::ptr::addr_of!(self.id().route.addr).cast::<u8>().add(RDMA_ADDR_DST).cast()) }
    }

    /// The device, which `call` has just bound the identifier to; [`Error::Incomplete`] if
    /// librdmacm has none.
    pub(crate) fn require_device(&self, verb: &'static str) -> Result<String> {
        self.device_name().ok_or_else(|| Error::incomplete(verb, "RDMA device"))
    }

    /// The local address, which `call` has just established; [`Error::Incomplete`] if
    /// librdmacm has none.
    pub(crate) fn require_local_addr(&self, verb: &'static str) -> Result<SocketAddr> {
        self.local_addr().ok_or_else(|| Error::incomplete(verb, "local address"))
    }

    /// The peer's address, which `call` has just established; [`Error::Incomplete`] if
    /// librdmacm has none.
    pub(crate) fn require_peer_addr(&self, verb: &'static str) -> Result<SocketAddr> {
        self.peer_addr().ok_or_else(|| Error::incomplete(verb, "peer address"))
    }

    pub(crate) fn try_event(&self) -> Result<Option<RawEvent>> {
        self.channel.try_get()
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.channel.as_raw_fd()
    }

    /// The identifier's event channel's fd, borrowed for as long as the identifier.
    pub(crate) fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.channel)
    }

    /// `rdma_init_qp_attr()`: what the CM says the QP needs to enter `state`.
    fn qp_attr(&self, state: ffi::ibv_qp_state::Type) -> Result<(ffi::ibv_qp_attr, ffi::ibv_qp_attr_mask)> {
        // SAFETY: all-zero is a valid `ibv_qp_attr` (integers and structs of them).
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: live identifier; both out-pointers are valid.
        let rc = unsafe { ffi::rdma_init_qp_attr(self.as_ptr(), &mut attr, &mut mask) };
        check("rdma_init_qp_attr", rc)?;
        Ok((attr, ffi::ibv_qp_attr_mask(mask as u32)))
    }

    /// Refuses a QP on another device than `device`, the one the identifier is bound to.
    pub(crate) fn check_device<T: Transport, S: TypeState>(qp: &QueuePair<'_, T, S>, device: &str) -> Result<()> {
        let qp_device = qp.pd().context().name();
        if qp_device == device {
            Ok(())
        } else {
            Err(Error::DeviceMismatch { cm_device: device.to_owned(), qp_device: qp_device.to_owned() })
        }
    }

    /// `Reset -> Init` with the CM's port and P_Key and the caller's access flags, for an
    /// identifier bound to `device`.
    pub(crate) fn init_qp<'res>(
        &self,
        qp: QueuePair<'res, Rc, Reset>,
        access: AccessFlags,
        device: &str,
    ) -> Result<QueuePair<'res, Rc, Init>> {
        Self::check_device(&qp, device)?;
        let (mut attr, mask) = self.qp_attr(ffi::ibv_qp_state::IBV_QPS_INIT)?;
        attr.qp_access_flags = access.bits();
        let mask = ffi::ibv_qp_attr_mask(mask.0 | ffi::ibv_qp_attr_mask::IBV_QP_ACCESS_FLAGS.0);
        qp.modify_with(&mut attr, mask).map_err(Error::Verbs)
    }

    /// `Init -> ReadyToReceive -> ReadyToSend` with the CM's path, peer QP and PSNs. READ/atomic
    /// depths are the given ones, or the CM's negotiated ones capped by the device's limits.
    /// `ack_timeout` replaces the CM's local ACK timeout. Returns the QP and the depths used,
    /// `(responder_resources, initiator_depth)`.
    pub(crate) fn ready_qp<'res>(
        &self,
        qp: QueuePair<'res, Rc, Init>,
        responder_resources: Option<u8>,
        initiator_depth: Option<u8>,
        ack_timeout: Option<u8>,
        device: &str,
    ) -> Result<(QueuePair<'res, Rc, ReadyToSend>, u8, u8)> {
        Self::check_device(&qp, device)?;
        let (max_resp, max_init) = device_depths(qp.pd().context());
        let (mut attr, mask) = self.qp_attr(ffi::ibv_qp_state::IBV_QPS_RTR)?;
        let resp = responder_resources.unwrap_or_else(|| attr.max_dest_rd_atomic.min(max_resp));
        attr.max_dest_rd_atomic = resp;
        let qp: QueuePair<'res, Rc, ReadyToReceive> = qp.modify_with(&mut attr, mask).map_err(Error::Verbs)?;
        let (mut attr, mask) = self.qp_attr(ffi::ibv_qp_state::IBV_QPS_RTS)?;
        let init = initiator_depth.unwrap_or_else(|| attr.max_rd_atomic.min(max_init));
        attr.max_rd_atomic = init;
        if let Some(t) = ack_timeout {
            attr.timeout = t;
        }
        let qp = qp.modify_with(&mut attr, mask).map_err(Error::Verbs)?;
        Ok((qp, resp, init))
    }
}

impl RawId {
    /// `Reset -> Init -> ReadyToReceive -> ReadyToSend` for a UD QP of an identifier bound to
    /// `device`: `Init` with the port, P_Key index and Q_Key the CM gives
    /// (`rdma_init_qp_attr()`), then the two UD transitions that need nothing more (what
    /// librdmacm's own `rdma_create_qp` does for a UD identifier, `ucma_init_ud_qp`). The CM
    /// computes no attributes for a UD QP past `Init`.
    pub(crate) fn ready_ud_qp<'res>(
        &self,
        qp: QueuePair<'res, Ud, Reset>,
        device: &str,
    ) -> Result<QueuePair<'res, Ud, ReadyToSend>> {
        Self::check_device(&qp, device)?;
        let (mut attr, mask) = self.qp_attr(ffi::ibv_qp_state::IBV_QPS_INIT)?;
        let qp: QueuePair<'res, Ud, Init> = qp.modify_with(&mut attr, mask)?;
        Ok(qp.ready_to_receive()?.ready_to_send(0)?)
    }
}

/// The device's READ/atomic depth limits as `(responder_resources, initiator_depth)`.
pub(crate) fn device_depths(ctx: &rdma_verbs::Context) -> (u8, u8) {
    let cap = |n: u32| u8::try_from(n).unwrap_or(u8::MAX);
    (cap(ctx.attr().max_qp_rd_atom), cap(ctx.attr().max_qp_init_rd_atom))
}

impl Drop for RawId {
    #[doc(alias = "rdma_destroy_id")]
    fn drop(&mut self) {
        // SAFETY: owned identifier, destroyed once. Every event we read was acknowledged when its
        // `RawEvent` dropped, so this does not wait. The channel is dropped after this.
        unsafe { ffi::rdma_destroy_id(self.raw.as_ptr()) };
    }
}

impl RawId {
    /// One step of waiting for an event of kind `want`, without waiting: the event if it is
    /// queued, `None` once the channel is empty. Benign events (address change, timewait exit)
    /// are skipped; failures become their own [`Error`] variants, anything else
    /// [`Error::UnexpectedEvent`].
    pub(crate) fn expect_step(
        &self,
        want: crate::EventKind,
        state: &'static str,
        peer: SocketAddr,
    ) -> Result<Option<RawEvent>> {
        self.expect_step_or(want, state, peer, |_| None)
    }

    /// [`expect_step`](Self::expect_step), where `refusal` may read a failure event its own way
    /// first (what a UD identifier's events mean differs from a connection's; see [`failure`]).
    pub(crate) fn expect_step_or(
        &self,
        want: crate::EventKind,
        state: &'static str,
        peer: SocketAddr,
        refusal: impl Fn(&RawEvent) -> Option<Error>,
    ) -> Result<Option<RawEvent>> {
        while let Some(ev) = self.try_event()? {
            let kind = ev.kind();
            if kind == want {
                return Ok(Some(ev));
            }
            if !matches!(kind, crate::EventKind::AddressChange | crate::EventKind::TimewaitExit) {
                return Err(refusal(&ev).unwrap_or_else(|| failure(&ev, state, peer)));
            }
        }
        Ok(None)
    }

    /// Takes `step` until it gives a value, waiting for the channel until `until` between
    /// tries (see [`EventChannel::wait_for`]).
    pub(crate) fn wait_for<T>(
        &self,
        until: Deadline,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        self.channel.wait_for(until, what, step)
    }

    /// [`wait_for`](Self::wait_for), taking `step` again at least every `every` (see
    /// [`EventChannel::wait_for_every`]).
    pub(crate) fn wait_for_every<T>(
        &self,
        until: Deadline,
        every: Duration,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        self.channel.wait_for_every(until, every, what, step)
    }
}

#[cfg(feature = "tokio")]
impl RawId {
    /// Takes `step` until it gives a value, awaiting the channel between tries, until `until`
    /// and at least every `every` (see [`EventChannel::wait_for_async`]). Cancellation-safe.
    pub(crate) async fn wait_for_async<T>(
        &self,
        until: Deadline,
        every: Duration,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        self.channel.wait_for_async(until, every, what, step).await
    }
}

/// The error an event that ends an attempt stands for.
pub(crate) fn failure(ev: &RawEvent, state: &'static str, addr: SocketAddr) -> Error {
    use crate::event::Event;
    use crate::RejectReason;
    let device = None;
    match ev.to_event() {
        Event::AddressError { errno } => Error::AddressResolution { addr, errno },
        Event::RouteError { errno } => Error::RouteResolution { addr, device, errno },
        Event::Rejected { reason: RejectReason::InvalidServiceId, .. } => Error::NoListener { addr, device },
        Event::Rejected { reason, private_data } => Error::Rejected { addr, device, reason, private_data },
        Event::Unreachable { errno } => Error::Unreachable { addr, device, errno },
        Event::ConnectError { errno } => Error::ConnectError { addr, device, errno },
        Event::Disconnected => Error::PeerDisconnected { addr, device },
        Event::DeviceRemoval => Error::DeviceRemoved { device },
        other => Error::UnexpectedEvent { state, device, event: other.kind(), errno: ev.errno() },
    }
}
