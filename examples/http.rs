//! HTTP/1.1 and HTTP/2 over an RDMA stream: a hyper server and hyper-util's pooled client,
//! whose connections are `rdma_stream::Stream`s instead of TCP. Needs the `stream-ecosystem`
//! feature.
//!
//! ```text
//! http server ADDR
//! http client ADDR [--from IP] [--size BYTES] [--requests N]
//! ```
//! In the Soft-RoCE VM (`scripts/softroce run -- ...`; rxe0 is 10.77.0.1, rxe1 10.77.0.2):
//! ```text
//! cargo build --features stream-ecosystem --example http
//! target/debug/examples/http server 10.77.0.1:8080 &
//! target/debug/examples/http client 10.77.0.1:8080 --from 10.77.0.2 --size 1048576 --requests 8
//! ```
//! The server (examples/common/http.rs) accepts with `rdma_stream::Listener`, and serves each
//! stream, wrapped in hyper-util's `TokioIo`, with hyper-util's `server::conn::auto::Builder`:
//! HTTP/1.1 or HTTP/2 as the connection's first bytes say. It answers a `POST` with its body.
//! The client is hyper-util's `client::legacy::Client` built on `rdma_stream::hyper::Connector`
//! (the URI's host:port is the server's RDMA address): it POSTs `--requests` bodies of `--size`
//! bytes over HTTP/1.1, then as many over HTTP/2, checks every byte of every answer (exit
//! status 1 on a mismatch) and prints one line per version with its time.

#[path = "common/http.rs"]
mod http;
#[path = "common/pattern.rs"]
mod pattern;

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use clap::{Args, Parser, Subcommand};
use http::Result;
use hyper::Version;
use pattern::pattern;
use rdma_stream::Listener;

#[derive(Parser)]
#[command(about = "HTTP/1.1 and HTTP/2 (hyper) over an RDMA stream")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serves the echo service until killed.
    Server(ServerArgs),
    /// POSTs bodies over HTTP/1.1 and HTTP/2 and checks the answers.
    Client(ClientArgs),
}

#[derive(Args)]
struct ServerArgs {
    /// The address to listen on (its RDMA device carries the connections).
    addr: SocketAddr,
}

#[derive(Args)]
struct ClientArgs {
    /// The server's address.
    addr: SocketAddr,
    /// The local address to connect from (its RDMA device carries the connections).
    #[arg(long)]
    from: Option<IpAddr>,
    /// Bytes of each request body (and so of each answer).
    #[arg(long, default_value_t = 1 << 20)]
    size: usize,
    /// Requests of each HTTP version.
    #[arg(long, default_value_t = 8)]
    requests: u64,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let result = runtime.block_on(async {
        match cli.command {
            Command::Server(args) => {
                let listener = Listener::bind(args.addr)?;
                eprintln!("http server: listening on {}", listener.local_addr());
                http::serve(listener).await
            }
            Command::Client(args) => client(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("http: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn client(args: ClientArgs) -> Result<()> {
    let from = args.from.map(|ip| SocketAddr::new(ip, 0));
    let uri = format!("http://{}/echo", args.addr);
    for (http2, want) in [(false, Version::HTTP_11), (true, Version::HTTP_2)] {
        let client = http::client(from, http2);
        let start = Instant::now();
        for i in 0..args.requests {
            let body = pattern(args.size, i);
            let (version, answer) = http::post(&client, &uri, body.clone()).await?;
            if version != want {
                return Err(format!("asked for {want:?}, answered in {version:?}").into());
            }
            if answer != body {
                return Err(
                    format!("request {i}: {} B sent, {} different B came back", body.len(), answer.len()).into()
                );
            }
        }
        let took = start.elapsed();
        let mib = (2 * args.requests * args.size as u64) as f64 / f64::from(1 << 20);
        println!(
            "http client: {want:?}: {} POSTs of {} B echoed in {took:?} ({:.1} MiB/s both ways); all bytes checked",
            args.requests,
            args.size,
            mib / took.as_secs_f64()
        );
    }
    Ok(())
}
