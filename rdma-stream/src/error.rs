//! [`Error`]: what building, connecting or using a stream can fail with.

use std::io;

/// The errors of this crate. Reads and writes return [`std::io::Error`]s, whose kind says
/// what a program usually branches on ([`From<Error>`](#impl-From<Error>-for-Error) maps
/// each).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The connection manager failed (resolving, connecting, accepting, its events).
    #[error(transparent)]
    Cm(#[from] rdma_cm::Error),
    /// A verb failed (registering buffers, creating the queue pair, posting, polling).
    #[error(transparent)]
    Verbs(#[from] rdma_verbs::Error),
    /// The options cannot make a stream (on this device).
    #[error("stream options: {0}")]
    Options(String),
    /// The peer is not a stream of this protocol version (its private data has no hello).
    #[error("{peer} is not an rdma-stream peer of this version (no hello in its private data)")]
    NotAStream {
        /// The peer's address.
        peer: std::net::SocketAddr,
    },
    /// The peer broke the protocol: what it did.
    #[error("the peer broke the stream protocol: {0}")]
    Protocol(&'static str),
    /// A completion reported a failure: the connection is gone.
    #[error("the connection failed: {0}")]
    Failed(String),
    /// The peer disconnected before this side's direction ended cleanly.
    #[error("the peer disconnected")]
    PeerDisconnected,
    /// A wait ran out of time.
    #[error("{what} timed out")]
    TimedOut {
        /// What was waited for.
        what: &'static str,
    },
    /// A write after this side's direction was shut down.
    #[error("write after shutdown")]
    Shutdown,
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let kind = match &e {
            Error::Cm(e) if e.is_timeout() => io::ErrorKind::TimedOut,
            Error::Cm(_) => io::ErrorKind::ConnectionRefused,
            Error::Verbs(_) | Error::Failed(_) => io::ErrorKind::ConnectionReset,
            Error::Options(_) => io::ErrorKind::InvalidInput,
            Error::NotAStream { .. } | Error::Protocol(_) => io::ErrorKind::InvalidData,
            Error::PeerDisconnected => io::ErrorKind::ConnectionReset,
            Error::TimedOut { .. } => io::ErrorKind::TimedOut,
            Error::Shutdown => io::ErrorKind::BrokenPipe,
        };
        io::Error::new(kind, e)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
