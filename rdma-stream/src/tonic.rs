//! tonic (gRPC) over the stream (feature `tonic`).
//!
//! - **server**: [`Incoming`] is a listener's accepted streams as a `futures_core::Stream`,
//!   which `Server::builder()...serve_with_incoming(incoming)` serves; every [`Stream`] is
//!   tonic's [`Connected`], so `Request::remote_addr()` and `local_addr()` give the
//!   connection's addresses as they do over TCP.
//! - **client**: `Endpoint::connect_with_connector(Connector::new())` with the
//!   [`Connector`](crate::hyper::Connector) of [`crate::hyper`]: the endpoint's
//!   URI (`http://IP:PORT`) names the server's RDMA address. The endpoint's own settings
//!   (timeouts, HTTP/2 windows, keep-alive) apply as over TCP.
//!
//! # Rules
//! - A tokio runtime with IO and time enabled (`Builder::enable_all`, or `#[tokio::main]`),
//!   current-thread or multi-thread, runs the server and the channel: tonic spawns each
//!   connection's task on it.
//! - tonic's channel speaks HTTP/2 without TLS ("h2c"): `http://` endpoints.
//! - An accept that fails (a peer that gave up during the handshake, a device error) is an
//!   `Err` item of [`Incoming`]: tonic's server skips it and accepts the next, as it does
//!   for TCP. Handshakes run side by side, so a stalled client delays no other.
//!
//! # Example
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use rdma_stream::hyper::Connector;
//! use rdma_stream::tonic::Incoming;
//! use rdma_stream::Listener;
//! use tonic::transport::{Endpoint, Server};
//! # let routes = tonic::service::Routes::default();
//!
//! // The server: any tonic service, on the connections the listener accepts.
//! let incoming = Incoming::new(Listener::bind("10.77.0.1:50051".parse()?)?);
//! tokio::spawn(Server::builder().add_routes(routes).serve_with_incoming(incoming));
//!
//! // The client: a channel to it, for any generated or hand-written client.
//! let channel = Endpoint::from_static("http://10.77.0.1:50051").connect_with_connector(Connector::new()).await?;
//! # let _ = channel;
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::tonic::transport::server::{Connected, TcpConnectInfo};

use crate::listener::Handshake;
use crate::{Listener, Stream};

/// The streams a [`Listener`] accepts, one item per accept, for tonic's
/// `serve_with_incoming` (or any consumer of a `futures_core::Stream`).
///
/// Handshakes run side by side, up to [`MAX_HANDSHAKES`] at a time, and each stream is handed
/// out as soon as its own completes: a client that sends its request and then stalls holds
/// only its own place (up to the listener's connect timeout), never the clients behind it.
/// Requests beyond that bound wait in the CM's backlog.
///
/// Never ends: an accept that fails is an `Err` item, and the next poll accepts again. The
/// listener closes when the `Incoming` is dropped (the server's end).
pub struct Incoming {
    listener: Arc<Listener>,
    /// Waiting for the next request, and answering it.
    next: Option<BoxFuture<crate::Result<Handshake>>>,
    /// Requests answered, their handshakes under way.
    handshakes: Vec<BoxFuture<crate::Result<Stream>>>,
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// How many handshakes an [`Incoming`] runs at a time: each holds a queue pair and its
/// receive buffers until it completes or times out.
pub const MAX_HANDSHAKES: usize = 32;

impl Incoming {
    /// Accepts on `listener`.
    pub fn new(listener: Listener) -> Incoming {
        Incoming { listener: Arc::new(listener), next: None, handshakes: Vec::new() }
    }

    /// The listener's address.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr()
    }
}

impl From<Listener> for Incoming {
    fn from(listener: Listener) -> Incoming {
        Incoming::new(listener)
    }
}

impl fmt::Debug for Incoming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Incoming").field("local_addr", &self.local_addr()).finish_non_exhaustive()
    }
}

impl ::futures_core::Stream for Incoming {
    type Item = io::Result<Stream>;

    /// The next accepted stream. Cancel-safe: handshakes in progress when the caller stops
    /// polling stay in the `Incoming` and complete on later polls.
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<io::Result<Stream>>> {
        let this = self.get_mut();
        loop {
            for i in 0..this.handshakes.len() {
                if let Poll::Ready(result) = this.handshakes[i].as_mut().poll(cx) {
                    drop(this.handshakes.swap_remove(i));
                    return Poll::Ready(Some(result.map_err(Into::into)));
                }
            }
            if this.handshakes.len() >= MAX_HANDSHAKES {
                return Poll::Pending;
            }
            let listener = Arc::clone(&this.listener);
            let next = this.next.get_or_insert_with(|| Box::pin(async move { listener.next_handshake().await }));
            match next.as_mut().poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(handshake)) => {
                    this.next = None;
                    this.handshakes.push(Box::pin(handshake.finish()));
                }
                Poll::Ready(Err(e)) => {
                    this.next = None;
                    return Poll::Ready(Some(Err(e.into())));
                }
            }
        }
    }
}

/// The connection's addresses, as tonic reports a TCP connection's: a request's
/// `remote_addr()` is the peer's RDMA address.
impl Connected for Stream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        TcpConnectInfo { local_addr: Some(self.local_addr()), remote_addr: Some(self.peer_addr()) }
    }
}
