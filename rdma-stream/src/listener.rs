//! [`Listener`]: accepts streams, like a `TcpListener`.

use std::net::SocketAddr;
use std::os::fd::AsFd;

use rdma_cm::{Accepting, ConnParams, ConnectRequest};
use rdma_verbs::{AccessFlags, Deadline};

use crate::build::{Half, Rest};
use crate::wire::Hello;
use crate::{Options, Result, Stream};

/// The private data of the rejection a connect request without a stream's hello gets.
const NOT_A_STREAM: &[u8] = b"rdma-stream: no hello";
/// The private data of the rejection a hello whose window or message size no stream can have
/// gets.
const OUT_OF_RANGE: &[u8] = b"rdma-stream: hello out of range";

/// Listens for streams on an address: each [`accept`](Self::accept) gives the next connected
/// [`Stream`].
///
/// A connect request that is not a stream's (no hello of this version in its private data, or
/// one with a window or message size out of range) is rejected and the accept goes on
/// waiting. Dropping the listener rejects the requests it had not accepted.
pub struct Listener {
    inner: rdma_cm::Listener,
    options: Options,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("local", &self.local_addr()).finish_non_exhaustive()
    }
}

impl Listener {
    /// Listens on `addr` (an address of an RDMA device's interface; port 0 picks one) with
    /// the default [`Options`].
    ///
    /// # Errors
    /// [`Error::Cm`](crate::Error::Cm) when the address cannot be bound or listened on.
    ///
    /// # References
    /// - [`rdma_listen(3)`](https://man7.org/linux/man-pages/man3/rdma_listen.3.html)
    #[doc(alias = "rdma_listen")]
    pub fn bind(addr: SocketAddr) -> Result<Listener> {
        Self::bind_with(addr, &Options::default())
    }

    /// [`bind`](Self::bind) with `options` for every stream it accepts.
    ///
    /// # Errors
    /// As [`bind`](Self::bind); [`Error::Options`](crate::Error::Options) for options no stream
    /// can have.
    pub fn bind_with(addr: SocketAddr, options: &Options) -> Result<Listener> {
        options.check()?;
        Ok(Listener { inner: rdma_cm::Listener::bind(addr, 128)?, options: options.clone() })
    }

    /// The address listened on (with the port picked, if it was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }

    /// The next stream: an [`Accept`] to `.wait(timeout)` for, or (feature `tokio`) to
    /// `.await`.
    ///
    /// # Errors
    /// When waited for: [`Error::Cm`](crate::Error::Cm) when the CM fails or the handshake
    /// of the request taken does not complete (within the options' connect timeout);
    /// [`Error::Options`](crate::Error::Options) and [`Error::Verbs`](crate::Error::Verbs) when
    /// the device cannot hold the stream's buffers (the request is rejected). Later accepts
    /// take the next requests.
    ///
    /// # References
    /// - [`rdma_get_cm_event(3)`](https://man7.org/linux/man-pages/man3/rdma_get_cm_event.3.html)
    /// - [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
    #[doc(alias = "rdma_accept")]
    pub fn accept(&self) -> Accept<'_> {
        Accept { listener: self }
    }

    /// The accept of `req` with this side's queue pair and hello; `None` when `req` is no
    /// stream's (it is rejected). A request this side cannot build a stream for is rejected too.
    fn answer(&self, req: ConnectRequest) -> Result<Option<(Accepting<'static>, Rest)>> {
        match Hello::decode(req.private_data()) {
            None => {
                let _ = req.reject(NOT_A_STREAM);
                return Ok(None);
            }
            // Refused before any buffer is made for it, and the accept goes on waiting.
            Some(hello) if !hello.in_range() => {
                let _ = req.reject(OUT_OF_RANGE);
                return Ok(None);
            }
            Some(_) => {}
        }
        let half = Half::new(
            req.device_name(),
            || req.open_context(),
            |qp| req.init_qp(qp, AccessFlags::empty()),
            &self.options,
        );
        let half = match half {
            Ok(half) => half,
            Err(e) => {
                let _ = req.reject(NOT_A_STREAM);
                return Err(e);
            }
        };
        let hello = half.hello().encode();
        let (qp, rest) = half.take_qp();
        Ok(Some((req.accept(qp, &ConnParams::new().private_data(&hello)), rest)))
    }
}

impl AsFd for Listener {
    /// The CM event channel's fd: readable when a request (or another CM event) is waiting.
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.inner.as_fd()
    }
}

/// An accept in progress ([`Listener::accept`]).
#[derive(Debug)]
#[must_use = "an accept does nothing until it is waited for or awaited"]
pub struct Accept<'a> {
    listener: &'a Listener,
}

impl Accept<'_> {
    /// Waits, blocking, for the next stream's request until `until`, then completes its
    /// handshake within the options' connect timeout. Handshakes go one at a time: a client
    /// that sends its request and then stalls holds the accept up to that timeout. A server
    /// that must not wait on one slow client accepts with `tonic::Incoming` (feature `tonic`),
    /// which runs handshakes side by side.
    ///
    /// # Errors
    /// As [`Listener::accept`]; [`Error::Cm`](crate::Error::Cm) with a timeout when no request
    /// came before `until`.
    pub fn wait(self, until: impl Into<Deadline>) -> Result<Stream> {
        let until: Deadline = until.into();
        let listener = self.listener;
        loop {
            let req = listener.inner.recv_request(until.remaining())?;
            if let Some((accepting, rest)) = listener.answer(req)? {
                let conn = accepting.wait(listener.options.connect_timeout)?;
                return Ok(Stream::from_shared(rest.establish(conn)?));
            }
        }
    }

    /// [`wait`](Self::wait) on the current tokio runtime, without a deadline for the request.
    ///
    /// Not cancel-safe once a request was taken: dropping the future while its handshake runs
    /// drops that connection (the client sees it fail). `tonic::Incoming` (feature `tonic`)
    /// keeps one accept future across its polls, so it loses none.
    ///
    /// # Errors
    /// As [`wait`](Self::wait).
    #[cfg(feature = "tokio")]
    pub async fn wait_async(self) -> Result<Stream> {
        self.listener.next_handshake().await?.finish().await
    }
}

/// A stream's request answered, its handshake not yet complete.
#[cfg(feature = "tokio")]
pub(crate) struct Handshake {
    accepting: Accepting<'static>,
    rest: Rest,
    timeout: std::time::Duration,
}

#[cfg(feature = "tokio")]
impl Listener {
    /// Waits for the next stream's request and answers it (requests that are no stream's are
    /// rejected on the way).
    pub(crate) async fn next_handshake(&self) -> Result<Handshake> {
        loop {
            let req = self.inner.recv_request_async().await?;
            if let Some((accepting, rest)) = self.answer(req)? {
                return Ok(Handshake { accepting, rest, timeout: self.options.connect_timeout });
            }
        }
    }
}

#[cfg(feature = "tokio")]
impl Handshake {
    /// Waits, within the options' connect timeout, for the handshake to complete; the stream.
    pub(crate) async fn finish(self) -> Result<Stream> {
        let conn = self.accepting.wait_async(self.timeout).await?;
        Ok(Stream::from_shared(self.rest.establish(conn)?))
    }
}

#[cfg(feature = "tokio")]
impl<'a> std::future::IntoFuture for Accept<'a> {
    type Output = Result<Stream>;
    type IntoFuture = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Stream>> + Send + 'a>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.wait_async())
    }
}
