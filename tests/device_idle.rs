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

/// CPU time so far of `pid` (user and system, every thread), in clock ticks: `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// CPU ticks a receiver may spend from its stop to its exit, with a session to end whose sender
/// is stopped: its teardown (its disconnect waits about a second for a peer that never
/// answers) and its exit. Its accept loop woke at once on every turn for the whole teardown
/// before (the stop flag's eventfd stays readable): a core's worth, about 100 ticks a second.
const MOST_STOP_TICKS: u64 = 60;

/// A receiver told to stop (SIGTERM) while a session's sender is stopped ends that session and
/// exits, asleep meanwhile: its accept loop does not spin while the session tears down.
#[test]
fn a_stopping_receiver_sleeps_while_its_sessions_end() {
    let topo = testkit::require_topology!();
    let (_dir, file, dst) = files("idle-stop");
    let rx = Receiver::start(&topo, 18992, &["--dir", dst.to_str().unwrap(), "--timeout", "60"]);
    let tx = spawn_send_reporting(&topo, 18992, &file, &["--chunk", "256K"]);
    wait_for_temporary(&dst);
    signal(tx.id(), libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(1));
    let pid = rx.child.id();
    let before = cpu_ticks(pid).unwrap();
    let start = std::time::Instant::now();
    signal(pid, libc::SIGTERM);
    let mut last = before;
    while let Some(now) = cpu_ticks(pid) {
        last = now;
        // A zombie has no more to spend: exited.
        if std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| s.contains(") Z ")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(30), "the receiver did not exit");
        std::thread::sleep(Duration::from_millis(10));
    }
    let spent = last - before;
    let took = start.elapsed();
    signal(tx.id(), libc::SIGCONT);
    let _ = wait_within(tx, Duration::from_secs(120), "the sender");
    let reports = rx.kill_for_reports();
    eprintln!("the stopping receiver spent {spent} ticks of CPU in {took:?} to exit");
    assert!(!stored(&dst), "{reports}");
    assert!(spent <= MOST_STOP_TICKS, "the stopping receiver spent {spent} ticks in {took:?}\n{reports}");
}
