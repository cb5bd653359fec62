//! An HTTP echo server and its client calls over RDMA streams, for the example `http` and the
//! device tests `device_stream_http`: hyper 1.x through hyper-util's `TokioIo`, as over TCP.

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Method, Request, Response, StatusCode, Version};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rdma_stream::hyper::Connector;
use rdma_stream::{Listener, Stream};

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

/// A pooled client of one HTTP version over RDMA streams.
pub type HttpClient = Client<Connector, Full<Bytes>>;

/// The server's answer to every request: `POST` gets its body back, anything else 405.
pub async fn echo(request: Request<Incoming>) -> Result<Response<Full<Bytes>>> {
    if request.method() != Method::POST {
        let mut answer = Response::new(Full::new(Bytes::from_static(b"POST only\n")));
        *answer.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
        return Ok(answer);
    }
    let body = request.into_body().collect().await?.to_bytes();
    Ok(Response::new(Full::new(body)))
}

/// Serves `stream`, HTTP/1.1 or HTTP/2 as its first bytes say, until the peer closes it.
pub async fn serve_connection(stream: Stream) -> Result<()> {
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.serve_connection(TokioIo::new(stream), hyper::service::service_fn(echo)).await
}

/// Accepts on `listener` for ever, each connection served by a task of its own.
pub async fn serve(listener: Listener) -> Result<()> {
    loop {
        let stream = listener.accept().await?;
        let peer = stream.peer_addr();
        tokio::spawn(async move {
            if let Err(e) = serve_connection(stream).await {
                eprintln!("http server: the connection from {peer} failed: {e}");
            }
        });
    }
}

/// A pooled client that connects from `from` (any device if `None`), speaking HTTP/2 (prior
/// knowledge) if `http2`, else HTTP/1.1.
pub fn client(from: Option<std::net::SocketAddr>, http2: bool) -> HttpClient {
    let connector = Connector::new().local_address(from);
    Client::builder(TokioExecutor::new()).http2_only(http2).build(connector)
}

/// POSTs `body` to `uri` and returns the answer's version and body, failing on a status other
/// than 200.
pub async fn post(client: &HttpClient, uri: &str, body: Vec<u8>) -> Result<(Version, Bytes)> {
    let request = Request::post(uri).body(Full::new(Bytes::from(body)))?;
    let answer = client.request(request).await?;
    if answer.status() != StatusCode::OK {
        return Err(format!("POST {uri}: {}", answer.status()).into());
    }
    let version = answer.version();
    Ok((version, answer.into_body().collect().await?.to_bytes()))
}
