//! Device tests: a receiver whose places are all taken. A sender told `busy` asks again after
//! the receiver's hint (`send --busy-wait`), and a session that progresses far below its share
//! gives its place to a newer sender, keeping its partial.

mod cli;

use std::time::{Duration, Instant};

use cli::*;

/// Sixteen senders at once against a receiver at its defaults (8 sessions, 4 connections per
/// address: all sixteen come from rxe1's one address), every sender at its defaults: all
/// arrive: each told `busy` asks again after the receiver's hint.
#[test]
fn sixteen_senders_against_eight_places_all_arrive_at_the_defaults() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("busy16-src"), scratch("busy16-dst"));
    let data = random_file(&src.join("f00"), 2 << 20, 48);
    let names: Vec<String> = (0..16).map(|i| format!("f{i:02}")).collect();
    for name in &names[1..] {
        std::fs::copy(src.join("f00"), src.join(name)).unwrap();
    }
    let rx = Receiver::start(&topo, 7821, &["--dir", dst.to_str().unwrap()]);
    let t = Instant::now();
    let senders: Vec<_> = names.iter().map(|n| spawn_send(&topo, 7821, &[src.join(n).as_os_str()])).collect();
    let mut failed = Vec::new();
    for (name, s) in names.iter().zip(senders) {
        let (code, err, _) = wait_within(s, Duration::from_secs(120), name);
        if code != Some(0) {
            failed.push(format!("{name}: exit {code:?}: {err}"));
        }
    }
    let took = t.elapsed();
    let report = rx.kill_for_reports();
    assert!(failed.is_empty(), "{} of 16 failed:\n{}\nreceiver:\n{report}", failed.len(), failed.join("\n"));
    for name in &names {
        assert!(std::fs::read(dst.join(name)).unwrap() == data, "{name} differs");
    }
    let busy = report.lines().filter(|l| l.contains("busy")).count();
    eprintln!("16 x 2 MiB in {took:.1?}; the receiver said busy {busy} times");
    assert!(busy > 0, "the receiver was never full: the test tests nothing\n{report}");
}

/// Eight senders with the secret (so that one address may hold every place), each trickling
/// 64 KiB every 0.7 s (about 90 KB/s, above the pace floor of 16 KiB/s), hold all eight
/// sessions. The slowest of them gives its place (`busy`, and when to come back, its partial
/// kept) and an honest sender is served within seconds, not once they are done.
#[test]
fn tricklers_holding_every_place_give_way_to_an_honest_sender_within_seconds() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("trickle8-src"), scratch("trickle8-dst"), scratch("trickle8-keys"));
    let key = secret_file(&keys);
    let key = key.to_str().unwrap();
    for i in 0..8 {
        random_file(&src.join(format!("slow{i}")), 4 << 20, 60 + i);
    }
    let honest = src.join("honest");
    let data = random_file(&honest, 8 << 20, 59);
    let rx = Receiver::start(&topo, 7822, &["--dir", dst.to_str().unwrap(), "--secret-file", key]);
    let trickle = ["--quiet", "--secret-file", key, "--chunk", "64K", "--depth", "1", "--test-chunk-delay-ms", "700"];
    let tricklers: Vec<_> =
        (0..8).map(|i| keyed_sender(&topo, 7822, &src.join(format!("slow{i}")), &trickle)).collect();
    // All eight in their data phase (a partial each, holding bytes), then measured a while.
    let t = Instant::now();
    while listing(&dst).iter().filter(|n| n.ends_with(".part.rdcp-tmp")).count() < 8
        || (listing(&dst).into_iter().filter(|n| n.ends_with(".part.rdcp-tmp")))
            .any(|n| std::fs::metadata(dst.join(n)).map_or(true, |m| m.len() == 0))
    {
        assert!(t.elapsed() < Duration::from_secs(60), "the tricklers never all started: {:?}", listing(&dst));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(3));
    let t = Instant::now();
    let out = keyed_sender(&topo, 7822, &honest, &["--quiet", "--secret-file", key, "--timeout", SEND_TIMEOUT_S]);
    let (code, err, took) = wait_within(out, Duration::from_secs(120), "the honest sender");
    eprintln!("the honest sender among 8 tricklers: exit {code:?} after {took:.1?}: {}", err.trim());
    for mut s in tricklers {
        let _ = s.kill();
        let _ = s.wait();
    }
    let report = rx.kill_for_reports();
    eprintln!("the receiver's reports:\n{report}");
    assert_eq!(code, Some(0), "the honest sender: {err}\nreceiver:\n{report}");
    assert!(std::fs::read(dst.join("honest")).unwrap() == data, "the file differs");
    // Loose: the VM's speed swings, but 30 s of busy is what this replaces.
    assert!(took < Duration::from_secs(20) && t.elapsed() < Duration::from_secs(25), "served after {took:?}");
    // A trickler gave its place first: its session ended busy before the honest one was stored.
    let lines: Vec<&str> = report.lines().collect();
    let gave_way = lines.iter().position(|l| l.contains("newer sender took"));
    let stored = lines.iter().position(|l| l.contains("honest") && l.contains(": ok"));
    assert!(gave_way.is_some() && stored.is_some() && gave_way < stored, "in this order:\n{report}");
}

/// A batch that finds every place taken asks again as a single file does (`--busy-wait`, at its
/// default), and is stored whole once a place frees: the receiver has one place, held by a
/// sender that progresses steadily (so it does not give way), and the batch starts meanwhile.
#[test]
fn a_batch_told_busy_asks_again_and_arrives_at_the_defaults() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("busybatch-src"), scratch("busybatch-dst"));
    let first = random_file(&src.join("first"), 24 << 20, 70);
    let names = ["b0", "b1", "b2"];
    let batch: Vec<Vec<u8>> =
        names.iter().zip(71..).map(|(n, seed)| random_file(&src.join(n), 1 << 20, seed)).collect();
    let rx = Receiver::start(&topo, 7824, &["--dir", dst.to_str().unwrap(), "--max-sessions", "1"]);
    // About 10 MB/s: 1 MiB every 100 ms, for some 2.4 s.
    let steady = ["--chunk", "1M", "--depth", "1", "--test-chunk-delay-ms", "100"];
    let holder = spawn_send_reporting(&topo, 7824, &src.join("first"), &steady);
    wait_for_temporary(&dst);
    let mut args: Vec<&std::ffi::OsStr> = vec!["--batch".as_ref(), "--timeout".as_ref(), SEND_TIMEOUT_S.as_ref()];
    let paths: Vec<_> = names.iter().map(|n| src.join(n)).collect();
    args.extend(paths.iter().map(|p| p.as_os_str()));
    let (code, err, took) = wait_within(spawn_send(&topo, 7824, &args), Duration::from_secs(120), "the batch");
    let (holder_code, holder_err, _) = wait_within(holder, Duration::from_secs(120), "the first sender");
    let report = rx.kill_for_reports();
    eprintln!("the batch: exit {code:?} after {took:.1?}; the receiver's reports:\n{report}");
    assert_eq!(holder_code, Some(0), "the first sender: {holder_err}");
    assert_eq!(code, Some(0), "the batch: {err}\nreceiver:\n{report}");
    assert!(std::fs::read(dst.join("first")).unwrap() == first, "first differs");
    for (name, data) in names.iter().zip(&batch) {
        assert!(std::fs::read(dst.join(name)).unwrap() == *data, "{name} differs");
    }
    assert!(
        report.lines().any(|l| l.contains("busy")),
        "the batch never met a full receiver: the test tests nothing\n{report}"
    );
}
