//! File transfer over RDMA: a Send/Recv control plane (HELLO, GRANT, CREDIT, FIN, ACK) and a
//! pipelined one-sided RDMA WRITE data plane.
//!
//! # Quick start
//!
//! A receiver serving a directory on a thread of its own, and a send to it (more, and the
//! async forms, in [`driver`]):
//!
//! ```no_run
//! # #[cfg(feature = "driver")]
//! # fn main() -> Result<(), rdma_proto::driver::Error> {
//! use rdma_proto::driver::{send_file, ReceiveOptions, SendOptions, Server};
//!
//! let (addr, mut opts) = ("10.0.0.1:7471".parse().unwrap(), ReceiveOptions::default());
//! opts.dir = Some("/srv/incoming".into());
//! let server = Server::bind(addr, opts)?;
//! std::thread::spawn(move || server.serve(None, |r| println!("{}: {:?}", r.peer, r.result)));
//!
//! let report = send_file("data.bin".as_ref(), &SendOptions::new(addr), |_done, _total| {})?;
//! println!("sent {} bytes in {:?}", report.bytes, report.total);
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "driver"))]
//! # fn main() {}
//! ```
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
//! The wire format and both state diagrams are in the workspace's [`docs/protocol.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/protocol.md).
//!
//! The crate has no `unsafe` code: verbs calls are `rdma-verbs`' and `rdma-cm`'s, POSIX calls
//! are rustix's.
#![forbid(unsafe_code)]

/// A decision's log line: through `tracing` when the driver is built; the core alone has no
/// logger, and says nothing.
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {{
        #[cfg(feature = "driver")]
        tracing::$level!($($arg)*);
    }};
}

pub mod auth;
pub mod digest;
pub mod name;
mod outbox;
pub mod policy;
pub mod receiver;
pub mod seal;
pub mod sender;
pub mod status;
pub mod wire;

#[cfg(feature = "driver")]
pub mod driver;

pub use digest::Digest;
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
    /// The sender kept a pace below the receiver's floor (`ReceiverConfig::min_rate`): it
    /// brought `bytes` in `over` of its own time. The receiver ends the session with an ACK
    /// [`Status::Busy`] saying so, and keeps a resumable partial.
    #[error("the sender brought {bytes} bytes in {over:?}, below the floor of {min_rate} bytes/s")]
    TooSlow {
        /// Bytes (and entry credits) brought in the window judged.
        bytes: u64,
        /// The peer's time in that window.
        over: Duration,
        /// The floor, in bytes per second.
        min_rate: u64,
    },
    /// A newer sender took this session's place (every one being taken), this session
    /// progressing below its fair share of the receiver's rate
    /// ([`Receiver::give_way`](crate::receiver::Receiver::give_way)). The receiver ends the
    /// session with an ACK [`Status::Busy`] that says when to come back, and keeps a
    /// resumable partial.
    #[error("a newer sender took this session's place: it progressed below its fair share")]
    Displaced,
    /// With a secret, a control message arrived whose seal is wrong: changed on the path, or
    /// not from the peer that proved the secret. The session ends without a verdict, as when
    /// the connection is cut, and a receiver keeps its resumable partial: someone on the path
    /// can end a session, but not make the receiver throw away what it holds, nor give the
    /// sender a verdict that stops its retries (a [`Status::ProtocolMismatch`] would: a sender
    /// with retries gives up on it).
    #[error("a message whose seal is wrong: changed on the path, or not from the peer that proved the secret")]
    Unsealed,
    /// The receiver's device completed a WRITE with immediate a second time: the chunk that
    /// arrived last came again. Linux 6.1's rxe does so under load, when it executes a
    /// retransmitted WRITE it had already completed ([`docs/testing.md`, Known limits](https://github.com/rdma-rs/rdma-rs/blob/main/docs/testing.md#known-limits)); a peer
    /// that sends a chunk twice looks the same, and loses only its own session. The receiver
    /// ends the session without a verdict (the connection, not the sender, failed), so that a
    /// sender with retries sends again and resumes.
    #[error(
        "the device completed chunk {chunk} a second time (a retransmitted WRITE executed twice); \
         the session ends without a verdict, for the sender to send again"
    )]
    CompletedTwice {
        /// The chunk's number.
        chunk: u64,
    },
    /// The sender cancelled the transfer (a CANCEL, [`wire::caps::CANCEL`]): no verdict, and a
    /// receiver keeps its resumable partial, as when the connection is cut.
    #[error("the sender cancelled the transfer")]
    Cancelled,
}

/// When a machine's timer fires: `timeout` after its last progress, or never (`None`) when that
/// instant cannot be represented (`Duration::MAX`, say). The machines report it through
/// `poll_timeout`, as quinn-proto reports its timers: they keep no deadline type of their own.
/// The workspace's deadline for blocking waits is `rdma_verbs::Deadline`, with the same rule.
pub(crate) fn timer(progress: std::time::Instant, timeout: std::time::Duration) -> Option<std::time::Instant> {
    progress.checked_add(timeout)
}
