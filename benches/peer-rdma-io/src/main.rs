//! The same load as rdma-stream's benchmark cells (examples/stream.rs, examples/stream-bench.rs,
//! examples/grpc.rs `bench`), driven through crates.io's `rdma-io` stream and `rdma-io-tonic`,
//! so that scripts/compare can run them side by side. It prints the same result lines.
//!
//! ```text
//! peer-rdma-io bulk-recv ADDR
//! peer-rdma-io bulk-send ADDR [--bytes N] [--write-size S]
//! peer-rdma-io echo-server ADDR [--conns N]
//! peer-rdma-io echo ADDR [--size S] [--streams N] [--seconds T | --messages M]
//! peer-rdma-io grpc-server ADDR
//! peer-rdma-io grpc-bench ADDR [--size S] [--concurrency N] [--seconds T]
//! ```
//! rdma-io's connect takes no local address: the client's connection is resolved from the
//! destination alone (in the VM, where both devices are local, on rxe0 itself).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use rdma_io::async_cm::AsyncCmListener;
use rdma_io::async_stream::AsyncRdmaStream;
use rdma_io::send_recv_transport::{SendRecvConfig, SendRecvTransport};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Accepts one stream, reads it to the end.
    BulkRecv { addr: SocketAddr },
    /// Writes `bytes` in writes of `write_size`, then ends.
    BulkSend {
        addr: SocketAddr,
        #[arg(long, default_value_t = 64 << 20)]
        bytes: u64,
        #[arg(long, default_value_t = 1 << 20)]
        write_size: usize,
    },
    /// Echoes every stream it accepts; exits after `conns` streams ended (0: never).
    EchoServer {
        addr: SocketAddr,
        #[arg(long, default_value_t = 0)]
        conns: u64,
    },
    /// Round trips of `size` bytes on `streams` streams at once.
    Echo {
        addr: SocketAddr,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 1)]
        streams: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
        /// Round trips per stream instead of a time.
        #[arg(long)]
        messages: Option<u64>,
    },
    /// The echo gRPC service over rdma-io-tonic.
    GrpcServer { addr: SocketAddr },
    /// Unary calls of `size` bytes, `concurrency` at once on one channel.
    GrpcBench {
        addr: SocketAddr,
        #[arg(long, default_value_t = 64)]
        size: usize,
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        #[arg(long, default_value_t = 5.0)]
        seconds: f64,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let result = rt.block_on(async {
        match cli.command {
            Command::BulkRecv { addr } => bulk_recv(addr).await,
            Command::BulkSend { addr, bytes, write_size } => bulk_send(addr, bytes, write_size).await,
            Command::EchoServer { addr, conns } => echo_server(addr, conns).await,
            Command::Echo { addr, size, streams, seconds, messages } => {
                echo(addr, size, streams, seconds, messages).await
            }
            Command::GrpcServer { addr } => grpc::server(addr).await,
            Command::GrpcBench { addr, size, concurrency, seconds } => {
                grpc::bench(addr, size, concurrency, seconds).await
            }
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peer-rdma-io: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn config() -> SendRecvConfig {
    SendRecvConfig::stream()
}

async fn bulk_recv(addr: SocketAddr) -> Result<()> {
    let listener = AsyncCmListener::bind(&addr)?;
    eprintln!("peer-rdma-io: listening on {addr}");
    let mut s = AsyncRdmaStream::new(SendRecvTransport::accept(&listener, config()).await?);
    let start = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let t = start.elapsed().as_secs_f64();
    eprintln!("received {total} bytes in {t:.3} s ({:.1} MiB/s)", total as f64 / t / f64::from(1 << 20));
    Ok(())
}

async fn bulk_send(addr: SocketAddr, bytes: u64, write_size: usize) -> Result<()> {
    let mut s = AsyncRdmaStream::new(SendRecvTransport::connect(&addr, config()).await?);
    let data = vec![7u8; write_size.max(1)];
    let start = Instant::now();
    let mut sent = 0u64;
    while sent < bytes {
        let n = (bytes - sent).min(data.len() as u64) as usize;
        s.write_all(&data[..n]).await?;
        sent += n as u64;
    }
    s.shutdown().await?;
    let t = start.elapsed().as_secs_f64();
    eprintln!("sent {sent} bytes in {t:.3} s ({:.1} MiB/s)", sent as f64 / t / f64::from(1 << 20));
    Ok(())
}

async fn echo_server(addr: SocketAddr, conns: u64) -> Result<()> {
    tokio::task::LocalSet::new().run_until(echo_serve(addr, conns)).await
}

async fn echo_serve(addr: SocketAddr, conns: u64) -> Result<()> {
    let listener = AsyncCmListener::bind(&addr)?;
    eprintln!("peer-rdma-io: listening on {addr}");
    let mut tasks = Vec::new();
    let mut accepted = 0u64;
    while conns == 0 || accepted < conns {
        let mut s = AsyncRdmaStream::new(SendRecvTransport::accept(&listener, config()).await?);
        accepted += 1;
        tasks.push(tokio::task::spawn_local(async move {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = s.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>(());
                }
                s.write_all(&buf[..n]).await?;
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

async fn read_exact(s: &mut AsyncRdmaStream<SendRecvTransport>, mut buf: &mut [u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        let n = s.read(buf).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf = &mut buf[n..];
    }
    Ok(())
}

async fn echo(addr: SocketAddr, size: usize, streams: usize, seconds: f64, messages: Option<u64>) -> Result<()> {
    let mut conns = Vec::new();
    for _ in 0..streams {
        conns.push(AsyncRdmaStream::new(SendRecvTransport::connect(&addr, config()).await?));
    }
    let local = tokio::task::LocalSet::new();
    let out = local
        .run_until(async move {
            let start = Instant::now();
            let end = start + Duration::from_secs_f64(seconds);
            let mut tasks = Vec::new();
            for mut s in conns {
                tasks.push(tokio::task::spawn_local(async move {
                    let msg = vec![1u8; size];
                    let mut back = vec![0u8; size];
                    let mut lat = Vec::new();
                    loop {
                        let t = Instant::now();
                        if messages.map_or(t >= end, |m| lat.len() as u64 >= m) {
                            break;
                        }
                        s.write_all(&msg).await?;
                        read_exact(&mut s, &mut back).await?;
                        lat.push(t.elapsed().as_nanos() as u64);
                    }
                    s.shutdown().await?;
                    Ok::<_, std::io::Error>(lat)
                }));
            }
            let mut all = Vec::new();
            for t in tasks {
                all.extend(t.await.expect("an echo task")?);
            }
            Ok::<_, std::io::Error>((all, start.elapsed()))
        })
        .await?;
    report(out.0, out.1);
    Ok(())
}

/// The benchmark's result line, as rdma-stream's examples print it.
fn report(mut lat: Vec<u64>, elapsed: Duration) {
    lat.sort_unstable();
    let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    println!(
        "bench: messages={} seconds={:.3} rate={:.1} p50_us={:.2} p99_us={:.2}",
        lat.len(),
        elapsed.as_secs_f64(),
        lat.len() as f64 / elapsed.as_secs_f64(),
        q(0.5) as f64 / 1e3,
        q(0.99) as f64 / 1e3
    );
}

mod grpc {
    //! The echo service's unary method, written without protoc, for tonic 0.14.

    use std::convert::Infallible;
    use std::future::Future;
    use std::net::SocketAddr;
    use std::pin::Pin;
    use std::task::{Context, Poll};
    use std::time::{Duration, Instant};

    use rdma_io_tonic::{RdmaConnector, RdmaIncoming};
    use tonic::codegen::http::uri::PathAndQuery;
    use tonic::codegen::{http, Service};
    use tonic::transport::{Endpoint, Server};
    use tonic::{Request, Response, Status};
    use tonic_prost::ProstCodec;

    use super::{config, report, Result};

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Payload {
        #[prost(bytes = "vec", tag = "1")]
        pub data: Vec<u8>,
    }

    type BoxFuture<T, E> = Pin<Box<dyn Future<Output = std::result::Result<T, E>> + Send>>;

    #[derive(Clone, Copy, Default)]
    struct EchoServer;

    impl tonic::server::NamedService for EchoServer {
        const NAME: &'static str = "rdma.echo.Echo";
    }

    struct Unary;

    impl tonic::server::UnaryService<Payload> for Unary {
        type Response = Payload;
        type Future = BoxFuture<Response<Payload>, Status>;
        fn call(&mut self, request: Request<Payload>) -> Self::Future {
            Box::pin(async move { Ok(Response::new(request.into_inner())) })
        }
    }

    impl Service<http::Request<tonic::body::Body>> for EchoServer {
        type Response = http::Response<tonic::body::Body>;
        type Error = Infallible;
        type Future = BoxFuture<Self::Response, Infallible>;
        fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<std::result::Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
            if request.uri().path() == "/rdma.echo.Echo/Unary" {
                Box::pin(async move {
                    let mut g = tonic::server::Grpc::new(ProstCodec::<Payload, Payload>::default());
                    Ok(g.unary(Unary, request).await)
                })
            } else {
                Box::pin(async move { Ok(Status::unimplemented("no such method").into_http()) })
            }
        }
    }

    pub async fn server(addr: SocketAddr) -> Result<()> {
        let incoming = RdmaIncoming::bind(&addr, config())?;
        eprintln!("peer-rdma-io grpc: listening on {addr}");
        Server::builder().add_service(EchoServer).serve_with_incoming(incoming).await?;
        Ok(())
    }

    pub async fn bench(addr: SocketAddr, size: usize, concurrency: usize, seconds: f64) -> Result<()> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.timeout(Duration::from_secs(30));
        let channel = endpoint.connect_with_connector(RdmaConnector::new(config())).await?;
        let client = tonic::client::Grpc::new(channel);
        let path = PathAndQuery::from_static("/rdma.echo.Echo/Unary");
        let start = Instant::now();
        let end = start + Duration::from_secs_f64(seconds);
        let mut tasks = Vec::new();
        for _ in 0..concurrency {
            let mut client = client.clone();
            let path = path.clone();
            tasks.push(tokio::spawn(async move {
                let data = vec![3u8; size];
                let mut lat = Vec::new();
                loop {
                    let t = Instant::now();
                    if t >= end {
                        break;
                    }
                    client.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
                    let reply = client
                        .unary(
                            Request::new(Payload { data: data.clone() }),
                            path.clone(),
                            ProstCodec::<Payload, Payload>::default(),
                        )
                        .await?;
                    if reply.get_ref().data.len() != size {
                        return Err(Status::data_loss("a short answer"));
                    }
                    lat.push(t.elapsed().as_nanos() as u64);
                }
                Ok::<_, Status>(lat)
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        report(all, start.elapsed());
        Ok(())
    }
}
