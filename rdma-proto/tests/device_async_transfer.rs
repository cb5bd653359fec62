//! Device tests of the async driver (feature `tokio`): `Server::serve_async` and
//! `send_file_async` run many transfers on one runtime, a task each, and store exactly the
//! bytes sent.
#![cfg(feature = "tokio")]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use rdma_proto::driver::{send_file, send_file_async, ReceiveOptions, ReceiveReport, SendOptions, Server};

mod scratch;

use scratch::{random_file, TempDir};

fn runtime(multi: bool) -> tokio::runtime::Runtime {
    let mut b =
        if multi { tokio::runtime::Builder::new_multi_thread() } else { tokio::runtime::Builder::new_current_thread() };
    b.enable_all().build().unwrap()
}

/// Serves `sessions` on `addr` from the current runtime, collecting the reports.
async fn serve(server: Server, sessions: usize) -> Vec<ReceiveReport> {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    server.serve_async(Some(sessions), move |r| sink.lock().unwrap().push(r)).await.unwrap();
    let reports = std::mem::take(&mut *reports.lock().unwrap());
    reports
}

/// A server on `addr` storing into `dst` (replacing files), and a sender to it from `from`.
fn overwriting_pair(addr: SocketAddr, dst: &std::path::Path, from: Option<SocketAddr>) -> (Server, SendOptions) {
    let mut opts = ReceiveOptions::default();
    opts.dir = Some(dst.to_path_buf());
    opts.overwrite = true;
    let mut send = SendOptions::new(addr);
    send.from = from;
    (Server::bind(addr, opts).unwrap(), send)
}

/// [`serve`] on this thread, with the threaded server.
fn serve_threaded(server: Server, sessions: usize) -> Vec<ReceiveReport> {
    let reports = Arc::new(Mutex::new(Vec::new()));
    let sink = reports.clone();
    server.serve(Some(sessions), move |r| sink.lock().unwrap().push(r)).unwrap();
    let reports = std::mem::take(&mut *reports.lock().unwrap());
    reports
}

/// Two transfers at once, server and both senders on one current-thread runtime: both files
/// arrive byte for byte, and each session reports OK.
#[test]
fn two_transfers_on_one_current_thread_runtime() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("async-src"), TempDir::new("async-dst"));
    let files: Vec<_> = (0..2u64)
        .map(|i| {
            let path = src.0.join(format!("file{i}"));
            let bytes = random_file(&path, 12 << 20 | (i as usize * 4099), 7 + i);
            (path, bytes)
        })
        .collect();
    let addr = SocketAddr::from((topo.server.addr, 18641));
    let mut opts = ReceiveOptions::default();
    opts.dir = Some(dst.0.clone());
    let server = Server::bind(addr, opts).unwrap();
    let rt = runtime(false);
    let reports = rt.block_on(async {
        let serving = tokio::spawn(serve(server, 2));
        let sends: Vec<_> = files
            .iter()
            .map(|(path, _)| {
                let (path, mut opts) = (path.clone(), SendOptions::new(addr));
                opts.from = Some(SocketAddr::from((topo.client.addr, 0)));
                tokio::spawn(async move { send_file_async(&path, &opts, |_, _| {}).await })
            })
            .collect();
        for s in sends {
            let report = s.await.unwrap().unwrap();
            assert!(report.bytes >= 12 << 20);
        }
        serving.await.unwrap()
    });
    assert_eq!(reports.len(), 2);
    for r in &reports {
        assert!(r.result.is_ok(), "{r:?}");
    }
    for (path, bytes) in &files {
        let got = std::fs::read(dst.0.join(path.file_name().unwrap())).unwrap();
        assert!(got == *bytes, "{} differs from what was sent", path.display());
    }
}

/// The same 32 MiB file through the threaded driver (`send_file`, `Server::serve`) and the
/// async one (`send_file_async`, `Server::serve_async` on a multi-thread runtime), alternating
/// three times: every copy is identical; the throughputs are printed side by side.
#[test]
fn async_and_threaded_transfers_side_by_side() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("side-src"), TempDir::new("side-dst"));
    let path = src.0.join("data");
    let bytes = random_file(&path, 32 << 20, 99);
    let from = Some(SocketAddr::from((topo.client.addr, 0)));
    let mut rates = (Vec::new(), Vec::new());
    for round in 0..3u16 {
        for threaded in [true, false] {
            let addr = SocketAddr::from((topo.server.addr, 18650 + round * 2 + u16::from(threaded)));
            let (server, send) = overwriting_pair(addr, &dst.0, from);
            let report = if threaded {
                let serving = std::thread::spawn(move || server.serve(Some(1), |_| {}));
                let r = send_file(&path, &send, |_, _| {}).unwrap();
                serving.join().unwrap().unwrap();
                r
            } else {
                runtime(true).block_on(async {
                    let serving = tokio::spawn(async move { server.serve_async(Some(1), |_| {}).await });
                    let r = send_file_async(&path, &send, |_, _| {}).await.unwrap();
                    serving.await.unwrap().unwrap();
                    r
                })
            };
            let rate = report.bytes as f64 / report.phases.data.as_secs_f64() / 1e6;
            if threaded {
                rates.0.push(rate)
            } else {
                rates.1.push(rate)
            }
            assert!(std::fs::read(dst.0.join("data")).unwrap() == bytes, "round {round}: the copy differs");
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (t, a) = (median(&mut rates.0), median(&mut rates.1));
    println!("32 MiB data phase, median of 3: threaded {t:.1} MB/s, async {a:.1} MB/s, async/threaded {:.2}x", a / t);
}

/// A `send_file_async` future dropped mid-transfer (its `tokio::time::timeout` ran out) is a
/// sender that went away: the receiver's session fails, nothing is left under the final name
/// nor as a temporary, and the next transfer on the same server and runtime arrives whole.
#[test]
fn a_send_dropped_mid_transfer_leaves_nothing_and_the_next_one_arrives() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("drop-src"), TempDir::new("drop-dst"));
    let path = src.0.join("big");
    let bytes = random_file(&path, 48 << 20, 5);
    let addr = SocketAddr::from((topo.server.addr, 18660));
    let mut opts = ReceiveOptions::default();
    opts.dir = Some(dst.0.clone());
    let server = Server::bind(addr, opts).unwrap();
    let mut send = SendOptions::new(addr);
    send.from = Some(SocketAddr::from((topo.client.addr, 0)));
    let reports = runtime(true).block_on(async {
        let serving = tokio::spawn(serve(server, 2));
        // Dropped once 8 MiB of the 48 are written: mid-stream, after the receiver accepted.
        // The progress callback wakes this task through a `Notify`, not a timer: a timer can
        // fire late on a busy runtime, after the sender has written everything.
        let reached = Arc::new(tokio::sync::Notify::new());
        let wake = reached.clone();
        let mut woke = false;
        let progress = move |done, _| {
            if done >= 8 << 20 && !std::mem::replace(&mut woke, true) {
                wake.notify_one();
            }
        };
        let mut first = Box::pin(send_file_async(&path, &send, progress));
        tokio::select! {
            biased;
            () = reached.notified() => {}
            r = &mut first => panic!("the transfer ended before it was dropped: {:?}", r.map(|r| r.bytes)),
        }
        drop(first);
        let mut heard = Vec::new();
        let second = send_file_async(&path, &send, |done, total| heard.push((done, total))).await;
        let reports = serving.await.unwrap();
        let report =
            second.unwrap_or_else(|e| panic!("the second send failed: {e}; the receiver's reports: {reports:?}"));
        assert_eq!(report.bytes, bytes.len() as u64);
        // Every chunk's completion is heard once, however the session's waits took it: each
        // chunk after what the receiver kept of the dropped send (it resumes from there).
        let (size, chunk) = (bytes.len() as u64, u64::from(report.chunk));
        let expected = (size - report.resumed_from).div_ceil(chunk.max(1));
        let from = report.resumed_from;
        assert_eq!(heard.len() as u64, expected, "one call per chunk after {from} of chunk {chunk}: {heard:?}");
        assert!(heard.windows(2).all(|w| w[0].0 < w[1].0), "{heard:?}");
        assert_eq!(heard.last(), Some(&(size, size)));
        reports
    });
    // The sessions end in either order (the dropped one ends when the receiver sees its
    // sender gone): one failed, one stored the file.
    assert_eq!(reports.len(), 2, "{reports:?}");
    let failed = reports.iter().filter(|r| r.result.is_err()).count();
    let stored = reports.iter().filter(|r| r.result.is_ok()).count();
    assert_eq!((failed, stored), (1, 1), "one session failed (the dropped sender's), one stored: {reports:?}");
    let names: Vec<_> = std::fs::read_dir(&dst.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["big"], "what the destination holds");
    assert!(std::fs::read(dst.0.join("big")).unwrap() == bytes, "the second copy differs");
}

/// Striping (`LANES`) through both fronts: an async sender over 3 lanes into `serve_async` on
/// one current-thread runtime, and async against threaded each way; every copy is identical
/// and every send striped.
#[test]
fn striped_transfers_through_the_async_and_threaded_fronts() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("lanes-src"), TempDir::new("lanes-dst"));
    let path = src.0.join("data");
    let bytes = random_file(&path, (24 << 20) + 4099, 77);
    let from = Some(SocketAddr::from((topo.client.addr, 0)));
    for (i, (async_send, async_serve)) in [(true, true), (true, false), (false, true)].into_iter().enumerate() {
        let addr = SocketAddr::from((topo.server.addr, 18670 + i as u16));
        let (server, mut send) = overwriting_pair(addr, &dst.0, from);
        send.lanes = 3;
        let rt = runtime(false);
        let (report, reports) = rt.block_on(async {
            let serving = if async_serve {
                tokio::spawn(serve(server, 1))
            } else {
                tokio::task::spawn_blocking(move || serve_threaded(server, 1))
            };
            let report = if async_send {
                send_file_async(&path, &send, |_, _| {}).await.unwrap()
            } else {
                let (path, send) = (path.clone(), send.clone());
                tokio::task::spawn_blocking(move || send_file(&path, &send, |_, _| {})).await.unwrap().unwrap()
            };
            (report, serving.await.unwrap())
        });
        assert_eq!(report.lanes, 3, "send {i}: striped");
        assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
        assert!(std::fs::read(dst.0.join("data")).unwrap() == bytes, "send {i}: the copy differs");
    }
}

/// A runtime built without tokio's time driver: IO only.
fn io_only_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap()
}

/// A transfer served and sent on a runtime built without tokio's time driver (`enable_io`
/// only): every deadline and pause of the async driver is a `timerfd` on the reactor, so it
/// runs as on any runtime and stores the bytes sent.
#[test]
fn a_transfer_runs_on_a_runtime_without_time() {
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("notime-src"), TempDir::new("notime-dst"));
    let path = src.0.join("data");
    let bytes = random_file(&path, (2 << 20) + 17, 91);
    let addr = SocketAddr::from((topo.server.addr, 18680));
    let (server, send) = overwriting_pair(addr, &dst.0, Some(SocketAddr::from((topo.client.addr, 0))));
    let rt = io_only_runtime();
    let (report, reports) = rt.block_on(async {
        let serving = tokio::spawn(serve(server, 1));
        let report = send_file_async(&path, &send, |_, _| {}).await.unwrap();
        (report, serving.await.unwrap())
    });
    assert_eq!(report.bytes, bytes.len() as u64);
    assert!(reports.iter().all(|r| r.result.is_ok()), "{reports:?}");
    assert!(std::fs::read(dst.0.join("data")).unwrap() == bytes, "the copy differs");
}

/// A receiver that takes the connect request and never answers it: the sender's
/// `connect_timeout` ends the send with the `Timeout` rdma-cm built where the time ran out,
/// naming `rdma_connect` and the whole bound, inside the error that names both addresses
/// (exit code 3); blocking, and awaited on a runtime without tokio's time driver, alike.
#[test]
fn a_connect_no_one_answers_is_the_timeout_of_rdma_connect() {
    let topo = testkit::require_topology!();
    let src = TempDir::new("silent-src");
    let path = src.0.join("data");
    random_file(&path, 4096, 5);
    let addr = SocketAddr::from((topo.server.addr, 18681));
    let listener = rdma_cm::Listener::bind(addr, 4).unwrap();
    let bound = std::time::Duration::from_millis(400);
    let mut send = SendOptions::new(addr);
    send.from = Some(SocketAddr::from((topo.client.addr, 0)));
    send.connect_timeout = bound;
    let rt = io_only_runtime();
    for awaited in [true, false] {
        let start = std::time::Instant::now();
        let sent = match awaited {
            true => rt.block_on(send_file_async(&path, &send, |_, _| {})),
            false => send_file(&path, &send, |_, _| {}),
        };
        let took = start.elapsed();
        let e = sent.expect_err("no one answered");
        match &e {
            rdma_proto::driver::Error::Connect { source, to, .. } => {
                assert_eq!(*to, addr);
                assert!(
                    matches!(**source, rdma_cm::Error::Timeout { what: "rdma_connect", after, .. } if after == bound),
                    "awaited: {awaited}: {source:?}"
                );
            }
            other => panic!("awaited: {awaited}: {other:?}"),
        }
        assert_eq!(e.exit_code(), 3, "{e}");
        let text = e.to_string();
        assert!(text.contains("rdma_connect") && text.contains("timed out after 400ms"), "{text}");
        assert!((bound..bound + std::time::Duration::from_secs(2)).contains(&took), "awaited: {awaited}: {took:?}");
        // The request did reach the listener, which never answered it.
        drop(listener.recv_request(std::time::Duration::from_secs(5)).unwrap());
    }
}
