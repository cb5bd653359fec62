//! Connection-manager events: every `RDMA_CM_EVENT_*`, typed.

use std::ptr::NonNull;

use rdma_verbs::ffi;
use rdma_verbs::ffi::rdma_cm_event_type as t;

use crate::error::{status_errno, RejectReason};

/// The kind of an event, without its payload: what errors and logs name.
///
/// # References
/// - [`rdma_get_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_get_cm_event.3.html)
#[doc(alias = "rdma_cm_event_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EventKind {
    /// `RDMA_CM_EVENT_ADDR_RESOLVED`.
    AddressResolved,
    /// `RDMA_CM_EVENT_ADDR_ERROR`.
    AddressError,
    /// `RDMA_CM_EVENT_ROUTE_RESOLVED`.
    RouteResolved,
    /// `RDMA_CM_EVENT_ROUTE_ERROR`.
    RouteError,
    /// `RDMA_CM_EVENT_CONNECT_REQUEST`.
    ConnectRequest,
    /// `RDMA_CM_EVENT_CONNECT_RESPONSE`.
    ConnectResponse,
    /// `RDMA_CM_EVENT_CONNECT_ERROR`.
    ConnectError,
    /// `RDMA_CM_EVENT_UNREACHABLE`.
    Unreachable,
    /// `RDMA_CM_EVENT_REJECTED`.
    Rejected,
    /// `RDMA_CM_EVENT_ESTABLISHED`.
    Established,
    /// `RDMA_CM_EVENT_DISCONNECTED`.
    Disconnected,
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`.
    DeviceRemoval,
    /// `RDMA_CM_EVENT_MULTICAST_JOIN`.
    MulticastJoin,
    /// `RDMA_CM_EVENT_MULTICAST_ERROR`.
    MulticastError,
    /// `RDMA_CM_EVENT_ADDR_CHANGE`.
    AddressChange,
    /// `RDMA_CM_EVENT_TIMEWAIT_EXIT`.
    TimewaitExit,
    /// A value this crate does not know (from a newer librdmacm): the raw
    /// `enum rdma_cm_event_type` value.
    Other(u32),
}

impl EventKind {
    /// The kind of the raw `enum rdma_cm_event_type` value.
    pub fn from_raw(raw: u32) -> Self {
        match raw {
            t::RDMA_CM_EVENT_ADDR_RESOLVED => EventKind::AddressResolved,
            t::RDMA_CM_EVENT_ADDR_ERROR => EventKind::AddressError,
            t::RDMA_CM_EVENT_ROUTE_RESOLVED => EventKind::RouteResolved,
            t::RDMA_CM_EVENT_ROUTE_ERROR => EventKind::RouteError,
            t::RDMA_CM_EVENT_CONNECT_REQUEST => EventKind::ConnectRequest,
            t::RDMA_CM_EVENT_CONNECT_RESPONSE => EventKind::ConnectResponse,
            t::RDMA_CM_EVENT_CONNECT_ERROR => EventKind::ConnectError,
            t::RDMA_CM_EVENT_UNREACHABLE => EventKind::Unreachable,
            t::RDMA_CM_EVENT_REJECTED => EventKind::Rejected,
            t::RDMA_CM_EVENT_ESTABLISHED => EventKind::Established,
            t::RDMA_CM_EVENT_DISCONNECTED => EventKind::Disconnected,
            t::RDMA_CM_EVENT_DEVICE_REMOVAL => EventKind::DeviceRemoval,
            t::RDMA_CM_EVENT_MULTICAST_JOIN => EventKind::MulticastJoin,
            t::RDMA_CM_EVENT_MULTICAST_ERROR => EventKind::MulticastError,
            t::RDMA_CM_EVENT_ADDR_CHANGE => EventKind::AddressChange,
            t::RDMA_CM_EVENT_TIMEWAIT_EXIT => EventKind::TimewaitExit,
            other => EventKind::Other(other),
        }
    }

    /// The C name, e.g. `"RDMA_CM_EVENT_ESTABLISHED"` (what `rdma_event_str(3)` returns).
    pub fn name(self) -> &'static str {
        match self {
            EventKind::AddressResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            EventKind::AddressError => "RDMA_CM_EVENT_ADDR_ERROR",
            EventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            EventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            EventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            EventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            EventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            EventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            EventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            EventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            EventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            EventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            EventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            EventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            EventKind::AddressChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            EventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            EventKind::Other(_) => "unknown RDMA CM event",
        }
    }
}

/// What the peer sent with a connection request, response or acceptance
/// (`struct rdma_conn_param` of the event).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerParams {
    /// The peer's private data. InfiniBand CM messages have fixed-size private-data fields, so
    /// this arrives zero-padded to the field's size (56 bytes in a request, 196 in a reply); a
    /// protocol that needs the exact length must carry it inside.
    pub private_data: Vec<u8>,
    /// RDMA READ / atomic requests the peer accepts outstanding from this side.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests the peer will have outstanding at this side.
    pub initiator_depth: u8,
    /// Whether the peer does end-to-end flow control.
    pub flow_control: bool,
    /// Transport retries the peer asked for.
    pub retry_count: u8,
    /// RNR retries the peer asked for.
    pub rnr_retry_count: u8,
    /// Whether the peer's QP uses a shared receive queue.
    pub srq: bool,
    /// The peer's QP number.
    pub qp_num: u32,
}

/// What a UD identifier's event carries (`struct rdma_ud_param`): where to send datagrams and
/// with which keys. From a service ID resolution ([`UdId::resolve_peer`](crate::UdId::resolve_peer)):
/// the peer's QP; from a multicast join ([`Membership`](crate::Membership)): the group.
#[doc(alias = "rdma_ud_param")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdParams {
    /// The address vector the kernel's CM computed from the route (`ah_attr`): the local port,
    /// the destination GID (the group's GID for multicast), the source GID index, hop limit,
    /// traffic class and service level. Make the address handle of the sends from it
    /// ([`ProtectionDomain::create_ah`](rdma_verbs::ProtectionDomain::create_ah)). The
    /// `ah_attr`'s flow label and static rate are not carried (rdma-verbs' [`AddressVector`]
    /// sends with 0 for both: no flow label, the port's rate).
    ///
    /// [`AddressVector`]: rdma_verbs::AddressVector
    pub address: rdma_verbs::AddressVector,
    /// The remote QP number: the peer's QP, or `0xFFFFFF` for a multicast group.
    pub qp_num: u32,
    /// The Q_Key the datagrams must carry to be accepted.
    pub qkey: u32,
    /// The private data the peer sent (a resolution's reply, zero-padded to 136 bytes); empty
    /// for a multicast join.
    pub private_data: Vec<u8>,
}

/// A connection-manager event with its payload. Owned: the C event is acknowledged
/// (`rdma_ack_cm_event`) as soon as it has been read.
///
/// # References
/// - [`rdma_get_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_get_cm_event.3.html)
#[doc(alias = "rdma_cm_event")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Event {
    /// The address resolved to a local device and port.
    AddressResolved,
    /// Address resolution failed (a positive `errno`).
    AddressError {
        /// Why.
        errno: i32,
    },
    /// The route to the peer resolved.
    RouteResolved,
    /// Route resolution failed (a positive `errno`).
    RouteError {
        /// Why.
        errno: i32,
    },
    /// A peer asks to connect (on a listener).
    ConnectRequest(PeerParams),
    /// The peer accepted; the active side must now ready its QP and call `rdma_establish`.
    ConnectResponse(PeerParams),
    /// The handshake failed (a positive `errno`).
    ConnectError {
        /// Why.
        errno: i32,
    },
    /// The peer's CM never answered (a positive `errno`, usually `ETIMEDOUT`).
    Unreachable {
        /// Why.
        errno: i32,
    },
    /// The peer refused.
    Rejected {
        /// The reject reason (the event's status, an InfiniBand CM reject reason, not an
        /// `errno`).
        reason: RejectReason,
        /// The private data sent with the rejection.
        private_data: Vec<u8>,
    },
    /// The connection is up.
    Established(PeerParams),
    /// The connection is down (the peer disconnected, or our own disconnect completed).
    Disconnected,
    /// The RDMA device went away.
    DeviceRemoval,
    /// A multicast join completed.
    MulticastJoin,
    /// A multicast join failed (a positive `errno`).
    MulticastError {
        /// Why.
        errno: i32,
    },
    /// The address's network device changed.
    AddressChange,
    /// The QP left the timewait state.
    TimewaitExit,
    /// An event kind this crate does not know (from a newer librdmacm).
    Other {
        /// The raw `enum rdma_cm_event_type` value.
        code: u32,
        /// The event's raw status (librdmacm's convention: 0, or a negative `errno`).
        status: i32,
    },
}

impl Event {
    /// The kind, without the payload.
    pub fn kind(&self) -> EventKind {
        match self {
            Event::AddressResolved => EventKind::AddressResolved,
            Event::AddressError { .. } => EventKind::AddressError,
            Event::RouteResolved => EventKind::RouteResolved,
            Event::RouteError { .. } => EventKind::RouteError,
            Event::ConnectRequest(_) => EventKind::ConnectRequest,
            Event::ConnectResponse(_) => EventKind::ConnectResponse,
            Event::ConnectError { .. } => EventKind::ConnectError,
            Event::Unreachable { .. } => EventKind::Unreachable,
            Event::Rejected { .. } => EventKind::Rejected,
            Event::Established(_) => EventKind::Established,
            Event::Disconnected => EventKind::Disconnected,
            Event::DeviceRemoval => EventKind::DeviceRemoval,
            Event::MulticastJoin => EventKind::MulticastJoin,
            Event::MulticastError { .. } => EventKind::MulticastError,
            Event::AddressChange => EventKind::AddressChange,
            Event::TimewaitExit => EventKind::TimewaitExit,
            Event::Other { code, .. } => EventKind::Other(*code),
        }
    }
}

/// An event read from a channel and not yet acknowledged; acknowledged on drop.
pub(crate) struct RawEvent(NonNull<ffi::rdma_cm_event>);

// SAFETY: an event is a heap object of librdmacm's that any thread may read and acknowledge.
unsafe impl Send for RawEvent {}

impl RawEvent {
    /// # Safety
    /// `raw` came from `rdma_get_cm_event` and is not acknowledged elsewhere.
    pub(crate) unsafe fn new(raw: NonNull<ffi::rdma_cm_event>) -> Self {
        RawEvent(raw)
    }

    fn raw(&self) -> &ffi::rdma_cm_event {
        // SAFETY: valid until acknowledged, which only our drop does.
        unsafe { self.0.as_ref() }
    }

    pub(crate) fn kind(&self) -> EventKind {
        EventKind::from_raw(self.raw().event)
    }

    pub(crate) fn status(&self) -> i32 {
        self.raw().status
    }

    /// The status as a positive `errno`, for an event that carries one: every negative status
    /// except a rejection's (whose status is a reject reason).
    pub(crate) fn errno(&self) -> Option<i32> {
        let status = self.status();
        (status < 0 && self.kind() != EventKind::Rejected).then(|| status_errno(status))
    }

    /// The identifier the event is about (for a connection request: the new one).
    pub(crate) fn id(&self) -> *mut ffi::rdma_cm_id {
        self.raw().id
    }

    /// The connection parameters of a connection event.
    fn conn(&self) -> PeerParams {
        // SAFETY: for the connected port space (RDMA_PS_TCP) librdmacm fills `param.conn`; every
        // field is an integer or a pointer, so reading it cannot be invalid even for events that
        // leave it zeroed. For a UD identifier's events it fills `param.ud`, whose first two
        // fields are the same private-data pointer and length (the rest is then meaningless,
        // but integers).
        let conn = unsafe { self.raw().param.conn };
        // SAFETY: as above: the pointer and length librdmacm set for this event.
        let private_data = unsafe { copy_private_data(conn.private_data, conn.private_data_len) };
        PeerParams {
            private_data,
            responder_resources: conn.responder_resources,
            initiator_depth: conn.initiator_depth,
            flow_control: conn.flow_control != 0,
            retry_count: conn.retry_count,
            rnr_retry_count: conn.rnr_retry_count,
            srq: conn.srq != 0,
            qp_num: conn.qp_num,
        }
    }

    /// The parameters of a UD identifier's event (`param.ud`): an `ESTABLISHED` that answers a
    /// service ID resolution, a `CONNECT_REQUEST` or `UNREACHABLE` of one, or a
    /// `MULTICAST_JOIN`. `private_data` says whether the event's private-data pointer points to
    /// private data: it does not in a multicast event, where librdmacm puts the join's context
    /// pointer there.
    pub(crate) fn ud(&self, private_data: bool) -> UdParams {
        // SAFETY: a UD identifier's events carry `param.ud` (librdmacm's `ucma_copy_ud_event`):
        // a pointer and integers, valid for any bit pattern.
        let ud = unsafe { self.raw().param.ud };
        let attr = &ud.ah_attr;
        let address = rdma_verbs::AddressVector {
            port: attr.port_num,
            // SAFETY: every member of `union ibv_gid` is 16 plain bytes.
            dgid: rdma_verbs::Gid(unsafe { attr.grh.dgid.raw }),
            sgid_index: attr.grh.sgid_index,
            hop_limit: attr.grh.hop_limit,
            traffic_class: attr.grh.traffic_class,
            service_level: attr.sl,
            dlid: attr.dlid,
        };
        let private_data = if private_data {
            // SAFETY: outside multicast events the pointer and length librdmacm set for this
            // event (its own copy in the event, alive until acknowledged).
            unsafe { copy_private_data(ud.private_data, ud.private_data_len) }
        } else {
            Vec::new()
        };
        UdParams { address, qp_num: ud.qp_num, qkey: ud.qkey, private_data }
    }

    /// Copies the event out.
    pub(crate) fn to_event(&self) -> Event {
        let status = self.status();
        match self.kind() {
            EventKind::AddressResolved => Event::AddressResolved,
            EventKind::AddressError => Event::AddressError { errno: status_errno(status) },
            EventKind::RouteResolved => Event::RouteResolved,
            EventKind::RouteError => Event::RouteError { errno: status_errno(status) },
            EventKind::ConnectRequest => Event::ConnectRequest(self.conn()),
            EventKind::ConnectResponse => Event::ConnectResponse(self.conn()),
            EventKind::ConnectError => Event::ConnectError { errno: status_errno(status) },
            EventKind::Unreachable => Event::Unreachable { errno: status_errno(status) },
            EventKind::Rejected => {
                Event::Rejected { reason: RejectReason::from_status(status), private_data: self.conn().private_data }
            }
            EventKind::Established => Event::Established(self.conn()),
            EventKind::Disconnected => Event::Disconnected,
            EventKind::DeviceRemoval => Event::DeviceRemoval,
            EventKind::MulticastJoin => Event::MulticastJoin,
            EventKind::MulticastError => Event::MulticastError { errno: status_errno(status) },
            EventKind::AddressChange => Event::AddressChange,
            EventKind::TimewaitExit => Event::TimewaitExit,
            EventKind::Other(code) => Event::Other { code, status },
        }
    }
}

/// Copies `len` bytes of private data from `ptr` (nothing from a null pointer).
///
/// # Safety
/// A non-null `ptr` points to `len` readable bytes: an event's private data, read before the
/// event is acknowledged.
unsafe fn copy_private_data(ptr: *const std::ffi::c_void, len: u8) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len.into()) }.to_vec()
}

impl Drop for RawEvent {
    #[doc(alias = "rdma_ack_cm_event")]
    fn drop(&mut self) {
        // SAFETY: from `rdma_get_cm_event`, acknowledged exactly once, here. Copies of its
        // private data were taken before.
        unsafe { ffi::rdma_ack_cm_event(self.0.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_known_event_code_maps_to_its_own_kind_and_name() {
        let mut names = std::collections::HashSet::new();
        for raw in 0..=15 {
            let kind = EventKind::from_raw(raw);
            assert!(!matches!(kind, EventKind::Other(_)), "{raw}");
            assert!(names.insert(kind.name()), "{raw} repeats a name");
            // SAFETY: rdma_event_str returns a static string for any value.
            let c = unsafe { std::ffi::CStr::from_ptr(ffi::rdma_event_str(raw)) };
            assert_eq!(c.to_str().unwrap(), kind.name(), "librdmacm names {raw} differently");
        }
        assert_eq!(EventKind::from_raw(99), EventKind::Other(99));
        assert_eq!(EventKind::from_raw(t::RDMA_CM_EVENT_ESTABLISHED).name(), "RDMA_CM_EVENT_ESTABLISHED");
    }
}
