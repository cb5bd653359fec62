//! A hostile sender against `rdma-copy recv`: a sender written by hand over
//! rdma-verbs ([`RawSender`], in `cli/`) sends control messages that are malformed, truncated,
//! oversized, out of order or of another session, FINs that do not match what was sent, WRITEs
//! outside the grant, with the wrong length or immediate, past the end, after and racing the
//! FIN. For each, the receiver answers with the status the protocol gives (read from the ACK the
//! raw sender receives, when the receiver can send one) or reports the violation, leaves
//! nothing in the destination, and then serves a real sender.
//!
//! rxe1 10.77.0.2 sends to rxe0 10.77.0.1, ports 7570-7573. Run with `--nocapture` to see
//! each case's outcome.

mod cli;

use std::time::Duration;

use cli::*;
use rdma_proto::wire::{self, Ack, Credit, Fin, Grant, Hello, Message};
use rdma_proto::Status;
use rdma_verbs::WcStatus;

/// The file every raw session offers: four chunks of the 4 KiB the raw HELLO asks for, the last
/// one short, in a ring of four slots.
const SIZE: usize = 3 * 4096 + 100;
const CHUNKS: u64 = 4;

/// What one hostile session saw.
#[derive(Debug)]
struct Seen {
    case: &'static str,
    /// The session id it used (0: it sent no HELLO).
    session: u64,
    /// The ACK's status, if one came.
    ack: Option<Status>,
    /// A request of the raw sender the device refused (a WRITE outside the grant, say).
    refused: Option<WcStatus>,
}

/// The data of the raw sessions' file.
fn data() -> Vec<u8> {
    (0..SIZE).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// The FIN an honest sender sends for `file`.
fn fin_of(file: &[u8]) -> Fin {
    let digest = xxhash_rust::xxh3::xxh3_128(file).to_be_bytes().to_vec();
    Fin { chunks: CHUNKS, size: file.len() as u64, digest }
}

fn encoded(session: u64, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode(session, m, &mut out).unwrap();
    out
}

/// A raw sender that was granted a ring for a file named `name` of [`SIZE`] bytes.
fn granted(topo: &testkit::Topology, port: u16, session: u64, name: &str) -> (RawSender, Grant) {
    let mut s = RawSender::connect(topo, port);
    let g = s.hello(session, name, SIZE as u64);
    assert_eq!((g.slot_size, g.slot_count), (4096, 4), "the ring the cases are written for");
    (s, g)
}

/// WRITEs chunks `0..n` of `file` as an honest sender does.
fn write_chunks(s: &mut RawSender, g: &Grant, file: &[u8], n: u64) {
    for seq in 0..n {
        s.write_chunk(g, file, seq).unwrap_or_else(|e| panic!("chunk {seq}: {e:?}"));
    }
}

/// The session's outcome: its ACK, if any (an ACK of another session fails the test).
fn outcome(case: &'static str, session: u64, mut s: RawSender, refused: Option<WcStatus>) -> Seen {
    let ack = s.ack().map(|(sid, a)| {
        assert_eq!(sid, session, "{case}: an ACK of another session: {a:?}");
        a.status
    });
    let seen = Seen { case, session, ack, refused };
    eprintln!("{case}: {seen:?}");
    seen
}

/// The receiver's report, line by line: (session, what happened).
fn reports(out: &str) -> Vec<(u64, String)> {
    out.lines()
        .map(|l| {
            let session = u64::from_str_radix(&l[..16], 16).unwrap_or_else(|_| panic!("a report line: {l}"));
            let what = l.split_once(" MB/s): ").and_then(|(_, r)| r.split_once("; connect")).map(|(w, _)| w);
            (session, what.unwrap_or_else(|| panic!("a report line: {l}")).to_owned())
        })
        .collect()
}

/// Checks each case against the receiver's report: the session's line says `what`.
fn check_reports(report: &str, seen: &[Seen], expected: &[(&str, &str)]) {
    let lines = reports(report);
    for (case, what) in expected {
        let s = seen.iter().find(|s| s.case == *case).unwrap_or_else(|| panic!("no case {case}"));
        let found = lines.iter().any(|(sid, w)| *sid == s.session && w.contains(what));
        assert!(found, "{case} (session {:016x}): no report line with {what:?} in\n{report}", s.session);
    }
}

/// Control messages out of place, malformed, truncated, oversized or of another session.
#[test]
fn control_messages_out_of_place_are_refused() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("hostile-ctl-src"), scratch("hostile-ctl-dst"));
    let real = random_file(&src.join("real"), 70_000, 11);
    // Eight sessions send a HELLO (and count as transfers); three send none.
    let rx = Receiver::start(&topo, 7570, &["--dir", dst.to_str().unwrap(), "--count", "9", "--timeout", "5"]);
    let file = data();
    let mut seen = Vec::new();
    let fin = Message::Fin(fin_of(&file));

    // Before any HELLO: no session, so no ACK; not a transfer.
    let mut s = RawSender::connect(&topo, 7570);
    s.send_message(0x7570_0001, &fin).unwrap();
    seen.push(outcome("a FIN before the HELLO", 0, s, None));
    let mut s = RawSender::connect(&topo, 7570);
    s.send_bytes(b"GET / HTTP/1.1\r\nHost: rdma\r\n\r\n").unwrap();
    seen.push(outcome("junk before the HELLO", 0, s, None));
    let mut s = RawSender::connect(&topo, 7570);
    let hello = encoded(0x7570_0003, &Message::Hello(Hello { name: "cut".into(), ..raw_hello(SIZE as u64) }));
    s.send_bytes(&hello[..30]).unwrap();
    seen.push(outcome("a truncated HELLO", 0, s, None));

    // After the GRANT, with the file open.
    let after_grant: [(&'static str, u64, Vec<u8>); 7] = [
        ("a CREDIT from the sender", 0x7570_0004, encoded(0x7570_0004, &Message::Credit(Credit { consumed: 0 }))),
        (
            "a second HELLO",
            0x7570_0005,
            encoded(0x7570_0005, &Message::Hello(Hello { name: "again".into(), ..raw_hello(1) })),
        ),
        (
            "an ACK from the sender",
            0x7570_0006,
            encoded(
                0x7570_0006,
                &Message::Ack(Ack { status: Status::Ok, received: 0, detail: String::new(), retry_after_ms: 0 }),
            ),
        ),
        ("a FIN of another session", 0x7570_0007, encoded(0x7570_0107, &fin)),
        ("bytes without the magic", 0x7570_0008, vec![0x5a; 64]),
        ("a truncated FIN", 0x7570_0009, encoded(0x7570_0009, &fin)[..40].to_vec()),
        ("a length over the limit", 0x7570_000a, {
            let mut b = encoded(0x7570_000a, &fin);
            b[8..12].copy_from_slice(&4096u32.to_be_bytes());
            b
        }),
    ];
    for (case, session, bytes) in after_grant {
        let (mut s, g) = granted(&topo, 7570, session, &format!("ctl-{session:x}"));
        s.write_chunk(&g, &file, 0).unwrap();
        s.send_bytes(&bytes).unwrap();
        seen.push(outcome(case, session, s, None));
    }

    // A Send larger than the receive buffers: the device refuses it, the connection is in error.
    let (mut s, _) = granted(&topo, 7570, 0x7570_000b, "ctl-oversized");
    let r = s.send_bytes(&[7u8; 4 * wire::MAX_MESSAGE_LEN]).err();
    seen.push(outcome("a Send of 4 KiB", 0x7570_000b, s, r));

    let out = send(&topo, 7570, &[src.join("real").to_str().unwrap()]);
    assert!(out.status.success(), "the receiver kept serving: {}", text(&out.stderr));
    let (code, report) = rx.finish(std::time::Duration::from_secs(30));
    eprintln!("receiver exit {code}:\n{report}");
    assert_eq!(code, 9, "{report}");
    for s in &seen {
        let want = if s.session == 0 || s.case == "a Send of 4 KiB" { None } else { Some(Status::ProtocolMismatch) };
        assert_eq!(s.ack, want, "{}", s.case);
    }
    check_reports(
        &report,
        &seen,
        &[
            ("a CREDIT from the sender", "unexpected Credit while Data"),
            ("a second HELLO", "unexpected Hello while Data"),
            ("an ACK from the sender", "unexpected Ack while Data"),
            ("a FIN of another session", "message of session 0x75700107, ours is 0x75700007"),
            ("bytes without the magic", "bad magic"),
            ("a truncated FIN", "truncated message"),
            ("a length over the limit", "length 4096 out of range"),
            ("a Send of 4 KiB", "broke the rules"),
        ],
    );
    // The sessions without a HELLO are reported (session 0) but are no transfer.
    for what in ["unexpected Fin while AwaitHello", "bad magic", "truncated message"] {
        assert!(reports(&report).iter().any(|(sid, w)| *sid == 0 && w.contains(what)), "{what}:\n{report}");
    }
    assert_eq!(listing(&dst), ["real"], "nothing of the hostile sessions is left");
    assert!(std::fs::read(dst.join("real")).unwrap() == real);
}

/// FINs that do not match what was sent, and, as a control, the raw sender's honest transfer.
#[test]
fn fins_that_do_not_match_are_refused() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("hostile-fin-src"), scratch("hostile-fin-dst"));
    let real = random_file(&src.join("real"), 70_000, 12);
    let rx = Receiver::start(&topo, 7571, &["--dir", dst.to_str().unwrap(), "--count", "8", "--timeout", "5"]);
    let file = data();
    let good = fin_of(&file);
    let cases: [(&'static str, u64, Fin, Option<Status>); 7] = [
        ("an honest transfer", 0x7571_0001, good.clone(), Some(Status::Ok)),
        ("a FIN after 2 of 4 chunks", 0x7571_0002, good.clone(), Some(Status::ProtocolMismatch)),
        ("a FIN for 5 chunks", 0x7571_0003, Fin { chunks: CHUNKS + 1, ..good.clone() }, Some(Status::ProtocolMismatch)),
        (
            "a FIN 1 byte short",
            0x7571_0004,
            Fin { size: SIZE as u64 - 1, ..good.clone() },
            Some(Status::ProtocolMismatch),
        ),
        (
            "a digest of 8 bytes",
            0x7571_0005,
            Fin { digest: good.digest[..8].to_vec(), ..good.clone() },
            Some(Status::ProtocolMismatch),
        ),
        (
            "a digest of 64 bytes",
            0x7571_0006,
            Fin { digest: vec![1; wire::MAX_DIGEST_LEN], ..good.clone() },
            Some(Status::ProtocolMismatch),
        ),
        (
            "a wrong digest",
            0x7571_0007,
            Fin { digest: vec![0; wire::DIGEST_LEN], ..good.clone() },
            Some(Status::ChecksumMismatch),
        ),
    ];
    let mut seen = Vec::new();
    for (case, session, fin, want) in cases {
        let name = format!("fin-{session:x}");
        let (mut s, g) = granted(&topo, 7571, session, &name);
        write_chunks(&mut s, &g, &file, if case == "a FIN after 2 of 4 chunks" { 2 } else { CHUNKS });
        s.send_message(session, &Message::Fin(fin)).unwrap();
        let o = outcome(case, session, s, None);
        assert_eq!(o.ack, want, "{case}");
        seen.push(o);
    }

    let out = send(&topo, 7571, &[src.join("real").to_str().unwrap()]);
    assert!(out.status.success(), "the receiver kept serving: {}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    eprintln!("receiver exit {code}:\n{report}");
    assert_eq!(code, 9, "{report}");
    check_reports(
        &report,
        &seen,
        &[
            ("an honest transfer", "ok"),
            ("a FIN after 2 of 4 chunks", "FIN for 4 chunks / 12388 bytes; 2 of 4 chunks"),
            ("a FIN for 5 chunks", "FIN for 5 chunks"),
            ("a FIN 1 byte short", "FIN for 4 chunks / 12387 bytes"),
            ("a digest of 8 bytes", "has 16 bytes, not 8"),
            ("a digest of 64 bytes", "has 16 bytes, not 64"),
            ("a wrong digest", "checksum mismatch"),
        ],
    );
    assert_eq!(listing(&dst), ["fin-75710001", "real"], "only the honest transfer and the real one are stored");
    assert!(std::fs::read(dst.join("fin-75710001")).unwrap() == file);
    assert!(std::fs::read(dst.join("real")).unwrap() == real);
}

/// WRITEs with the wrong immediate or length, past the end of the file, and outside the grant.
#[test]
fn writes_out_of_place_are_refused() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("hostile-wr-src"), scratch("hostile-wr-dst"));
    let real = random_file(&src.join("real"), 70_000, 13);
    let rx = Receiver::start(&topo, 7572, &["--dir", dst.to_str().unwrap(), "--count", "7", "--timeout", "5"]);
    let file = data();
    let mut seen = Vec::new();

    // Checked by the receiver: ACK ProtocolMismatch.
    let (mut s, g) = granted(&topo, 7572, 0x7572_0001, "wr-1");
    let req = s.write_request(&file[4096..8192], g.addr + 4096, g.rkey, 1);
    s.post(req).unwrap();
    seen.push(outcome("chunk 1 first", 0x7572_0001, s, None));

    let (mut s, g) = granted(&topo, 7572, 0x7572_0002, "wr-2");
    let req = s.write_request(&file[..100], g.addr, g.rkey, 0);
    s.post(req).unwrap();
    seen.push(outcome("chunk 0 of 100 bytes", 0x7572_0002, s, None));

    let (mut s, g) = granted(&topo, 7572, 0x7572_0003, "wr-3");
    write_chunks(&mut s, &g, &file, CHUNKS);
    assert!(s.credited(1), "no credit for the slot of chunk 4");
    let req = s.write_request(&file[..4096], g.addr, g.rkey, CHUNKS as u32);
    s.post(req).unwrap();
    seen.push(outcome("an immediate past the end", 0x7572_0003, s, None));

    // Refused by the device: the receiver sees its connection fail and reports the violation.
    // Where each WRITE goes: (address, rkey) given the grant.
    type Target = fn(&Grant) -> (u64, u32);
    let outside: [(&'static str, Target); 3] = [
        ("a WRITE past the ring", |g| (g.addr + 4 * 4096, g.rkey)),
        ("a WRITE across the ring's end", |g| (g.addr + 3 * 4096 + 100, g.rkey)),
        ("a WRITE with another rkey", |g| (g.addr, g.rkey ^ 0x80)),
    ];
    for (i, (case, at)) in outside.into_iter().enumerate() {
        let session = 0x7572_0004 + i as u64;
        let (mut s, g) = granted(&topo, 7572, session, &format!("wr-{session:x}"));
        let (addr, rkey) = at(&g);
        let req = s.write_request(&file[..4096], addr, rkey, 0);
        let r = s.post(req);
        assert!(r.is_err(), "{case}: the device let it through");
        seen.push(outcome(case, session, s, r.err()));
    }

    let out = send(&topo, 7572, &[src.join("real").to_str().unwrap()]);
    assert!(out.status.success(), "the receiver kept serving: {}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    eprintln!("receiver exit {code}:\n{report}");
    assert_eq!(code, 9, "{report}");
    for s in &seen {
        let want = if s.refused.is_some() { None } else { Some(Status::ProtocolMismatch) };
        assert_eq!(s.ack, want, "{}", s.case);
    }
    check_reports(
        &report,
        &seen,
        &[
            ("chunk 1 first", "WRITE tagged chunk 1, expected chunk 0"),
            ("chunk 0 of 100 bytes", "chunk 0 of 100 bytes, expected 4096"),
            ("an immediate past the end", "a WRITE beyond the file's 4 chunks"),
            ("a WRITE past the ring", "broke the rules"),
            ("a WRITE across the ring's end", "broke the rules"),
            ("a WRITE with another rkey", "broke the rules"),
        ],
    );
    assert_eq!(listing(&dst), ["real"], "nothing of the hostile sessions is left");
    assert!(std::fs::read(dst.join("real")).unwrap() == real);
}

/// A WRITE after the FIN, and a WRITE or a second FIN racing it (one doorbell). Whether the
/// commit was asked for before the late message arrived decides between `Ok` and a refusal, so
/// each runs a few times; either way the verdict is the disk's: `Ok` with the file identical, or
/// a failure and nothing stored. The racing WRITE puts other bytes into the last chunk's slot:
/// if they land before that chunk is copied out, the digest must catch them.
#[test]
fn writes_after_and_racing_the_fin_never_leave_a_wrong_file() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("hostile-race-src"), scratch("hostile-race-dst"));
    let real = random_file(&src.join("real"), 70_000, 14);
    let rounds = 3u64;
    let rx = Receiver::start(
        &topo,
        7573,
        &["--dir", dst.to_str().unwrap(), "--count", &(3 * rounds + 1).to_string(), "--timeout", "5"],
    );
    let file = data();
    let fin = encoded(0, &Message::Fin(fin_of(&file)));
    let garbage = vec![0xee; 100];
    let last_slot = |g: &Grant| g.addr + ((CHUNKS - 1) % u64::from(g.slot_count)) * u64::from(g.slot_size);
    let mut seen = Vec::new();
    for round in 0..rounds {
        for (k, case) in
            ["a WRITE after the FIN", "a WRITE racing the FIN", "a second FIN racing the FIN"].into_iter().enumerate()
        {
            let session = 0x7573_0000 + round * 16 + k as u64;
            let (mut s, g) = granted(&topo, 7573, session, &format!("race-{session:x}"));
            write_chunks(&mut s, &g, &file, CHUNKS);
            let mut fin = fin.clone();
            fin[12..20].copy_from_slice(&session.to_be_bytes());
            let fin_req = s.send_request(&fin);
            let results = match k {
                0 => {
                    s.post(fin_req).unwrap();
                    let w = s.write_request(&garbage, last_slot(&g), g.rkey, CHUNKS as u32);
                    vec![s.post(w)]
                }
                1 => {
                    let w = s.write_request(&garbage, last_slot(&g), g.rkey, CHUNKS as u32);
                    s.post_all(vec![fin_req, w])
                }
                _ => {
                    let again = s.send_request(&fin);
                    s.post_all(vec![fin_req, again])
                }
            };
            // The receiver may already have left (it ACKed and the sender's late request found
            // the connection closing): the outcome is what counts.
            let refused = results.into_iter().find_map(Result::err);
            seen.push(outcome(case, session, s, refused));
        }
    }

    let out = send(&topo, 7573, &[src.join("real").to_str().unwrap()]);
    assert!(out.status.success(), "the receiver kept serving: {}", text(&out.stderr));
    let (code, report) = rx.finish(Duration::from_secs(30));
    eprintln!("receiver exit {code}:\n{report}");
    let mut stored = vec!["real".to_owned()];
    for s in &seen {
        let name = format!("race-{:x}", s.session);
        match s.ack {
            Some(Status::Ok) => {
                assert!(std::fs::read(dst.join(&name)).unwrap() == file, "{}: ACK Ok for other bytes", s.case);
                stored.push(name);
            }
            Some(Status::ProtocolMismatch | Status::ChecksumMismatch) => {}
            other => panic!("{} (session {:x}): {other:?}", s.case, s.session),
        }
    }
    stored.sort();
    assert_eq!(listing(&dst), stored, "only the sessions ACKed Ok are stored");
    assert_eq!(code, if stored.len() == seen.len() + 1 { 0 } else { 9 }, "{report}");
    assert!(std::fs::read(dst.join("real")).unwrap() == real);
    let tally = |st: Status| seen.iter().filter(|s| s.ack == Some(st)).count();
    eprintln!(
        "racing outcomes: {} ok, {} protocol mismatch, {} checksum mismatch",
        tally(Status::Ok),
        tally(Status::ProtocolMismatch),
        tally(Status::ChecksumMismatch)
    );
}

/// A sender that takes its verdict's SEND never (it posts no receive for it: an RNR NAK, which
/// the receiver retries without end) and disconnects once the file is stored: the session ends
/// at its disconnect, not at the teardown's bound. Its verdict is committed, so nothing it sent
/// must still arrive once the peer has left; an ACK lost on the wire, or never sent by a peer
/// that flushed its QP as it read the verdict, is the same case.
#[test]
fn a_sender_that_leaves_without_taking_its_verdict_frees_the_session_at_once() {
    let topo = testkit::require_topology!();
    let dst = scratch("hs-verdict-dst");
    // --timeout 10: the teardown's bound is its 5 s then, which this session must not wait.
    let rx = Receiver::start(&topo, 7574, &["--dir", dst.to_str().unwrap(), "--count", "1", "--timeout", "10"]);
    let mut s = RawSender::connect_with_receives(&topo, 7574, 1);
    let hello = Hello { name: "empty".into(), ..raw_hello(0) };
    s.send_message(0x7574_0001, &Message::Hello(hello)).unwrap();
    // The GRANT takes the one receive, and it is not posted again.
    let Message::Grant(_) = s.hold() else { panic!("no GRANT") };
    let digest = xxhash_rust::xxh3::xxh3_128(&[]).to_be_bytes().to_vec();
    s.send_message(0x7574_0001, &Message::Fin(Fin { chunks: 0, size: 0, digest })).unwrap();
    let t = std::time::Instant::now();
    while !dst.join("empty").exists() {
        assert!(t.elapsed() < Duration::from_secs(10), "the empty file was not stored");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The verdict is posted after the commit: let it meet the missing receive.
    std::thread::sleep(Duration::from_millis(100));
    let left = std::time::Instant::now();
    drop(s);
    let (code, report) = rx.finish(Duration::from_secs(30));
    let took = left.elapsed();
    eprintln!("the receiver exited {code} {took:?} after the sender left: {report}");
    assert_eq!(code, 0, "the session stored its file: {report}");
    assert_eq!(listing(&dst), ["empty"]);
    assert!(took < Duration::from_secs(2), "the session waited {took:?} for a verdict's ACK from a peer that left");
}
