//! `rping`, in Rust: the same flags and the same protocol as rdma-core's `rping`, so either side
//! can be this program or rdma-core's.
//!
//! ```text
//! rping -s [-vV] [-S size] [-C count] [-a addr] [-p port] [-t secs]
//! rping -c [-vV] [-S size] [-C count] [-I addr] -a addr [-p port] [-t secs]
//! ```
//!
//! In the Soft-RoCE VM (`scripts/softroce run -- ...`):
//! ```text
//! rping -s -a 10.77.0.1 -C 5 -v &                                   # rdma-core's server
//! cargo run --example rping -- -c -a 10.77.0.1 -I 10.77.0.2 -C 5 -V -v   # this client
//! ```
//! `-t` (not in rdma-core's rping) bounds every wait, in seconds (default 10).

#[path = "../common/cm.rs"]
mod cm;
mod protocol;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use protocol::{Options, DEFAULT_PORT, DEFAULT_SIZE};

fn usage() -> ! {
    eprintln!("usage: rping -s [-vV] [-S size] [-C count] [-a addr] [-p port] [-t secs]");
    eprintln!("       rping -c [-vV] [-S size] [-C count] [-I addr] -a addr [-p port] [-t secs]");
    std::process::exit(2)
}

fn main() {
    let (mut server, mut client, mut verbose) = (false, false, false);
    let (mut addr, mut source): (Option<IpAddr>, Option<IpAddr>) = (None, None);
    let mut port = DEFAULT_PORT;
    let mut o = Options { size: DEFAULT_SIZE, count: 0, validate: false, timeout: Duration::from_secs(10) };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage());
        match arg.as_str() {
            "-s" => server = true,
            "-c" => client = true,
            "-v" => verbose = true,
            "-V" => o.validate = true,
            "-vV" | "-Vv" => (verbose, o.validate) = (true, true),
            "-a" => addr = Some(val().parse().unwrap_or_else(|_| usage())),
            "-I" => source = Some(val().parse().unwrap_or_else(|_| usage())),
            "-p" => port = val().parse().unwrap_or_else(|_| usage()),
            "-S" => o.size = val().parse().unwrap_or_else(|_| usage()),
            "-C" => o.count = val().parse().unwrap_or_else(|_| usage()),
            "-t" => o.timeout = Duration::from_secs(val().parse().unwrap_or_else(|_| usage())),
            _ => usage(),
        }
    }
    let result = match (server, client) {
        (true, false) => {
            let addr = SocketAddr::new(addr.unwrap_or(IpAddr::from([0, 0, 0, 0])), port);
            rdma_cm::Listener::bind(addr, 3).map_err(Into::into).and_then(|listener| {
                protocol::serve(&listener, &o, |_, data| {
                    if verbose {
                        println!("server ping data: {}", protocol::text(data));
                    }
                })
            })
        }
        (false, true) => {
            let Some(addr) = addr else { usage() };
            let src = source.map(|ip| SocketAddr::new(ip, 0));
            protocol::client(SocketAddr::new(addr, port), src, &o, |_, data| {
                if verbose {
                    println!("ping data: {}", protocol::text(data));
                }
            })
        }
        _ => usage(),
    };
    match result {
        Ok(n) => eprintln!("rping: {n} ping(s) done"),
        Err(e) => {
            eprintln!("rping: {e}");
            std::process::exit(1);
        }
    }
}
