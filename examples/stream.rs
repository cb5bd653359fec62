//! Bulk bytes over an `rdma-stream` byte stream, blocking: one side listens and reads (or echoes),
//! the other connects and writes; both print what they moved and at what rate.
//!
//! ```text
//! stream recv ADDR [--echo] [--messages N] [--message-size S]
//! stream send ADDR [--from IP] [--bytes N | --forever] [--write-size S] [--messages N] [--message-size S]
//! ```
//! In the Soft-RoCE VM (rxe0 is 10.77.0.1, rxe1 10.77.0.2):
//! ```text
//! target/debug/examples/stream recv 10.77.0.1:7700 &
//! target/debug/examples/stream send 10.77.0.1:7700 --from 10.77.0.2 --bytes 268435456
//! ```
//! `recv` accepts one stream, reads until end of file (writing every byte back with `--echo`),
//! prints `received N bytes in T s (R MiB/s)` and exits 0; a stream that fails prints the error
//! and exits 1. `send` writes `--bytes` bytes (or until killed, with `--forever`) in writes of
//! `--write-size`, ends its direction, reads until end of file and prints its line.
//! `--messages` and `--message-size` size each side's receive buffers ([`Options`]; the window
//! each way is the smaller side's).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use rdma_stream::{Listener, Options, Stream};

#[derive(Parser)]
#[command(name = "stream", about = "Bulk bytes over an RDMA byte stream (rdma-stream)")]
struct Cli {
    #[command(subcommand)]
    role: Role,
}

#[derive(Subcommand)]
enum Role {
    /// Accepts one stream and reads it to the end.
    Recv {
        /// IP:PORT to listen on.
        addr: SocketAddr,
        /// Write every byte read back to the sender.
        #[arg(long)]
        echo: bool,
        #[command(flatten)]
        window: Window,
    },
    /// Connects and writes.
    Send {
        /// The listener's IP:PORT.
        addr: SocketAddr,
        /// The local address to connect from.
        #[arg(long)]
        from: Option<IpAddr>,
        /// Bytes to write.
        #[arg(long, default_value_t = 64 << 20)]
        bytes: u64,
        /// Write until killed.
        #[arg(long)]
        forever: bool,
        /// Bytes per write call.
        #[arg(long, default_value_t = 1 << 20)]
        write_size: usize,
        #[command(flatten)]
        window: Window,
    },
}

/// The receive buffers of this side ([`Options::messages`], [`Options::message_size`]).
#[derive(clap::Args)]
struct Window {
    /// Receive buffers posted (the default: the library's).
    #[arg(long)]
    messages: Option<u32>,
    /// Bytes per receive buffer (the default: the library's).
    #[arg(long)]
    message_size: Option<usize>,
}

impl Window {
    fn options(&self) -> Options {
        let mut options = Options::new();
        if let Some(n) = self.messages {
            options = options.messages(n);
        }
        if let Some(bytes) = self.message_size {
            options = options.message_size(bytes);
        }
        options
    }
}

const T: Duration = Duration::from_secs(30);

fn main() {
    let result = match Cli::parse().role {
        Role::Recv { addr, echo, window } => recv(addr, echo, &window.options()),
        Role::Send { addr, from, bytes, forever, write_size, window } => {
            send(addr, from, bytes, forever, write_size, &window.options())
        }
    };
    if let Err(e) = result {
        eprintln!("stream: {e}");
        std::process::exit(1);
    }
}

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn report(what: &str, bytes: u64, start: Instant) {
    let s = start.elapsed().as_secs_f64();
    eprintln!("{what} {bytes} bytes in {s:.3} s ({:.1} MiB/s)", bytes as f64 / s / (1 << 20) as f64);
}

fn recv(addr: SocketAddr, echo: bool, options: &Options) -> Result<()> {
    let listener = Listener::bind_with(addr, options)?;
    eprintln!("stream: listening on {}", listener.local_addr());
    let mut stream = listener.accept().wait(Duration::MAX)?;
    let start = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        total += n as u64;
        if echo {
            stream.write_all(&buf[..n])?;
        }
    }
    stream.shutdown_write()?;
    stream.flush()?;
    report("received", total, start);
    Ok(())
}

fn send(
    addr: SocketAddr,
    from: Option<IpAddr>,
    bytes: u64,
    forever: bool,
    write_size: usize,
    options: &Options,
) -> Result<()> {
    let from = from.map(|ip| SocketAddr::new(ip, 0));
    let stream = Stream::connect_with(addr, from, options).wait(T)?;
    let start = Instant::now();
    let data: Vec<u8> = (0..write_size.max(1)).map(|i| (i % 251) as u8).collect();
    let mut sent = 0u64;
    let echoed = std::thread::scope(|s| -> Result<u64> {
        // Reads beside the writes, so that an echo never fills both windows.
        let reader = s.spawn(|| -> std::io::Result<u64> {
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            loop {
                match (&stream).read(&mut buf)? {
                    0 => return Ok(total),
                    n => total += n as u64,
                }
            }
        });
        while forever || sent < bytes {
            let n = (bytes - sent).min(data.len() as u64) as usize;
            let n = if forever { data.len() } else { n };
            (&stream).write_all(&data[..n])?;
            sent += n as u64;
        }
        stream.shutdown_write()?;
        (&stream).flush()?;
        Ok(reader.join().expect("the reader")?)
    })?;
    report("sent", sent, start);
    if echoed > 0 {
        eprintln!("echoed {echoed} bytes");
    }
    Ok(())
}
