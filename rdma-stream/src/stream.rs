//! [`Stream`]: one connection's two byte streams, read and written like a `TcpStream`.

use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rdma_cm::{CmId, ConnParams, Connecting, RouteResolved};
use rdma_verbs::{AccessFlags, Deadline};

use crate::build::{Half, Rest};
use crate::link::{ReadOutcome, Shared};
use crate::{Options, Result};

/// A connected byte stream over RDMA: reliable, ordered, both directions independent.
///
/// Bytes go as RC SENDs into receive buffers the peer posted, with credits carried in each
/// message's immediate value, so a writer never sends what the peer has no buffer for
/// (docs/stream.md). It is `Read + Write` (also through `&Stream`, so that one thread reads
/// while another writes), and with the feature `tokio` `AsyncRead + AsyncWrite`
/// (`into_split` gives halves for two tasks). Its async waits stay registered with the runtime
/// they first ran on, as tokio's own IO types do: use a stream within one runtime.
///
/// What a user of `TcpStream` relies on holds:
/// - a `write` takes bytes while the peer's window has room and blocks (or is `Pending`) only
///   while it is full; small writes made while half the window or less is open are sent
///   together, and so are the pieces of one vectored write (`write_vectored`, which hyper and
///   h2 use for a frame's header and payload) that fit in one message;
/// - bytes written go when the window allows, at the latest when this side next reads (and
///   finds nothing), writes, flushes, shuts down or drops the stream: there is no background
///   thread, so a program that waits for an answer elsewhere must [`flush`](Write::flush)
///   first, which waits until everything written has been handed to the device;
/// - [`shutdown_write`](Self::shutdown_write) ends this direction: the peer reads every byte
///   written, then end of file, and may go on writing;
/// - a peer that disconnects or fails ends every wait at once with an error (end of file when it
///   had ended its direction first); a peer host that vanishes without a disconnect is noticed
///   by a write (its send times out), not by a read alone: bound such reads with a timeout;
/// - every blocking wait has a timeout option ([`set_read_timeout`](Self::set_read_timeout),
///   [`set_write_timeout`](Self::set_write_timeout)).
///
/// Dropping the stream sends what credits allow, waits up to the drain timeout
/// ([`Options::drain_timeout`]) for its messages to be acknowledged, and disconnects. Bytes a
/// full window still held back are lost: call [`flush`](Write::flush) (or shut down and read to
/// the end) to know they went. Dropped inside a tokio runtime (feature `tokio`), the stream
/// hands that wait to a task of the runtime and returns at once; elsewhere the drop blocks its
/// thread for it.
pub struct Stream {
    pub(crate) shared: Arc<Shared>,
    timeouts: Mutex<Timeouts>,
    /// What async reads and writes keep between their polls and their waits (in a mutex only so
    /// that the stream is `Sync`: they are reached through `&mut self`, never locked).
    #[cfg(feature = "tokio")]
    pub(crate) read_wait: Mutex<crate::wait::AsyncWait>,
    #[cfg(feature = "tokio")]
    pub(crate) write_wait: Mutex<crate::wait::AsyncWait>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Timeouts {
    read: Option<Duration>,
    write: Option<Duration>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish_non_exhaustive()
    }
}

impl Stream {
    pub(crate) fn from_shared(shared: Arc<Shared>) -> Stream {
        Stream {
            shared,
            timeouts: Mutex::new(Timeouts::default()),
            #[cfg(feature = "tokio")]
            read_wait: Mutex::default(),
            #[cfg(feature = "tokio")]
            write_wait: Mutex::default(),
        }
    }

    /// Connects to a [`Listener`](crate::Listener) at `addr` with the default [`Options`]:
    /// a [`Connect`] to `.wait(timeout)` for, or (feature `tokio`) to `.await`.
    ///
    /// # Errors
    /// When waited for: [`Error::Cm`](crate::Error::Cm) when the address does not resolve,
    /// nothing listens, or the peer rejects; [`Error::NotAStream`](crate::Error::NotAStream)
    /// when the peer is no stream; [`Error::Options`](crate::Error::Options) and
    /// [`Error::Verbs`](crate::Error::Verbs) when the device cannot hold the buffers.
    ///
    /// # References
    /// - [`rdma_resolve_addr(3)`](https://man7.org/linux/man-pages/man3/rdma_resolve_addr.3.html)
    /// - [`rdma_connect(3)`](https://man7.org/linux/man-pages/man3/rdma_connect.3.html)
    #[doc(alias = "rdma_connect")]
    pub fn connect(addr: SocketAddr) -> Connect {
        Self::connect_with(addr, None, &Options::default())
    }

    /// [`connect`](Self::connect) from the local address `from` (its RDMA device carries the
    /// connection; `None`: the route's), with `options`.
    pub fn connect_with(addr: SocketAddr, from: Option<SocketAddr>, options: &Options) -> Connect {
        Connect { addr, from, options: options.clone() }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.shared.conn.peer_addr()
    }

    /// This side's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.conn.local_addr()
    }

    /// Ends this direction (a half-close, `shutdown(SHUT_WR)`): the peer reads what was
    /// written, then end of file. Later writes fail with `BrokenPipe`; reads go on.
    ///
    /// Blocks, as a [`flush`](Write::flush) does, until what was written and the end have
    /// been handed to the device (within the write timeout): the end waits for the peer's
    /// window like data, and this side has no thread of its own that would send it later, so
    /// a thread that shut down and then waited elsewhere for the peer would wait for ever.
    ///
    /// # Errors
    /// The stream's failure; `TimedOut` when the write timeout passed first (the end still
    /// goes with the next call that finds credits for it).
    pub fn shutdown_write(&self) -> io::Result<()> {
        self.shared.state.lock().shutdown();
        self.flush_blocking()
    }

    /// The bound of each blocking read (`None`, the default: none). A read that times out
    /// fails with `TimedOut` and loses nothing.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) {
        self.timeouts.lock().read = timeout;
    }

    /// The bound of each blocking write and flush (`None`, the default: none).
    pub fn set_write_timeout(&self, timeout: Option<Duration>) {
        self.timeouts.lock().write = timeout;
    }

    fn deadline(timeout: Option<Duration>) -> Deadline {
        timeout.map_or_else(Deadline::never, Deadline::after)
    }

    fn read_blocking(&self, buf: &mut [u8]) -> io::Result<usize> {
        let until = Self::deadline(self.timeouts.lock().read);
        self.shared.wait_blocking(until, "a read", |st| match st.read(buf) {
            Ok(ReadOutcome::Read(n)) => Some(Ok(n)),
            Ok(ReadOutcome::Empty) => None,
            Err(e) => Some(Err(e)),
        })
    }

    fn write_blocking(&self, buf: &[u8]) -> io::Result<usize> {
        let until = Self::deadline(self.timeouts.lock().write);
        self.shared.wait_blocking(until, "a write", |st| st.write(buf).transpose())
    }

    fn write_vectored_blocking(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        let until = Self::deadline(self.timeouts.lock().write);
        self.shared.wait_blocking(until, "a write", |st| st.write_vectored(bufs).transpose())
    }

    fn flush_blocking(&self) -> io::Result<()> {
        let until = Self::deadline(self.timeouts.lock().write);
        self.shared.wait_blocking(until, "a flush", |st| match st.flushed() {
            Ok(true) => Some(Ok(())),
            Ok(false) => None,
            Err(e) => Some(Err(e)),
        })
    }
}

impl Drop for Stream {
    /// Closes the stream (see the type's docs); inside a tokio runtime on a task of that
    /// runtime, once every handle (the stream, its write half) is dropped.
    fn drop(&mut self) {
        #[cfg(feature = "tokio")]
        self.shared.release_handle();
    }
}

impl Read for &Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_blocking(buf)
    }
}

impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_blocking(buf)
    }

    /// Takes the pieces in order into the same messages (see [`Stream`]).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.write_vectored_blocking(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_blocking()
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_blocking(buf)
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_blocking(buf)
    }

    /// Takes the pieces in order into the same messages (see [`Stream`]).
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.write_vectored_blocking(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_blocking()
    }
}

/// A connect in progress ([`Stream::connect`]): `.wait(timeout)` blocks for it, `.await` (feature
/// `tokio`) awaits it. Nothing is sent before then.
#[derive(Debug)]
#[must_use = "a connect does nothing until it is waited for or awaited"]
pub struct Connect {
    addr: SocketAddr,
    from: Option<SocketAddr>,
    options: Options,
}

impl Connect {
    /// Resolves, connects and builds the stream, blocking the thread, all within `until` (a
    /// timeout from now, or a [`Deadline`]).
    ///
    /// # Errors
    /// As [`Stream::connect`]; [`Error::Cm`](crate::Error::Cm) with a timeout when `until`
    /// passed.
    pub fn wait(self, until: impl Into<Deadline>) -> Result<Stream> {
        let until = until.into();
        let id = CmId::new()?.resolve(self.from, self.addr).wait(until)?;
        let (connecting, rest) = self.start(id)?;
        Ok(Stream::from_shared(rest.establish(connecting.wait(until)?)?))
    }

    /// [`wait`](Self::wait) on the current tokio runtime, all within `until`. Dropping the
    /// future before it completes abandons the connect and frees what it made.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    #[cfg(feature = "tokio")]
    pub async fn wait_async(self, until: impl Into<Deadline>) -> Result<Stream> {
        let until = until.into();
        let id = CmId::new()?.resolve(self.from, self.addr).wait_async(until).await?;
        let (connecting, rest) = self.start(id)?;
        Ok(Stream::from_shared(rest.establish(connecting.wait_async(until).await?)?))
    }

    /// This side's queue pair with its receives posted, and the connect that carries its hello.
    fn start(&self, id: CmId<RouteResolved>) -> Result<(Connecting<'static>, Rest)> {
        let half = Half::new(
            id.device_name(),
            || id.open_context(),
            |qp| id.init_qp(qp, AccessFlags::empty()),
            &self.options,
        )?;
        let hello = half.hello().encode();
        let (qp, rest) = half.take_qp();
        Ok((id.connect(qp, &ConnParams::new().private_data(&hello)), rest))
    }
}

#[cfg(feature = "tokio")]
impl std::future::IntoFuture for Connect {
    type Output = Result<Stream>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Stream>> + Send>>;

    /// Awaits the connect within the options' connect timeout.
    fn into_future(self) -> Self::IntoFuture {
        let until = Deadline::after(self.options.connect_timeout);
        Box::pin(self.wait_async(until))
    }
}
