//! The driver: runs the [`sender`](crate::sender) and [`receiver`](crate::receiver) machines
//! over `rdma-cm` connections, with `rdma-verbs`' slot pools, send queue and receive ring, and
//! the files.
//!
//! - [`send_file`] connects to a receiver and sends one file, blocking the calling thread.
//! - [`Server`] listens and serves senders, each connection on its own thread with its own
//!   context, PD, queues and memory budget (`'static` resources shared by `Arc`).
//! - With the feature `tokio`: `send_file_async` and `Server::serve_async`, the same sessions
//!   as tasks of the caller's runtime (many transfers on one thread, none started by the
//!   library). Both forms are one body: only where it waits differs (a blocking call, or the
//!   same call's async form awaited on the reactor).
//!
//! Every wait is bounded: connection setup by `connect_timeout`, each protocol phase by the
//! machines' `timeout` (no progress for that long ends the session). An idle session sleeps
//! until a completion, its connection's CM event, a [`Flag`] ([`SendOptions::cancel`],
//! [`ReceiveOptions::stop`]) or its machine's next deadline: it costs nothing while it waits.
//!
//! For an application: [`Progress`] reports each chunk on either side
//! ([`ReceiveOptions::progress`], and `send_file`'s callback); [`SendOptions::cancel`] ends a
//! send from another thread or task ([`Error::Cancelled`]; the receiver keeps what it stored for
//! a resume); a [`ReceiveReport`]'s `result` is `Ok(())` only for a stored file, and a refusal is
//! [`Error::Refused`] with its status ([`ReceiveReport::status`]).
//!
//! # Embedding
//! A receiver in an application, serving on a thread of its own, and a sender:
//! ```no_run
//! use std::net::SocketAddr;
//! use std::path::Path;
//! use rdma_proto::driver::{send_file, ReceiveOptions, SendOptions, Server};
//!
//! # fn main() -> Result<(), rdma_proto::driver::Error> {
//! let mut opts = ReceiveOptions::default();
//! opts.dir = Some("/srv/incoming".into());
//! let server = Server::bind("10.0.0.1:7471".parse().unwrap(), opts)?;
//! std::thread::spawn(move || {
//!     // Forever: each session on a thread of its own; `report` is called as each ends.
//!     server.serve(None, |r| println!("{}: {:?}", r.peer, r.result))
//! });
//!
//! let to: SocketAddr = "10.0.0.1:7471".parse().unwrap();
//! let report = send_file(Path::new("data.bin"), &SendOptions::new(to), |done, total| {
//!     eprint!("\r{done}/{total}");
//! })?;
//! println!("sent {} bytes in {:?}", report.bytes, report.total);
//! # Ok(())
//! # }
//! ```
//! The same from async code (feature `tokio`), several transfers on one runtime:
//! ```no_run
//! # #[cfg(feature = "tokio")]
//! # async fn f() -> Result<(), rdma_proto::driver::Error> {
//! use std::path::PathBuf;
//! use rdma_proto::driver::{send_file_async, ReceiveOptions, SendOptions, Server};
//!
//! let server = Server::bind("10.0.0.1:7471".parse().unwrap(), ReceiveOptions::default())?;
//! let serving = tokio::spawn(async move { server.serve_async(None, |r| println!("{r:?}")).await });
//!
//! let opts = SendOptions::new("10.0.0.1:7471".parse().unwrap());
//! let sends: Vec<_> = ["a.bin", "b.bin"]
//!     .into_iter()
//!     .map(|name| {
//!         let (path, opts) = (PathBuf::from(name), opts.clone());
//!         tokio::spawn(async move { send_file_async(&path, &opts, |_, _| {}).await })
//!     })
//!     .collect();
//! for s in sends {
//!     let report = s.await.expect("the task panicked")?;
//!     println!("sent {} bytes", report.bytes);
//! }
//! serving.abort();
//! # Ok(())
//! # }
//! ```

mod batch;
mod digest;
mod files;
mod flag;
mod io;
mod link;
mod partials;
mod probe;
mod recv;
mod retry;
mod send;

pub use crate::policy::{Decision, Offer, Policy};
pub use digest::fastest_digest;
pub use flag::Flag;
pub use recv::{EntryCounts, EntryReport, ReceiveOptions, ReceiveReport, Server, REPORTED_ENTRIES};

/// A progress callback: called with the bytes of the file done so far and its size, as each
/// chunk completes (the sender: its WRITE completed; the receiver: it was stored), bytes held
/// from an interrupted transfer included. Cheap to clone.
#[derive(Clone)]
pub struct Progress(std::sync::Arc<dyn Fn(&ProgressEvent<'_>) + Send + Sync>);

/// What a [`Progress`] callback is told.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ProgressEvent<'a> {
    /// The session id.
    pub session: u64,
    /// The file's name (as the receiver stores it).
    pub name: &'a str,
    /// Bytes done: written (sender) or stored (receiver), held ones included.
    pub done: u64,
    /// The file's size.
    pub size: u64,
}

impl Progress {
    /// A callback.
    pub fn new(f: impl Fn(&ProgressEvent<'_>) + Send + Sync + 'static) -> Self {
        Progress(std::sync::Arc::new(f))
    }

    pub(crate) fn call(&self, event: &ProgressEvent<'_>) {
        (self.0)(event)
    }
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Progress(..)")
    }
}
#[cfg(feature = "tokio")]
pub use batch::send_files_async;
pub use batch::{send_files, BatchReport, SentEntry};
#[cfg(feature = "tokio")]
pub use send::send_file_async;
#[cfg(feature = "fault-injection")]
pub use send::AfterFin;
pub use send::{send_file, SendOptions, SendReport};

use std::time::Duration;

use crate::{ProtocolError, Status};

/// Why a transfer failed (on either side).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Setting up or running the connection failed.
    #[error("connection: {0}")]
    Cm(#[from] rdma_cm::Error),
    /// A verbs call failed.
    #[error("RDMA: {0}")]
    Verbs(#[from] rdma_verbs::Error),
    /// Connecting to the receiver failed: resolving `to` (leaving from `from`, any local
    /// address when `None`) or connecting to it. `source` says why, and so whose the fault is:
    /// a source address that cannot be used, a destination that does not resolve, no listener
    /// there, a rejection, or (a timeout) nothing that answered from `to`.
    #[error("connecting to {to} from {}: {source}{}", From(*from), Silent(source))]
    Connect {
        /// The local address asked for, if any.
        from: Option<std::net::SocketAddr>,
        /// The receiver's address.
        to: std::net::SocketAddr,
        /// The CM's error (boxed: the addresses already make this variant large).
        source: Box<rdma_cm::Error>,
    },
    /// A local file could not be read.
    #[error("{path}: {source}")]
    File {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file changed while it was being sent (rewritten, truncated, appended to, or its
    /// status changed): what was read may mix two versions, so nothing was committed.
    #[error("{path} changed while it was being sent ({what}); nothing was stored: send it again")]
    SourceChanged {
        /// The file.
        path: String,
        /// What changed.
        what: String,
    },
    /// The protocol ended without the receiver's verdict.
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    /// The receiver's verdict was not OK (on the sender: what it was told; in a
    /// [`ReceiveReport`]: the verdict the receiver sent).
    #[error("the receiver answered: {status}{}", if detail.is_empty() { String::new() } else { format!(" ({detail})") })]
    Refused {
        /// The verdict.
        status: Status,
        /// Its detail.
        detail: String,
        /// With [`Status::Busy`], how long the receiver asked the sender to wait before it
        /// asks again ([`wire::Ack::retry_after_ms`](crate::wire::Ack::retry_after_ms)), if it
        /// said.
        retry_after: Option<Duration>,
    },
    /// The peer disconnected before the session ended (it ended the connection, or its process
    /// died and its kernel did). Whatever a request of ours failed with just before is not
    /// reported: it depends only on the moment (`RemoteAccessError` as the peer's memory went,
    /// a flush, `RetryExceeded`).
    #[error("the peer disconnected mid-transfer")]
    PeerDisconnected,
    /// The connection failed before the session ended without the peer saying it left: the
    /// peer or the path to it stopped answering (a link down, a host gone). `status` is what the
    /// device reported for the request that failed (`RetryExceeded` when the peer stopped
    /// acknowledging, `LocalQpOperationError` when rxe could not send, a flush).
    #[error("the connection was lost mid-transfer: the peer or the path to it stopped answering ({status:?})")]
    ConnectionLost {
        /// The failed request's status.
        status: rdma_verbs::WcStatus,
    },
    /// The peer broke the rules at the verbs level, so the device refused its request and the
    /// connection is in error (receiver): a Send larger than the receive buffers
    /// (`LocalLengthError`), a WRITE outside the granted memory or with a wrong rkey, a READ
    /// (the grant allows only WRITE). `event` is the responder's asynchronous event when the
    /// request consumed no receive to fail (its receives were then flushed).
    #[error("the peer's request broke the rules and was refused by the device ({status:?}{})",
        event.map(|e| format!(", {e:?}")).unwrap_or_default())]
    PeerViolation {
        /// The failed receive's status.
        status: rdma_verbs::WcStatus,
        /// The QP's error event, if one told it.
        event: Option<rdma_verbs::AsyncEvent>,
    },
    /// The caller's request cannot be carried out as given (a file name that is not a valid
    /// name, say); nothing was sent.
    #[error("{0}")]
    Usage(String),
    /// The receiver's destination directory cannot take files (it is missing, not a
    /// directory, not writable, or its file system can put a file in place neither by
    /// `renameat2(RENAME_NOREPLACE)` nor by a hard link): found when the receiver starts,
    /// before any sender's data. The sentence names the cause.
    #[error("{0}")]
    Destination(String),
    /// The receiver was asked to stop ([`ReceiveOptions::stop`]) mid-session.
    #[error("the receiver is stopping")]
    Stopped,
    /// The sender was cancelled ([`SendOptions::cancel`]) mid-session; the receiver keeps
    /// what it stored for a resume. A receiver reports it too when its sender said so (a
    /// CANCEL, [`crate::wire::caps::CANCEL`]) before it left.
    #[error("the send was cancelled")]
    Cancelled,
    /// A receiver's connection that had not proved itself (no HELLO, or a secret not yet
    /// proved) within [`ReceiveOptions::preempt_after`] gave its place to a newer connection,
    /// every place being taken; it was closed without an answer.
    #[error("the connection proved nothing within its time, and a newer one took its place")]
    Preempted,
}

impl Error {
    /// Whether the connection failed mid-session, without a verdict ([`Error::PeerDisconnected`],
    /// [`Error::ConnectionLost`]): the transfer may succeed if sent again, and a resume then
    /// sends only what the receiver lacks. [`SendOptions::retries`] sends again on these.
    /// Linux 6.1's rxe ends some connections so under load ([`docs/testing.md`, Known limits](https://github.com/rdma-rs/rdma-rs/blob/main/docs/testing.md#known-limits)).
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::PeerDisconnected | Error::ConnectionLost { .. })
    }

    /// The exit code a tool should use: the status's for a verdict ([`Status::exit_code`]),
    /// 1 for a usage error, 2 for a connection failure (or a receiver's connection
    /// [`Preempted`](Error::Preempted)), 3 for a timeout, 4 for a protocol error,
    /// 5 for a local file error (or a source that changed while it was sent), 6 when the peer
    /// left or the connection was lost, 7 when the receiver was stopped, 8 when the sender was
    /// cancelled; a peer's violation
    /// ([`Error::PeerViolation`]) is a protocol error.
    pub fn exit_code(&self) -> i32 {
        match self {
            Error::Refused { status, .. } => status.exit_code(),
            Error::Protocol(ProtocolError::Timeout { .. }) => 3,
            Error::Cm(e) if e.is_timeout() => 3,
            Error::Connect { source, .. } if source.is_timeout() => 3,
            Error::Connect { .. } => 2,
            Error::Cm(_) | Error::Verbs(_) | Error::Preempted => 2,
            Error::Protocol(_) | Error::PeerViolation { .. } => 4,
            Error::File { .. } | Error::SourceChanged { .. } | Error::Destination(_) => 5,
            Error::PeerDisconnected | Error::ConnectionLost { .. } => 6,
            Error::Usage(_) => 1,
            Error::Stopped => 7,
            Error::Cancelled => 8,
        }
    }
}

impl Error {
    /// The same failure again, for a second place to report it (a batch's entry cut by the
    /// session's end, beside the batch's own result): every variant as it is, but the errors of
    /// `rdma-cm` and `rdma-verbs` (which cannot be copied) as a CM error of the same kind (a
    /// timeout stays a timeout, naming what it named, another keeps its `errno`), so that the
    /// exit code is the same.
    pub(crate) fn again(&self) -> Error {
        let cm = |e: &rdma_cm::Error| match e {
            rdma_cm::Error::Timeout { what, device, after } => {
                rdma_cm::Error::Timeout { what, device: device.clone(), after: *after }
            }
            rdma_cm::Error::Verbs(rdma_verbs::Error::Timeout { what, after }) => {
                rdma_cm::Error::Timeout { what, device: None, after: *after }
            }
            // The kernel's timer (ETIMEDOUT): a timeout of the connection.
            e if e.is_timeout() => {
                rdma_cm::Error::Timeout { what: "the session's connection", device: None, after: Duration::ZERO }
            }
            e => rdma_cm::Error::Cm {
                verb: "the session's connection",
                device: None,
                errno: e.errno().unwrap_or(libc::EIO),
            },
        };
        match self {
            Error::Cm(e) => Error::Cm(cm(e)),
            Error::Connect { from, to, source } => {
                Error::Connect { from: *from, to: *to, source: Box::new(cm(source)) }
            }
            Error::Verbs(rdma_verbs::Error::Timeout { what, after }) => {
                Error::Cm(rdma_cm::Error::Timeout { what, device: None, after: *after })
            }
            Error::Verbs(e) => Error::Cm(rdma_cm::Error::Cm {
                verb: "the session's connection",
                device: None,
                errno: e.errno().unwrap_or(libc::EIO),
            }),
            Error::File { path, source } => {
                Error::File { path: path.clone(), source: std::io::Error::new(source.kind(), source.to_string()) }
            }
            Error::SourceChanged { path, what } => Error::SourceChanged { path: path.clone(), what: what.clone() },
            Error::Protocol(e) => Error::Protocol(e.clone()),
            Error::Refused { status, detail, retry_after } => {
                Error::Refused { status: *status, detail: detail.clone(), retry_after: *retry_after }
            }
            Error::PeerDisconnected => Error::PeerDisconnected,
            Error::ConnectionLost { status } => Error::ConnectionLost { status: *status },
            Error::PeerViolation { status, event } => Error::PeerViolation { status: *status, event: *event },
            Error::Usage(s) => Error::Usage(s.clone()),
            Error::Destination(s) => Error::Destination(s.clone()),
            Error::Stopped => Error::Stopped,
            Error::Cancelled => Error::Cancelled,
            Error::Preempted => Error::Preempted,
        }
    }
}

/// `from` of a [`Error::Connect`]: the address, or "any local address".
struct From(Option<std::net::SocketAddr>);

impl std::fmt::Display for From {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Some(a) if a.port() == 0 => write!(f, "{}", a.ip()),
            Some(a) => write!(f, "{a}"),
            None => f.write_str("any local address"),
        }
    }
}

/// What a connect timeout says of the side at fault: nothing answered from the destination.
struct Silent<'a>(&'a rdma_cm::Error);

impl std::fmt::Display for Silent<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_timeout() {
            f.write_str(" (nothing answered from the receiver's address: is its host up, and the address right?)")?;
        }
        Ok(())
    }
}

/// The exit codes of a sender's own failures ([`Error::exit_code`]), with what each means.
const TOOL_EXIT_CODES: [(i32, &str); 9] = [
    (0, "stored under its name, digest matched (a batch: every entry)"),
    (1, "bad arguments (a name that is not a valid file name, an unreadable option)"),
    (2, "connection failure (no route, refused, no RDMA device)"),
    (3, "timeout (resolving, connecting, or a phase without progress)"),
    (4, "protocol error (a malformed or out-of-place message, the peer's request refused by the device)"),
    (5, "local file error (unreadable, not a regular file, changed while it was sent)"),
    (6, "the peer disconnected or the connection was lost mid-transfer"),
    (7, "the receiver was stopped"),
    (8, "the send was cancelled"),
];

/// Every exit code a sender may give, in order, with what it means: its own failures
/// ([`Error::exit_code`], 0..=8) and the receiver's verdicts ([`Status::exit_code`], `10 +
/// code`). What a tool lists in its help, so that the codes are told from the one place that
/// defines them.
pub fn exit_codes() -> Vec<(i32, String)> {
    let tool = TOOL_EXIT_CODES.iter().map(|&(code, what)| (code, what.to_owned()));
    let refused =
        Status::ALL.into_iter().filter(|&s| s != Status::Ok).map(|s| (s.exit_code(), format!("refused: {s}")));
    tool.chain(refused).collect()
}

/// `N` random bytes from the kernel (`getrandom(2)`), for session ids and the nonces of the
/// proofs of the secret.
///
/// # Panics
/// If the kernel has no randomness to give (`getrandom` fails other than by `EINTR`, which
/// Linux >= 3.17 does not do for small requests once booted): a nonce must never be guessable.
pub(crate) fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    let mut done = 0;
    while done < N {
        match rustix::rand::getrandom(&mut b[done..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => done += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => panic!("getrandom failed: {e}"),
        }
    }
    b
}

/// Time spent in each phase of a transfer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Address and route resolution, connection setup.
    pub connect: Duration,
    /// HELLO to GRANT.
    pub grant: Duration,
    /// Sender: connecting the extra lanes the GRANT granted (zero on one lane). The data phase
    /// starts once they are up.
    pub lanes: Duration,
    /// First chunk to the last WRITE's completion (sender) or the last chunk stored (receiver).
    pub data: Duration,
    /// Sender: FIN to ACK. Receiver: the digest comparison.
    pub digest: Duration,
    /// Receiver: fsync and rename.
    pub sync_rename: Duration,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The help's table is the errors' and the statuses' own codes: every error's code is
    /// listed once, in order, and every status's verdict too.
    #[test]
    fn exit_codes_match_the_errors_and_statuses() {
        let codes = exit_codes();
        let listed: Vec<i32> = codes.iter().map(|c| c.0).collect();
        let mut sorted = listed.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(listed, sorted, "listed in order, each once");
        let errors = [
            Error::Usage(String::new()),
            Error::Preempted,
            Error::Protocol(ProtocolError::Timeout { waiting_for: "x", after: Duration::ZERO }),
            Error::Protocol(ProtocolError::Peer(String::new())),
            Error::Destination(String::new()),
            Error::PeerDisconnected,
            Error::Stopped,
            Error::Cancelled,
        ];
        for e in errors {
            assert!(listed.contains(&e.exit_code()), "{e:?}: {} is not listed", e.exit_code());
        }
        for s in Status::ALL {
            let (code, what) = codes.iter().find(|c| c.0 == s.exit_code()).expect("every status is listed");
            assert!(*code == 0 || what.contains(&s.to_string()), "{s:?}: {what}");
        }
    }

    /// A failure reported twice (a batch's cut entry, and the batch) is the same failure: the
    /// same variant and exit code.
    #[test]
    fn a_failure_again_keeps_its_type_and_exit_code() {
        let errors = [
            Error::Cancelled,
            Error::Stopped,
            Error::PeerDisconnected,
            Error::ConnectionLost { status: rdma_verbs::WcStatus::RetryExceeded },
            Error::Refused { status: Status::NoSpace, detail: "full".into(), retry_after: None },
            Error::Protocol(ProtocolError::Timeout { waiting_for: "x", after: Duration::ZERO }),
            Error::Cm(rdma_cm::Error::Timeout { what: "x", device: None, after: Duration::ZERO }),
            Error::Cm(rdma_cm::Error::Cm { verb: "x", device: None, errno: libc::ENODEV }),
            Error::File { path: "f".into(), source: std::io::ErrorKind::NotFound.into() },
        ];
        for e in errors {
            let again = e.again();
            assert_eq!(std::mem::discriminant(&again), std::mem::discriminant(&e), "{e:?}");
            assert_eq!(again.exit_code(), e.exit_code(), "{e:?}");
        }
        // A timeout again still names what timed out, and after how long.
        let source =
            Box::new(rdma_cm::Error::Timeout { what: "rdma_connect", device: None, after: Duration::from_secs(5) });
        let e = Error::Connect { from: None, to: std::net::SocketAddr::from(([10, 77, 0, 1], 7471)), source };
        assert_eq!(e.again().to_string(), e.to_string());
    }
}
