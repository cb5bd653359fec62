//! Echo round trips over `rdma-stream`'s tokio streams, or over TCP with `--tcp`: the load
//! generator of `scripts/compare`'s stream parts. The same program measures both transports, so
//! only the stream under it differs. Needs the `tokio` feature.
//!
//! ```text
//! stream-bench server ADDR [--tcp] [--conns N]
//! stream-bench echo ADDR [--from IP] [--tcp] [--size S] [--streams N] [--seconds T | --messages M]
//! ```
//! In the Soft-RoCE VM (`scripts/softroce run -- ...`; rxe0 is 10.77.0.1, rxe1 10.77.0.2):
//! ```text
//! cargo build --release --features tokio --example stream-bench
//! target/release/examples/stream-bench server 10.77.0.1:7710 --conns 16 &
//! target/release/examples/stream-bench echo 10.77.0.1:7710 --from 10.77.0.2 --size 64 --streams 16
//! ```
//! `server` echoes every stream it accepts (a task per stream on one current-thread runtime) and
//! exits once `--conns` streams have ended (0: runs until killed). `echo` opens `--streams`
//! streams, then on each, one task at a time sends `--size` bytes, reads them back whole, and
//! checks them, for `--seconds` (or `--messages` round trips per stream), and prints one line:
//!
//! ```text
//! bench: messages=N seconds=T rate=R p50_us=X p99_us=Y
//! ```
//! `rate` is round trips per second over all streams; the percentiles are of each round trip,
//! timed from the write's start to the last byte read back (`Instant`, in the vDSO in the VM).
//! A mismatch or a failed stream exits 1.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[path = "common/bench_line.rs"]
mod bench_line;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// How long a connect may take.
const T: Duration = Duration::from_secs(30);

#[derive(Parser)]
#[command(name = "stream-bench", about = "Echo round trips over rdma-stream or TCP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Echoes every stream it accepts.
    Server(ServerArgs),
    /// Measures round trips.
    Echo(EchoArgs),
}

#[derive(Args)]
struct ServerArgs {
    /// IP:PORT to listen on.
    addr: SocketAddr,
    /// TCP instead of rdma-stream.
    #[arg(long)]
    tcp: bool,
    /// Exit once this many streams have ended (0: serve until killed).
    #[arg(long, default_value_t = 0)]
    conns: u64,
}

#[derive(Args)]
struct EchoArgs {
    /// The server's IP:PORT.
    addr: SocketAddr,
    /// The local address to connect from.
    #[arg(long)]
    from: Option<IpAddr>,
    /// TCP instead of rdma-stream.
    #[arg(long)]
    tcp: bool,
    /// Bytes per message.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Streams at once, each with one message in flight.
    #[arg(long, default_value_t = 1)]
    streams: usize,
    /// How long to measure.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Round trips per stream, instead of `--seconds`.
    #[arg(long)]
    messages: Option<u64>,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a tokio runtime");
    let local = tokio::task::LocalSet::new();
    let result = local.block_on(&runtime, async {
        match cli.command {
            Command::Server(args) => server(args).await,
            Command::Echo(args) => echo(args).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("stream-bench: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Echoes `s` until its peer ends it.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = s.read(&mut buf).await?;
        if n == 0 {
            return s.shutdown().await;
        }
        s.write_all(&buf[..n]).await?;
        s.flush().await?;
    }
}

async fn server(args: ServerArgs) -> Result<()> {
    enum L {
        Tcp(tokio::net::TcpListener),
        Rdma(rdma_stream::Listener),
    }
    let listener = if args.tcp {
        L::Tcp(tokio::net::TcpListener::bind(args.addr).await?)
    } else {
        L::Rdma(rdma_stream::Listener::bind(args.addr)?)
    };
    eprintln!("stream-bench: listening on {}", args.addr);
    let mut tasks = Vec::new();
    let mut accepted = 0u64;
    while args.conns == 0 || accepted < args.conns {
        tasks.push(match &listener {
            L::Tcp(l) => {
                let (s, _) = l.accept().await?;
                s.set_nodelay(true)?;
                tokio::task::spawn_local(serve(s))
            }
            L::Rdma(l) => tokio::task::spawn_local(serve(l.accept().await?)),
        });
        accepted += 1;
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// `s`'s round trips: each one's time in nanoseconds.
async fn round_trips<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    size: usize,
    end: Instant,
    messages: Option<u64>,
    seed: u8,
) -> std::io::Result<Vec<u64>> {
    let msg: Vec<u8> = (0..size).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
    let mut back = vec![0u8; size];
    let mut lat = Vec::with_capacity(1 << 16);
    loop {
        let t = Instant::now();
        if messages.map_or(t >= end, |m| lat.len() as u64 >= m) {
            break;
        }
        s.write_all(&msg).await?;
        s.flush().await?;
        s.read_exact(&mut back).await?;
        lat.push(t.elapsed().as_nanos() as u64);
        if back != msg {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "an echo differs from its message"));
        }
    }
    s.shutdown().await?;
    Ok(lat)
}

async fn echo(args: EchoArgs) -> Result<()> {
    let from = args.from.map(|ip| SocketAddr::new(ip, 0));
    let mut tcp = Vec::new();
    let mut rdma = Vec::new();
    for _ in 0..args.streams {
        if args.tcp {
            let socket = match args.addr {
                SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
                SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
            };
            if let Some(from) = from {
                socket.bind(from)?;
            }
            let s = tokio::time::timeout(T, socket.connect(args.addr)).await??;
            s.set_nodelay(true)?;
            tcp.push(s);
        } else {
            let options = rdma_stream::Options::new();
            rdma.push(rdma_stream::Stream::connect_with(args.addr, from, &options).wait_async(T).await?);
        }
    }
    let start = Instant::now();
    let end = start + Duration::from_secs_f64(args.seconds);
    let mut tasks = Vec::new();
    for (i, s) in tcp.into_iter().enumerate() {
        tasks.push(tokio::task::spawn_local(round_trips(s, args.size, end, args.messages, i as u8)));
    }
    for (i, s) in rdma.into_iter().enumerate() {
        tasks.push(tokio::task::spawn_local(round_trips(s, args.size, end, args.messages, i as u8)));
    }
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await??);
    }
    let elapsed = start.elapsed();
    bench_line::print(lat, elapsed);
    Ok(())
}
