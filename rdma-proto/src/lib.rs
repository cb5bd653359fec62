//! File transfer over RDMA: a Send/Recv control plane (HELLO, GRANT, CREDIT, FIN, ACK) and a
//! pipelined one-sided RDMA WRITE data plane.
//!
//! The crate has two layers, after quinn-proto and quinn:
//! - **the protocol core**, with no I/O and no clock: the wire codec ([`wire`]), the
//!   [`Status`] an ACK carries, name checks ([`name`]), and the [`sender`] and [`receiver`]
//!   state machines. They take inputs (a message arrived, a WRITE completed, a chunk was read or
//!   stored, time passed) and queue actions. Every protocol rule lives here and is tested
//!   without a device. Build it alone with `default-features = false`: no libibverbs needed.
//! - **the driver** (feature `driver`, on by default): runs the machines over `rdma-cm`
//!   connections with `rdma-verbs`' slot pools, send queues and receive rings, and the files.
//!
//! The wire format and both state diagrams are in the workspace's `docs/protocol.md`.

pub mod name;
mod outbox;
pub mod receiver;
pub mod sender;
pub mod status;
pub mod wire;

#[cfg(feature = "driver")]
pub mod driver;

pub use status::Status;

use std::time::Duration;

/// How a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The receiver's verdict was sent (receiver) or received (sender).
    Acked {
        /// The verdict.
        status: Status,
        /// Its detail text.
        detail: String,
    },
    /// The session failed without a verdict from the receiver (sender) or on an error the
    /// receiver reported with an ACK if it could.
    Failed(ProtocolError),
}

/// Why a session failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtocolError {
    /// A message could not be decoded.
    #[error("malformed message: {0}")]
    Wire(#[from] wire::WireError),
    /// The peer broke the protocol (a message or WRITE out of order, bad fields).
    #[error("the peer broke the protocol: {0}")]
    Peer(String),
    /// A phase made no progress in time.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// What did not come.
        waiting_for: &'static str,
        /// The phase's timeout.
        after: Duration,
    },
    /// This side failed (bad arguments, I/O, a driver error).
    #[error("{0}")]
    Local(String),
}

/// `now + timeout`, for any `timeout`: one too far to represent (`Duration::MAX`, say) is a
/// century, which no transfer waits out.
pub(crate) fn deadline_after(now: std::time::Instant, timeout: std::time::Duration) -> std::time::Instant {
    const CENTURY: std::time::Duration = std::time::Duration::from_secs(100 * 365 * 24 * 3600);
    now.checked_add(timeout.min(CENTURY)).unwrap_or(now)
}
