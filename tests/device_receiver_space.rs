//! Device tests: free space is one of the receiver's limits. Partials that senders leave behind
//! on purpose cannot take the room an honest send needs.

mod cli;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use cli::*;

/// The names of the partials' data files in `dir`.
fn partials(dir: &std::path::Path) -> BTreeSet<String> {
    listing(dir).into_iter().filter(|n| n.ends_with(".part.rdcp-tmp")).collect()
}

/// Five senders (no secret), each sending a 96 MiB file under a name of its own (a fresh
/// resume key) into a 256 MiB file system and vanishing (SIGKILL) once 40 MiB arrived, then an
/// honest send of 96 MiB, all at the receiver's defaults: it arrives. Partials left so would
/// fill the file system (the caps count partials and bytes), so each transfer that opens gives
/// up partials until its file fits beside the free-space reserve (a fifth of this small file
/// system), and a partial is kept only while the reserve stays free.
#[test]
fn vanishing_senders_leave_room_for_an_honest_send() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("space-src"), scratch("space-dst"));
    // Mode 0700: partials are kept only where no other user may add files.
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "size=256m,mode=0700", "tmpfs"]).arg(&*dst).status();
    assert!(mounted.unwrap().success(), "mounting a 256 MiB tmpfs");
    let f = src.join("f");
    let data = random_file(&f, 96 << 20, 61);
    let rx = Receiver::start(&topo, 7823, &["--dir", dst.to_str().unwrap()]);
    for i in 0..5 {
        let before = partials(&dst);
        let name = format!("v{i}");
        let mut s = spawn_send_reporting(&topo, 7823, &f, &["--name", &name, "--retries", "0"]);
        let t = Instant::now();
        // Its partial is the new one: killed once it holds 40 MiB (or the sender ended).
        loop {
            let grown = partials(&dst)
                .difference(&before)
                .any(|n| std::fs::metadata(dst.join(n)).is_ok_and(|m| m.len() >= 40 << 20));
            if grown || s.try_wait().unwrap().is_some() {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(60), "sender {i} never got going");
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = s.kill();
        let _ = s.wait();
        assert!(!dst.join(&name).exists(), "sender {i} finished before it was killed: the test tests nothing");
        // Its session's end (its report line) before the next one starts.
        while rx.reports_so_far().lines().count() < i + 1 {
            assert!(t.elapsed() < Duration::from_secs(60), "session {i} never ended:\n{}", rx.reports_so_far());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let kept: u64 = partials(&dst).iter().map(|n| std::fs::metadata(dst.join(n)).map_or(0, |m| m.len())).sum();
    eprintln!("after 5 vanishing senders: {} partials, {} MiB", partials(&dst).len(), kept >> 20);
    let out = send(&topo, 7823, &["--name", "honest", f.to_str().unwrap()]);
    let report = rx.kill_for_reports();
    assert!(out.status.success(), "the honest send: {}\nreceiver:\n{report}", text(&out.stderr));
    assert!(std::fs::read(dst.join("honest")).unwrap() == data, "the file differs");
    eprintln!("then the honest send; {} partials left", partials(&dst).len());
}
