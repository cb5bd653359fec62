//! Device tests of the driver as an application embeds it: progress per chunk
//! on both sides, typed receiver results (a refusal never reads as `Ok`), and a send cancelled
//! from another thread, which the next send resumes.

#![cfg(feature = "driver")]

mod scratch;

use std::net::SocketAddr;
use std::path::Path;
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
    let server = serve(&topo, 18670, &dst.0, 3);
    let mut sent = Vec::new();
    let report = send_file(&src.0.join("f"), &send_opts(&topo, 18670), |done, total| sent.push((done, total))).unwrap();
    // The same name again, other bytes of the same size: the receiver refuses (it exists; an
    // identical file would be proved and counted as stored).
    let other = TempDir::new("other");
    random_file(&other.0.join("f"), size, 9);
    let again = send_file(&other.0.join("f"), &send_opts(&topo, 18670), |_, _| {});
    // A batch of two files, the last entry a file: each chunk of each is heard once, and the
    // last call is the batch's total (not the last file's chunks again after its ACK).
    let (a, b) = (src.0.join("a"), src.0.join("b"));
    let (a_len, b_len) = (random_file(&a, (1 << 20) + 7, 3).len() as u64, random_file(&b, 600_000, 4).len() as u64);
    let mut in_batch = Vec::new();
    let batch =
        rdma_proto::driver::send_files(&[a, b], &send_opts(&topo, 18670), |d, t| in_batch.push((d, t))).unwrap();
    let (reports, received) = server.join().unwrap();
    let total = a_len + b_len;
    let chunk = u64::from(send_opts(&topo, 18670).chunk);
    assert_eq!(batch.bytes, total, "{batch:?}");
    assert_eq!(in_batch.len() as u64, a_len.div_ceil(chunk) + b_len.div_ceil(chunk), "{in_batch:?}");
    assert!(in_batch.windows(2).all(|w| w[0].0 < w[1].0), "{in_batch:?}");
    assert_eq!(in_batch.last(), Some(&(total, total)), "{in_batch:?}");
    assert!(std::fs::read(dst.0.join("f")).unwrap() == data);

    let chunks = (size as u64).div_ceil(u64::from(report.chunk));
    assert_eq!(sent.len() as u64, chunks, "one sender progress call per chunk: {sent:?}");
    assert!(sent.windows(2).all(|w| w[0].0 < w[1].0), "{sent:?}");
    assert_eq!(sent.last(), Some(&(size as u64, size as u64)));
    // The receiver's events of the single file (the batch's files are of other sizes).
    let received: Vec<_> = received.into_iter().filter(|&(_, of)| of == size as u64).collect();
    assert_eq!(received.len() as u64, chunks, "one receiver progress call per chunk");
    assert_eq!(received.last(), Some(&(size as u64, size as u64)));

    assert!(matches!(again, Err(Error::Refused { status: Status::Exists, .. })), "{again:?}");
    assert_eq!(reports.len(), 3);
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
            cancel.set();
            cancelled_at = Some(std::time::Instant::now());
        }
    });
    let took = cancelled_at.expect("progress passed 8 MiB").elapsed();
    eprintln!("cancelled send: {r:?} after {took:?}");
    assert!(matches!(r, Err(Error::Cancelled)), "{r:?}");
    // Checked every round, and an idle round's sleep wakes for it; plus the teardown's
    // disconnect (up to 1 s when the peer does not answer it).
    assert!(took < Duration::from_millis(1500), "cancelling took {took:?}");
    assert_eq!(Error::Cancelled.exit_code(), 8);
    // The receiver is told the send was cancelled (a CANCEL before the sender leaves), and
    // keeps what it stored: the next send resumes.
    std::thread::sleep(Duration::from_millis(300));
    let mut again = send_opts(&topo, 18671);
    again.timeout = Duration::from_secs(10);
    let report = send_file(&src.0.join("f"), &again, |_, _| {}).unwrap();
    let (reports, _) = server.join().unwrap();
    eprintln!("resumed at {}", report.resumed_from);
    assert!(report.resumed_from >= 8 << 20, "resumed at {}", report.resumed_from);
    assert!(std::fs::read(dst.0.join("f")).unwrap() == data);
    // Reports come as sessions finish their teardown, in either order.
    // The cancelled session is reported as cancelled, not as a peer that vanished.
    assert!(reports.iter().any(|r| matches!(r.result, Err(Error::Cancelled))), "{reports:?}");
    assert!(reports.iter().any(|r| r.result.is_ok()), "{reports:?}");
    let left: Vec<_> = std::fs::read_dir(&dst.0).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, ["f"]);
}

/// An embedder's policy (`ReceiveOptions::policy`) sees every offer before anything is opened
/// for it, with the sender's address and whether it proved the secret, and decides: here it
/// refuses `*.key` files and anything over 1 MiB. A refused single file answers the sender
/// with the policy's status and detail; a refused batch entry is refused alone and the rest of
/// the batch is stored; nothing is left of what was refused.
#[test]
fn an_embedders_policy_sees_each_offer_first_and_its_refusals_store_nothing() {
    use rdma_proto::driver::{send_files, Decision, Policy};
    let topo = testkit::require_topology!();
    let (src, dst) = (TempDir::new("policy-src"), TempDir::new("policy-dst"));
    random_file(&src.0.join("id.key"), 1000, 2);
    let tree = src.0.join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let small = random_file(&tree.join("small"), 4096, 3);
    random_file(&tree.join("sub/big"), (1 << 20) + 1, 4);
    random_file(&tree.join("sub/other.key"), 10, 5);
    let kept = random_file(&tree.join("sub/kept"), 10, 6);

    let offers = Arc::new(Mutex::new(Vec::new()));
    let seen = offers.clone();
    let mut opts = ReceiveOptions::default();
    opts.dir = Some(dst.0.clone());
    opts.timeout = Duration::from_secs(5);
    opts.policy = Some(Policy::new(move |o| {
        seen.lock().unwrap().push((o.path.to_owned(), o.directory, o.size, o.in_batch, o.authenticated, o.peer.ip()));
        if o.path.ends_with(".key") {
            Decision::refuse(Status::NotAuthorized, "no keys here")
        } else if o.size > 1 << 20 {
            Decision::refuse(Status::TooLarge, "at most 1 MiB per file here")
        } else {
            Decision::Accept
        }
    }));
    let server = Server::bind(SocketAddr::new(topo.server.addr.into(), 18672), opts).unwrap();
    let serving = std::thread::spawn(move || {
        let reports = Arc::new(Mutex::new(Vec::new()));
        let r = reports.clone();
        server.serve(Some(2), move |report| r.lock().unwrap().push(report)).unwrap();
        let taken = std::mem::take(&mut *reports.lock().unwrap());
        taken
    });

    let single = send_file(&src.0.join("id.key"), &send_opts(&topo, 18672), |_, _| {});
    assert!(
        matches!(&single, Err(Error::Refused { status: Status::NotAuthorized, detail, .. }) if detail == "no keys here"),
        "{single:?}"
    );
    let batch = send_files(&[tree], &send_opts(&topo, 18672), |_, _| {}).unwrap();
    let reports = serving.join().unwrap();
    eprintln!("{batch:?}");
    let verdicts: Vec<(String, Option<Status>)> = batch
        .entries
        .iter()
        .map(|e| {
            let status = match &e.result {
                Ok(()) => Some(Status::Ok),
                Err(Error::Refused { status, .. }) => Some(*status),
                Err(_) => None,
            };
            (e.path.clone(), status)
        })
        .collect();
    for (path, want) in [
        ("tree/small", Status::Ok),
        ("tree/sub/big", Status::TooLarge),
        ("tree/sub/other.key", Status::NotAuthorized),
        ("tree/sub/kept", Status::Ok),
    ] {
        assert!(verdicts.contains(&(path.to_owned(), Some(want))), "{path}: {verdicts:?}");
    }
    assert!(std::fs::read(dst.0.join("tree/small")).unwrap() == small);
    assert!(std::fs::read(dst.0.join("tree/sub/kept")).unwrap() == kept);
    let mut left: Vec<String> = std::fs::read_dir(dst.0.join("tree/sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["kept"], "nothing of the refused entries, no temporary");
    assert!(!dst.0.join("id.key").exists());
    assert_eq!(reports.len(), 2);

    // The policy saw every offer, each once, with the sender's address; no secret here.
    let offers = offers.lock().unwrap();
    let client = std::net::IpAddr::from(topo.client.addr);
    assert!(offers.iter().all(|o| o.5 == client && !o.4), "{offers:?}");
    assert_eq!(offers.first().map(|o| (o.0.as_str(), o.3)), Some(("id.key", false)), "{offers:?}");
    for path in ["tree/small", "tree/sub/big", "tree/sub/other.key", "tree/sub/kept"] {
        assert_eq!(offers.iter().filter(|o| o.0 == path && o.3).count(), 1, "{path}: {offers:?}");
    }
    assert!(offers.iter().any(|o| o.0 == "tree/sub/big" && o.2 == (1 << 20) + 1 && !o.1), "{offers:?}");
    assert!(offers.iter().any(|o| o.0 == "tree" && o.1), "the directory entry too: {offers:?}");
}

/// A send to a host that is not there says which addresses it tried and that nothing answered
/// from the receiver's.
#[test]
fn a_send_to_an_absent_host_names_both_addresses_and_says_nothing_answered() {
    let topo = testkit::require_topology!();
    let src = TempDir::new("absent");
    random_file(&src.0.join("f"), 1024, 3);
    // On the server port's subnet, but nobody has it: ARP goes unanswered.
    let octets = topo.server.addr.octets();
    let mut opts = SendOptions::new(SocketAddr::from(([octets[0], octets[1], octets[2], 99], 18672)));
    opts.from = Some(SocketAddr::new(topo.client.addr.into(), 0));
    opts.connect_timeout = Duration::from_secs(1);
    let err = send_file(&src.0.join("f"), &opts, |_, _| {}).unwrap_err();
    let text = err.to_string();
    eprintln!("{err:?}: {text}");
    assert_eq!(err.exit_code(), 3, "a timeout: {err:?}");
    let to = format!("{}.{}.{}.99:18672", octets[0], octets[1], octets[2]);
    assert!(text.contains(&to), "the receiver's address is named: {text}");
    assert!(text.contains(&topo.client.addr.to_string()), "the sender's address is named: {text}");
    assert!(text.contains("nothing answered"), "the side at fault is said: {text}");
}
