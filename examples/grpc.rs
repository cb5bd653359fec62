//! gRPC over an RDMA stream: a tonic server and client whose connections are
//! `rdma_stream::Stream`s instead of TCP. Needs the `stream-ecosystem` feature.
//!
//! ```text
//! grpc server ADDR [--count N] [--quiet] [--tcp]
//! grpc client ADDR [--from IP] [--size BYTES] [--messages N]
//! grpc bench ADDR [--from IP] [--tcp] [--size BYTES] [--concurrency N] [--seconds T]
//! ```
//! In the Soft-RoCE VM (`scripts/softroce run -- ...`; rxe0 is 10.77.0.1, rxe1 10.77.0.2):
//! ```text
//! cargo build --features stream-ecosystem --example grpc
//! target/debug/examples/grpc server 10.77.0.1:50051 &
//! target/debug/examples/grpc client 10.77.0.1:50051 --from 10.77.0.2 --size 1048576 --messages 16
//! ```
//! The service (examples/common/grpc.rs) is written without protoc: its messages derive
//! `prost::Message`, and its server and client use tonic's `server::Grpc` and `client::Grpc` as
//! generated code would. What makes it RDMA is two lines, the rest is tonic as over TCP:
//! - the server serves `rdma_stream::tonic::Incoming::new(Listener::bind(addr)?)` with
//!   `serve_with_incoming`;
//! - the client's channel is `Endpoint::connect_with_connector(rdma_stream::hyper::Connector)`.
//!
//! The client makes one unary call (`--size` bytes, echoed) and one server-streaming call
//! (`--messages` messages of `--size` bytes), checks every byte (exit status 1 on a mismatch)
//! and prints one line with the calls' times. The server logs each call with the peer's
//! address (not with `--quiet`), and runs until it is killed, or until `--count` calls were
//! answered.
//!
//! `bench` is the load generator of `scripts/compare`'s gRPC cells: `--concurrency` tasks share
//! one channel (one connection, HTTP/2 streams), each making unary calls of `--size` bytes one
//! after another for `--seconds`, and checks every answer. It prints one line,
//! `bench: messages=N seconds=T rate=R p50_us=X p99_us=Y` (calls per second over all tasks, and
//! the percentiles of one call's time). With `--tcp` on both the server and `bench`, the same
//! program runs tonic over TCP (`TCP_NODELAY` on both ends), so that only the transport differs.

// tonic's handlers and interceptors return `Result<_, tonic::Status>`: the size of its error
// is tonic's to choose.
#![allow(clippy::result_large_err)]

#[path = "common/bench_line.rs"]
mod bench_line;
#[path = "common/grpc.rs"]
mod grpc;
#[path = "common/pattern.rs"]
mod pattern;

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use grpc::{EchoClient, EchoServer, StreamRequest};
use pattern::pattern;
use rdma_stream::hyper::Connector;
use rdma_stream::tonic::Incoming;
use rdma_stream::Listener;
use tonic::transport::{Endpoint, Server};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How long the client waits for its connection, and for each call.
const T: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(about = "gRPC (tonic) over an RDMA stream")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serves the echo service.
    Server(ServerArgs),
    /// Calls it and checks the answers.
    Client(ClientArgs),
    /// Unary calls, many at once, for a time: calls per second and each call's time.
    Bench(BenchArgs),
}

#[derive(Args)]
struct ServerArgs {
    /// The address to listen on (its RDMA device carries the connections).
    addr: SocketAddr,
    /// Exit after this many calls (0: serve until killed).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Log no call.
    #[arg(long)]
    quiet: bool,
    /// Serve over TCP instead of RDMA.
    #[arg(long)]
    tcp: bool,
}

#[derive(Args)]
struct ClientArgs {
    /// The server's address.
    addr: SocketAddr,
    /// The local address to connect from (its RDMA device carries the connection).
    #[arg(long)]
    from: Option<IpAddr>,
    /// Bytes of the unary call's request, and of each streamed message.
    #[arg(long, default_value_t = 1 << 20)]
    size: u32,
    /// Messages of the server-streaming call.
    #[arg(long, default_value_t = 16)]
    messages: u32,
}

#[derive(Args)]
struct BenchArgs {
    /// The server's address.
    addr: SocketAddr,
    /// The local address to connect from.
    #[arg(long)]
    from: Option<IpAddr>,
    /// Call over TCP instead of RDMA.
    #[arg(long)]
    tcp: bool,
    /// Bytes of each call's request (and answer).
    #[arg(long, default_value_t = 64)]
    size: u32,
    /// Calls in flight at once, each task making one call after another.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// How long to call.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Server(args) => server(args).await,
            Command::Client(args) => client(args).await,
            Command::Bench(args) => bench(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("grpc: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn server(args: ServerArgs) -> Result<()> {
    let calls = Arc::new(AtomicU64::new(0));
    let enough = Arc::new(tokio::sync::Notify::new());
    let (counter, done) = (Arc::clone(&calls), Arc::clone(&enough));
    let (count, quiet) = (args.count, args.quiet);
    // Logs each call with its peer (tonic's `remote_addr`, from the stream's `Connected`).
    let log = move |request: tonic::Request<()>| {
        if !quiet {
            eprintln!("grpc server: call from {:?}", request.remote_addr());
        }
        if counter.fetch_add(1, Ordering::Relaxed) + 1 == count {
            done.notify_one();
        }
        Ok(request)
    };
    let service = tonic::service::interceptor::InterceptedService::new(EchoServer, log);
    let stop = async move {
        if count == 0 {
            std::future::pending::<()>().await
        }
        enough.notified().await;
    };
    // The interceptor counts a streaming call when it starts: serve_with_incoming_shutdown
    // lets the calls in progress finish before it returns.
    if args.tcp {
        eprintln!("grpc server: listening on {} (TCP)", args.addr);
        Server::builder().tcp_nodelay(true).add_service(service).serve_with_shutdown(args.addr, stop).await?;
    } else {
        let incoming = Incoming::new(Listener::bind(args.addr)?);
        eprintln!("grpc server: listening on {}", incoming.local_addr());
        Server::builder().add_service(service).serve_with_incoming_shutdown(incoming, stop).await?;
    }
    eprintln!("grpc server: {} calls answered", calls.load(Ordering::Relaxed));
    Ok(())
}

async fn client(args: ClientArgs) -> Result<()> {
    let connector = Connector::new().local_address(args.from.map(|ip| SocketAddr::new(ip, 0)));
    let endpoint = Endpoint::from_shared(format!("http://{}", args.addr))?.connect_timeout(T).timeout(T);
    let mut client = EchoClient::new(endpoint.connect_with_connector(connector).await?);
    let size = args.size as usize;

    let start = Instant::now();
    let sent = pattern(size, 1);
    let echoed = client.unary(sent.clone()).await?;
    if echoed != sent {
        return Err(format!("the unary call's {} B came back as {} different B", sent.len(), echoed.len()).into());
    }
    let unary = start.elapsed();

    let start = Instant::now();
    let mut stream = client.stream(StreamRequest { count: args.messages, size: args.size, seed: 100 }).await?;
    let mut received = 0u64;
    while let Some(message) = stream.message().await? {
        if message.data != pattern(size, 100 + received) {
            return Err(format!("streamed message {received} differs from what the server sent").into());
        }
        received += 1;
    }
    if received != u64::from(args.messages) {
        return Err(format!("the stream ended after {received} of {} messages", args.messages).into());
    }
    let streamed = start.elapsed();
    let mib = (received * size as u64) as f64 / f64::from(1 << 20);
    println!(
        "grpc client: unary {size} B in {unary:?}; stream of {received} x {size} B in {streamed:?} ({:.1} MiB/s); all bytes checked",
        mib / streamed.as_secs_f64()
    );
    Ok(())
}

async fn bench(args: BenchArgs) -> Result<()> {
    let endpoint = Endpoint::from_shared(format!("http://{}", args.addr))?.connect_timeout(T).timeout(T);
    let channel = if args.tcp {
        endpoint.tcp_nodelay(true).local_address(args.from).connect().await?
    } else {
        let connector = Connector::new().local_address(args.from.map(|ip| SocketAddr::new(ip, 0)));
        endpoint.connect_with_connector(connector).await?
    };
    let client = EchoClient::new(channel);
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    let mut tasks = Vec::new();
    for i in 0..args.concurrency {
        let mut client = client.clone();
        let sent = pattern(args.size as usize, i as u64);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1 << 16);
            loop {
                let t = Instant::now();
                if t >= end {
                    return Ok::<_, tonic::Status>(lat);
                }
                let echoed = client.unary(sent.clone()).await?;
                lat.push(t.elapsed().as_nanos() as u64);
                if echoed != sent {
                    return Err(tonic::Status::data_loss("an answer differs from its request"));
                }
            }
        }));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    bench_line::print(lat, start.elapsed());
    Ok(())
}
