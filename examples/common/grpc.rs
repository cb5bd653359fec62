//! A gRPC service written without protoc: the messages derive `prost::Message`, the server and
//! client are what tonic-build would generate, reduced to tonic's own `server::Grpc` and
//! `client::Grpc`. The service, as a .proto file would say it:
//!
//! ```text
//! package rdma.echo;
//! service Echo {
//!   rpc Unary(Payload) returns (Payload);               // the request's bytes, back
//!   rpc Stream(StreamRequest) returns (stream Payload);  // `count` messages of `pattern` bytes
//! }
//! message Payload { bytes data = 1; }
//! message StreamRequest { uint32 count = 1; uint32 size = 2; uint64 seed = 3; }
//! ```
//! The example `grpc` and the device tests `device_stream_grpc` use it, with
//! examples/common/pattern.rs as `crate::pattern`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codec::ProstCodec;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, tokio_stream, Service};
use tonic::{Request, Response, Status, Streaming};

use crate::pattern::pattern;

/// The service's name, as the paths of its methods start.
pub const SERVICE: &str = "rdma.echo.Echo";
/// The largest message either side decodes (tonic's default is 4 MiB).
pub const MAX_MESSAGE: usize = 64 << 20;

/// Bytes, one message of the service.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Payload {
    #[prost(bytes = "vec", tag = "1")]
    pub data: Vec<u8>,
}

/// What `Stream` answers: `count` messages of `size` bytes, message `i` being
/// `pattern(size, seed + i)`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamRequest {
    #[prost(uint32, tag = "1")]
    pub count: u32,
    #[prost(uint32, tag = "2")]
    pub size: u32,
    #[prost(uint64, tag = "3")]
    pub seed: u64,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;
/// The messages of a server-streaming answer.
pub type PayloadStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<Payload, Status>> + Send>>;

/// The service's handlers.
#[derive(Clone, Copy, Debug, Default)]
pub struct Echo;

impl Echo {
    async fn unary(request: Request<Payload>) -> Result<Response<Payload>, Status> {
        Ok(Response::new(request.into_inner()))
    }

    async fn stream(request: Request<StreamRequest>) -> Result<Response<PayloadStream>, Status> {
        let StreamRequest { count, size, seed } = request.into_inner();
        if size as usize > MAX_MESSAGE {
            return Err(Status::invalid_argument(format!("size {size} is over {MAX_MESSAGE}")));
        }
        let messages = (0..u64::from(count)).map(move |i| Ok(Payload { data: pattern(size as usize, seed + i) }));
        Ok(Response::new(Box::pin(tokio_stream::iter(messages)) as PayloadStream))
    }
}

/// The service as a tower service of HTTP requests, to add to a tonic server.
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoServer;

impl tonic::server::NamedService for EchoServer {
    const NAME: &'static str = SERVICE;
}

impl Service<http::Request<tonic::body::Body>> for EchoServer {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        match request.uri().path().strip_prefix("/").and_then(|p| p.strip_prefix(SERVICE)).unwrap_or("") {
            "/Unary" => Box::pin(async move { Ok(grpc().unary(Unary, request).await) }),
            "/Stream" => Box::pin(async move { Ok(grpc().server_streaming(Streamer, request).await) }),
            _ => Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The server side of one call, with the service's message size limits.
fn grpc<Encode, Decode>() -> tonic::server::Grpc<ProstCodec<Encode, Decode>>
where
    Encode: prost::Message + Send + 'static,
    Decode: prost::Message + Default + Send + 'static,
{
    tonic::server::Grpc::new(ProstCodec::default()).apply_max_message_size_config(Some(MAX_MESSAGE), Some(MAX_MESSAGE))
}

struct Unary;

impl tonic::server::UnaryService<Payload> for Unary {
    type Response = Payload;
    type Future = BoxFuture<Response<Payload>, Status>;

    fn call(&mut self, request: Request<Payload>) -> Self::Future {
        Box::pin(Echo::unary(request))
    }
}

struct Streamer;

impl tonic::server::ServerStreamingService<StreamRequest> for Streamer {
    type Response = Payload;
    type ResponseStream = PayloadStream;
    type Future = BoxFuture<Response<PayloadStream>, Status>;

    fn call(&mut self, request: Request<StreamRequest>) -> Self::Future {
        Box::pin(Echo::stream(request))
    }
}

/// The service's client over any tonic channel.
#[derive(Clone, Debug)]
pub struct EchoClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl EchoClient {
    /// A client on `channel`.
    pub fn new(channel: tonic::transport::Channel) -> EchoClient {
        let inner = tonic::client::Grpc::new(channel)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        EchoClient { inner }
    }

    async fn ready(&mut self) -> Result<(), Status> {
        self.inner.ready().await.map_err(|e| Status::unavailable(format!("the channel is not ready: {e}")))
    }

    /// `Unary`: `data`, echoed.
    pub async fn unary(&mut self, data: Vec<u8>) -> Result<Vec<u8>, Status> {
        self.ready().await?;
        let path = PathAndQuery::from_static("/rdma.echo.Echo/Unary");
        let reply =
            self.inner.unary(Request::new(Payload { data }), path, ProstCodec::<Payload, Payload>::default()).await?;
        Ok(reply.into_inner().data)
    }

    /// `Stream`: the server's messages, as they arrive.
    pub async fn stream(&mut self, request: StreamRequest) -> Result<Streaming<Payload>, Status> {
        self.ready().await?;
        let path = PathAndQuery::from_static("/rdma.echo.Echo/Stream");
        Ok(self
            .inner
            .server_streaming(Request::new(request), path, ProstCodec::<StreamRequest, Payload>::default())
            .await?
            .into_inner())
    }
}
