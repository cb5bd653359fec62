//! The crate's error type.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use crate::event::EventKind;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong while setting up, using or tearing down a connection.
///
/// Each way a connection attempt can fail is its own variant, so that callers can tell "nobody
/// listens there" from "the peer said no" from "nothing answered in time" without parsing text.
/// [`Error::is_timeout`] groups every flavour of timeout.
///
/// As in `rdma-verbs`' [`Error`](rdma_verbs::Error):
/// - every `errno` is positive (a CM event's negative `status` is negated), is what
///   [`Error::errno`] returns, and displays as [`std::io::Error::from_raw_os_error`] does;
/// - once the RDMA device is known (after address resolution, in a request, in a connection),
///   the error names it in its `device` field and its message.
///
/// `rdma-verbs` errors convert into this type ([`Error::Verbs`], with `?`; see
/// [`Error::as_verbs`]), so code that mixes the two crates can return [`Result`] throughout.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A librdmacm call returned an error.
    #[error("{verb}{}: {}", OnDevice(.device), Errno(*.errno))]
    Cm {
        /// The function that failed, e.g. `"rdma_bind_addr"`.
        verb: &'static str,
        /// The device the identifier was bound to, when known.
        device: Option<String>,
        /// The `errno` it reported.
        errno: i32,
    },
    /// A verbs call failed: opening the device, or moving the connection's queue pair, or any
    /// other `rdma-verbs` call that `?` converted. It names its own device.
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
    /// `RDMA_CM_EVENT_ADDR_ERROR`, or `rdma_resolve_addr` failing: the destination could not be
    /// mapped to a local RDMA device and port (`ENODEV`: the route leaves through an interface
    /// with no RDMA device; `ENETUNREACH`: no route; `ETIMEDOUT`: the neighbour never answered
    /// ARP). No device is known yet.
    #[error("resolving the address {addr}: {}", Errno(*.errno))]
    AddressResolution {
        /// The destination being resolved.
        addr: SocketAddr,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// The source address given to a resolution cannot be used (`rdma_resolve_addr` binds the
    /// identifier to it first): its port is in use (`EADDRINUSE`), or it is not an address of
    /// this host (`EADDRNOTAVAIL`). The fault is the source's, not the destination's.
    #[error("resolving {dst} from {src}: the source address cannot be used: {}{}", Errno(*.errno), SourceHint(*.errno))]
    SourceAddress {
        /// The source address given.
        src: SocketAddr,
        /// The destination being resolved.
        dst: SocketAddr,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// `rdma_bind_addr` refused the address a listener was to bind: its port is in use
    /// (`EADDRINUSE`), or it is not an address of this host (`EADDRNOTAVAIL`), or no RDMA
    /// device has it (`ENODEV`).
    #[error("binding {addr}: {}{}", Errno(*.errno), SourceHint(*.errno))]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// `RDMA_CM_EVENT_ROUTE_ERROR`: no path to the resolved address.
    #[error("resolving the route to {addr}{}: {}", OnDevice(.device), Errno(*.errno))]
    RouteResolution {
        /// The destination.
        addr: SocketAddr,
        /// The device the address resolved to.
        device: Option<String>,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// `RDMA_CM_EVENT_REJECTED` with reason "invalid service ID": the peer's RDMA CM answered,
    /// but nothing listens on that port.
    #[error("connecting to {addr}{}: no listener on that port (rejected, invalid service ID)", OnDevice(.device))]
    NoListener {
        /// The address connected to.
        addr: SocketAddr,
        /// The local device.
        device: Option<String>,
    },
    /// `RDMA_CM_EVENT_REJECTED`: the peer (or its CM) refused the connection. Its `status` is an
    /// InfiniBand CM reject reason, not an `errno`.
    #[error("connection to {addr}{} rejected: {reason} ({} bytes of private data)", OnDevice(.device), .private_data.len())]
    Rejected {
        /// The peer's address.
        addr: SocketAddr,
        /// The local device.
        device: Option<String>,
        /// The reason code the peer's CM sent.
        reason: RejectReason,
        /// The private data the peer sent with its rejection (zero-padded to the transport's fixed
        /// size; empty if none came).
        private_data: Vec<u8>,
    },
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer's CM did not answer after every retry.
    #[error("connecting to {addr}{}: unreachable: {}", OnDevice(.device), Errno(*.errno))]
    Unreachable {
        /// The peer's address.
        addr: SocketAddr,
        /// The local device.
        device: Option<String>,
        /// Why (a positive `errno`, usually `ETIMEDOUT`).
        errno: i32,
    },
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the handshake failed after it started.
    #[error("connection with {addr}{} failed during the handshake: {}", OnDevice(.device), Errno(*.errno))]
    ConnectError {
        /// The peer's address.
        addr: SocketAddr,
        /// The local device.
        device: Option<String>,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// The peer disconnected (`RDMA_CM_EVENT_DISCONNECTED`) while an answer from it was
    /// awaited.
    #[error("connection with {addr}{}: the peer disconnected", OnDevice(.device))]
    PeerDisconnected {
        /// The peer's address.
        addr: SocketAddr,
        /// The local device.
        device: Option<String>,
    },
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the RDMA device went away.
    #[error("the RDMA device{} was removed", Named(.device))]
    DeviceRemoved {
        /// The device, when known (a listener on a wildcard address has none).
        device: Option<String>,
    },
    /// An event that the state the identifier was in does not allow.
    #[error("unexpected {event:?} while {state}{}{}", OnDevice(.device), InParens(*.errno))]
    UnexpectedEvent {
        /// What the identifier was doing, e.g. `"resolving an address"`.
        state: &'static str,
        /// The device, when known.
        device: Option<String>,
        /// The event that came.
        event: EventKind,
        /// The event's status as a positive `errno`, when it carried one (a negative status).
        errno: Option<i32>,
    },
    /// A wait ran out of time: no event, or the kernel's own timer fired first (`ETIMEDOUT`).
    #[error("{what}{}: timed out after {after:?}", OnDevice(.device))]
    Timeout {
        /// What was waited for, e.g. `"rdma_connect"`.
        what: &'static str,
        /// The device, when known.
        device: Option<String>,
        /// How long.
        after: Duration,
    },
    /// The queue pair handed in lives on another device than the one the CM chose.
    #[error("the queue pair is on {qp_device}, but the connection goes through {cm_device}")]
    DeviceMismatch {
        /// The device the CM resolved the address to.
        cm_device: String,
        /// The device of the queue pair's context.
        qp_device: String,
    },
    /// An argument was rejected before any call was made.
    #[error("{verb}{}: invalid argument: {reason}", OnDevice(.device))]
    InvalidArgument {
        /// The call it was meant for.
        verb: &'static str,
        /// The device, when known.
        device: Option<String>,
        /// What is wrong.
        reason: String,
    },
    /// librdmacm reported success, but left out what the step establishes: the identifier's
    /// local address or device, or a request's peer address. The step fails rather than
    /// report a made-up value (see the crate docs on addresses and devices).
    #[error("{verb}{}: librdmacm left the identifier without a {missing}", OnDevice(.device))]
    Incomplete {
        /// The call (or event) that should have established it.
        verb: &'static str,
        /// The device, when known.
        device: Option<String>,
        /// What is missing, e.g. `"local address"`.
        missing: &'static str,
    },
    /// The caller gave up a wait before its end: the condition it handed in (as to
    /// [`Accepting::wait_while`](crate::Accepting::wait_while)) said to stop.
    #[error("{what}{}: given up by the caller", OnDevice(.device))]
    Cancelled {
        /// What was waited for, e.g. `"rdma_accept"`.
        what: &'static str,
        /// The device, when known.
        device: Option<String>,
    },
    /// Joining a multicast group failed: the call (`rdma_join_multicast`), the CM's answer
    /// (`RDMA_CM_EVENT_MULTICAST_ERROR`), or attaching the queue pair to the group
    /// (`ibv_attach_mcast`). A join the kernel refuses as unsupported is
    /// [`Error::Unsupported`] instead.
    #[error("{verb}: joining the multicast group {group}{}: {}", OnDevice(.device), Errno(*.errno))]
    Multicast {
        /// What failed: `"rdma_join_multicast"`, `"RDMA_CM_EVENT_MULTICAST_ERROR"` or
        /// `"ibv_attach_mcast"`.
        verb: &'static str,
        /// The group.
        group: SocketAddr,
        /// The device of the identifier that joined.
        device: Option<String>,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// The kernel's CM or the device does not do what was asked, as the call's `errno` says
    /// (`ENOTSUPP`, 524, which `std::io` shows as "Unknown error 524"; `EOPNOTSUPP`; `ENOSYS`):
    /// for one, an IPv6 multicast group on a RoCE v2 port ([`UdId::join`](crate::UdId::join)).
    #[error("{verb}{}: not supported: {reason}", OnDevice(.device))]
    Unsupported {
        /// The call that refused.
        verb: &'static str,
        /// The device.
        device: Option<String>,
        /// What is not supported, and the evidence.
        reason: String,
        /// The `errno` the call reported.
        errno: Option<i32>,
    },
    /// The host has no RDMA the CM can use: `rdma_create_event_channel` found no
    /// `/dev/infiniband/rdma_cm` (`ENODEV`). The message says what to do, as `rdma-verbs` does
    /// when it finds no device ([`rdma_verbs::Error::NoDevice`]): with no device at all, load
    /// an RDMA driver; with devices but no CM, load `rdma_ucm`.
    #[error("{verb}: {}: {}", Errno(*.errno), NoRdma(.available))]
    NoDevice {
        /// The call that found none, `"rdma_create_event_channel"`.
        verb: &'static str,
        /// The `errno` it reported (`ENODEV`).
        errno: i32,
        /// The RDMA devices libibverbs lists (none on a host without RDMA).
        available: Vec<String>,
    },
    /// An async call (`*_async`, with the `tokio` feature) found no Tokio runtime to wait on:
    /// it ran outside one, or the runtime it ran on was shutting down.
    #[error("{what}: no Tokio runtime to wait on (outside one, or it has shut down)")]
    NoRuntime {
        /// What was to be awaited, e.g. `"rdma_connect"`.
        what: &'static str,
    },
}

impl Error {
    /// The `errno` behind this error, when there is one: from a librdmacm call, from a CM
    /// event's status, or from the `rdma-verbs` error inside.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Cm { errno, .. }
            | Error::AddressResolution { errno, .. }
            | Error::RouteResolution { errno, .. }
            | Error::Unreachable { errno, .. }
            | Error::ConnectError { errno, .. }
            | Error::NoDevice { errno, .. }
            | Error::SourceAddress { errno, .. }
            | Error::Bind { errno, .. }
            | Error::Multicast { errno, .. } => Some(*errno),
            Error::UnexpectedEvent { errno, .. } | Error::Unsupported { errno, .. } => *errno,
            Error::Verbs(e) => e.errno(),
            Error::NoListener { .. }
            | Error::Rejected { .. }
            | Error::PeerDisconnected { .. }
            | Error::DeviceRemoved { .. }
            | Error::Timeout { .. }
            | Error::DeviceMismatch { .. }
            | Error::InvalidArgument { .. }
            | Error::Incomplete { .. }
            | Error::Cancelled { .. }
            | Error::NoRuntime { .. } => None,
        }
    }

    /// The `rdma-verbs` error inside, for an error that came from a verbs call.
    pub fn as_verbs(&self) -> Option<&rdma_verbs::Error> {
        match self {
            Error::Verbs(e) => Some(e),
            _ => None,
        }
    }

    /// True for every timeout: a wait of ours (or of `rdma-verbs`) that ran out, or the kernel
    /// reporting `ETIMEDOUT` (an address the neighbour never answered for, a peer whose CM never
    /// answered).
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Verbs(e) => matches!(e, rdma_verbs::Error::Timeout { .. }),
            _ => self.errno() == Some(libc::ETIMEDOUT),
        }
    }

    pub(crate) fn last_os_error(verb: &'static str) -> Self {
        Self::from_errno(verb, std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO))
    }

    /// The error of `verb` finding no RDMA CM device (`ENODEV`): [`Error::NoDevice`], listing
    /// the verbs devices that exist. Any other `errno` is [`Error::Cm`].
    pub(crate) fn no_cm_device(verb: &'static str, errno: i32) -> Self {
        if errno != libc::ENODEV {
            return Self::from_errno(verb, errno);
        }
        let available = rdma_verbs::DeviceList::available().map(|l| l.names()).unwrap_or_default();
        Error::NoDevice { verb, errno, available }
    }

    pub(crate) fn from_errno(verb: &'static str, errno: i32) -> Self {
        Error::Cm { verb, device: None, errno }
    }

    pub(crate) fn invalid(verb: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { verb, device: None, reason: reason.into() }
    }

    pub(crate) fn incomplete(verb: &'static str, missing: &'static str) -> Self {
        Error::Incomplete { verb, device: None, missing }
    }

    /// Names `device` in an error that has room for one and does not name one yet. Verbs
    /// errors name their own.
    pub(crate) fn on_device(mut self, name: &str) -> Self {
        match &mut self {
            Error::Cm { device, .. }
            | Error::RouteResolution { device, .. }
            | Error::NoListener { device, .. }
            | Error::Rejected { device, .. }
            | Error::Unreachable { device, .. }
            | Error::ConnectError { device, .. }
            | Error::PeerDisconnected { device, .. }
            | Error::DeviceRemoved { device }
            | Error::UnexpectedEvent { device, .. }
            | Error::Timeout { device, .. }
            | Error::InvalidArgument { device, .. }
            | Error::Incomplete { device, .. }
            | Error::Cancelled { device, .. }
            | Error::Multicast { device, .. }
            | Error::Unsupported { device, .. } => {
                if device.is_none() {
                    *device = Some(name.to_owned());
                }
            }
            Error::Verbs(_)
            | Error::AddressResolution { .. }
            | Error::SourceAddress { .. }
            | Error::Bind { .. }
            | Error::NoDevice { .. }
            | Error::DeviceMismatch { .. }
            | Error::NoRuntime { .. } => {}
        }
        self
    }
}

/// A CM event's `status` as a positive `errno`: librdmacm reports failures as negative errnos
/// (`EIO` stands in for a failure event with no status).
pub(crate) fn status_errno(status: i32) -> i32 {
    match status.checked_abs() {
        Some(0) | None => libc::EIO,
        Some(errno) => errno,
    }
}

/// For callers that speak `std::io`: timeouts become [`std::io::ErrorKind::TimedOut`].
impl From<Error> for std::io::Error {
    fn from(e: Error) -> Self {
        let kind = if e.is_timeout() { std::io::ErrorKind::TimedOut } else { std::io::ErrorKind::Other };
        std::io::Error::new(kind, e)
    }
}

/// Checks a librdmacm return code (0, or -1 with `errno` set).
pub(crate) fn check(verb: &'static str, rc: libc::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::last_os_error(verb))
    }
}

/// `" on DEVICE"`, or nothing.
struct OnDevice<'a>(&'a Option<String>);

impl fmt::Display for OnDevice<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(device) => write!(f, " on {device}"),
            None => Ok(()),
        }
    }
}

/// `" DEVICE"`, or nothing.
struct Named<'a>(&'a Option<String>);

impl fmt::Display for Named<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(device) => write!(f, " {device}"),
            None => Ok(()),
        }
    }
}

/// An `errno` as `std::io` shows it, e.g. `Connection timed out (os error 110)`.
struct Errno(i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&std::io::Error::from_raw_os_error(self.0), f)
    }
}

/// What an address's `errno` says of it, after the error's own words: whose the address is at
/// fault for.
struct SourceHint(i32);

impl fmt::Display for SourceHint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            libc::EADDRINUSE => f.write_str(" (its port is in use on this host)"),
            libc::EADDRNOTAVAIL => f.write_str(" (it is not an address of this host)"),
            libc::ENODEV => f.write_str(" (no RDMA device has it)"),
            _ => Ok(()),
        }
    }
}

/// What to do about a host whose CM cannot be opened: `rdma-verbs`' own words when there is no
/// device at all.
struct NoRdma<'a>(&'a [String]);

impl fmt::Display for NoRdma<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_empty() {
            let none = rdma_verbs::Error::NoDevice { name: None, available: Vec::new() };
            return fmt::Display::fmt(&none, f);
        }
        write!(
            f,
            "the RDMA device(s) {} have no connection manager: is the rdma_ucm module loaded? (`modprobe rdma_ucm`)",
            self.0.join(", ")
        )
    }
}

/// `" (ERRNO)"`, or nothing.
struct InParens(Option<i32>);

impl fmt::Display for InParens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(errno) => write!(f, " ({})", Errno(errno)),
            None => Ok(()),
        }
    }
}

/// Why a connection was rejected: the reject reason of the InfiniBand CM (which RoCE uses too),
/// as carried in the `status` of `RDMA_CM_EVENT_REJECTED`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RejectReason {
    /// 28, `IB_CM_REJ_CONSUMER_DEFINED`: the peer application called `rdma_reject`.
    ConsumerDefined,
    /// 8, `IB_CM_REJ_INVALID_SERVICE_ID`: no one listens on the port.
    InvalidServiceId,
    /// 1, `IB_CM_REJ_NO_QP`, or 3, `IB_CM_REJ_NO_RESOURCES`: the peer ran out of resources.
    NoResources,
    /// 4, `IB_CM_REJ_TIMEOUT`: the peer's CM gave up waiting.
    Timeout,
    /// 5, `IB_CM_REJ_UNSUPPORTED`: the request asked for something the peer does not do.
    Unsupported,
    /// 10, `IB_CM_REJ_STALE_CONN`: the peer still holds a connection with the same QP number.
    StaleConnection,
    /// Any other code (see `enum ib_cm_rej_reason` in the kernel's `ib_cm.h`).
    Other(i32),
}

impl RejectReason {
    /// The reason for a `status` value.
    pub fn from_status(status: i32) -> Self {
        match status {
            28 => RejectReason::ConsumerDefined,
            8 => RejectReason::InvalidServiceId,
            1 | 3 => RejectReason::NoResources,
            4 => RejectReason::Timeout,
            5 => RejectReason::Unsupported,
            10 => RejectReason::StaleConnection,
            other => RejectReason::Other(other),
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::ConsumerDefined => f.write_str("rejected by the peer application"),
            RejectReason::InvalidServiceId => f.write_str("no listener (invalid service ID)"),
            RejectReason::NoResources => f.write_str("the peer has no resources"),
            RejectReason::Timeout => f.write_str("the peer's CM timed out"),
            RejectReason::Unsupported => f.write_str("unsupported request"),
            RejectReason::StaleConnection => f.write_str("stale connection"),
            RejectReason::Other(code) => write!(f, "reject reason {code}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr() -> SocketAddr {
        "10.0.0.1:1".parse().unwrap()
    }

    #[test]
    fn reject_reasons_map_the_ib_cm_codes() {
        assert_eq!(RejectReason::from_status(28), RejectReason::ConsumerDefined);
        assert_eq!(RejectReason::from_status(8), RejectReason::InvalidServiceId);
        assert_eq!(RejectReason::from_status(3), RejectReason::NoResources);
        assert_eq!(RejectReason::from_status(99), RejectReason::Other(99));
        assert!(RejectReason::Other(99).to_string().contains("99"));
    }

    #[test]
    fn timeouts_are_recognised_in_every_form() {
        assert!(Error::Timeout { what: "x", device: None, after: Duration::from_secs(1) }.is_timeout());
        let addr = addr();
        assert!(Error::AddressResolution { addr, errno: libc::ETIMEDOUT }.is_timeout());
        assert!(Error::Unreachable { addr, device: None, errno: libc::ETIMEDOUT }.is_timeout());
        assert!(!Error::AddressResolution { addr, errno: libc::ENODEV }.is_timeout());
        assert!(!Error::NoListener { addr, device: None }.is_timeout());
        let verbs = rdma_verbs::Error::Timeout { what: "ibv_poll_cq", after: Duration::from_secs(1) };
        assert!(Error::from(verbs).is_timeout());
    }

    #[test]
    fn event_statuses_are_positive_errnos() {
        assert_eq!(status_errno(-libc::ECONNRESET), libc::ECONNRESET);
        assert_eq!(status_errno(libc::ETIMEDOUT), libc::ETIMEDOUT);
        assert_eq!(status_errno(0), libc::EIO);
        assert_eq!(status_errno(i32::MIN), libc::EIO);
    }

    /// A resolution whose source cannot be used blames the source, naming both addresses;
    /// a bind names its address.
    #[test]
    fn address_errors_name_the_addresses_and_the_side_at_fault() {
        let src: SocketAddr = "10.77.0.2:7000".parse().unwrap();
        let dst: SocketAddr = "10.77.0.1:7471".parse().unwrap();
        let e = Error::SourceAddress { src, dst, errno: libc::EADDRINUSE };
        let text = e.to_string();
        assert!(
            text.starts_with("resolving 10.77.0.1:7471 from 10.77.0.2:7000: the source address cannot be used"),
            "{text}"
        );
        assert!(text.ends_with("(its port is in use on this host)"), "{text}");
        let e = Error::Bind { addr: "192.0.2.1:7471".parse().unwrap(), errno: libc::EADDRNOTAVAIL };
        let text = e.to_string();
        assert!(text.starts_with("binding 192.0.2.1:7471: "), "{text}");
        assert!(text.ends_with("(it is not an address of this host)"), "{text}");
    }

    #[test]
    fn errno_covers_every_variant_that_carries_one() {
        let addr = addr();
        let with = [
            Error::Cm { verb: "rdma_bind_addr", device: None, errno: libc::EADDRINUSE },
            Error::AddressResolution { addr, errno: libc::ENODEV },
            Error::SourceAddress { src: addr, dst: addr, errno: libc::EADDRINUSE },
            Error::Bind { addr, errno: libc::EADDRNOTAVAIL },
            Error::RouteResolution { addr, device: None, errno: libc::ENETUNREACH },
            Error::Unreachable { addr, device: None, errno: libc::ETIMEDOUT },
            Error::ConnectError { addr, device: None, errno: libc::ECONNRESET },
            Error::UnexpectedEvent {
                state: "connected",
                device: None,
                event: EventKind::MulticastError,
                errno: Some(libc::ENETRESET),
            },
            Error::Verbs(rdma_verbs::Error::Verb { verb: "ibv_modify_qp", device: None, errno: libc::EINVAL }),
        ];
        for e in &with {
            let errno = e.errno().unwrap_or_else(|| panic!("{e:?} has an errno"));
            assert!(errno > 0, "{e:?}");
            let shown = std::io::Error::from_raw_os_error(errno).to_string();
            assert!(e.to_string().contains(&shown), "{e} shows {shown}");
        }
        let without = [
            Error::NoListener { addr, device: None },
            Error::Rejected { addr, device: None, reason: RejectReason::ConsumerDefined, private_data: vec![] },
            Error::PeerDisconnected { addr, device: None },
            Error::DeviceRemoved { device: None },
            Error::UnexpectedEvent { state: "listening", device: None, event: EventKind::Established, errno: None },
            Error::Timeout { what: "rdma_connect", device: None, after: Duration::from_secs(1) },
            Error::DeviceMismatch { cm_device: "rxe0".into(), qp_device: "rxe1".into() },
            Error::invalid("rdma_connect", "too long"),
            Error::incomplete("rdma_bind_addr", "local address"),
            Error::NoRuntime { what: "rdma_connect" },
        ];
        for e in &without {
            assert_eq!(e.errno(), None, "{e:?}");
        }
    }

    #[test]
    fn errors_name_the_device_once_it_is_known() {
        let e = Error::Cm { verb: "rdma_connect", device: None, errno: libc::EINVAL }.on_device("rxe1");
        assert!(e.to_string().starts_with("rdma_connect on rxe1: "), "{e}");
        let e = Error::ConnectError { addr: addr(), device: None, errno: libc::ECONNRESET }.on_device("rxe1");
        assert!(e.to_string().contains("10.0.0.1:1 on rxe1"), "{e}");
        assert_eq!(
            Error::DeviceRemoved { device: None }.on_device("rxe0").to_string(),
            "the RDMA device rxe0 was removed"
        );
        // A device already named stays; verbs errors name their own.
        let e = Error::Timeout { what: "x", device: Some("rxe0".into()), after: Duration::ZERO }.on_device("rxe1");
        assert!(matches!(e, Error::Timeout { device: Some(ref d), .. } if d == "rxe0"));
        let verbs = rdma_verbs::Error::Verb { verb: "ibv_modify_qp", device: None, errno: libc::EINVAL };
        let e = Error::from(verbs).on_device("rxe1");
        assert!(!e.to_string().contains("rxe1"), "{e}");
    }

    /// A verbs call that fails without any device.
    fn verbs_call() -> rdma_verbs::Result<u32> {
        Err(rdma_verbs::Error::Verb { verb: "ibv_query_port", device: Some("rxe0".into()), errno: libc::EINVAL })
    }

    /// An rdma-cm call that fails without any device.
    fn cm_call() -> Result<u32> {
        Err(Error::invalid("rdma_connect", "too long"))
    }

    #[test]
    fn question_mark_turns_verbs_errors_into_cm_errors() {
        fn mixed() -> Result<u32> {
            let n = verbs_call()?;
            Ok(n + cm_call()?)
        }
        let e = mixed().unwrap_err();
        let verbs = e.as_verbs().expect("a verbs error inside");
        assert!(matches!(verbs, rdma_verbs::Error::Verb { verb: "ibv_query_port", .. }));
        assert_eq!(e.errno(), Some(libc::EINVAL));
        assert_eq!(e.to_string(), verbs.to_string(), "shown as the verbs error it is");
        // A real verbs call too: opening a device that does not exist (with or without RDMA).
        fn open() -> Result<rdma_verbs::Context> {
            Ok(rdma_verbs::Context::open("no-such-rdma-device")?)
        }
        assert!(open().unwrap_err().as_verbs().is_some());
        assert!(cm_call().unwrap_err().as_verbs().is_none());
    }

    #[test]
    fn a_posting_scope_closure_may_return_cm_results() {
        // Compiled, not run: it needs a device. `scope`'s closure error is any type a verbs
        // error converts into, so `?` works on verbs and on rdma-cm calls inside.
        fn send(conn: &crate::Connection<'_>, mr: &rdma_verbs::MemoryRegion<'_>) -> Result<u32> {
            let t = Duration::from_secs(1);
            conn.qp().scope(t, |s| -> Result<u32> {
                let sge = [mr.sge(..)?];
                s.post_send(&mut [rdma_verbs::SendRequest::send(1, &sge)])?;
                let mut wc = [rdma_verbs::WorkCompletion::default(); 1];
                let n = s.wait(1, &mut wc, t)?.len() as u32;
                Ok(n + cm_call()?)
            })
        }
        let _ = send;
    }

    #[test]
    fn both_error_types_go_into_a_boxed_error() {
        type BoxError = Box<dyn std::error::Error + Send + Sync>;
        fn mixed(verbs_first: bool) -> std::result::Result<u32, BoxError> {
            if verbs_first {
                verbs_call()?;
            }
            Ok(cm_call()?)
        }
        let e = mixed(true).unwrap_err();
        assert!(e.downcast_ref::<rdma_verbs::Error>().is_some(), "{e}");
        let e = mixed(false).unwrap_err();
        assert!(matches!(e.downcast_ref::<Error>(), Some(Error::InvalidArgument { .. })), "{e}");
        // A cm error holding a verbs error: downcast to the cm error, then `as_verbs`.
        let e: BoxError = Error::from(verbs_call().unwrap_err()).into();
        assert!(e.downcast_ref::<Error>().and_then(Error::as_verbs).is_some());
        fn assert_thread_safe<T: Send + Sync + 'static>() {}
        assert_thread_safe::<Error>();
    }
}
