//! Device tests: striping. `rdma-copy send --lanes N` spreads
//! one session's chunks over N connections to the receiver: a 64 MiB file over 2 and 4 lanes,
//! a batch, and a transfer killed and resumed all arrive identical; a receiver that grants no
//! lanes (`--max-lanes 1`) is sent everything on one; a lane whose token names no live session
//! is rejected, and the session it tried to join goes on; the time the lanes take to connect
//! does not count against the transfer's timeout. Ports 7630-7636.

mod cli;

use std::path::Path;
use std::process::Child;
use std::time::Duration;

use cli::*;

/// `rdma-copy send --lanes LANES` of `file` to `port`, its report on stdout.
fn spawn_striped(topo: &testkit::Topology, port: u16, lanes: u16, file: &Path, extra: &[&str]) -> Child {
    let lanes = lanes.to_string();
    spawn_send_reporting(topo, port, file, &[&["--lanes", lanes.as_str()], extra].concat())
}

/// Sends `file` over `lanes` lanes to completion; its stdout report.
fn send_striped(topo: &testkit::Topology, port: u16, lanes: u16, file: &Path, extra: &[&str]) -> String {
    let out = spawn_striped(topo, port, lanes, file, extra).wait_with_output().unwrap();
    assert!(out.status.success(), "the striped send failed: {}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

#[test]
fn a_32_mib_file_striped_over_2_and_4_lanes_arrives_identical() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-src"), scratch("st-dst"));
    let data = random_file(&src.join("f"), 32 << 20, 31);
    let rx = Receiver::start(&topo, 7630, &["--dir", dst.to_str().unwrap(), "--count", "3"]);
    for lanes in [2u16, 4] {
        let name = format!("f{lanes}");
        let report = send_striped(&topo, 7630, lanes, &src.join("f"), &["--name", &name]);
        eprintln!("{}", report.trim());
        assert!(report.contains(&format!(", {lanes} lanes")), "{report}");
        assert!(std::fs::read(dst.join(&name)).unwrap() == data, "{lanes} lanes: the file differs");
    }
    // Small files too: fewer chunks than lanes, one chunk, none.
    for (i, len) in [0usize, 1, (1 << 20) + 1, 3 << 20].into_iter().enumerate() {
        random_file(&src.join(format!("s{i}")), len, 40 + i as u64);
    }
    let report = send_striped(
        &topo,
        7630,
        4,
        &src.join("s0"),
        &[
            "--batch",
            src.join("s1").to_str().unwrap(),
            src.join("s2").to_str().unwrap(),
            src.join("s3").to_str().unwrap(),
        ],
    );
    eprintln!("{}", report.trim());
    for i in 0..4 {
        let name = format!("s{i}");
        assert!(std::fs::read(dst.join(&name)).unwrap() == std::fs::read(src.join(&name)).unwrap(), "{name}");
    }
    let (code, lines) = rx.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{lines}");
    assert!(listing_without_partials(&dst).iter().all(|n| !n.ends_with(".rdcp-tmp")), "{:?}", listing(&dst));
}

#[test]
fn a_striped_batch_arrives_whole() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-b-src"), scratch("st-b-dst"));
    let t = src.join("tree");
    std::fs::create_dir_all(t.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(t.join("empty-dir")).unwrap();
    random_file(&t.join("big.bin"), (9 << 20) + 17, 1);
    random_file(&t.join("sub/small"), 1000, 2);
    random_file(&t.join("sub/deeper/one-chunk"), 1 << 20, 3);
    std::fs::write(t.join("empty"), b"").unwrap();
    let rx = Receiver::start(&topo, 7631, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
    let report = send_striped(&topo, 7631, 3, &t, &[]);
    let (code, lines) = rx.finish(Duration::from_secs(30));
    eprintln!("{report}{lines}");
    assert_eq!(code, 0, "{lines}");
    assert!(report.contains("batch: 8 of 8 entries stored"), "{report}");
    for f in ["big.bin", "sub/small", "sub/deeper/one-chunk", "empty"] {
        let (a, b) = (std::fs::read(t.join(f)).unwrap(), std::fs::read(dst.join("tree").join(f)).unwrap());
        assert!(a == b, "{f} differs");
    }
    assert!(dst.join("tree/empty-dir").is_dir());
}

#[test]
fn a_striped_transfer_killed_and_resumed_arrives_identical() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-r-src"), scratch("st-r-dst"));
    let data = random_file(&src.join("f"), 48 << 20, 33);
    let mut resumed = Vec::new();
    for (seed, (first, second)) in [(4u16, 2u16), (2, 4), (4, 1), (3, 3)].into_iter().enumerate() {
        let rx = Receiver::start(&topo, 7632, &["--dir", dst.to_str().unwrap(), "--count", "2", "--timeout", "5"]);
        let mut sender = spawn_striped(&topo, 7632, first, &src.join("f"), &[]);
        wait_for_partial(&dst, 1);
        std::thread::sleep(Duration::from_millis(100 + 150 * seed as u64));
        sender.kill().unwrap();
        sender.wait().unwrap();
        // As `wait_for_session_end`, saying how the receiver ended the session when it kept
        // nothing (once seen in CI on 6.1, 2026-11-28: the listing was empty).
        let t = std::time::Instant::now();
        while !listing(&dst).iter().any(|n| n.ends_with(".meta.rdcp-tmp") || n == "f") {
            let reports = rx.reports_so_far();
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "{first} lanes: the killed session kept nothing: {:?}\n{reports}",
                listing(&dst)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        if dst.join("f").exists() {
            std::fs::remove_file(dst.join("f")).unwrap();
        }
        let report = send_striped(&topo, 7632, second, &src.join("f"), &[]);
        let (code, lines) = rx.finish(Duration::from_secs(60));
        let at = resumed_at(&report);
        eprintln!("{first} then {second} lanes: resumed at {at}: {}", report.lines().next().unwrap_or(""));
        assert!(matches!(code, 0 | 9), "{lines}");
        assert_eq!(listing(&dst), ["f"], "{first} then {second} lanes: nothing but the file is left");
        assert!(std::fs::read(dst.join("f")).unwrap() == data, "{first} then {second} lanes: the file differs");
        std::fs::remove_file(dst.join("f")).unwrap();
        resumed.push(at);
    }
    assert!(resumed.iter().filter(|&&at| at > 0).count() >= 2, "resumed at {resumed:?}");
}

#[test]
fn a_receiver_that_grants_no_lanes_is_sent_everything_on_one() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-1-src"), scratch("st-1-dst"));
    let data = random_file(&src.join("f"), 8 << 20, 34);
    let rx = Receiver::start(&topo, 7633, &["--dir", dst.to_str().unwrap(), "--count", "1", "--max-lanes", "1"]);
    let report = send_striped(&topo, 7633, 4, &src.join("f"), &[]);
    let (code, lines) = rx.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{lines}");
    assert!(!report.contains("lanes"), "one lane: {report}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
}

/// Connects to `port` as an extra lane presenting `lane` (a LANE message) as its private
/// data; the CM's answer.
fn connect_lane(topo: &testkit::Topology, port: u16, session: u64, lane: rdma_proto::wire::Lane) -> rdma_cm::Error {
    let mut private = Vec::new();
    rdma_proto::wire::encode(session, &rdma_proto::wire::Message::Lane(lane), &mut private).unwrap();
    match connect_with(topo, port, &private) {
        Ok(_) => panic!("a lane with a wrong token was accepted"),
        Err(e) => e,
    }
}

/// Whether `e` is a rejection whose private data is an ACK NotAuthorized.
fn not_authorized(e: &rdma_cm::Error) -> bool {
    let rdma_cm::Error::Rejected { private_data, .. } = e else { return false };
    matches!(
        rdma_proto::wire::decode(private_data),
        Ok((_, rdma_proto::wire::Message::Ack(a))) if a.status == rdma_proto::Status::NotAuthorized
    )
}

#[test]
fn a_lane_with_a_wrong_token_is_refused_and_the_session_goes_on() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-t-src"), scratch("st-t-dst"));
    let data = random_file(&src.join("f"), 64 << 20, 35);
    let rx = Receiver::start(&topo, 7634, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
    let sender = spawn_striped(&topo, 7634, 2, &src.join("f"), &[]);
    wait_for_temporary(&dst);
    // While the striped session runs: lanes that present a guessed token, for lane 1 (which
    // the session holds) and for a lane it was never granted.
    for lane in [1u16, 2, 7] {
        let e = connect_lane(&topo, 7634, 0x1234, rdma_proto::wire::Lane { lane, token: [0x5a; 16] });
        assert!(not_authorized(&e), "lane {lane}: {e:?}");
    }
    let out = sender.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (code, lines) = rx.finish(Duration::from_secs(30));
    eprintln!("{}{lines}", text(&out.stdout));
    assert_eq!(code, 0, "the refused lanes are no failed transfer: {lines}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the session went on: the file is whole");
    assert_eq!(lines.lines().filter(|l| l.contains("not authorized")).count(), 3, "{lines}");
}

#[test]
fn a_sender_whose_lanes_present_another_token_is_refused_and_nothing_is_stored() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-w-src"), scratch("st-w-dst"));
    random_file(&src.join("f"), 8 << 20, 36);
    let rx = Receiver::start(&topo, 7635, &["--dir", dst.to_str().unwrap(), "--count", "1", "--timeout", "5"]);
    let token = ["--test-lane-token", "00112233445566778899aabbccddeeff"];
    let out = spawn_striped(&topo, 7635, 2, &src.join("f"), &token).wait_with_output().unwrap();
    let (code, lines) = rx.finish(Duration::from_secs(30));
    eprintln!("{}{}{lines}", text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(19), "NotAuthorized: {}", text(&out.stderr));
    assert_eq!(code, 9, "its session failed: {lines}");
    assert_eq!(listing_without_partials(&dst), Vec::<String>::new(), "nothing stored");
}

/// The extra lanes connect after the GRANT, within the sender's `--connect-timeout` (10 s), as the
/// first connection does; a CM message lost on the way is resent only after seconds. That time is
/// not the data phase's: the transfer's `--timeout 5` counts from when the lanes are up.
#[test]
fn lanes_slow_to_connect_do_not_count_against_the_transfer_timeout() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("st-d-src"), scratch("st-d-dst"));
    let data = random_file(&src.join("f"), 8 << 20, 37);
    let rx = Receiver::start(&topo, 7636, &["--dir", dst.to_str().unwrap(), "--count", "1"]);
    let report = send_striped(&topo, 7636, 2, &src.join("f"), &["--test-lane-delay-ms", "6000", "--timeout", "5"]);
    let (code, lines) = rx.finish(Duration::from_secs(30));
    eprintln!("{}{lines}", report.trim());
    assert_eq!(code, 0, "{lines}");
    assert!(report.contains(", 2 lanes"), "{report}");
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
}
