//! Device tests of the driver as an application embeds it (issue 21, 2.5): progress per chunk
//! on both sides, typed receiver results (a refusal never reads as `Ok`), and a send cancelled
//! from another thread, which the next send resumes.

#![cfg(feature = "driver")]

mod scratch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdma_proto::driver::{send_file, Error, Progress, ReceiveOptions, ReceiveReport, SendOptions, Server};
use rdma_proto::Status;
use scratch::{random_file, TempDir};

/// A server on rxe0's `port` storing into `dir`, serving `sessions` on a thread; the reports
/// and the receiver's progress events (done, size) come back when it ends.
type Served = std::thread::JoinHandle<(Vec<ReceiveReport>, Vec<(u64, u64)>)>;

fn serve(topo: &testkit::Topology, port: u16, dir: &Path, sessions: usize) -> Served {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let mut opts = ReceiveOptions::default();
    opts.dir = Some(dir.to_owned());
    opts.timeout = Duration::from_secs(5);
    opts.progress = Some(Progress::new(move |e| sink.lock().unwrap().push((e.done, e.size))));
    let server = Server::bind(SocketAddr::new(topo.server.addr.into(), port), opts).unwrap();
    std::thread::spawn(move || {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let r = reports.clone();
        server.serve(Some(sessions), move |report| r.lock().unwrap().push(report)).unwrap();
        let reports = std::mem::take(&mut *reports.lock().unwrap());
        let events = std::mem::take(&mut *events.lock().unwrap());
        (reports, events)
    })
}

fn send_opts(topo: &testkit::Topology, port: u16) -> SendOptions {
    let mut o = SendOptions::new(SocketAddr::new(topo.server.addr.into(), port));
    o.from = Some(SocketAddr::new(topo.client.addr.into(), 0));
    o.chunk = 256 << 10;
    o
}

#[test]
fn progress_comes_per_chunk_on_both_sides_and_refusals_are_typed() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("src"), TempDir::new("dst"));
    let size = (5 << 20) + 12_345;
    let data = random_file(&src.0.join("f"), size, 1);
    let server = serve(&topo, 18670, &dst.0, 2);
    let mut sent = Vec::new();
    let report = send_file(&src.0.join("f"), &send_opts(&topo, 18670), |done, total| sent.push((done, total))).unwrap();
    // The same file again: the receiver refuses (it exists).
    let again = send_file(&src.0.join("f"), &send_opts(&topo, 18670), |_, _| {});
    let (reports, received) = server.join().unwrap();
    assert!(std::fs::read(dst.0.join("f")).unwrap() == data);

    let chunks = (size as u64).div_ceil(u64::from(report.chunk));
    assert_eq!(sent.len() as u64, chunks, "one sender progress call per chunk: {sent:?}");
    assert!(sent.windows(2).all(|w| w[0].0 < w[1].0), "{sent:?}");
    assert_eq!(sent.last(), Some(&(size as u64, size as u64)));
    assert_eq!(received.len() as u64, chunks, "one receiver progress call per chunk");
    assert_eq!(received.last(), Some(&(size as u64, size as u64)));

    assert!(matches!(again, Err(Error::Refused { status: Status::Exists, .. })), "{again:?}");
    assert_eq!(reports.len(), 2);
    let ok = reports.iter().find(|r| r.result.is_ok()).expect("the stored session");
    assert_eq!(ok.status(), Some(Status::Ok));
    let refused = reports.iter().find(|r| r.result.is_err()).expect("the refused session");
    assert!(matches!(refused.result, Err(Error::Refused { status: Status::Exists, .. })), "{refused:?}");
    assert_eq!(refused.status(), Some(Status::Exists), "a refusal is no Ok");
}

#[test]
fn a_cancelled_send_stops_within_milliseconds_and_the_next_resumes() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("csrc"), TempDir::new("cdst"));
    let data = random_file(&src.0.join("f"), 48 << 20, 2);
    let server = serve(&topo, 18671, &dst.0, 2);
    let opts = send_opts(&topo, 18671);
    let cancel = opts.cancel.clone();
    let mut cancelled_at = None;
    let r = send_file(&src.0.join("f"), &opts, |done, _| {
        if done >= 8 << 20 && cancelled_at.is_none() {
            cancel.store(true, Ordering::Relaxed);
            cancelled_at = Some(std::time::Instant::now());
        }
    });
    let took = cancelled_at.expect("progress passed 8 MiB").elapsed();
    eprintln!("cancelled send: {r:?} after {took:?}");
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    // Checked every round: well within the 20 ms an idle round may sleep, plus the teardown's
    // disconnect (up to 1 s when the peer does not answer it).
    assert!(took < Duration::from_millis(1500), "cancelling took {took:?}");
    assert_eq!(Error::Cancelled.exit_code(), 8);
    // The receiver sees its sender gone, and keeps what it stored: the next send resumes.
    std::thread::sleep(Duration::from_millis(300));
    let mut again = send_opts(&topo, 18671);
    again.timeout = Duration::from_secs(10);
    let report = send_file(&src.0.join("f"), &again, |_, _| {}).unwrap();
    let (reports, _) = server.join().unwrap();
    eprintln!("resumed at {}", report.resumed_from);
    assert!(report.resumed_from >= 8 << 20, "resumed at {}", report.resumed_from);
    assert!(std::fs::read(dst.0.join("f")).unwrap() == data);
    // Reports come as sessions finish their teardown, in either order.
    assert!(reports.iter().any(|r| matches!(r.result, Err(Error::PeerDisconnected))), "{reports:?}");
    assert!(reports.iter().any(|r| r.result.is_ok()), "{reports:?}");
    let left: Vec<_> = std::fs::read_dir(&dst.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["f"]);
}
