//! An echo server for many clients, two ways: a **tokio echo server with many clients** (a task
//! per connection on one current-thread runtime), and a **thread-per-connection server using
//! blocking waits**; and the client that measures them. Needs the `tokio` feature.
//!
//! ```text
//! echo server ADDR [--mode threads|async] [--wait spin|block] [--count N]
//! echo client ADDR [--from IP] [--clients N] [--round-trips R] [--size S]
//!                  [--mode threads|async] [--wait spin|block] [--hold SECS]
//! ```
//! In the Soft-RoCE VM (`scripts/softroce run -- ...`; rxe0 is 10.77.0.1, rxe1 10.77.0.2):
//! ```text
//! cargo build --features tokio --example echo
//! target/debug/examples/echo server 10.77.0.1:7474 --mode async &
//! target/debug/examples/echo client 10.77.0.1:7474 --from 10.77.0.2 --clients 8 --round-trips 2000
//! ```
//! The client connects `--clients` connections (threads or tasks, as `--mode` says), each sending
//! `--round-trips` messages of `--size` bytes one at a time and checking every reply byte for byte
//! (exit status 1 on a mismatch), then prints one line: the round trip's p50, p99 and mean over
//! all connections, and the messages echoed per second.
//!
//! # The servers
//! Both accept with rdma-cm, post a ring of receives sized by the client's request (its private
//! data carries the message size), and echo each message from a slot of their own.
//! - `--mode async`: one current-thread tokio runtime. The listener's requests are awaited
//!   (`Listener::recv_request_async`); each is accepted (`ConnectRequest::accept(..).await`) and served
//!   by a task of its own that `tokio::select!`s between the ring's next message
//!   (`RecvRing::recv_async`) and the peer leaving (`Connection::disconnected_async`); both are
//!   cancellation-safe, so the losing arm loses nothing. The task then drops the connection with
//!   `close_async`, so that no teardown blocks the runtime.
//! - `--mode threads`: the main thread accepts (`recv_request`, `accept`, blocking) and hands
//!   each connection to a thread of its own, which waits for messages with `RecvRing::recv` (up to
//!   100 ms, then reads the connection's events to see whether the peer left) and for send
//!   completions with `SendQueue::wait`.
//!
//! `--wait block` (the default) is the library's default `WaitPolicy`: spin 50 µs, then sleep on
//! the completion channel; `--wait spin` spins until the deadline, a core per waiting thread.
//! Either way a connection that ends is logged as `connection from PEER ended: REASON`, with the
//! reason `peer disconnected` when the client left. The server runs until it is killed, or until
//! `--count` connections were served.

#[path = "common/echo.rs"]
mod echo;
#[path = "common/echo_client.rs"]
mod echo_client;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use echo::{Devices, Half, Link, Mode, Result, Wait};
use rdma_cm::{ConnParams, ConnectRequest, Listener};
use rdma_verbs::{AccessFlags, Init, QueuePair, Rc};

/// How long a threads server's wait for a message lasts before it looks for the peer's
/// disconnect: a peer that left is noticed within it, and an idle connection's thread wakes
/// twice a second (the async server waits for both in one `select!`, and wakes for neither).
const IDLE_CHECK: Duration = Duration::from_millis(500);
/// How long a connection whose receive or send failed is given to show its peer left.
const LEAVING: Duration = Duration::from_secs(2);

#[derive(Parser)]
#[command(name = "echo", about = "RDMA echo server and load client (rdma-cm, RC SENDs)")]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Echoes every message of every connection.
    Server {
        /// The address to listen on: IP:PORT, or IP (port 7474).
        #[arg(value_parser = parse_addr)]
        addr: SocketAddr,
        /// Exit once this many connections were served.
        #[arg(long)]
        count: Option<usize>,
        /// Test hook (fault-injection builds): flip the last byte of the Nth message echoed.
        #[cfg(feature = "fault-injection")]
        #[arg(long, hide = true)]
        test_corrupt: Option<u64>,
        #[command(flatten)]
        how: How,
    },
    /// Sends messages and checks their echoes; prints the round trip's figures.
    Client(echo_client::ClientArgs),
}

/// How connections are served or driven.
#[derive(Args, Clone, Copy)]
pub struct How {
    /// A thread per connection with blocking waits, or a tokio task per connection.
    #[arg(long, value_enum, default_value_t = Mode::Threads)]
    pub(crate) mode: Mode,
    /// Spin until the deadline, or the default policy (spin 50 µs, then sleep).
    #[arg(long, value_enum, default_value_t = Wait::Block)]
    pub(crate) wait: Wait,
}

fn parse_addr(s: &str) -> std::result::Result<SocketAddr, String> {
    s.parse().or_else(|_| s.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 7474))).map_err(|e| format!("{s}: {e}"))
}

fn main() {
    let result = match Cli::parse().role {
        #[cfg(feature = "fault-injection")]
        Role::Server { addr, count, how, test_corrupt } => {
            fault::CORRUPT_AT.store(test_corrupt.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
            serve(addr, count, how)
        }
        #[cfg(not(feature = "fault-injection"))]
        Role::Server { addr, count, how } => serve(addr, count, how),
        Role::Client(args) => echo_client::run(&args),
    };
    if let Err(e) = result {
        eprintln!("echo: {e}");
        std::process::exit(1);
    }
}

fn serve(addr: SocketAddr, count: Option<usize>, how: How) -> Result<()> {
    let listener = Listener::bind(addr, 64)?;
    eprintln!("echo server: listening on {} ({:?}, wait {:?})", listener.local_addr(), how.mode, how.wait);
    match how.mode {
        Mode::Threads => serve_threads(&listener, count, how.wait),
        Mode::Async => {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(serve_async(listener, count, how.wait))?;
        }
    }
    eprintln!("echo server: done");
    Ok(())
}

/// Prepares the QP and receives for a client's request, sized by its private data.
fn prepare(devices: &Devices, req: &ConnectRequest) -> Result<(QueuePair<'static, Rc, Init>, echo::Rest)> {
    let Some(size) = echo::size_of_hello(req.private_data()) else {
        return Err("not an echo client's request (private data)".into());
    };
    let half =
        Half::new(devices, req.device_name(), || req.open_context(), |qp| req.init_qp(qp, AccessFlags::empty()), size)?;
    Ok(half.take_qp())
}

/// Logs an accepted connection.
fn log_start(link: &Link) {
    eprintln!("connection from {}: established", link.peer());
}

fn log_end(link: &Link, served: Result<()>, left: bool) {
    match served {
        Err(_) if left => eprintln!("connection from {} ended: peer disconnected", link.peer()),
        Ok(()) => eprintln!("connection from {} ended: peer disconnected", link.peer()),
        Err(e) => eprintln!("connection from {} ended: {e}", link.peer()),
    }
}

// ---- thread per connection, blocking waits ----

fn serve_threads(listener: &Listener, count: Option<usize>, wait: Wait) {
    let devices = Devices::default();
    let mut threads = Vec::new();
    let mut accepted = 0;
    while count.map_or(true, |n| accepted < n) {
        let req = match listener.recv_request(Duration::MAX) {
            Ok(req) => req,
            Err(e) => {
                eprintln!("echo server: {e}");
                continue;
            }
        };
        let peer = req.peer_addr();
        let link = prepare(&devices, &req).and_then(|(qp, rest)| {
            let conn = req.accept(qp, &ConnParams::new()).wait(echo::T)?;
            Link::new(conn, rest, wait)
        });
        let mut link = match link {
            Ok(link) => link,
            Err(e) => {
                eprintln!("connection from {peer} failed: {e}");
                continue;
            }
        };
        accepted += 1;
        log_start(&link);
        threads.retain(|t: &std::thread::JoinHandle<()>| !t.is_finished());
        threads.push(std::thread::spawn(move || {
            let served = echo_blocking(&mut link);
            let left = served.is_err() && link.peer_leaves(LEAVING);
            log_end(&link, served, left);
        }));
    }
    for t in threads {
        let _ = t.join();
    }
}

/// Echoes every message until the peer leaves (`Ok`) or a receive or send fails.
fn echo_blocking(link: &mut Link) -> Result<()> {
    loop {
        let msg = match link.ring.recv(IDLE_CHECK) {
            Ok(msg) => msg,
            Err(rdma_verbs::Error::Timeout { .. }) if link.peer_left()? => return Ok(()),
            Err(rdma_verbs::Error::Timeout { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        msg.ok()?;
        link.send(&fault::reply(msg.bytes()))?;
        link.ring.release(msg)?;
    }
}

// ---- tokio: a task per connection ----

async fn serve_async(listener: Listener, count: Option<usize>, wait: Wait) -> Result<()> {
    let devices = std::sync::Arc::new(Devices::default());
    let mut tasks = tokio::task::JoinSet::new();
    let (mut accepted, mut served) = (0, 0);
    while count.map_or(true, |n| served < n) {
        tokio::select! {
            req = listener.recv_request_async(), if count.map_or(true, |n| accepted < n) => {
                let req = req?;
                accepted += 1;
                tasks.spawn(connection(devices.clone(), req, wait));
            }
            Some(ok) = tasks.join_next() => {
                // A connection that failed before it was established is not one served.
                match ok {
                    Ok(true) => served += 1,
                    _ => accepted -= 1,
                }
            }
        }
    }
    Ok(())
}

/// Accepts `req`, echoes until the peer leaves, and drops the connection: `true` when the
/// connection was established.
async fn connection(devices: std::sync::Arc<Devices>, req: ConnectRequest, wait: Wait) -> bool {
    let peer = req.peer_addr();
    let link = async {
        let (qp, rest) = prepare(&devices, &req)?;
        let accepted = tokio::time::timeout(echo::T, req.accept(qp, &ConnParams::new())).await;
        let conn = accepted.map_err(|_| format!("not established within {:?}", echo::T))??;
        Link::new(conn, rest, wait)
    };
    let mut link = match link.await {
        Ok(link) => link,
        Err(e) => {
            eprintln!("connection from {peer} failed: {e}");
            return false;
        }
    };
    log_start(&link);
    let served = echo_async(&mut link).await;
    let left = served.is_err() && tokio::time::timeout(LEAVING, link.conn.disconnected_async()).await.is_ok();
    log_end(&link, served, left);
    link.close_async().await;
    true
}

/// Echoes every message until the peer leaves (`Ok`) or a receive or send fails.
async fn echo_async(link: &mut Link) -> Result<()> {
    loop {
        let msg = tokio::select! {
            // First: once the peer left, its flushed receives are not worth reading.
            biased;
            gone = link.conn.disconnected_async() => return Ok(gone?),
            msg = link.ring.recv_async() => msg?,
        };
        msg.ok()?;
        link.send_async(&fault::reply(msg.bytes())).await?;
        link.ring.release(msg)?;
    }
}

/// The reply to a message: its bytes, except with the hidden `--test-corrupt N` of
/// fault-injection builds (the Nth message echoed, over all connections, gets its last byte
/// flipped, for the test of the client's check).
mod fault {
    use std::borrow::Cow;

    #[cfg(feature = "fault-injection")]
    pub static CORRUPT_AT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

    #[cfg(feature = "fault-injection")]
    pub fn reply(bytes: &[u8]) -> Cow<'_, [u8]> {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        static ECHOED: AtomicU64 = AtomicU64::new(0);
        if ECHOED.fetch_add(1, Relaxed) + 1 != CORRUPT_AT.load(Relaxed) {
            return Cow::Borrowed(bytes);
        }
        let mut v = bytes.to_vec();
        if let Some(last) = v.last_mut() {
            *last ^= 0xff;
        }
        Cow::Owned(v)
    }

    #[cfg(not(feature = "fault-injection"))]
    pub fn reply(bytes: &[u8]) -> Cow<'_, [u8]> {
        Cow::Borrowed(bytes)
    }
}
