//! The protocol of rdma-core's `rdma_server` and `rdma_client`, as either side, so that each
//! can talk to rdma-core's other half.
//!
//! ```text
//! rdma_server_client server [-s addr] [-p port] [-n connections] [-t secs]
//! rdma_server_client client -s addr [-b source] [-p port] [-n connections] [-t secs]
//! ```
//!
//! In the Soft-RoCE VM (`scripts/softroce run -- ...`):
//! ```text
//! rdma_server -s 10.77.0.1 &                                          # rdma-core's server
//! cargo run --example rdma_server_client -- client -s 10.77.0.1 -b 10.77.0.2
//! ```
//! Each connection carries one 16-byte message each way; `-n` makes several, one after another.

#[path = "../common/cm.rs"]
mod cm;
mod protocol;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use protocol::{DEFAULT_PORT, MSG_LEN};

fn usage() -> ! {
    eprintln!("usage: rdma_server_client server [-s addr] [-p port] [-n connections] [-t secs]");
    eprintln!("       rdma_server_client client -s addr [-b source] [-p port] [-n connections] [-t secs]");
    std::process::exit(2)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let role = args.next().unwrap_or_else(|| usage());
    let (mut addr, mut source): (Option<IpAddr>, Option<IpAddr>) = (None, None);
    let (mut port, mut n, mut timeout) = (DEFAULT_PORT, 1u32, Duration::from_secs(10));
    while let Some(arg) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "-s" => addr = Some(val().parse().unwrap_or_else(|_| usage())),
            "-b" => source = Some(val().parse().unwrap_or_else(|_| usage())),
            "-p" => port = val().parse().unwrap_or_else(|_| usage()),
            "-n" => n = val().parse().unwrap_or_else(|_| usage()),
            "-t" => timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    let mut message = [0u8; MSG_LEN];
    message[..15].copy_from_slice(b"rdma-rs says hi");
    let result: Result<(), cm::BoxError> = match role.as_str() {
        "server" => {
            let bind = SocketAddr::new(addr.unwrap_or(IpAddr::from([0, 0, 0, 0])), port);
            println!("rdma_server_client: listening on {bind}");
            rdma_cm::Listener::bind(bind, 8).map_err(Into::into).and_then(|listener| {
                (0..n).try_for_each(|i| {
                    let got = protocol::serve(&listener, &message, timeout)?;
                    println!("connection {i}: received {got:02x?}, answered");
                    Ok(())
                })
            })
        }
        "client" => {
            let Some(addr) = addr else { usage() };
            let src = source.map(|ip| SocketAddr::new(ip, 0));
            (0..n).try_for_each(|i| {
                let got = protocol::client(SocketAddr::new(addr, port), src, &message, timeout)?;
                println!("connection {i}: sent, received {got:02x?}");
                Ok(())
            })
        }
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("rdma_server_client: {e}");
        std::process::exit(1);
    }
}
