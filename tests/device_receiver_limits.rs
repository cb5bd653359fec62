//! Device tests: a few unauthenticated peers cannot exhaust a receiver or lock others out
//! (`docs/protocol.md`, "Threat model"): each limit against the peers it stops.

mod cli;

use std::time::{Duration, Instant};

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
    let out = cli::rdma_copy()
        .args(["send", "--quiet", "--to", &to, "--from", &from, "--timeout", "20"])
        .arg(src.join("f"))
        .output()
        .unwrap();
    assert!(out.status.success(), "another address was locked out: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    drop(idle);
    let _ = rx.stop(Duration::from_secs(30));
}

/// Connections that prove nothing (no HELLO; or a HELLO and no proof of the secret) must not
/// hold every place, `max_per_address` each from a few addresses, while a sender with the
/// secret hears Busy: a connection that proved nothing for `--preempt-after` (1 s) gives its
/// place to the next request. Here one address holds all 2 + 4 places (its own limit lifted: the
/// place pool is what is tested), then a sender with the secret connects, and is served.
#[test]
fn connections_that_prove_nothing_give_their_places_to_a_sender_with_the_secret() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("preempt-src"), scratch("preempt-dst"), scratch("preempt-key"));
    let data = random_file(&src.join("f"), 1 << 20, 55);
    let key = secret_file(&keys);
    let args = ["--dir", dst.to_str().unwrap(), "--secret-file", key.to_str().unwrap()];
    let rx = Receiver::start(&topo, 7655, &[&args[..], &["--max-sessions", "2", "--max-per-address", "16"]].concat());
    let mut idle = Vec::new();
    for i in 0..6 {
        idle.push(connect_with(&topo, 7655, &[]).unwrap_or_else(|e| panic!("place {i} of 6: {e:?}")));
    }
    match connect_with(&topo, 7655, &[]) {
        Err(rdma_cm::Error::Rejected { .. }) => {}
        // Connecting took over a second in the VM: the first one gave way already.
        Ok(c) => idle.push(c),
        Err(e) => panic!("{e:?}"),
    }
    std::thread::sleep(Duration::from_millis(1100));
    let t = Instant::now();
    let out = keyed_sender(&topo, 7655, &src.join("f"), &["--quiet", "--timeout", "20"]).wait_with_output().unwrap();
    assert!(out.status.success(), "a sender with the secret was locked out: {}", text(&out.stderr));
    eprintln!("served in {:?}, with every place held by a connection that proved nothing", t.elapsed());
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    drop(idle);
    let (_, report) = rx.stop(Duration::from_secs(30));
    assert!(report.contains("a newer one took its place"), "no connection gave its place: {report}");
}

/// A peer that keeps opening connections, each proving nothing, keeps every place younger than
/// `--preempt-after`, so none can be given to a newcomer by age; the sender's connect request
/// therefore proves the secret (KNOCK) and takes the place of an unproven connection at any
/// age, instead of hearing Busy. The churn here comes from
/// the sender's own address (the VM has one client address), so that only the knock can tell
/// them apart; `--preempt-after 5` lets a churn of a connection a second keep up.
#[test]
fn a_peer_that_keeps_opening_connections_cannot_keep_a_sender_with_the_secret_out() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("churn-src"), scratch("churn-dst"), scratch("churn-key"));
    let data = random_file(&src.join("f"), 1 << 20, 56);
    let key = secret_file(&keys);
    let args = ["--dir", dst.to_str().unwrap(), "--secret-file", key.to_str().unwrap()];
    let limits = ["--max-sessions", "2", "--max-per-address", "64", "--preempt-after", "5"];
    let rx = Receiver::start(&topo, 7656, &[&args[..], &limits].concat());
    let (stop, made, refused) = (AtomicBool::new(false), AtomicUsize::new(0), AtomicUsize::new(0));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let mut held = std::collections::VecDeque::new();
                while !stop.load(Ordering::Acquire) {
                    match connect_with(&topo, 7656, &[]) {
                        Ok(c) => {
                            made.fetch_add(1, Ordering::AcqRel);
                            held.push_back(c);
                            if held.len() > 6 {
                                held.pop_front();
                            }
                        }
                        Err(_) => {
                            refused.fetch_add(1, Ordering::AcqRel);
                        }
                    }
                }
            });
        }
        // The churn fills every place (a connection of it is refused), then keeps them young:
        // the sender starts once they are full, every place younger than `--preempt-after`.
        let t = Instant::now();
        while refused.load(Ordering::Acquire) == 0 && t.elapsed() < Duration::from_secs(30) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let before = refused.load(Ordering::Acquire);
        let t = Instant::now();
        let out = keyed_sender(&topo, 7656, &src.join("f"), &["--quiet", "--timeout", "20"]).wait_with_output();
        stop.store(true, Ordering::Release);
        let out = out.unwrap();
        eprintln!(
            "served in {:?}; the churn made {} connections, {} refused ({} while the sender ran)",
            t.elapsed(),
            made.load(Ordering::Acquire),
            refused.load(Ordering::Acquire),
            refused.load(Ordering::Acquire) - before,
        );
        assert!(refused.load(Ordering::Acquire) > 0, "the churn never filled the places: the test proves nothing");
        assert!(out.status.success(), "a sender with the secret was locked out: {}", text(&out.stderr));
    });
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    let (_, report) = rx.stop(Duration::from_secs(30));
    assert!(report.contains("a newer one took its place"), "no connection gave its place: {report}");
}

/// A knocked request is counted by `--max-per-address` but not held back by it: four
/// connections that prove nothing, from the address a secret holder sends from (a co-tenant of
/// its host), must not keep it out with "4 connections from this address already".
#[test]
fn connections_that_prove_nothing_from_the_sender_s_address_do_not_use_up_its_limit() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("cap-src"), scratch("cap-dst"), scratch("cap-key"));
    let data = random_file(&src.join("f"), 1 << 20, 57);
    let key = secret_file(&keys);
    let args = ["--dir", dst.to_str().unwrap(), "--secret-file", key.to_str().unwrap(), "--max-per-address", "4"];
    let rx = Receiver::start(&topo, 7657, &args);
    let idle: Vec<_> =
        (0..4).map(|i| connect_with(&topo, 7657, &[]).unwrap_or_else(|e| panic!("place {i} of 4: {e:?}"))).collect();
    let out = keyed_sender(&topo, 7657, &src.join("f"), &["--quiet", "--timeout", "20"]).wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "a sender with the secret was kept out by its address's limit: {}",
        text(&out.stderr)
    );
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    drop(idle);
    let _ = rx.stop(Duration::from_secs(30));
}

/// A connection request that is answered but never completed: `rdma_connect()`, and then no
/// event read, so the receiver's accept never sees its connection established. Held open (the
/// identifier alive) until dropped. `qp_num` is the number the request claims for its QP (there
/// is none): the receiver's CM refuses a second request naming the same one as stale.
fn never_completed_request(topo: &testkit::Topology, port: u16, qp_num: u32) -> rdma_cm::CmId<rdma_cm::RouteResolved> {
    use std::net::SocketAddr;
    let to = SocketAddr::new(topo.server.addr.into(), port);
    let from = SocketAddr::new(topo.client.addr.into(), 0);
    let id = rdma_cm::CmId::new().unwrap().resolve(Some(from), to).wait(Duration::from_secs(5)).unwrap();
    // SAFETY: an all-zero `rdma_conn_param` is a valid one (no private data: a null pointer
    // with length 0).
    let mut param: rdma_cm::verbs::ffi::rdma_conn_param = unsafe { std::mem::zeroed() };
    (param.responder_resources, param.initiator_depth, param.retry_count, param.rnr_retry_count) = (1, 1, 7, 7);
    param.qp_num = qp_num;
    // SAFETY: a live identifier with a resolved route, and a parameter block that lives across
    // the call, which copies it. The identifier is then only destroyed, by its `Drop`.
    let rc = unsafe { rdma_cm::verbs::ffi::rdma_connect(id.as_raw(), &mut param) };
    assert_eq!(rc, 0, "rdma_connect: {}", std::io::Error::last_os_error());
    id
}

/// The CM events queued on `id`'s own (non-blocking) channel, read and acknowledged.
fn events_of(id: &rdma_cm::CmId<rdma_cm::RouteResolved>) -> Vec<u32> {
    use rdma_cm::verbs::ffi;
    let mut kinds = Vec::new();
    // SAFETY: a live identifier; librdmacm set its channel, which lives as long as it does.
    let channel = unsafe { (*id.as_raw()).channel };
    loop {
        let mut event: *mut ffi::rdma_cm_event = std::ptr::null_mut();
        // SAFETY: the identifier's channel, and an out pointer; fails with EAGAIN when empty.
        if unsafe { ffi::rdma_get_cm_event(channel, &mut event) } != 0 {
            return kinds;
        }
        // SAFETY: an event librdmacm handed us, read once and then acknowledged once.
        unsafe {
            kinds.push((*event).event);
            ffi::rdma_ack_cm_event(event);
        }
    }
}

/// Requests never completed: a displaced connection still being accepted ends within 20 ms. At
/// most four times the places may be leaving (twice for requests without a knock), so were it
/// to linger in its accept up to `hello_timeout` (10 s), a peer keeping the places filled with
/// such requests would hold knocked requests to about `2 × places / hello_timeout` a second: here five
/// requests never completed hold every place (`--max-sessions 1` and four more), a sender with
/// the secret takes one of them, and the peer of the one it took hears the receiver give it up
/// within seconds, not at the end of the 10 s.
#[test]
fn a_displaced_request_never_completed_is_given_up_at_once() {
    let topo = testkit::require_topology!();
    let (src, dst, keys) = (scratch("linger-src"), scratch("linger-dst"), scratch("linger-key"));
    let data = random_file(&src.join("f"), 64 << 10, 58);
    let key = secret_file(&keys);
    let args = ["--dir", dst.to_str().unwrap(), "--secret-file", key.to_str().unwrap()];
    let rx = Receiver::start(&topo, 7658, &[&args[..], &["--max-sessions", "1", "--max-per-address", "16"]].concat());
    let t = Instant::now();
    let held: Vec<_> = (0..5).map(|i| never_completed_request(&topo, 7658, 0x1000 + i)).collect();
    // How many of them the receiver gave up since: any event but the connect response (its
    // REP, which a request never completed leaves unanswered) on its identifier.
    let given_up = std::cell::Cell::new(0);
    let look = || {
        for id in &held {
            if events_of(id)
                .iter()
                .any(|&e| e != rdma_cm::verbs::ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_RESPONSE)
            {
                given_up.set(given_up.get() + 1);
            }
        }
        given_up.get()
    };
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(look(), 0, "a request was given up before any was displaced: it proves nothing");
    let sender = keyed_sender(&topo, 7658, &src.join("f"), &["--quiet", "--timeout", "20"]);
    // Looked for while the sender runs (its request displaces one at its start), and before
    // the accepts' own 10 s could run out.
    while look() == 0 && t.elapsed() < Duration::from_secs(8) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let at = t.elapsed();
    let out = sender.wait_with_output().unwrap();
    assert!(out.status.success(), "a sender with the secret: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    eprintln!("{} of 5 requests never completed given up {at:?} after they were made", given_up.get());
    assert!(given_up.get() >= 1, "the displaced request lingered in its accept: none given up in {at:?}");
    drop(held);
    let (_, report) = rx.stop(Duration::from_secs(30));
    assert!(report.contains("a newer one took its place"), "no connection gave its place: {report}");
}

/// A connection request the receiver cannot take (no file descriptor left for its event
/// channel) is rejected and the receiver serves on, so that peers holding connections until the
/// receiver runs out of descriptors cannot stop it for everyone. Its descriptor limit is lowered to the lowest free
/// number (none free), then raised again.
#[test]
fn a_request_the_receiver_has_no_descriptor_for_is_rejected_and_it_serves_on() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("emfile-src"), scratch("emfile-dst"));
    let data = random_file(&src.join("f"), 1 << 20, 59);
    let mut rx = Receiver::start(&topo, 7659, &["--dir", dst.to_str().unwrap()]);
    let pid = rx.child.id() as libc::pid_t;
    let open: std::collections::BTreeSet<u64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    let lowest_free = (0..).find(|n| !open.contains(n)).unwrap();
    let mut was = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: prlimit(2) on our own child, which exists until we reap it; the struct lives
    // across the call.
    let got = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, std::ptr::null(), &mut was) };
    assert_eq!(got, 0, "prlimit: {}", std::io::Error::last_os_error());
    let none_free = libc::rlimit { rlim_cur: lowest_free, rlim_max: was.rlim_max };
    // SAFETY: as above.
    let set = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &none_free, std::ptr::null_mut()) };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let refused = connect_with(&topo, 7659, &[]);
    assert!(refused.is_err(), "a request was taken with no descriptor free: the test proves nothing");
    std::thread::sleep(Duration::from_millis(500));
    let exited = rx.child.try_wait().unwrap();
    // SAFETY: as above, the limit it had back.
    let restored = unsafe { libc::prlimit(pid, libc::RLIMIT_NOFILE, &was, std::ptr::null_mut()) };
    assert!(exited.is_none(), "one request it had no descriptor for ended the receiver: {exited:?}");
    assert_eq!(restored, 0);
    let out = send(&topo, 7659, &["--timeout", "20", src.join("f").to_str().unwrap()]);
    assert!(out.status.success(), "after a request it could not take: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    let (_, report) = rx.stop(Duration::from_secs(30));
    eprintln!("{report}");
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

/// A session that fails after its GRANT keeps its place among `--max-sessions` until its
/// teardown freed the ring. The teardown waits up to 5 s per lane for a peer that never
/// disconnects: were the place given back before, a new session could be granted a share while
/// the old ring was still registered,
/// so one address could hold 2.5 times `--memory`. The place, and with it the share, is
/// therefore given back only after the ring is freed.
#[test]
fn a_session_in_teardown_holds_its_memory_share_until_its_ring_is_freed() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("teardown-src"), scratch("teardown-dst"));
    let data = random_file(&src.join("f"), 1 << 20, 53);
    let dir = dst.to_str().unwrap();
    let args = ["--dir", dir, "--max-sessions", "1", "--max-per-address", "4", "--memory", "8M", "--timeout", "20"];
    let rx = Receiver::start(&topo, 7653, &args);
    let mut first = RawSender::connect(&topo, 7653);
    let ring = greedy_hello(&mut first, 0x7653_0001);
    // Out of place after the GRANT: the session fails with an ACK, then waits for this peer to
    // disconnect, which it does not do.
    first.send_message(0x7653_0001, &Message::Hello(raw_hello(1))).unwrap();
    match first.recv() {
        Message::Ack(a) => assert_ne!(a.status, rdma_proto::Status::Ok, "a second HELLO was accepted"),
        other => panic!("{other:?} instead of an ACK"),
    }
    let mut second = RawSender::connect(&topo, 7653);
    let hello = Hello { chunk: u32::MAX, depth: u32::MAX, name: "greedy-second".into(), ..raw_hello(1 << 40) };
    second.send_message(0x7653_0002, &Message::Hello(hello)).unwrap();
    match second.recv() {
        Message::Ack(a) => assert_eq!(a.status, rdma_proto::Status::Busy, "{a:?}"),
        Message::Grant(g) => panic!(
            "a ring of {} MiB granted while the failed session's ring of {} MiB was still registered (--memory 8M)",
            (u64::from(g.slot_size) * u64::from(g.slot_count)) >> 20,
            ring >> 20
        ),
        other => panic!("{other:?} instead of an ACK"),
    }
    drop(second);
    drop(first);
    // With the failed peer gone, its place comes back: an honest send is served.
    let mut out = send(&topo, 7653, &[src.join("f").to_str().unwrap()]);
    for _ in 0..10 {
        if out.status.code() != Some(18) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        out = send(&topo, 7653, &[src.join("f").to_str().unwrap()]);
    }
    assert!(out.status.success(), "the honest send after: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data);
    let _ = rx.stop(Duration::from_secs(30));
}

/// A sender that trickles (one 16 KiB chunk every 2.5 s, 6.4 KiB/s) makes progress within
/// every `--timeout`, so the timeout alone would let it hold its place for as long as it liked
/// (on a receiver with one place, nobody else served meanwhile). A window of `--timeout` of its
/// time that brings less than `--min-rate` (16 KiB/s by default) ends it: it is told `busy`
/// and why, its place serves the next sender, and its partial is kept, so that the same file
/// sent at a normal pace resumes and arrives whole.
#[test]
fn a_trickling_sender_is_ended_by_the_pace_floor_and_its_place_serves_the_next() {
    let topo = testkit::require_topology!();
    let (src, dst) = (scratch("trickle-src"), scratch("trickle-dst"));
    let f = src.join("f");
    let data = random_file(&f, 256 << 10, 54);
    let dir = dst.to_str().unwrap();
    let rx = Receiver::start(&topo, 7654, &["--dir", dir, "--max-sessions", "1", "--timeout", "5"]);
    // One slot: each chunk is written as soon as it is read, 2.5 s after the one before.
    let trickle =
        ["--chunk", "16K", "--depth", "1", "--retries", "0", "--busy-wait", "0", "--test-chunk-delay-ms", "2500"]
            .map(std::ffi::OsStr::new);
    let trickler = spawn_send(&topo, 7654, &[&trickle[..], &[f.as_os_str()]].concat());
    let (code, err, took) = wait_within(trickler, Duration::from_secs(60), "the trickling sender");
    eprintln!("the trickler: exit {code:?} after {took:?}: {}", err.trim());
    assert_eq!(code, Some(18), "the trickler was not refused: {err}");
    assert!(err.contains("below this receiver's floor of 16384 bytes/s"), "{err}");
    // One window of 5 s (a few seconds of setup on top), not the 40 s the file takes at its pace.
    assert!(took < Duration::from_secs(25), "the trickler held its place for {took:?}");
    wait_for_session_end(&dst, "f");
    assert!(partial_len(&dst).is_some_and(|n| n > 0), "no partial kept: {:?}", listing(&dst));

    let t = Instant::now();
    let mut out = send(&topo, 7654, &[f.to_str().unwrap()]);
    while out.status.code() == Some(18) && t.elapsed() < Duration::from_secs(10) {
        // The trickler's teardown may still hold the one place for a moment.
        std::thread::sleep(Duration::from_millis(500));
        out = send(&topo, 7654, &[f.to_str().unwrap()]);
    }
    assert!(out.status.success(), "the honest send after the trickler: {}", text(&out.stderr));
    assert!(std::fs::read(dst.join("f")).unwrap() == data, "the file differs");
    let (_, report) = rx.stop(Duration::from_secs(30));
    eprintln!("{report}");
    assert!(report.contains("floor"), "the receiver's report does not say why: {report}");
    assert_eq!(listing(&dst), ["f"], "nothing but the file is left");
}
