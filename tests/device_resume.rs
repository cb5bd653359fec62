//! Device tests: interrupted transfers resume. A sender
//! or receiver killed at seeded points mid-file; the next send of the same file sends only what
//! the receiver lacks, the file arrives identical, and no temporary or partial is left.

mod cli;

use std::path::Path;
use std::time::Duration;

use cli::*;

/// Kill points per test: half of them (the even seeds) past the receiver's first checkpoint.
/// Four, not more: each costs 10-20 s of VM time (docs/testing.md, "The command").
const SEEDS: u64 = 4;

/// The receivers' checkpoint interval (`recv --checkpoint-every`): small, so that files of a few
/// checkpoints are small too (at the default 64 MiB, the killed-receiver test moved 96 MiB a
/// seed and took 138 s).
const CHECKPOINT: &str = "8M";
const CHECKPOINT_BYTES: u64 = 8 << 20;

/// How a sender that a test interrupts sends: 1 MiB chunks, each read 30 ms late (the
/// fault-injection build's `--test-chunk-delay-ms`), so at most 4 MiB are in flight and a
/// kill once the receiver holds some bytes finds most of the file still to go. At the default
/// 4 MiB chunks a whole 24 MiB file could be in flight when the first 12 MiB had landed, and
/// the kill came after the commit.
const INTERRUPTED: [&str; 4] = ["--chunk", "1M", "--test-chunk-delay-ms", "30"];

/// A deterministic delay in 0..max_ms for `seed` (xorshift).
fn seeded_ms(seed: u64, max_ms: u64) -> u64 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    x.wrapping_mul(0x2545_f491_4f6c_dd1d) % max_ms
}

/// Sends `file` to completion; its stdout report.
fn send_ok(topo: &testkit::Topology, port: u16, file: &Path) -> String {
    let out = spawn_send_reporting(topo, port, file, &[]).wait_with_output().unwrap();
    assert!(out.status.success(), "the resumed send failed: {}", text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn a_killed_sender_resumes_at_seeded_points_and_the_file_arrives_identical() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("rs-src"), scratch("rs-dst"));
    let data = random_file(&src.join("f"), 32 << 20, 21);
    let mut resumed = Vec::new();
    for seed in 0..SEEDS {
        let rx = Receiver::start(&topo, 7580, &["--dir", dst.to_str().unwrap(), "--count", "2", "--timeout", "5"]);
        let mut sender = spawn_send_reporting(&topo, 7580, &src.join("f"), &INTERRUPTED);
        wait_for_partial(&dst, 1);
        std::thread::sleep(Duration::from_millis(seeded_ms(seed, 600)));
        sender.kill().unwrap();
        sender.wait().unwrap();
        wait_for_session_end(&dst, "f");
        if dst.join("f").exists() {
            // The transfer finished before the kill landed: send it whole again.
            std::fs::remove_file(dst.join("f")).unwrap();
        }
        let report = send_ok(&topo, 7580, &src.join("f"));
        let (code, lines) = rx.finish(Duration::from_secs(60));
        let at = resumed_at(&report);
        eprintln!("seed {seed}: resumed at {at}: {}", report.lines().next().unwrap_or(""));
        assert!(matches!(code, 0 | 9), "{lines}");
        assert_eq!(listing(&dst), ["f"], "seed {seed}: nothing but the file is left");
        assert!(std::fs::read(dst.join("f")).unwrap() == data, "seed {seed}: the file differs");
        std::fs::remove_file(dst.join("f")).unwrap();
        resumed.push(at);
    }
    // A killed sender's receiver keeps every byte it stored: most kills land mid-file.
    assert!(resumed.iter().filter(|&&at| at > 0).count() as u64 >= SEEDS / 2, "resumed at {resumed:?}");
}

#[test]
fn a_killed_receiver_resumes_from_its_last_checkpoint_and_the_file_arrives_identical() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("rr-src"), scratch("rr-dst"));
    // Over the checkpoint interval, so that a SIGKILL after it leaves a sidecar.
    let data = random_file(&src.join("f"), 3 * CHECKPOINT_BYTES as usize, 22);
    let mut resumed = Vec::new();
    let args = ["--dir", dst.to_str().unwrap(), "--count", "1", "--checkpoint-every", CHECKPOINT];
    for seed in 0..SEEDS {
        let mut rx = Receiver::start(&topo, 7581, &args);
        let sender = spawn_send_reporting(&topo, 7581, &src.join("f"), &INTERRUPTED);
        let past = if seed % 2 == 0 { CHECKPOINT_BYTES + (CHECKPOINT_BYTES >> 2) } else { 1 };
        wait_for_partial(&dst, past);
        std::thread::sleep(Duration::from_millis(seeded_ms(seed, 300)));
        rx.child.kill().unwrap();
        let _ = rx.child.wait();
        let (code, err, _) = wait_within(sender, Duration::from_secs(90), "the sender of a killed receiver");
        if code == Some(0) {
            // The transfer finished before the kill landed: nothing to resume.
            std::fs::remove_file(dst.join("f")).unwrap();
            continue;
        }
        assert_eq!(code, Some(6), "{err}");
        if dst.join("f").exists() {
            // Killed after the commit but before its ACK left (seen once on 6.12): the file is
            // in place and whole, the sender had no verdict; a resend would be told Exists.
            eprintln!("seed {seed}: the receiver was killed between its commit and its ACK");
            assert_eq!(listing(&dst), ["f"], "seed {seed}: nothing but the file is left");
            assert!(std::fs::read(dst.join("f")).unwrap() == data, "seed {seed}: the file differs");
            std::fs::remove_file(dst.join("f")).unwrap();
            continue;
        }
        let rx = Receiver::start(&topo, 7581, &args);
        let report = send_ok(&topo, 7581, &src.join("f"));
        let (code, lines) = rx.finish(Duration::from_secs(60));
        let at = resumed_at(&report);
        eprintln!("seed {seed} (killed past {past}): resumed at {at}");
        assert_eq!(code, 0, "{lines}");
        assert_eq!(listing(&dst), ["f"], "seed {seed}: nothing but the file is left");
        assert!(std::fs::read(dst.join("f")).unwrap() == data, "seed {seed}: the file differs");
        std::fs::remove_file(dst.join("f")).unwrap();
        if past > 1 {
            assert!(at >= CHECKPOINT_BYTES, "seed {seed}: killed past the checkpoint, resumed at {at}");
        }
        resumed.push(at);
    }
    assert!(!resumed.is_empty());
}

/// `send --retries`: a sender whose receiver was killed mid-file, then started again by its
/// administrator, sends the file again by itself, and the new receiver resumes it from the
/// checkpoint the killed one left. Without `--retries` the sender exits 6 (the test above).
#[test]
fn a_sender_with_retries_resumes_by_itself_once_its_killed_receiver_is_back() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("rt-src"), scratch("rt-dst"));
    // Killed past the first checkpoint with half the file to go: the kill finds it in flight.
    let data = random_file(&src.join("f"), 5 * CHECKPOINT_BYTES as usize, 23);
    let args = ["--dir", dst.to_str().unwrap(), "--count", "1", "--checkpoint-every", CHECKPOINT];
    let mut rx = Receiver::start(&topo, 7584, &args);
    let sender = spawn_send_reporting(&topo, 7584, &src.join("f"), &[&INTERRUPTED[..], &["--retries", "5"]].concat());
    wait_for_partial(&dst, CHECKPOINT_BYTES + (CHECKPOINT_BYTES >> 1));
    rx.child.kill().unwrap();
    let _ = rx.child.wait();
    let rx = Receiver::start(&topo, 7584, &args);
    let out = sender.wait_with_output().unwrap();
    let (report, err) = (text(&out.stdout), text(&out.stderr));
    eprintln!("the sender: {}{}", report.trim(), err.trim());
    assert!(out.status.success(), "the sender did not resume by itself: {err}");
    assert!(report.contains(" retr"), "the report does not say it retried: {report}");
    let at = resumed_at(&report);
    assert!(at >= CHECKPOINT_BYTES, "killed past the checkpoint, resumed at {at}");
    let (code, lines) = rx.finish(Duration::from_secs(60));
    assert_eq!(code, 0, "{lines}");
    assert_eq!(listing(&dst), ["f"], "nothing but the file is left");
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
}

#[test]
fn a_changed_source_starts_over_and_stale_partials_expire() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("rc-src"), scratch("rc-dst"));
    random_file(&src.join("f"), 24 << 20, 23);
    let rx = Receiver::start(&topo, 7582, &["--dir", dst.to_str().unwrap(), "--count", "2", "--timeout", "5"]);
    let mut sender = spawn_send_reporting(&topo, 7582, &src.join("f"), &INTERRUPTED);
    wait_for_partial(&dst, 8 << 20);
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(&dst, "f");
    // The file changes (another version): its partial is not this version's.
    std::thread::sleep(Duration::from_millis(20));
    let data = random_file(&src.join("f"), 24 << 20, 24);
    let report = send_ok(&topo, 7582, &src.join("f"));
    assert_eq!(resumed_at(&report), 0, "{report}");
    let _ = rx.finish(Duration::from_secs(60));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    // The old version's partial is still there (nothing claimed it) ...
    assert!(listing(&dst).iter().any(|n| n.ends_with(".part.rdcp-tmp")), "{:?}", listing(&dst));
    // ... until a receiver with a short TTL starts after it expired: its files last written
    // over 2 s ago (the sweep counts mtimes in whole seconds), part of which the resend took.
    let age = listing(&dst)
        .iter()
        .filter(|n| n.ends_with(".part.rdcp-tmp") || n.ends_with(".meta.rdcp-tmp"))
        .map(|n| std::fs::metadata(dst.join(n)).unwrap().modified().unwrap().elapsed().unwrap_or_default())
        .min()
        .unwrap_or_default();
    std::thread::sleep(Duration::from_millis(2100).saturating_sub(age));
    let mut rx = Receiver::start(&topo, 7582, &["--dir", dst.to_str().unwrap(), "--partial-ttl", "1"]);
    assert_eq!(listing(&dst), ["f"], "the stale partial expired");
    rx.child.kill().unwrap();
    let _ = rx.child.wait();
}

#[test]
fn no_resume_sends_every_byte_and_keeps_no_partial() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("rn-src"), scratch("rn-dst"));
    let data = random_file(&src.join("f"), 32 << 20, 25);
    let rx = Receiver::start(
        &topo,
        7583,
        &["--dir", dst.to_str().unwrap(), "--count", "2", "--timeout", "5", "--no-resume"],
    );
    let mut sender = spawn_send_reporting(&topo, 7583, &src.join("f"), &INTERRUPTED);
    wait_for_temporary(&dst);
    std::thread::sleep(Duration::from_millis(300));
    sender.kill().unwrap();
    sender.wait().unwrap();
    let report = send_ok(&topo, 7583, &src.join("f"));
    assert_eq!(resumed_at(&report), 0, "{report}");
    let _ = rx.finish(Duration::from_secs(60));
    assert_eq!(listing(&dst), ["f"]);
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
}

/// A key seen in `ls -a` or on the wire, offered with another name, neither takes
/// the owner's partial nor removes it; the owner's next send still resumes.
#[test]
fn a_sniffed_key_offered_with_another_name_leaves_the_owner_s_partial_alone() {
    use rdma_proto::wire::{caps, Hello, Message};
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("sniff-src"), scratch("sniff-dst"));
    let data = random_file(&src.join("f"), 3 * CHECKPOINT_BYTES as usize, 24);
    let args = ["--dir", dst.to_str().unwrap(), "--count", "3", "--timeout", "5", "--checkpoint-every", CHECKPOINT];
    let rx = Receiver::start(&topo, 7585, &args);
    let mut sender = spawn_send_reporting(&topo, 7585, &src.join("f"), &INTERRUPTED);
    wait_for_partial(&dst, CHECKPOINT_BYTES + (CHECKPOINT_BYTES >> 1));
    sender.kill().unwrap();
    sender.wait().unwrap();
    wait_for_session_end(&dst, "f");
    let part = listing(&dst).into_iter().find(|n| n.ends_with(".part.rdcp-tmp")).expect("a partial");
    let key = u64::from_str_radix(part.trim_start_matches('.').split('.').next().unwrap(), 16).unwrap();
    // Another peer offers a small file "other" under that key and sends it whole: a completed
    // transfer must not remove a partial it could not use.
    let mut thief = RawSender::connect(&topo, 7585);
    let caps = caps::DIGEST_XXH3_128 | caps::RESUME;
    let hello = Hello { name: "other".into(), caps, resume: Some(key), ..raw_hello(4096) };
    thief.send_message(0x7585_0001, &Message::Hello(hello)).unwrap();
    let Message::Grant(g) = thief.recv() else { panic!("no GRANT") };
    let other = vec![7u8; 4096];
    thief.write_chunk(&g, &other, 0).unwrap();
    let digest = xxhash_rust::xxh3::xxh3_128(&other).to_be_bytes().to_vec();
    let fin = rdma_proto::wire::Fin { chunks: 1, size: 4096, digest };
    thief.send_message(0x7585_0001, &Message::Fin(fin)).unwrap();
    let answer = loop {
        match thief.recv() {
            Message::Credit(_) => continue,
            m => break m,
        }
    };
    assert!(matches!(&answer, Message::Ack(a) if a.status == rdma_proto::Status::Ok), "{answer:?}");
    drop(thief);
    assert!(std::fs::read(dst.join("other")).unwrap() == other);
    std::thread::sleep(Duration::from_secs(1));
    assert!(listing(&dst).contains(&part), "the owner's partial was removed: {:?}", listing(&dst));
    let report = send_ok(&topo, 7585, &src.join("f"));
    let (_, lines) = rx.finish(Duration::from_secs(60));
    let at = resumed_at(&report);
    assert!(at >= CHECKPOINT_BYTES, "the owner resumed at {at}: {report}{lines}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
}

/// A peer that read a partial's key in `ls -a` and offers the same name and size, with other
/// bytes, cannot continue it: asked to prove the bytes the partial holds (a keyed hash under the
/// receiver's fresh nonce), it cannot, and is served from byte 0 into a new temporary. It writes
/// some junk and leaves: the partial and its sidecar are as they were, and the owner's next send
/// resumes and is stored (exit 0).
#[test]
fn a_peer_with_the_resume_key_but_other_bytes_gets_a_fresh_temporary_and_the_owner_resumes() {
    use rdma_proto::wire::{caps, Hello, Message, Proof};
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("prove-src"), scratch("prove-dst"));
    let data = random_file(&src.join("f"), 3 * CHECKPOINT_BYTES as usize, 26);
    let args = ["--dir", dst.to_str().unwrap(), "--count", "3", "--timeout", "5", "--checkpoint-every", CHECKPOINT];
    let rx = Receiver::start(&topo, 7588, &args);
    let mut owner = spawn_send_reporting(&topo, 7588, &src.join("f"), &INTERRUPTED);
    wait_for_partial(&dst, CHECKPOINT_BYTES + (CHECKPOINT_BYTES >> 1));
    owner.kill().unwrap();
    owner.wait().unwrap();
    wait_for_session_end(&dst, "f");
    let part = listing(&dst).into_iter().find(|n| n.ends_with(".part.rdcp-tmp")).expect("a partial");
    let meta = part.replace(".part.", ".meta.");
    let key = u64::from_str_radix(part.trim_start_matches('.').split('.').next().unwrap(), 16).unwrap();
    let before = (std::fs::read(dst.join(&part)).unwrap(), std::fs::read(dst.join(&meta)).unwrap());

    // The hostile peer: the key, the same name and size, other bytes.
    let mut hostile = RawSender::connect(&topo, 7588);
    let caps = caps::DIGEST_XXH3_128 | caps::RESUME | caps::RESUME_PROOF;
    let hello = Hello { caps, resume: Some(key), ..raw_hello(data.len() as u64) };
    hostile.send_message(0x7588_0001, &Message::Hello(hello)).unwrap();
    let grant = match hostile.recv() {
        Message::Challenge(c) if c.prefix.is_some() => {
            // It cannot prove bytes it does not hold.
            hostile.send_message(0x7588_0001, &Message::Proof(Proof { nonce: c.nonce, mac: [0x42; 32] })).unwrap();
            match hostile.recv() {
                Message::Grant(g) => g,
                m => panic!("{m:?} instead of a GRANT"),
            }
        }
        Message::Grant(g) => g,
        m => panic!("{m:?} instead of a GRANT or a CHALLENGE"),
    };
    eprintln!("the hostile peer was granted from byte {}", grant.resume_from);
    let junk = vec![0x6au8; 4 * grant.slot_size as usize];
    for seq in 0..4 {
        hostile.write_chunk(&grant, &junk, seq).unwrap();
    }
    assert!(hostile.credited(4), "the receiver stored the hostile peer's chunks");
    drop(hostile);
    std::thread::sleep(Duration::from_secs(1));
    let after = (std::fs::read(dst.join(&part)).ok(), std::fs::read(dst.join(&meta)).ok());
    let intact = after.0.as_ref() == Some(&before.0) && after.1.as_ref() == Some(&before.1);

    let out = spawn_send_reporting(&topo, 7588, &src.join("f"), &[]).wait_with_output().unwrap();
    let report = text(&out.stdout);
    let (_, lines) = rx.finish(Duration::from_secs(60));
    eprintln!("the owner's resend: {:?}: {}{}", out.status.code(), report.trim(), text(&out.stderr).trim());
    assert_eq!(out.status.code(), Some(0), "the owner's resend failed: {}{lines}", text(&out.stderr));
    assert_eq!(grant.resume_from, 0, "the hostile peer was let continue the partial");
    assert!(intact, "the owner's partial changed under the hostile peer's session");
    assert!(resumed_at(&report) >= CHECKPOINT_BYTES, "the owner did not resume: {report}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
    assert_eq!(listing(&dst), ["f"], "nothing but the file is left");
}

/// With a secret, a resumed partial is hashed with keyed BLAKE3 before the GRANT, and the
/// sender waits for that GRANT only its `--timeout`: a partial that took longer to hash would
/// never be resumed, and each timed-out attempt would rewrite its sidecar, so it never expired
/// either. The receiver therefore resumes from what it hashed within a third of its
/// `--timeout`, and is sent the rest. A 256 MiB file, cut once 160 MiB are kept, then sent
/// again with `--timeout 3` on both sides (keyed BLAKE3 of 160 MiB takes seconds in the VM):
/// the second send succeeds, resumed from less than what was kept.
#[test]
fn a_partial_too_large_to_hash_within_the_timeout_resumes_from_what_was_hashed() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("rs-big-src"), scratch("rs-big-dst"), scratch("rs-big-keys"));
    let key = secret_file(&keys);
    let data = random_file(&src.join("f"), 256 << 20, 86);
    let args =
        ["--dir", dst.to_str().unwrap(), "--count", "2", "--timeout", "3", "--secret-file", key.to_str().unwrap()];
    let rx = Receiver::start(&topo, 7586, &args);
    let sender = |extra: &[&str]| keyed_sender(&topo, 7586, &src.join("f"), extra);
    let mut first = sender(&["--quiet", "--timeout", "30"]);
    wait_for_partial(&dst, 160 << 20);
    first.kill().unwrap();
    first.wait().unwrap();
    wait_for_session_end(&dst, "f");
    let kept = partial_len(&dst).unwrap_or(0);
    let out = sender(&["--timeout", "3"]).wait_with_output().unwrap();
    let report = text(&out.stdout);
    let (_, lines) = rx.finish(Duration::from_secs(60));
    eprintln!("kept {kept} bytes; {}{}{lines}", report.trim(), text(&out.stderr));
    assert!(out.status.success(), "the resend failed: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
    let at = resumed_at(&report);
    assert!(at > 0 && at < kept, "resumed at {at} of the {kept} bytes kept");
}

/// A peer that offers a resume and leaves at once costs the receiver no more hashing than it
/// stays connected for (not a third of its `--timeout` of the partial's bytes, read from disk,
/// for a connection of about 1 KB): the hash asks every 16 MiB whether the peer left, and
/// stops. A 128 MiB partial cut at 96 MiB or more (six looks at the connection), with
/// a secret (keyed BLAKE3, tens of MB/s in the VM) and `--timeout 60` (a budget of 20 s: it
/// would all be hashed): a sender
/// killed as soon as the receiver logs that the hash began leaves a hash that stopped short and
/// says the peer was gone; the next sender resumes and the file arrives whole.
#[test]
fn a_peer_that_offers_a_resume_and_leaves_stops_the_hash_of_the_partial() {
    use std::io::BufRead;
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("rs-left-src"), scratch("rs-left-dst"), scratch("rs-left-keys"));
    let key = secret_file(&keys);
    let data = random_file(&src.join("f"), 128 << 20, 87);
    // The receiver's log (RUST_LOG=info, on stderr), line by line to this test.
    let listen = format!("{}:7587", topo.server.addr);
    let mut rx = cli::rdma_copy()
        .args(["recv", "--listen", &listen, "--dir", dst.to_str().unwrap(), "--count", "3", "--timeout", "60"])
        .args(["--secret-file", key.to_str().unwrap()])
        .env("RUST_LOG", "rdma_proto=info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (log_tx, log) = std::sync::mpsc::channel::<String>();
    let err = std::io::BufReader::new(rx.stderr.take().unwrap());
    std::thread::spawn(move || err.lines().map_while(Result::ok).for_each(|l| drop(log_tx.send(plain(&l)))));
    let out = rx.stdout.take().unwrap();
    let reports = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let wait_for = |what: &str, limit: Duration| -> Vec<String> {
        let deadline = std::time::Instant::now() + limit;
        let mut seen = Vec::new();
        while let Ok(line) = log.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            let hit = line.contains(what);
            seen.push(line);
            if hit {
                return seen;
            }
        }
        panic!("the receiver did not log {what:?} within {limit:?}: {seen:#?}");
    };
    wait_for("listening on", Duration::from_secs(10));
    let sender = |extra: &[&str]| keyed_sender(&topo, 7587, &src.join("f"), extra);
    let mut first = sender(&["--quiet"]);
    wait_for_partial(&dst, 96 << 20);
    first.kill().unwrap();
    first.wait().unwrap();
    wait_for_session_end(&dst, "f");
    let kept = partial_len(&dst).unwrap_or(0);

    let mut leaver = sender(&["--quiet"]);
    wait_for("hashing the bytes a partial holds", Duration::from_secs(60));
    leaver.kill().unwrap();
    leaver.wait().unwrap();
    let seen = wait_for("resuming from what was hashed", Duration::from_secs(60));
    let line = seen.last().unwrap().clone();
    let hashed: u64 = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("hashed=")?.parse().ok())
        .unwrap_or_else(|| panic!("no hashed= in {line:?}"));
    eprintln!("kept {kept} bytes; the leaver's session: {line}");
    assert!(line.contains("gone=true"), "the hash stopped for the peer that left: {line}");
    assert!(hashed < kept, "hashed {hashed} of the {kept} bytes kept for a peer that left");

    let out = sender(&[]).wait_with_output().unwrap();
    let report = text(&out.stdout);
    let _ = rx.kill();
    let _ = rx.wait();
    let lines = reports.join().unwrap_or_default();
    eprintln!("{}{}{lines}", report.trim(), text(&out.stderr));
    assert!(out.status.success(), "the resend failed: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
    assert!(resumed_at(&report) > 0, "the honest sender resumed: {report}");
}

/// `line` without its ANSI colour sequences (`ESC [ ... m`, which tracing's log lines carry).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// A file sent again to a receiver that holds it, identical, is a success with nothing sent,
/// and so is a batch sent again: the receiver asks the sender to prove the whole file (as a
/// resume's prefix) and counts it stored, as rsync does. A file of that name with other bytes
/// is still refused (`Exists`, exit 17).
#[test]
fn a_file_or_batch_sent_again_is_already_stored_and_other_bytes_still_exist() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("again-src"), scratch("again-dst"));
    let data = random_file(&src.join("f"), 3 << 20, 27);
    std::fs::create_dir(src.join("tree")).unwrap();
    random_file(&src.join("tree").join("a"), 1 << 20, 28);
    random_file(&src.join("tree").join("b"), 4096, 29);
    let rx = Receiver::start(&topo, 7589, &["--dir", dst.to_str().unwrap(), "--count", "5"]);
    let f = src.join("f");
    let first = send(&topo, 7589, &[f.to_str().unwrap()]);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let again = send(&topo, 7589, &[f.to_str().unwrap()]);
    eprintln!("the resend: {:?}: {}{}", again.status.code(), text(&again.stdout).trim(), text(&again.stderr).trim());
    let tree = src.join("tree");
    let batch = send(&topo, 7589, &[tree.to_str().unwrap()]);
    assert!(batch.status.success(), "{}", text(&batch.stderr));
    let batch_again = send(&topo, 7589, &[tree.to_str().unwrap()]);
    eprintln!(
        "the batch again: {:?}: {}{}",
        batch_again.status.code(),
        text(&batch_again.stdout),
        text(&batch_again.stderr)
    );
    // The same name and size, other bytes: still refused.
    let other = scratch("again-other");
    random_file(&other.join("f"), 3 << 20, 30);
    let refused = send(&topo, 7589, &[other.join("f").to_str().unwrap()]);
    let (_, lines) = rx.finish(Duration::from_secs(60));
    assert_eq!(again.status.code(), Some(0), "the resend: {}{lines}", text(&again.stderr));
    assert!(text(&again.stdout).contains("already stored"), "{}", text(&again.stdout));
    assert_eq!(batch_again.status.code(), Some(0), "the batch again: {}{lines}", text(&batch_again.stderr));
    assert_eq!(refused.status.code(), Some(17), "other bytes under the name: {}", text(&refused.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file in place is untouched");
    assert_eq!(listing(&dst), ["f", "tree"], "nothing else is left");
}
