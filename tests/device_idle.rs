//! An idle transfer sleeps until something happens: with its peer stopped (`SIGSTOP`), a
//! receiver and a sender wake only for a completion, a CM event, a flag or their machine's
//! deadline (here a minute away), not on a clock of their own. Counted as every thread's
//! voluntary context switches (`/proc/PID/task/*/status`): each is a sleep that ended.
//!
//! The window is 3 s (`$RDMA_TEST_IDLE_WINDOW_S` to change it, 60 for wake-ups per idle
//! minute). The driver looked every 20 ms before: about 150 wake-ups of the session in 3 s, and
//! as many of a receiver's accept loop.

mod cli;

use std::path::Path;
use std::time::Duration;

use cli::*;

/// Wake-ups a 3 s idle window may show: a few for the start and end of the window's own
/// stop, and slack for a stray event; a 20 ms cadence makes hundreds.
const MOST_WAKEUPS: u64 = 10;

/// Voluntary context switches so far of every thread of `pid`.
fn wakeups(pid: u32) -> u64 {
    let mut n = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(status) = std::fs::read_to_string(task.unwrap().path().join("status")) else { continue };
        let line = status.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
        n += line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap();
    }
    n
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) on a child of this test, not reaped yet.
    assert_eq!(unsafe { libc::kill(pid as libc::pid_t, sig) }, 0);
}

/// The window, and the wake-ups of `idle` in it while `stopped` is stopped.
fn idle_window(stopped: u32, idle: u32) -> (Duration, u64) {
    let window = std::env::var("RDMA_TEST_IDLE_WINDOW_S").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let window = Duration::from_secs(window);
    signal(stopped, libc::SIGSTOP);
    // What was in flight completes (rxe acknowledges for a stopped process), then all is quiet.
    std::thread::sleep(Duration::from_secs(1));
    let before = wakeups(idle);
    std::thread::sleep(window);
    let woke = wakeups(idle) - before;
    signal(stopped, libc::SIGCONT);
    (window, woke)
}

/// A 32 MiB file in a fresh directory, and the directory the receiver stores into.
fn files(name: &str) -> (Scratch, std::path::PathBuf, std::path::PathBuf) {
    let dir = scratch(name);
    let (src, dst) = (dir.join("src"), dir.join("dst"));
    std::fs::create_dir_all(&src).unwrap();
    std::fs::create_dir_all(&dst).unwrap();
    random_file(&src.join("f"), 32 << 20, 7);
    (dir, src.join("f"), dst)
}

fn stored(dst: &Path) -> bool {
    std::fs::metadata(dst.join("f")).map(|m| m.len() == 32 << 20).unwrap_or(false)
}

/// Sends a file, stops one end once the transfer started, and counts the other's wake-ups;
/// then lets the transfer finish, stored whole. `stop_sender`: the sender is stopped and the
/// receiver counted, else the other way round.
fn idle_end_sleeps(name: &str, port: u16, stop_sender: bool) {
    let topo = testkit::require_topology!();
    let (_dir, file, dst) = files(name);
    let rx = Receiver::start(&topo, port, &["--dir", dst.to_str().unwrap(), "--timeout", "60"]);
    let tx = spawn_send_reporting(&topo, port, &file, &["--chunk", "256K"]);
    wait_for_temporary(&dst);
    let (stopped, idle, who) = match stop_sender {
        true => (tx.id(), rx.child.id(), "receiver"),
        false => (rx.child.id(), tx.id(), "sender"),
    };
    let (window, woke) = idle_window(stopped, idle);
    eprintln!("{who}: {woke} wake-ups in {window:?} with its peer stopped");
    let (code, out, _) = wait_within(tx, Duration::from_secs(120), "the sender");
    assert_eq!(code, Some(0), "{out}");
    assert!(stored(&dst), "{}", rx.kill_for_reports());
    assert!(woke <= MOST_WAKEUPS, "the idle {who} woke {woke} times in {window:?}");
}

#[test]
fn a_receiver_whose_sender_stopped_sleeps() {
    idle_end_sleeps("idle-rx", 18990, true);
}

#[test]
fn a_sender_whose_receiver_stopped_sleeps() {
    idle_end_sleeps("idle-tx", 18991, false);
}
