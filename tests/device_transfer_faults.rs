//! Device tests of what a user would see go wrong with `rdma-copy`: counts, session ids, a
//! source that changes, a killed receiver, the connect timeout, the secret and a forger on the
//! path (rxe1 10.77.0.2 sends to rxe0 10.77.0.1).

mod cli;

use std::process::Command;
use std::time::{Duration, Instant};

use cli::*;
use rdma_proto::wire::{self, Hello, Message};
use rdma_verbs::{RemoteRegion, SlotRequest};

/// `recv --count 1` does not use its one transfer on a connection that sends nothing (it would
/// exit before the real sender came): only a HELLO counts; the idle connection is ended once the count is
/// reached, and is no failure (exit 0).
#[test]
fn recv_count_counts_transfers_not_connections() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("count-src"), scratch("count-dst"));
    let data = random_file(&src.join("f"), 100_000, 1);
    let rx = Receiver::start(&topo, 7560, &["--dir", dst.to_str().unwrap(), "--count", "1", "--timeout", "30"]);
    let idle = idle_connection(&topo, 7560);
    std::thread::sleep(Duration::from_millis(300));
    drop(idle);
    let idle2 = idle_connection(&topo, 7560);
    let out = send(&topo, 7560, &[src.join("f").to_str().unwrap()]);
    assert!(out.status.success(), "the receiver still served after an idle connection: {}", text(&out.stderr));
    let t = Instant::now();
    let (code, report) = rx.finish(Duration::from_secs(10));
    eprintln!("receiver (exited {:?} after the transfer): {report}", t.elapsed());
    drop(idle2);
    assert_eq!(code, 0, "connections that asked for no transfer are no failure: {report}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
}

#[cfg(feature = "fault-injection")]
/// Two senders that use one session id are both served: their temporaries have different
/// names (one name would give one of them DiskIo "File exists", with the receiver's absolute
/// path in the detail).
#[test]
fn two_senders_with_one_session_id_are_both_served() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("sid-src"), scratch("sid-dst"));
    let da = random_file(&src.join("a"), 24 << 20, 2);
    let db = random_file(&src.join("b"), 24 << 20, 3);
    // No --count: a sender's retry is a session of its own.
    let rx = Receiver::start(&topo, 7561, &["--dir", dst.to_str().unwrap()]);
    // Two senders at once: Linux 6.1's rxe ends some such connections under TCG (Known limits
    // in docs/testing.md; seen here once, 2026-11-27), and a user's answer is --retries. A
    // retry keeps the session id.
    let sid = std::ffi::OsStr::new("--test-session=42");
    let retries = [std::ffi::OsStr::new("--retries"), "3".as_ref()];
    let a = spawn_send(&topo, 7561, &[&retries[..], &[sid, src.join("a").as_os_str()]].concat());
    let b = spawn_send(&topo, 7561, &[&retries[..], &[sid, src.join("b").as_os_str()]].concat());
    let (ca, ea, _) = wait_within(a, Duration::from_secs(120), "sender a");
    let (cb, eb, _) = wait_within(b, Duration::from_secs(120), "sender b");
    let (code, report) = rx.stop(Duration::from_secs(30));
    eprintln!("receiver: {report}");
    assert_eq!((ca, cb), (Some(0), Some(0)), "a: {ea}\nb: {eb}");
    assert!(!report.contains(dst.to_str().unwrap()), "a detail named the receiver's path: {report}");
    assert_eq!(code, 128 + libc::SIGTERM, "{report}");
    for line in failures_retried(&report, &["a", "b"]) {
        eprintln!("tried again after Linux 6.1's rxe ended it: {line}");
    }
    assert!(std::fs::read(dst.join("a")).unwrap() == da);
    assert!(std::fs::read(dst.join("b")).unwrap() == db);
}

/// A source rewritten while it is sent is not stored torn with ACK OK: the sender compares
/// the file's identity (size, mtime, ctime, inode) once it read every chunk and fails (exit 5)
/// before its FIN; the receiver stores nothing.
#[test]
fn a_source_changed_while_it_is_sent_is_not_stored() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("torn-src"), scratch("torn-dst"));
    let path = src.join("f");
    // Long enough to be rewritten mid-transfer: the rewrite follows the first chunk at once.
    random_file(&path, 32 << 20, 4);
    let rx = Receiver::start(&topo, 7562, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
    let sender = spawn_send(&topo, 7562, &[path.as_os_str()]);
    wait_for_temporary(&dst);
    // Rewrite the first 4 KiB in place, as an editor or a log writer would (same size).
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.write_all_at(&[0x5a; 4096], 0).unwrap();
    }
    let (code, err, _) = wait_within(sender, Duration::from_secs(120), "sender");
    let (_, report) = rx.finish(Duration::from_secs(30));
    eprintln!("sender exit {code:?}: {err}\nreceiver: {report}");
    assert_eq!(code, Some(5), "{err}");
    assert!(err.contains("changed while it was being sent"), "{err}");
    // Nothing under the name and no session temporary. What was stored of the old version is
    // a hidden partial keyed to it, which no later send continues (the file's key changed) and
    // which expires (`--partial-ttl`).
    assert!(listing_without_partials(&dst).is_empty(), "something was stored: {:?}", listing(&dst));
}

/// The receiver's line for a session gives its id and rate even when it failed: a HELLO refused
/// before anything was opened logged session 0000000000000000, and a session that failed after
/// storing data reported 0.0 MB/s.
#[test]
fn failed_and_refused_sessions_report_their_id_and_rate() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("rate-src"), scratch("rate-dst"));
    random_file(&src.join("big"), 256 << 20, 5);
    let rx = Receiver::start(
        &topo,
        7563,
        &["--dir", dst.to_str().unwrap(), "--count", "2", "--timeout", "5", "--max-size", "1G"],
    );
    // A HELLO the receiver refuses before opening anything (a name it does not take), sent by
    // hand: rdma-copy checks names before it connects.
    let mut raw = RawSender::connect(&topo, 7563);
    let bad = Hello { name: "..".into(), ..raw_hello(4096) };
    let mut out = Vec::new();
    wire::encode(0x5e55, &Message::Hello(bad), &mut out).unwrap();
    raw.send_bytes(&out).unwrap();
    match raw.recv() {
        Message::Ack(a) => assert_eq!(a.status, rdma_proto::Status::BadName),
        other => panic!("{other:?} instead of an ACK"),
    }
    drop(raw);
    let mut sender = spawn_send(&topo, 7563, &[src.join("big").as_os_str()]);
    wait_for_temporary(&dst);
    std::thread::sleep(Duration::from_millis(1500));
    sender.kill().unwrap();
    sender.wait().unwrap();
    let (_, report) = rx.finish(Duration::from_secs(60));
    eprintln!("receiver: {report}");
    for line in report.lines() {
        assert!(!line.starts_with("0000000000000000"), "a session reported without its id: {line}");
    }
    let failed = report.lines().find(|l| l.contains("big") && l.contains("failed")).expect("the killed session");
    let (bytes, rate) = bytes_and_rate(failed);
    assert!(bytes > 0, "{failed}");
    assert!(rate > 0.0, "a session that stored {bytes} bytes reported {rate} MB/s: {failed}");
}

/// "(N bytes, R MB/s)" of a receiver's report line.
fn bytes_and_rate(line: &str) -> (u64, f64) {
    let inner = line.split_once(" (").and_then(|(_, r)| r.split_once(')')).map(|(i, _)| i).unwrap_or("");
    let mut it = inner.split(", ");
    let bytes = it.next().and_then(|b| b.strip_suffix(" bytes")).and_then(|b| b.parse().ok()).unwrap_or(0);
    let rate = it.next().and_then(|r| r.strip_suffix(" MB/s")).and_then(|r| r.parse().ok()).unwrap_or(0.0);
    (bytes, rate)
}

/// Every kill of the receiver gives the sender "the peer disconnected" (exit 6), whichever
/// completion failed first (it depends on the moment: judged by it alone, 3 kills of 5 gave
/// exit 2, "RemoteAccessError").
#[test]
fn a_killed_receiver_always_gives_the_sender_exit_6() {
    let topo = testkit::require_topology!();
    let src = scratch("rk6-src");
    random_file(&src.join("big"), 96 << 20, 7);
    for (i, delay_ms) in [0u64, 150, 400, 700, 1000].into_iter().enumerate() {
        let dst = scratch(&format!("rk6-dst{i}"));
        let port = 7564;
        let mut rx = Receiver::start(&topo, port, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
        let sender = spawn_send(&topo, port, &["--timeout".as_ref(), "10".as_ref(), src.join("big").as_os_str()]);
        wait_for_temporary(&dst);
        std::thread::sleep(Duration::from_millis(delay_ms));
        rx.child.kill().unwrap();
        let _ = rx.child.wait();
        let (code, err, waited) = wait_within(sender, Duration::from_secs(30), "sender");
        eprintln!("kill {i} ({delay_ms} ms into the data): exit {code:?} after {waited:?}: {}", err.trim());
        if code == Some(0) {
            continue; // the transfer finished before the kill: nothing to judge
        }
        assert_eq!(code, Some(6), "kill {i}: {err}");
        assert!(err.contains("disconnected"), "kill {i}: {err}");
    }
}

/// `--connect-timeout` bounds resolving and connecting together, not each step (17.5 s for
/// 10 s, so). With 1.2 s of delay each way on the wire (netem), resolving (an ARP round trip)
/// and connecting (REQ/REP) each take about 2.4 s: under a 3 s bound each, over it together.
/// The send fails as a timeout (exit 3; bounding each step, it would connect and exit 0) within
/// the bound and a margin.
///
/// The time is counted from the sender's own "sending" log line (just before it resolves) to
/// its exit, not from the spawn: starting the process (the debug binary read over the VM's 9p
/// root under TCG) took from 0.5 s to over 2 s on a loaded CI host (a CI run once measured
/// 5.4 s from spawn to exit where the sender's own part was 3.1 s), and that is not what the
/// bound is about. The margin of 1.5 s holds the teardown after the timeout and the exit.
#[test]
fn connect_timeout_bounds_resolving_and_connecting_together() {
    let topo = testkit::require_topology!();
    let src = scratch("ct-src");
    random_file(&src.join("f"), 4096, 8);
    let rx = Receiver::start(&topo, 7565, &["--discard", "--count", "1"]);
    let delay = Netem::delay(&["veth0", "veth1"], "1200ms");
    let _ = Command::new("ip").args(["neigh", "flush", "dev", "veth1"]).status();
    let _ = Command::new("ip").args(["neigh", "flush", "dev", "veth0"]).status();
    let to = format!("{}:7565", topo.server.addr);
    let t = Instant::now();
    let out = cli::rdma_copy()
        .args(["send", "--quiet", "--to", &to, "--from", &topo.client.addr.to_string()])
        .args(["--connect-timeout", "3", src.join("f").to_str().unwrap()])
        .env("RUST_LOG", "rdma_proto=info")
        .output()
        .unwrap();
    let own = own_time(&out, std::time::SystemTime::now());
    let took = t.elapsed();
    drop(delay);
    let err = text(&out.stderr);
    eprintln!(
        "send with --connect-timeout 3: exit {:?}, {own:?} from its \"sending\" line to its exit \
         ({took:?} from the spawn): {}",
        out.status.code(),
        err.trim()
    );
    assert!(own < Duration::from_millis(4500), "took {own:?} for a 3 s bound: {err}");
    assert_eq!(out.status.code(), Some(3), "{err}");
    // The receiver saw no transfer; a plain send now completes it.
    let out = send(&topo, 7565, &[src.join("f").to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{report}");
}

/// Every failed receive on the receiver was reported as "the peer disconnected": a peer's WRITE
/// outside its grant or a Send larger than the receive buffers must say what the peer did. The
/// receiver reports the violation, stores nothing, and serves the next sender.
#[test]
fn a_peers_violations_are_reported_as_such_and_leave_nothing() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("viol-src"), scratch("viol-dst"));
    let data = random_file(&src.join("after"), 50_000, 9);
    let rx = Receiver::start(&topo, 7566, &["--dir", dst.to_str().unwrap(), "--count", "3", "--timeout", "5"]);

    // A WRITE with immediate past the end of the granted slots.
    let mut s = RawSender::connect(&topo, 7566);
    let g = s.hello(11, "outside", 64 << 10);
    let outside =
        RemoteRegion { addr: g.addr + u64::from(g.slot_size) * u64::from(g.slot_count), rkey: g.rkey, len: 4096 };
    let slot = s.pool.try_take().unwrap();
    let r = s.post(SlotRequest::write(slot, 4096, outside).with_imm(0));
    eprintln!("WRITE outside the grant: {r:?}");
    assert!(r.is_err(), "the device let a WRITE outside the grant through");
    drop(s);

    // A Send larger than the receiver's receive buffers (MAX_MESSAGE_LEN).
    let mut s = RawSender::connect(&topo, 7566);
    let _ = s.hello(12, "oversized", 64 << 10);
    let r = s.send_bytes(&[7u8; 4 * wire::MAX_MESSAGE_LEN]);
    eprintln!("oversized Send: {r:?}");
    drop(s);

    let out = send(&topo, 7566, &[src.join("after").to_str().unwrap()]);
    assert!(out.status.success(), "the receiver kept serving: {}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    eprintln!("receiver: {report}");
    assert_eq!(code, 9, "{report}");
    for name in ["outside", "oversized"] {
        let line = report.lines().find(|l| l.contains(name)).unwrap_or_else(|| panic!("no line for {name}: {report}"));
        assert!(line.contains("broke the rules"), "{name}: {line}");
    }
    assert_eq!(listing(&dst), ["after"], "nothing of the violating sessions is left");
    assert!(std::fs::read(dst.join("after")).unwrap() == data);
}

/// Writes `secret` to a file of mode `mode` in `dir`.
fn secret_file(dir: &std::path::Path, name: &str, secret: &str, mode: u32) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// Runs `rdma-copy send` with `RDMA_COPY_SECRET` set to `secret` (or unset).
fn send_with_secret(
    topo: &testkit::Topology,
    port: u16,
    secret: Option<&str>,
    file: &std::path::Path,
) -> std::process::Output {
    send_with_secret_timed(topo, port, secret, file).0
}

/// [`send_with_secret`], and the time from the sender's own "sending" log line to its exit
/// ([`own_time`]).
fn send_with_secret_timed(
    topo: &testkit::Topology,
    port: u16,
    secret: Option<&str>,
    file: &std::path::Path,
) -> (std::process::Output, Duration) {
    let to = format!("{}:{port}", topo.server.addr);
    let mut c = cli::rdma_copy();
    c.args(["send", "--quiet", "--to", &to, "--from", &topo.client.addr.to_string()]).arg(file);
    c.env("RUST_LOG", "rdma_proto=info");
    match secret {
        Some(s) => c.env("RDMA_COPY_SECRET", s),
        None => c.env_remove("RDMA_COPY_SECRET"),
    };
    let out = c.output().unwrap();
    let took = own_time(&out, std::time::SystemTime::now());
    (out, took)
}

/// Authorization: a receiver with `--secret-file` serves a sender that proves
/// the secret (from `RDMA_COPY_SECRET`); one without it or with another is refused with
/// NotAuthorized (exit 19) and leaves nothing; past 5 wrong proofs from its address the answers
/// to further wrong ones are held back, while the right secret is still served at once; a
/// sender with a secret refuses a receiver that cannot prove it.
#[test]
fn a_receiver_with_a_secret_serves_only_senders_that_prove_it() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("auth-src"), scratch("auth-dst"), scratch("auth-keys"));
    let data = random_file(&src.join("f"), 300_000, 10);
    const SECRET: &str = "a shared secret of 32 bytes, ok!";
    let open = secret_file(&keys, "open", SECRET, 0o644);
    let key = secret_file(&keys, "key", SECRET, 0o600);

    // A secret file others can read is refused outright.
    let to = format!("{}:7567", topo.server.addr);
    let out = cli::rdma_copy().args(["recv", "--listen", &to, "--secret-file"]).arg(&open).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("chmod 600"), "{}", text(&out.stderr));

    let mut rx = Receiver::start(
        &topo,
        7567,
        &["--dir", dst.to_str().unwrap(), "--count", "10", "--secret-file", key.to_str().unwrap()],
    );
    let out = send_with_secret(&topo, 7567, Some(SECRET), &src.join("f"));
    assert!(out.status.success(), "with the secret: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    std::fs::remove_file(dst.join("f")).unwrap();

    let out = send_with_secret(&topo, 7567, None, &src.join("f"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(19), "without a secret: {err}");
    assert!(err.contains("requires a shared secret"), "{err}");
    assert!(listing(&dst).is_empty());

    // Wrong proofs: the first 5 answered at once, the next held back 1 s, then 2 s. Each is
    // timed from its sender's own "sending" line: starting the process swings by more than the
    // holds' margins under a loaded CI host (a 7th wrong proof measured 2.57 s from the spawn
    // where the first five took 0.69-0.86 s).
    let mut took = Vec::new();
    for i in 0..7 {
        let (out, own) = send_with_secret_timed(&topo, 7567, Some("not the secret, but long enough"), &src.join("f"));
        took.push(own);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(19), "wrong secret {i}: {err}");
        assert!(err.contains("proof of the shared secret is wrong"), "{err}");
        assert!(!err.contains(SECRET), "{err}");
    }
    eprintln!("wrong proofs answered after {took:?}");
    let base = *took[..5].iter().min().unwrap();
    assert!(took[5] >= base + Duration::from_millis(800), "the 6th wrong proof was not slowed: {took:?}");
    // Each bound is from the quickest unheld answer: a hold only adds to the time, so noise
    // cannot make a held answer look early. Comparing the 7th with the 6th would put noise on
    // both sides (CI once measured the 6th at base + 1.33 s and the 7th at base + 2.03 s).
    assert!(took[6] >= base + Duration::from_millis(1700), "the 7th wrong proof was not slowed more: {took:?}");
    // The right secret from the same address is served, and not held back.
    let (out, own) = send_with_secret_timed(&topo, 7567, Some(SECRET), &src.join("f"));
    let err = text(&out.stderr);
    assert!(out.status.success(), "the right secret after 7 wrong proofs: {err}");
    assert!(own < took[5], "the right secret was held back: {own:?}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    std::fs::remove_file(dst.join("f")).unwrap();
    rx.child.kill().unwrap();
    let _ = rx.child.wait();

    // A receiver without the secret: the sender with one sends nothing to it.
    let rx = Receiver::start(&topo, 7568, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
    let out = send_with_secret(&topo, 7568, Some(SECRET), &src.join("f"));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("without proving"), "{err}");
    let (_, report) = rx.finish(Duration::from_secs(30));
    eprintln!("receiver without a secret: {report}");
    assert!(listing(&dst).is_empty(), "{:?}", listing(&dst));
}

/// With `--count 1` and a secret, only a sender that proved the secret counts (a HELLO with a
/// wrong proof using up the count would make the receiver exit 9, and the sender with the
/// secret find nobody listening); the wrong proof and the sender without a secret are
/// refused (exit 19) and reported, the right one is served, and the receiver exits 0.
#[test]
fn senders_that_cannot_prove_the_secret_do_not_use_up_the_count() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("count-auth-src"), scratch("count-auth-dst"), scratch("count-auth-keys"));
    let data = random_file(&src.join("f"), 100_000, 11);
    const SECRET: &str = "a shared secret of 32 bytes, ok!";
    let key = secret_file(&keys, "key", SECRET, 0o600);
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7569, &["--dir", dir, "--count", "1", "--secret-file", key.to_str().unwrap()]);
    let out = send_with_secret(&topo, 7569, Some("not the secret, but long enough"), &src.join("f"));
    assert_eq!(out.status.code(), Some(19), "a wrong secret: {}", text(&out.stderr));
    let out = send_with_secret(&topo, 7569, None, &src.join("f"));
    assert_eq!(out.status.code(), Some(19), "no secret: {}", text(&out.stderr));
    let out = send_with_secret(&topo, 7569, Some(SECRET), &src.join("f"));
    assert!(out.status.success(), "the right secret after two that could not prove it: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    let (code, report) = rx.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "the refused senders counted as failed transfers: {report}");
    assert_eq!(report.lines().count(), 3, "{report}");
}

/// With a secret the digest is keyed: someone on the path who rewrites a WRITE's payload (and
/// its ICRC) and the FIN's digest cannot have the changed data stored with the verdict `Ok`. The hidden `--test-tamper N` plays that forger from inside the sender: chunk
/// N changes after it was hashed, and the FIN carries the digest of what was sent, computed
/// without the secret. With a secret the session's digest is BLAKE3 keyed from it, so the
/// verdict is ChecksumMismatch (exit 11) and nothing is stored. Without a secret the forger
/// wins, as `docs/protocol.md` ("Threat model") says: that half shows the forger's digest is
/// right, so the keyed half fails for the key and for nothing else.
#[test]
fn data_changed_on_the_path_fails_the_verdict_when_the_digest_is_keyed() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("tamper-src"), scratch("tamper-dst"), scratch("tamper-keys"));
    let data = random_file(&src.join("f"), 3 << 20, 12);
    const SECRET: &str = "a shared secret of 32 bytes, ok!";
    let key = secret_file(&keys, "key", SECRET, 0o600);
    let dir = dst.to_str().unwrap();
    let tampered = |port: u16, secret: Option<&str>| {
        let to = format!("{}:{port}", topo.server.addr);
        let mut c = cli::rdma_copy();
        c.args(["send", "--quiet", "--to", &to, "--from", &topo.client.addr.to_string(), "--chunk", "512K"]);
        c.args(["--test-tamper", "2"]).arg(src.join("f"));
        match secret {
            Some(s) => c.env("RDMA_COPY_SECRET", s),
            None => c.env_remove("RDMA_COPY_SECRET"),
        };
        c.output().unwrap()
    };

    let rx = Receiver::start(&topo, 7546, &["--dir", dir, "--count", "1", "--secret-file", key.to_str().unwrap()]);
    let out = tampered(7546, Some(SECRET));
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(11), "with a secret, the changed chunk must fail the verdict: {err}");
    assert!(listing(&dst).is_empty(), "{:?}", listing(&dst));
    let (_, report) = rx.finish(Duration::from_secs(30));
    assert!(report.contains("checksum mismatch"), "the receiver's report: {report}");

    let rx = Receiver::start(&topo, 7547, &["--dir", dir, "--count", "1"]);
    let out = tampered(7547, None);
    assert!(out.status.success(), "without a secret the forger's digest is the right one: {}", text(&out.stderr));
    let stored = std::fs::read(dst.join("f")).unwrap();
    assert_eq!(stored.len(), data.len());
    assert!(stored != data, "the hook changed nothing");
    let _ = rx.finish(Duration::from_secs(30));

    // Untouched, a batch over two lanes with the secret arrives whole: each entry's keyed
    // digest checks on both sides.
    let tree = src.join("tree");
    std::fs::create_dir(&tree).unwrap();
    let a = random_file(&tree.join("a"), (2 << 20) + 5, 13);
    let b = random_file(&tree.join("b"), 100_000, 14);
    let dst2 = scratch("tamper-dst2");
    let dir2 = dst2.to_str().unwrap();
    let rx = Receiver::start(&topo, 7548, &["--dir", dir2, "--count", "1", "--secret-file", key.to_str().unwrap()]);
    let to = format!("{}:7548", topo.server.addr);
    let out = cli::rdma_copy()
        .args(["send", "--quiet", "--to", &to, "--from", &topo.client.addr.to_string(), "--lanes", "2"])
        .arg(&tree)
        .env("RDMA_COPY_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success(), "a batch with the secret: {}", text(&out.stderr));
    assert!(std::fs::read(dst2.join("tree/a")).unwrap() == a);
    assert!(std::fs::read(dst2.join("tree/b")).unwrap() == b);
    let (code, report) = rx.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{report}");
}

/// The time from a sender's "sending" log line (`RUST_LOG=rdma_proto=info`: just before it
/// resolves the receiver) to `exited`: what the sender itself took, without the start of its
/// process (the debug binary read over the VM's 9p root under TCG, which swings by seconds on
/// a loaded host).
fn own_time(out: &std::process::Output, exited: std::time::SystemTime) -> Duration {
    let err = text(&out.stderr);
    let began = err.lines().find(|l| l.contains("sending")).and_then(log_time_of_day);
    let began = began.unwrap_or_else(|| panic!("no timed \"sending\" line from the sender: {err}"));
    let now = exited.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64() % 86_400.0;
    Duration::from_secs_f64((now - began).rem_euclid(86_400.0))
}

/// The time of day, in seconds, of a log line that starts with tracing's RFC 3339 UTC timestamp
/// (`2026-11-27T15:59:29.159757Z`), colour codes or not.
fn log_time_of_day(line: &str) -> Option<f64> {
    let plain: String = {
        let mut out = String::new();
        let mut chars = line.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                // An SGR sequence: ESC [ ... m.
                for c in chars.by_ref() {
                    if c == 'm' {
                        break;
                    }
                }
            } else {
                out.push(c);
            }
        }
        out
    };
    let stamp = plain.split_whitespace().next()?;
    let time = stamp.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = time.splitn(3, ':');
    let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
    Some(h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + s.parse::<f64>().ok()?)
}
