//! hyper 1.x over the stream: HTTP/1.1 and HTTP/2 clients and servers (feature `hyper`).
//!
//! hyper reads and writes through its own `hyper::rt::Read` and `Write` traits; hyper-util's
//! [`TokioIo`] turns any tokio `AsyncRead + AsyncWrite` into them. A [`Stream`] in a `TokioIo`
//! is therefore a hyper connection, as a `TcpStream` in one is:
//!
//! - **server**: accept a stream with [`Listener::accept`](crate::Listener::accept) and serve
//!   it with `hyper::server::conn::http1::Builder::serve_connection(TokioIo::new(stream), service)`
//!   (or `http2::Builder`, or hyper-util's `server::conn::auto::Builder`, which answers both);
//! - **client, one connection**: `hyper::client::conn::http1::handshake(TokioIo::new(stream))`
//!   (or `http2::handshake`) on a stream from [`Stream::connect`];
//! - **client, pooled**: hyper-util's `client::legacy::Client::builder(TokioExecutor::new())
//!   .build(Connector::new())`: the [`Connector`] opens a stream to each request URI's
//!   `host:port`, the pool reuses it. The same connector serves tonic's
//!   `Endpoint::connect_with_connector` (see [`crate::tonic`]).
//!
//! # Rules
//! - Everything here runs on a tokio runtime with IO and time enabled
//!   (`Builder::enable_all`, or `#[tokio::main]`), current-thread or multi-thread: the
//!   stream's async waits sleep on tokio's IO driver, and the connector bounds a host name's
//!   lookup with its timer.
//! - The URI's host is the peer's address on its RDMA device (an IP literal, or a name that
//!   resolves to one): RDMA connection management resolves it to a device, not a TCP socket.
//!   A URI without a port gets its scheme's (`http`: 80, `https`: 443).
//! - There is no TLS here: `http` URIs only, unless a TLS layer wraps the stream.
//! - HTTP/2 without TLS is "prior knowledge" h2c: the client must be told to speak HTTP/2
//!   (`http2::handshake`, or the pooled client's `http2_only(true)`); hyper-util's auto server
//!   tells the two apart by the connection's first bytes.
//!
//! # Example
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use rdma_stream::hyper::Connector;
//!
//! let client: Client<Connector, String> = Client::builder(TokioExecutor::new()).build(Connector::new());
//! let response = client.get("http://10.77.0.1:8080/".parse()?).await?;
//! assert!(response.status().is_success());
//! # Ok(())
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use ::http::Uri;
use ::hyper_util::client::legacy::connect::{Connected, Connection};
/// hyper-util's adapter, re-exported so that the version that wraps a [`Stream`] is the one
/// this crate's [`Connector`] returns.
pub use ::hyper_util::rt::TokioIo;
use rdma_verbs::Deadline;

use crate::{Options, Stream};

/// Opens a [`Stream`] to a URI's `host:port`: a `tower::Service<http::Uri>` for hyper-util's
/// pooled client and for tonic's `Endpoint::connect_with_connector`.
///
/// Cheap to clone (the options are shared). Each call looks the host up if it is a name, then
/// connects to its addresses in turn, as [`Stream::connect_with`] does, all within the
/// options' connect timeout ([`Options::connect_timeout`], 10 s by default). Its future fails
/// with
/// - [`io::ErrorKind::InvalidInput`] for a URI without a host, or without a port and with a
///   scheme other than `http`/`https`;
/// - [`io::ErrorKind::TimedOut`] when no connection is up within the connect timeout;
/// - the last address's error otherwise (as an [`io::Error`], see [`Error`](crate::Error)),
///   e.g. [`io::ErrorKind::ConnectionRefused`] when nothing listens there.
#[derive(Clone)]
pub struct Connector {
    options: Arc<Options>,
    local: Option<SocketAddr>,
}

impl Connector {
    /// A connector with [`Options::default`], from any local device.
    pub fn new() -> Connector {
        Connector::with_options(Options::default())
    }

    /// A connector whose streams are built with `options`.
    pub fn with_options(options: Options) -> Connector {
        Connector { options: Arc::new(options), local: None }
    }

    /// Connects from `addr`, a local address whose RDMA device carries the connections (port
    /// 0: any); `None` (the default) lets routing choose the device.
    pub fn local_address(mut self, addr: Option<SocketAddr>) -> Connector {
        self.local = addr;
        self
    }
}

impl Default for Connector {
    fn default() -> Connector {
        Connector::new()
    }
}

impl fmt::Debug for Connector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connector").field("options", &self.options).field("local", &self.local).finish()
    }
}

impl ::tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = io::Error;
    type Future = Connecting;

    /// Always ready: each call opens its own connection.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Connecting {
        let this = self.clone();
        Connecting(Box::pin(async move { Ok(TokioIo::new(this.connect(&uri).await?)) }))
    }
}

impl Connector {
    /// Connects to the first of `uri`'s addresses that accepts, within the connect timeout;
    /// the last error if none does.
    async fn connect(&self, uri: &Uri) -> io::Result<Stream> {
        let (host, port) = host_port(uri)?;
        let until = Deadline::after(self.options.connect_timeout);
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, format!("connecting to {uri}: timed out"));
        let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => match ::tokio::time::timeout(until.remaining(), ::tokio::net::lookup_host((host, port))).await {
                Ok(found) => found?.collect(),
                Err(_) => return Err(timed_out()),
            },
        };
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
        for addr in addrs {
            if until.remaining().is_zero() {
                return Err(timed_out());
            }
            match Stream::connect_with(addr, self.local, &self.options).wait_async(until).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e.into(),
            }
        }
        Err(last)
    }
}

/// `uri`'s host (an IPv6 literal without its brackets) and port (the scheme's default when
/// it has none).
fn host_port(uri: &Uri) -> io::Result<(&str, u16)> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: {what}"));
    if uri.scheme_str() == Some("https") {
        // A stream carries no TLS: sending an https request in clear would leak what the
        // caller meant to protect.
        return Err(invalid("https needs TLS, which an rdma-stream does not carry; use http://"));
    }
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let port = match (uri.port_u16(), uri.scheme_str()) {
        (Some(port), _) => port,
        (None, Some("http")) => 80,
        (None, _) => return Err(invalid("no port, and no http scheme to take it from")),
    };
    Ok((host, port))
}

/// The future of [`Connector`]'s `call`: the connected stream, wrapped for hyper.
#[must_use = "a connect does nothing unless polled"]
pub struct Connecting(Pin<Box<dyn Future<Output = io::Result<TokioIo<Stream>>> + Send>>);

impl Future for Connecting {
    type Output = io::Result<TokioIo<Stream>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.0.as_mut().poll(cx)
    }
}

impl fmt::Debug for Connecting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connecting").finish_non_exhaustive()
    }
}

/// What hyper-util's pooled client asks of a connection: nothing beyond the defaults (no
/// proxy, HTTP/1.1 unless the client is told `http2_only`).
impl Connection for Stream {
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uri_gives_the_address_and_its_scheme_the_default_port() {
        let hp = |s: &str| host_port(&s.parse().unwrap()).map(|(h, p)| (h.to_string(), p)).map_err(|e| e.kind());
        let ok = |h: &str, p: u16| Ok((h.to_string(), p));
        assert_eq!(hp("http://10.77.0.1:50051/x"), ok("10.77.0.1", 50051));
        assert_eq!(hp("http://10.77.0.1"), ok("10.77.0.1", 80));
        assert_eq!(hp("https://host"), Err(io::ErrorKind::InvalidInput));
        assert_eq!(hp("https://host:8443"), Err(io::ErrorKind::InvalidInput));
        assert_eq!(hp("http://[fe80::1]:7"), ok("fe80::1", 7));
        assert_eq!(hp("10.77.0.1:9"), ok("10.77.0.1", 9));
        assert_eq!(hp("ftp://10.77.0.1"), Err(io::ErrorKind::InvalidInput));
        assert_eq!(hp("/path/only"), Err(io::ErrorKind::InvalidInput));
    }
}
