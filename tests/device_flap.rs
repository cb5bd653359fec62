//! Device test: a link flap on the harness's wire (`scripts/guest/flap`), with a transfer in
//! flight, and a new transfer after it.
//!
//! The transfer in flight is set up to fail during the flap: its receiver gives up after 1 s
//! without progress, while veth0 is down, and the disconnect it sends then usually cannot leave.
//! rxe then keeps rxe0's QP1 in error for good, so without the helper's repair no connection
//! through rxe0 would succeed again (docs/testing.md, "Link flaps"; in the VM the helper had
//! to re-create rxe0 in 2 of 3 runs, and with the repair removed the transfer after the flap
//! timed out). Ports 7600-7602 (the helper's own check uses 7609).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The example binary, built by `cargo test` next to this test's own binary.
fn tool() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples/rdma-copy")
}

/// The harness's flap helper (runs in the VM, as root).
fn flap_helper() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/guest/flap")
}

/// A fresh directory under the system's temporary directory, removed when the value drops.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("rdma-flap-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Scratch(d)
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `len` bytes of a reproducible pseudo-random stream (xorshift64*), written to `path`.
fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut data = Vec::with_capacity(len + 8);
    while data.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        data.extend_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
    data.truncate(len);
    std::fs::write(path, &data).unwrap();
    data
}

/// The packets `device` has received so far (rxe's port counter).
fn rcvd_pkts(device: &str) -> u64 {
    let path = format!("/sys/class/infiniband/{device}/ports/1/hw_counters/rcvd_pkts");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}")).trim().parse().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Starts `rdma-copy recv --count 1` on rxe0's address and `port`, storing into `dir`, and waits
/// until it listens.
fn receiver(topo: &testkit::Topology, port: u16, dir: &Path, timeout_s: u32) -> Child {
    use std::io::BufRead;
    let listen = format!("{}:{port}", topo.server.addr);
    let mut child = Command::new(tool())
        .args(["recv", "--listen", &listen, "--count", "1", "--timeout", &timeout_s.to_string(), "--dir"])
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

/// `rdma-copy send` from rxe1's address to rxe0's `port`, with `args`.
fn sender(topo: &testkit::Topology, port: u16, args: &[&str]) -> Command {
    let mut c = Command::new(tool());
    c.args([
        "send",
        "--quiet",
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
