//! What the `rdma-copy` device tests share: the tool, scratch directories, test files, a
//! running receiver and a sender. Each test file uses part of it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The example binary, built by `cargo test` next to this test's own binary.
pub fn tool() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().join("examples/rdma-copy")
}

/// A fresh directory under the system's temporary directory (in the VM a tmpfs of half its
/// RAM), removed when the value drops.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let d = std::env::temp_dir().join(format!("rdma-copy-test-{name}-{}", std::process::id()));
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
        let _ = Command::new("umount").arg(&self.0).stderr(Stdio::null()).status();
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn scratch(name: &str) -> Scratch {
    Scratch::new(name)
}

/// `len` bytes of a reproducible pseudo-random stream (xorshift64*), written to `path`.
pub fn random_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
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

/// Waits (up to 30 s) until a transfer into `dst` started: its temporary exists.
pub fn wait_for_temporary(dst: &Path) {
    let t = Instant::now();
    while !listing(dst).iter().any(|n| n.ends_with(".rdcp-tmp")) {
        assert!(t.elapsed() < Duration::from_secs(30), "no transfer started");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Entries of `dir`, sorted.
pub fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

/// A running receiver; its stdout (one line per session) is read at the end.
pub struct Receiver {
    pub child: Child,
}

impl Receiver {
    /// Starts `rdma-copy recv` on rxe0's address and port, and waits until it listens.
    pub fn start(topo: &testkit::Topology, port: u16, args: &[&str]) -> Receiver {
        let listen = format!("{}:{port}", topo.server.addr);
        let mut child = Command::new(tool())
            .args(["recv", "--listen", &listen])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        err.read_line(&mut line).unwrap();
        assert!(line.contains("listening on"), "receiver did not start: {line:?}");
        // Keep draining its stderr so it never blocks on a full pipe.
        std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
        Receiver { child }
    }

    /// The receiver's peak resident set so far, in KiB: `VmHWM` in `/proc/PID/status`.
    ///
    /// Not `wait4`'s `ru_maxrss`: that counts the high-water mark of the address space the
    /// child had before `exec`, and `Command` spawns with `vfork`, so it reported this test
    /// process's own peak (the 16 MiB of test data it holds) whenever that was larger.
    pub fn peak_rss_kib(&self) -> i64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).expect("VmHWM in /proc/PID/status");
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Waits (at most `limit`) for the receiver to exit; returns its exit code and stdout.
    pub fn finish(mut self, limit: Duration) -> (i32, String) {
        let deadline = Instant::now() + limit;
        let pid = self.child.id() as libc::pid_t;
        loop {
            let mut status = 0;
            // SAFETY: an all-zero rusage is valid; wait4 fills it.
            let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: our own child's pid; the out-pointers live across the call.
            let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
            if r == pid {
                let mut out = String::new();
                std::io::Read::read_to_string(self.child.stdout.as_mut().unwrap(), &mut out).unwrap();
                let code = std::process::ExitStatus::from_raw(status).code().unwrap_or(-1);
                return (code, out);
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the receiver did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Runs `rdma-copy send` from rxe1's address to rxe0's `port`.
pub fn send(topo: &testkit::Topology, port: u16, args: &[&str]) -> Output {
    let to = format!("{}:{port}", topo.server.addr);
    let from = topo.client.addr.to_string();
    Command::new(tool()).args(["send", "--quiet", "--to", &to, "--from", &from]).args(args).output().unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Starts `rdma-copy send --quiet ARGS...` from rxe1's address to rxe0's `port`, its stderr
/// piped.
pub fn spawn_send(topo: &testkit::Topology, port: u16, args: &[&std::ffi::OsStr]) -> Child {
    let to = format!("{}:{port}", topo.server.addr);
    Command::new(tool())
        .args(["send", "--quiet", "--to", &to, "--from", &topo.client.addr.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits up to `limit` for `child`; kills it and fails past that.
pub fn wait_within(mut child: Child, limit: Duration, what: &str) -> (Option<i32>, String, Duration) {
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            return (status.code(), err, t.elapsed());
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An RC connection to `port` that never sends anything (no HELLO).
pub fn idle_connection(topo: &testkit::Topology, port: u16) -> rdma_cm::Connection<'static> {
    use rdma_verbs::qp::state::{Rc, Reset};
    use rdma_verbs::{AccessFlags, CompletionQueue, ProtectionDomain, QpCreateAttr, QueuePair};
    use std::net::SocketAddr;
    use std::sync::Arc;
    let to = SocketAddr::new(topo.server.addr.into(), port);
    let from = SocketAddr::new(topo.client.addr.into(), 0);
    let id = rdma_cm::CmId::new().unwrap().resolve(Some(from), to, Duration::from_secs(5)).unwrap();
    let ctx = Arc::new(id.open_context().unwrap());
    let pd = Arc::new(ProtectionDomain::new(ctx.clone()).unwrap());
    let cq = Arc::new(CompletionQueue::new(ctx, 4, None).unwrap());
    let qp = QueuePair::<Rc, Reset>::create(pd, QpCreateAttr::new(cq.clone(), cq)).unwrap();
    let qp = id.init_qp(qp, AccessFlags::LOCAL_WRITE).unwrap();
    id.connect(qp, &rdma_cm::ConnParams::new(), Duration::from_secs(10)).unwrap()
}
