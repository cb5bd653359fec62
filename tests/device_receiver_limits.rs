//! Device tests: a few unauthenticated peers cannot exhaust a receiver or lock others out
//! (issue 33 §2): each limit against the hostile peer that used to win.

mod cli;

use std::time::Duration;

use cli::*;
use rdma_proto::wire::{Hello, Message};

/// Sends a HELLO asking for the largest ring there is; the GRANT's ring size in bytes.
fn greedy_hello(s: &mut RawSender, session: u64) -> u64 {
    let hello = Hello { chunk: u32::MAX, depth: u32::MAX, name: format!("greedy-{session:x}"), ..raw_hello(1 << 40) };
    s.send_message(session, &Message::Hello(hello)).unwrap();
    match s.recv() {
        Message::Grant(g) => u64::from(g.slot_size) * u64::from(g.slot_count),
        other => panic!("{other:?} instead of a GRANT"),
    }
}

#[test]
fn greedy_peers_share_the_memory_budget_and_an_honest_send_still_goes_through() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("greedy-src"), scratch("greedy-dst"));
    const BUDGET: u64 = 64 << 20;
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(
        &topo,
        7650,
        &["--dir", dir, "--max-sessions", "8", "--max-per-address", "8", "--memory", "64M", "--timeout", "20"],
    );
    let base = rx.peak_rss_kib();
    // Seven peers (fewer than --max-sessions) each ask for 4 GiB chunks, 4 Gi of them.
    let mut greedy = Vec::new();
    let mut granted = 0;
    for i in 0..7u64 {
        let mut s = RawSender::connect(&topo, 7650);
        granted += greedy_hello(&mut s, 0x7650_0000 + i);
        greedy.push(s);
    }
    let rss = rx.peak_rss_kib();
    eprintln!(
        "7 greedy peers: {} MiB of rings granted; receiver RSS {base} KiB before, {rss} KiB after",
        granted >> 20
    );
    assert!(
        granted <= BUDGET * 7 / 8,
        "{} MiB granted to 7 of 8 sessions, over their 7/8 of --memory 64M",
        granted >> 20
    );
    // Memory held: the rings (pinned) and their copy buffers, within the budget, plus slack for
    // the 7 connections' queues.
    assert!(((rss - base) as u64) << 10 <= BUDGET + (16 << 20), "RSS grew {} KiB", rss - base);
    let data = random_file(&src.join("f"), 4 << 20, 50);
    let out = send(&topo, 7650, &[src.join("f").to_str().unwrap()]);
    assert!(out.status.success(), "the honest send beside them: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    drop(greedy);
    let _ = rx.stop(Duration::from_secs(30));
}

#[test]
fn idle_connections_from_one_address_leave_the_other_addresses_served() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("peraddr-src"), scratch("peraddr-dst"));
    let data = random_file(&src.join("f"), 1 << 20, 51);
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7651, &["--dir", dir, "--timeout", "20"]);
    // One address opens 12 connections that never send a HELLO (the defaults: 8 sessions and 4
    // places beyond them for HELLOs, 4 per address): the first 4 are taken, the rest hear Busy.
    let mut idle = Vec::new();
    let mut busy = 0;
    for _ in 0..12 {
        match connect_with(&topo, 7651, &[]) {
            Ok(c) => idle.push(c),
            Err(rdma_cm::Error::Rejected { .. }) => busy += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert_eq!((idle.len(), busy), (4, 8), "4 connections per address");
    // A sender from the other address (rxe0's own, by loopback) is served at once.
    let to = format!("{}:7651", topo.server.addr);
    let from = topo.server.addr.to_string();
    let out = std::process::Command::new(tool())
        .args(["send", "--quiet", "--to", &to, "--from", &from, "--timeout", "20"])
        .arg(src.join("f"))
        .output()
        .unwrap();
    assert!(out.status.success(), "another address was locked out: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    drop(idle);
    let _ = rx.stop(Duration::from_secs(30));
}

#[test]
fn bogus_lanes_on_a_receiver_without_a_secret_cost_only_their_connection() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("lanes-src"), scratch("lanes-dst"));
    let data = random_file(&src.join("f"), 1 << 20, 52);
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7652, &["--dir", dir, "--timeout", "20"]);
    for lane in 1..=8u16 {
        let mut private = Vec::new();
        let bogus = rdma_proto::wire::Lane { lane, token: [0x5a; 16] };
        rdma_proto::wire::encode(0x7652, &Message::Lane(bogus), &mut private).unwrap();
        assert!(connect_with(&topo, 7652, &private).is_err(), "a bogus lane was accepted");
    }
    let out = send(&topo, 7652, &[src.join("f").to_str().unwrap()]);
    assert!(out.status.success(), "8 bogus lanes locked the address out: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    let _ = rx.stop(Duration::from_secs(30));
}
