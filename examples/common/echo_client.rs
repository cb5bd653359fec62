//! The echo example's client: `--clients` connections, each a thread (blocking waits) or a task
//! on one current-thread tokio runtime, each sending `--round-trips` messages one at a time and
//! checking every reply byte for byte.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use rdma_cm::{CmId, ConnParams, RouteResolved};
use rdma_verbs::{AccessFlags, Init, QueuePair, Rc};

use crate::echo::{check, fill, hello, summary, Devices, Half, Link, Mode, Rest, Result, Wait, MAX_SIZE, T};

#[derive(clap::Args, Clone)]
pub struct ClientArgs {
    /// The server's address: IP:PORT, or IP (port 7474).
    #[arg(value_parser = crate::parse_addr)]
    addr: SocketAddr,
    /// The local address to connect from (its RDMA device carries the connections).
    #[arg(long)]
    from: Option<IpAddr>,
    /// Connections, each sending its messages one at a time.
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Messages each connection sends (and waits for the echo of).
    #[arg(long, default_value_t = 1000)]
    round_trips: u32,
    /// Bytes per message.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Keep the connections open, idle, this many seconds after the run (to measure an idle
    /// server).
    #[arg(long, default_value_t = 0)]
    hold: u64,
    #[command(flatten)]
    how: crate::How,
}

pub fn run(args: &ClientArgs) -> Result<()> {
    if args.clients == 0 || args.round_trips == 0 || !(1..=MAX_SIZE).contains(&args.size) {
        return Err(format!("--clients and --round-trips at least 1, --size 1..={MAX_SIZE}").into());
    }
    match args.how.mode {
        Mode::Threads => run_threads(args),
        Mode::Async => tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(run_tasks(args)),
    }
}

/// Prints the figures line of the clients' `results` (before `--hold`, so that a script sees
/// the run is over), or returns the first error among them.
fn report(args: &ClientArgs, results: Vec<Result<Vec<u64>>>, wall: Duration) -> Result<()> {
    let rtts = merge(results)?;
    let (n, r, size, how) = (args.clients, args.round_trips, args.size, args.how);
    let figures = summary(rtts, wall);
    println!("echo client: {n} clients x {r} round trips of {size} B ({:?}, wait {:?}): {figures}", how.mode, how.wait);
    Ok(())
}

/// The QP and receives for `id`'s connection.
fn half(devices: &Devices, id: &CmId<RouteResolved>, size: usize) -> Result<(QueuePair<'static, Rc, Init>, Rest)> {
    let open = || id.open_context();
    Ok(Half::new(devices, id.device_name(), open, |qp| id.init_qp(qp, AccessFlags::empty()), size)?.take_qp())
}

fn source(args: &ClientArgs) -> Option<SocketAddr> {
    args.from.map(|ip| SocketAddr::new(ip, 0))
}

/// The first error of `results`, or their round trips.
fn merge(results: Vec<Result<Vec<u64>>>) -> Result<Vec<u64>> {
    results.into_iter().try_fold(Vec::new(), |mut all, r| {
        all.extend(r?);
        Ok(all)
    })
}

// ---- threads, blocking waits ----

fn connect(args: &ClientArgs, devices: &Devices) -> Result<Link> {
    let id = CmId::new()?.resolve(source(args), args.addr).wait(T)?;
    let (qp, rest) = half(devices, &id, args.size)?;
    let conn = id.connect(qp, &ConnParams::new().private_data(&hello(args.size))).wait(T)?;
    Link::new(conn, rest, args.how.wait)
}

fn run_threads(args: &ClientArgs) -> Result<()> {
    let devices = Devices::default();
    let start = Barrier::new(args.clients as usize + 1);
    let (results, wall) = std::thread::scope(|s| {
        let threads: Vec<_> = (0..args.clients)
            .map(|id| {
                let (devices, start) = (&devices, &start);
                s.spawn(move || {
                    let link = connect(args, devices);
                    start.wait();
                    let mut link = link?;
                    let rtts = round_trips(&mut link, id, args);
                    Ok::<_, crate::echo::BoxError>((link, rtts))
                })
            })
            .collect();
        start.wait();
        let t0 = Instant::now();
        let results: Vec<_> = threads.into_iter().map(|t| t.join().expect("a client thread panicked")).collect();
        (results, t0.elapsed())
    });
    let mut links = Vec::new();
    let mut rtts = Vec::new();
    for r in results {
        let (link, r) = r?;
        links.push(link);
        rtts.push(r);
    }
    report(args, rtts, wall)?;
    std::thread::sleep(Duration::from_secs(args.hold));
    drop(links);
    Ok(())
}

/// Client `id`'s round trips, each reply checked: their times in nanoseconds.
fn round_trips(link: &mut Link, id: u32, args: &ClientArgs) -> Result<Vec<u64>> {
    let (mut sent, mut rtts) = (Vec::with_capacity(args.size), Vec::with_capacity(args.round_trips as usize));
    for round in 0..args.round_trips {
        fill(&mut sent, args.size, id, round);
        let t0 = Instant::now();
        link.send(&sent)?;
        let reply = link.ring.recv(T)?;
        rtts.push(t0.elapsed().as_nanos() as u64);
        check(&reply, &sent, id, round)?;
        link.ring.release(reply)?;
    }
    Ok(rtts)
}

// ---- tasks on one current-thread runtime ----

async fn connect_async(
    addr: SocketAddr,
    src: Option<SocketAddr>,
    size: usize,
    wait: Wait,
    devices: Arc<Devices>,
) -> Result<Link> {
    let id = tokio::time::timeout(T, CmId::new()?.resolve(src, addr)).await.map_err(|_| "resolve: timed out")??;
    let (qp, rest) = half(&devices, &id, size)?;
    let hello = hello(size);
    let params = ConnParams::new().private_data(&hello);
    let conn = tokio::time::timeout(T, id.connect(qp, &params)).await.map_err(|_| "connect: timed out")??;
    Link::new(conn, rest, wait)
}

async fn run_tasks(args: &ClientArgs) -> Result<()> {
    let devices = Arc::new(Devices::default());
    let (src, size, wait) = (source(args), args.size, args.how.wait);
    let connecting: Vec<_> =
        (0..args.clients).map(|_| tokio::spawn(connect_async(args.addr, src, size, wait, devices.clone()))).collect();
    let mut links = Vec::new();
    for c in connecting {
        links.push(c.await?);
    }
    let links = links.into_iter().collect::<Result<Vec<_>>>()?;
    let t0 = Instant::now();
    let n = args.round_trips;
    let tasks: Vec<_> =
        links.into_iter().zip(0..).map(|(link, id)| tokio::spawn(round_trips_async(link, id, n, size))).collect();
    let mut results = Vec::new();
    let mut links = Vec::new();
    for t in tasks {
        let (link, rtts) = t.await?;
        links.push(link);
        results.push(rtts);
    }
    let reported = report(args, results, t0.elapsed());
    if reported.is_ok() {
        tokio::time::sleep(Duration::from_secs(args.hold)).await;
    }
    for link in links {
        link.close_async().await;
    }
    reported
}

/// [`round_trips`] awaited; the link comes back to be closed.
async fn round_trips_async(mut link: Link, id: u32, n: u32, size: usize) -> (Link, Result<Vec<u64>>) {
    let (mut sent, mut rtts) = (Vec::with_capacity(size), Vec::with_capacity(n as usize));
    for round in 0..n {
        fill(&mut sent, size, id, round);
        let t0 = Instant::now();
        let reply = async {
            link.send_async(&sent).await?;
            let reply = tokio::time::timeout(T, link.ring.recv_async()).await.map_err(|_| "no reply in time")??;
            Ok::<_, crate::echo::BoxError>(reply)
        };
        let checked = match reply.await {
            Ok(reply) => {
                rtts.push(t0.elapsed().as_nanos() as u64);
                let checked = check(&reply, &sent, id, round).map_err(Into::into);
                checked.and_then(|()| link.ring.release(reply).map_err(Into::into))
            }
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            return (link, Err(e));
        }
    }
    (link, Ok(rtts))
}
