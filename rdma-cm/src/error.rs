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
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A librdmacm call returned an error.
    #[error("{call}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Cm {
        /// The function that failed, e.g. `"rdma_bind_addr"`.
        call: &'static str,
        /// The `errno` it reported.
        errno: i32,
    },
    /// A verbs call failed: opening the device, or moving the connection's queue pair.
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
    /// `RDMA_CM_EVENT_ADDR_ERROR`: the destination could not be mapped to a local RDMA device and
    /// port (`ENODEV`: the route leaves through an interface with no RDMA device; `ENETUNREACH`:
    /// no route; `ETIMEDOUT`: the neighbour never answered ARP).
    #[error("resolving the address {addr}: {}", std::io::Error::from_raw_os_error(*.errno))]
    AddressResolution {
        /// The destination being resolved.
        addr: SocketAddr,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// `RDMA_CM_EVENT_ROUTE_ERROR`: no path to the resolved address.
    #[error("resolving the route to {addr}: {}", std::io::Error::from_raw_os_error(*.errno))]
    RouteResolution {
        /// The destination.
        addr: SocketAddr,
        /// Why (a positive `errno`).
        errno: i32,
    },
    /// `RDMA_CM_EVENT_REJECTED` with reason "invalid service ID": the peer's RDMA CM answered,
    /// but nothing listens on that port.
    #[error("connecting to {addr}: no listener on that port (rejected, invalid service ID)")]
    NoListener {
        /// The address connected to.
        addr: SocketAddr,
    },
    /// `RDMA_CM_EVENT_REJECTED`: the peer (or its CM) refused the connection.
    #[error("connection to {addr} rejected: {reason} ({} bytes of private data)", .private_data.len())]
    Rejected {
        /// The peer's address.
        addr: SocketAddr,
        /// The reason code the peer's CM sent.
        reason: RejectReason,
        /// The private data the peer sent with its rejection (zero-padded to the transport's fixed
        /// size; empty if none came).
        private_data: Vec<u8>,
    },
    /// `RDMA_CM_EVENT_UNREACHABLE`: the peer's CM did not answer after every retry.
    #[error("{addr} is unreachable (status {status})")]
    Unreachable {
        /// The peer's address.
        addr: SocketAddr,
        /// The status the event carried.
        status: i32,
    },
    /// `RDMA_CM_EVENT_CONNECT_ERROR`: the handshake failed after it started.
    #[error("connection with {addr} failed during the handshake (status {status})")]
    ConnectError {
        /// The peer's address.
        addr: SocketAddr,
        /// The status the event carried (often a negative `errno`).
        status: i32,
    },
    /// The peer disconnected while an answer from it was awaited.
    #[error("{addr} disconnected")]
    Disconnected {
        /// The peer's address.
        addr: SocketAddr,
    },
    /// `RDMA_CM_EVENT_DEVICE_REMOVAL`: the RDMA device went away.
    #[error("the RDMA device was removed")]
    DeviceRemoved,
    /// An event that the state the identifier was in does not allow.
    #[error("unexpected {event:?} (status {status}) while {state}")]
    UnexpectedEvent {
        /// What the identifier was doing, e.g. `"resolving an address"`.
        state: &'static str,
        /// The event that came.
        event: EventKind,
        /// Its status field.
        status: i32,
    },
    /// A wait ran out of time: no event, or the kernel's own timer fired first (`ETIMEDOUT`).
    #[error("{what}: timed out after {after:?}")]
    Timeout {
        /// What was waited for, e.g. `"rdma_connect"`.
        what: &'static str,
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
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The call it was meant for.
        call: &'static str,
        /// What is wrong.
        reason: String,
    },
}

impl Error {
    /// The `errno` behind this error, when there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Cm { errno, .. } | Error::AddressResolution { errno, .. } | Error::RouteResolution { errno, .. } => {
                Some(*errno)
            }
            Error::Verbs(e) => e.errno(),
            _ => None,
        }
    }

    /// True for every timeout: a wait of ours that ran out, or the kernel reporting `ETIMEDOUT`.
    pub fn is_timeout(&self) -> bool {
        match self {
            Error::Timeout { .. } => true,
            Error::Verbs(e) => matches!(e, rdma_verbs::Error::Timeout { .. }),
            _ => self.errno() == Some(libc::ETIMEDOUT),
        }
    }

    pub(crate) fn last_os_error(call: &'static str) -> Self {
        Error::Cm { call, errno: std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO) }
    }

    pub(crate) fn invalid(call: &'static str, reason: impl Into<String>) -> Self {
        Error::InvalidArgument { call, reason: reason.into() }
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
pub(crate) fn check(call: &'static str, rc: libc::c_int) -> Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::last_os_error(call))
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
        assert!(Error::Timeout { what: "x", after: Duration::from_secs(1) }.is_timeout());
        let addr: SocketAddr = "10.0.0.1:1".parse().unwrap();
        assert!(Error::AddressResolution { addr, errno: libc::ETIMEDOUT }.is_timeout());
        assert!(!Error::AddressResolution { addr, errno: libc::ENODEV }.is_timeout());
        assert!(!Error::NoListener { addr }.is_timeout());
    }
}
