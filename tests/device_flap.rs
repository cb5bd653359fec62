//! Device test: a link flap on the harness's wire (`scripts/guest/flap`), with a transfer in
//! flight, and a new transfer after it.
//!
//! The transfer in flight is set up to fail during the flap: its receiver gives up after 1 s
//! without progress, while veth0 is down, and the disconnect it sends then usually cannot leave.
//! rxe then keeps rxe0's QP1 in error for good, so without the helper's repair no connection
//! through rxe0 would succeed again (docs/testing.md, "Link flaps"; in the VM the helper had
//! to re-create rxe0 in 2 of 3 runs, and with the repair removed the transfer after the flap
//! timed out). Ports 7600-7602 (the helper's own check uses 7609).
//!
//! The transfer interrupted by the flap itself:
//! it completes, or fails within its timeout and a second send resumes it to an identical
//! file, with nothing else left; then a new transfer works. Ports 7603-7606.

mod cli;

use cli::{random_file, resumed_at, text, Scratch};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The harness's flap helper (runs in the VM, as root).
fn flap_helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/guest/flap")
}

/// The packets `device` has received so far (rxe's port counter).
fn rcvd_pkts(device: &str) -> u64 {
    let path = format!("/sys/class/infiniband/{device}/ports/1/hw_counters/rcvd_pkts");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
}

/// Starts `rdma-copy recv --count 1` on rxe0's address and `port`, storing into `dir`, and waits
/// until it listens.
fn receiver(topo: &testkit::Topology, port: u16, dir: &Path, timeout_s: u32) -> Child {
    use std::io::BufRead;
    let listen = format!("{}:{port}", topo.server.addr);
    let mut child = cli::rdma_copy()
        .args(["recv", "--no-auth", "--listen", &listen, "--count", "1", "--timeout", &timeout_s.to_string(), "--dir"])
        .arg(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(line.contains("listening on"), "receiver did not start: {line:?}");
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    child
}

/// `rdma-copy send` from rxe1's address to rxe0's `port`, with `args`, one attempt
/// (`--retries 0`): these tests judge how a single send ends across a flap, where a retry
/// after it would send again.
fn sender(topo: &testkit::Topology, port: u16, args: &[&str]) -> Command {
    let mut c = cli::rdma_copy();
    c.args([
        "send",
        "--quiet",
        "--retries",
        "0",
        "--to",
        &format!("{}:{port}", topo.server.addr),
        "--from",
        &topo.client.addr.to_string(),
    ])
    .args(args);
    c
}

/// Waits up to `limit` for `child`; kills it and fails past that.
fn wait_within(mut child: Child, limit: Duration, what: &str) -> Output {
    let t = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// A 1 MiB file sent from rxe1 to rxe0 on `port` arrives identical, within `limit`.
fn transfer_works(topo: &testkit::Topology, port: u16, src: &Path, dst: &Path, limit: Duration, when: &str) {
    let f = src.join(format!("small-{port}"));
    let data = random_file(&f, 1 << 20, u64::from(port));
    let rx = receiver(topo, port, dst, 10);
    let t = Instant::now();
    let tx = sender(topo, port, &["--connect-timeout", "10", f.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_within(tx, limit, &format!("the transfer {when}"));
    let took = t.elapsed();
    eprintln!("transfer {when}: exit {:?} in {took:?}", out.status.code());
    if !out.status.success() {
        let mut rx = rx;
        let _ = rx.kill();
        let _ = rx.wait();
        panic!("the transfer {when} failed after {took:?}: {}", text(&out.stderr));
    }
    let report = wait_within(rx, Duration::from_secs(15), &format!("the receiver {when}"));
    assert!(report.status.success(), "the receiver {when}: {}", text(&report.stdout));
    let name = f.file_name().unwrap();
    assert!(std::fs::read(dst.join(name)).unwrap() == data, "the file sent {when} differs");
}

#[test]
fn a_transfer_after_a_link_flap_succeeds() {
    let topo = testkit::require_topology!();
    // Only inside the harness: this takes the VM's network interface down.
    if !testkit::device_required() {
        return;
    }
    let (src, dst) = (Scratch::new("src"), Scratch::new("dst"));
    transfer_works(&topo, 7600, &src, &dst, Duration::from_secs(30), "before the flap");

    // A transfer in flight when veth0 goes down for 3 s: its receiver gives up after 1 s
    // without progress, and disconnects while veth0 is still down; its sender waits 10 s.
    let big = src.join("big");
    random_file(&big, 256 << 20, 1);
    let rx = receiver(&topo, 7601, &dst, 1);
    let before = rcvd_pkts(&topo.server.device);
    let tx = sender(&topo, 7601, &["--timeout", "10", big.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Data flows: some 2,000 packets (about 8 MiB) have reached rxe0.
    let t = Instant::now();
    while rcvd_pkts(&topo.server.device) < before + 2000 {
        assert!(t.elapsed() < Duration::from_secs(30), "the transfer across the flap did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let flap = Command::new(flap_helper()).args(["veth0", "3"]).output().expect("running scripts/guest/flap");
    eprintln!("flap: {}{}", text(&flap.stdout), text(&flap.stderr));
    assert!(flap.status.success(), "scripts/guest/flap veth0 3: {}{}", text(&flap.stdout), text(&flap.stderr));
    let out = wait_within(tx, Duration::from_secs(30), "the sender across the flap");
    let report = wait_within(rx, Duration::from_secs(30), "the receiver across the flap");
    eprintln!(
        "across the flap: sender exit {:?} ({}), receiver exit {:?} ({})",
        out.status.code(),
        text(&out.stderr).trim(),
        report.status.code(),
        text(&report.stdout).trim()
    );
    assert!(!out.status.success(), "the receiver gave up during the flap, yet the sender succeeded");
    assert!(!dst.join("big").exists(), "the failed transfer left its file");

    // Bounded: connecting is given 10 s, the data a few.
    transfer_works(&topo, 7602, &src, &dst, Duration::from_secs(30), "after the flap");
}

/// `veth0`'s operational state is down (`/sys/class/net/veth0/operstate`).
fn veth0_down() -> bool {
    std::fs::read_to_string("/sys/class/net/veth0/operstate").is_ok_and(|s| s.trim() == "down")
}

/// The bytes a partial's sidecar (`.KEY.meta.rdcp-tmp` in `dir`) vouches for: its `held=` line;
/// `None` without a sidecar.
fn sidecar_held(dir: &Path) -> Option<u64> {
    let name = cli::listing(dir).into_iter().find(|n| n.ends_with(".meta.rdcp-tmp"))?;
    let meta = std::fs::read_to_string(dir.join(name)).ok()?;
    meta.lines().find_map(|l| l.strip_prefix("held=")).and_then(|n| n.parse().ok())
}

/// The size of a partial's data (`.KEY.part.rdcp-tmp` in `dir`), 0 without one.
fn partial_len(dir: &Path) -> u64 {
    let name = cli::listing(dir).into_iter().find(|n| n.ends_with(".part.rdcp-tmp"));
    name.and_then(|n| std::fs::metadata(dir.join(n)).ok()).map_or(0, |m| m.len())
}

/// `rdma-copy send --timeout TIMEOUT FILE` from rxe1 to rxe0's `port`, its report on stdout.
fn spawn_reporting_sender(topo: &testkit::Topology, port: u16, timeout_s: u64, file: &Path) -> Child {
    sender(topo, port, &["--connect-timeout", "10", "--timeout", &timeout_s.to_string()])
        .arg(file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A link down 3 s mid-transfer: a 64 MiB transfer from rxe1 to rxe0 (sender
/// `--timeout sender_s`, receiver `--timeout receiver_s`) when veth0 goes down for 3 s
/// (`scripts/guest/flap`, which also repairs a device whose QP1 the flap wedged). The sender
/// either succeeds, the file identical, or fails within its timeout (exit 3, timeout, or 6,
/// connection lost) and then a second send of the same file resumes where the receiver's
/// sidecar says and the file arrives identical. Either way a new transfer then works, and the
/// directory holds the two files and nothing else (no partial, sidecar or temporary).
/// Ports `port` (the transfer across the flap) and `port + 1` (a 1 MiB warm-up before it, the
/// resume and the new transfer). Prints the path taken and its timings.
fn interrupted_transfer_completes_or_resumes(port: u16, sender_s: u64, receiver_s: u64) {
    let topo = testkit::require_topology!();
    // Only inside the harness: this takes the VM's network interface down.
    if !testkit::device_required() {
        return;
    }
    let (src, dst) = (Scratch::new(&format!("ld-src-{port}")), Scratch::new(&format!("ld-dst-{port}")));
    let file = src.join(format!("flapped-{port}"));
    let data = random_file(&file, 64 << 20, u64::from(port));
    let name = file.file_name().unwrap().to_str().unwrap().to_owned();

    // A warm path first: on 6.12 the first connection after a previous test re-created rxe0
    // was once so slow that a sender with a 1 s timeout gave up before its data flowed.
    let warm = Scratch::new(&format!("ld-warm-{port}"));
    transfer_works(&topo, port + 1, &src, &warm, Duration::from_secs(30), "before the flap");

    let receiver_args = ["--dir", dst.to_str().unwrap(), "--count", "1", "--timeout", &receiver_s.to_string()];
    let mut rx = cli::Receiver::start(&topo, port, &receiver_args);
    let before = rcvd_pkts(&topo.server.device);
    let start = Instant::now();
    let mut tx = spawn_reporting_sender(&topo, port, sender_s, &file);
    // Data flows: some 500 packets (about 2 MiB) have reached rxe0; the clean transfer takes
    // about 1.2 s more. A sender whose short timeout ran out before the receiver's grant came
    // (on a slow machine's TCG, 2026-11-27: "timed out after 1s waiting for the receiver's
    // grant") is started again, twice at most: the test is of the flap, not of setup's speed.
    let mut early_timeouts = 0;
    while rcvd_pkts(&topo.server.device) < before + 500 {
        assert!(start.elapsed() < Duration::from_secs(30), "the transfer to interrupt did not start");
        if tx.try_wait().unwrap().is_some() {
            let out = tx.wait_with_output().unwrap();
            let err = text(&out.stderr);
            if out.status.code() == Some(3) && err.contains("waiting for the receiver's grant") && early_timeouts < 2 {
                // That session counted for the receiver's --count 1: it starts again too.
                early_timeouts += 1;
                eprintln!("the sender timed out before the grant ({err}); both ends started again");
                let _ = rx.kill_for_reports();
                rx = cli::Receiver::start(&topo, port, &receiver_args);
                tx = spawn_reporting_sender(&topo, port, sender_s, &file);
                continue;
            }
            panic!("the sender exited ({:?}) before its data flowed: {err}", out.status.code());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let stored_at_flap = partial_len(&dst);
    let flap_start = Instant::now();
    let flap = std::thread::spawn(|| {
        let t = Instant::now();
        (Command::new(flap_helper()).args(["veth0", "3"]).output().expect("running scripts/guest/flap"), t.elapsed())
    });
    // The flap must find the transfer in flight: the sender still runs when veth0 is down.
    let mut down_after = None;
    let t = Instant::now();
    while down_after.is_none() && t.elapsed() < Duration::from_secs(5) {
        if veth0_down() {
            down_after = Some((flap_start.elapsed(), partial_len(&dst)));
        }
        if down_after.is_none() {
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let (down_after, stored_at_down) = down_after.expect("veth0 never went down");
    let in_flight = tx.try_wait().unwrap().is_none();
    // The sender's timeout counts from its last progress, which may come after veth0 is back:
    // the last time the receiver's partial grew stands for it.
    let limit = Duration::from_secs(sender_s + 60);
    let (mut stored, mut last_growth) = (stored_at_down, flap_start);
    while tx.try_wait().unwrap().is_none() {
        if flap_start.elapsed() > limit {
            let _ = tx.kill();
            panic!("the sender across the flap still runs after {limit:?}");
        }
        let now = partial_len(&dst);
        if now != stored {
            (stored, last_growth) = (now, Instant::now());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (sent_after, sender_took) = (flap_start.elapsed(), start.elapsed());
    let since_growth = last_growth.elapsed();
    let out = tx.wait_with_output().unwrap();
    let (flap, flap_took) = flap.join().unwrap();
    let said = format!("{}{}", text(&flap.stdout), text(&flap.stderr));
    assert!(flap.status.success(), "scripts/guest/flap veth0 3: {said}");
    eprintln!("flap: {} ({flap_took:.1?})", said.trim());
    let (rcode, rreport) = rx.finish(Duration::from_secs(receiver_s + 60));
    eprintln!(
        "across the flap (sender --timeout {sender_s}, receiver --timeout {receiver_s}): {stored_at_flap} bytes \
         stored when the flap began, veth0 down {down_after:.2?} after ({stored_at_down} stored), transfer {}; sender exit {:?} \
         {sent_after:.2?} after the flap began ({sender_took:.2?} in all, {since_growth:.2?} after the receiver's \
         partial last grew, at {stored} bytes): {}{}; receiver exit {rcode}: {}",
        if in_flight { "still in flight" } else { "already over" },
        out.status.code(),
        text(&out.stdout).trim(),
        text(&out.stderr).trim(),
        rreport.trim()
    );
    assert!(in_flight, "the flap came too late: the transfer was over before veth0 went down");

    let listen_more = |count: &str| {
        cli::Receiver::start(&topo, port + 1, &["--dir", dst.to_str().unwrap(), "--count", count, "--timeout", "10"])
    };
    let path;
    let rx2 = match out.status.code() {
        Some(0) => {
            path = "completed across the flap".to_owned();
            assert_eq!(rcode, 0, "the sender succeeded, the receiver did not: {rreport}");
            listen_more("1")
        }
        Some(code @ (3 | 6)) if rcode == 0 => {
            // The receiver stored the file; only its ACK was lost to the flap.
            path = format!("failed with exit {code} though the receiver stored the file (its ACK lost)");
            listen_more("1")
        }
        Some(code @ (3 | 6)) => {
            // Fails within its timeout: counted from its last progress, plus the disconnect's
            // wait (1 s) and the VM's slowness (a CI boot measured 15.27 s for a 10 s
            // timeout, 2026-11-27, against a margin of 5 s then).
            let bound = Duration::from_secs(sender_s + 8);
            assert!(
                since_growth <= bound,
                "the sender failed {since_growth:?} after the receiver last stored data, over {bound:?}"
            );
            assert_eq!(rcode, 9, "the receiver of a failed transfer: {rreport}");
            assert!(!dst.join(&name).exists(), "the failed transfer left its file");
            let held = sidecar_held(&dst);
            eprintln!("kept for a resume: {:?}, the sidecar vouching for {held:?} bytes", cli::listing(&dst));
            let rx2 = listen_more("2");
            let t = Instant::now();
            let again = spawn_reporting_sender(&topo, port + 1, 10, &file).wait_with_output().unwrap();
            let report = text(&again.stdout);
            assert!(again.status.success(), "the resumed send failed: {}", text(&again.stderr));
            let at = resumed_at(&report);
            let why = match held {
                Some(h) if h > 0 => {
                    assert_eq!(at, h, "resumed elsewhere than the sidecar says: {report}");
                    String::new()
                }
                Some(_) => ": the sidecar vouched for no byte".to_owned(),
                None => ": the receiver kept no partial".to_owned(),
            };
            path = format!(
                "failed with exit {code}, then resumed at byte {at} of {}{why}, in {:.2?}",
                data.len(),
                t.elapsed()
            );
            rx2
        }
        other => panic!("the sender across the flap: exit {other:?}, neither success nor a timeout or lost connection"),
    };
    assert!(std::fs::read(dst.join(&name)).unwrap() == data, "the file sent across the flap differs");

    // The next connection works: a new 1 MiB file to the same receiver.
    let small = src.join(format!("after-{port}"));
    let small_data = random_file(&small, 1 << 20, u64::from(port) + 1);
    let t = Instant::now();
    let next = spawn_reporting_sender(&topo, port + 1, 10, &small);
    let (code, err, _) = cli::wait_within(next, Duration::from_secs(30), "the transfer after the flap");
    let next_took = t.elapsed();
    assert_eq!(code, Some(0), "the transfer after the flap: {err}");
    let (code, lines) = rx2.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{lines}");
    assert!(std::fs::read(dst.join(small.file_name().unwrap())).unwrap() == small_data);
    // Sorted, as `listing` is.
    assert_eq!(
        cli::listing(&dst),
        [format!("after-{port}"), name.clone()],
        "the two files and nothing else: no partial, sidecar or temporary"
    );
    eprintln!("path: {path}; the flap helper took {flap_took:.1?}; the next transfer {next_took:.2?}");
}

/// The sender's timeout (10 s) outlasts the flap: a connection that survives it completes the
/// transfer. In the VM most did not (one of 9 on 6.1 completed, none of 3 on 6.12): the
/// receiver's QP went to error during the flap, the sender timed out, and the second send
/// resumed (docs/results/2026-11.md).
#[test]
fn a_transfer_across_a_3_s_link_flap_completes_or_resumes_identical() {
    interrupted_transfer_completes_or_resumes(7603, 10, 10);
}

/// The sender's timeout (2 s) ends before the flap does: the sender usually gives up during
/// it, and the receiver, whose timeout (6 s) ends after veth0 is back (so that its disconnect
/// can leave), keeps the partial the next send resumes. 2 s, not 1: on a slow machine's TCG a
/// 1 s sender timed out waiting for the grant in 5 tries of 5 on Linux 6.12, a 2 s one in 1 of
/// 2, which the restart above covers.
#[test]
fn a_transfer_whose_timeout_is_shorter_than_a_3_s_link_flap_resumes_identical() {
    interrupted_transfer_completes_or_resumes(7605, 2, 6);
}
