//! Device tests: many connections, sequential and concurrent, leave no file descriptor and no
//! verbs or CM resource behind (as `/proc/self/fd` and `rdma resource show` count them).

mod common;

use std::time::Instant;

use common::*;
use rdma_cm::*;

const SEQUENTIAL: u64 = 100;
const CONCURRENT: u64 = 8;

/// What must come back to where it was: open fds, and every resource count of both devices.
#[derive(Debug, PartialEq)]
struct Snapshot {
    fds: usize,
    server: Vec<(String, u64)>,
    client: Vec<(String, u64)>,
}

fn snapshot(topo: &testkit::Topology) -> Snapshot {
    Snapshot {
        fds: testkit::open_fds(),
        server: testkit::resource_counts(&topo.server.device),
        client: testkit::resource_counts(&topo.client.device),
    }
}

/// `n` connections one after the other, each with a ping and a client-side disconnect.
fn sequential(topo: &testkit::Topology, n: u64) {
    let listener = Listener::bind(server_any_port(topo), 16).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..n {
                let req = listener.recv_request(T).unwrap();
                accept(req, b"", |conn, pd| {
                    assert_eq!(ping_server(&conn, pd), i);
                    conn.peer_disconnect().wait(T).unwrap_or_else(|e| panic!("cycle {i}: {e}"));
                });
            }
        });
        for i in 0..n {
            client(topo, dst, b"", |conn, pd| {
                let conn = conn.unwrap_or_else(|e| panic!("cycle {i}: {e}"));
                ping_client(&conn, pd, i);
                conn.disconnect().wait(T).unwrap_or_else(|e| panic!("cycle {i}: {e}"));
            });
        }
    });
}

#[test]
fn sequential_and_concurrent_connections_leave_nothing_behind() {
    let topo = testkit::require_topology!();
    // librdmacm opens one verbs context per device the first time the process uses it and keeps
    // it until exit (seen: `ctx` +1 per device, 2 fds each). That is a fixed cost, not a leak:
    // measure from after a first connection.
    let cold = snapshot(&topo);
    sequential(&topo, 1);
    let before = snapshot(&topo);
    eprintln!("librdmacm's per-process cache: {} fds; {:?} -> {:?}", before.fds - cold.fds, cold.server, before.server);

    let start = Instant::now();
    sequential(&topo, SEQUENTIAL);
    let sequential = start.elapsed();
    assert_eq!(snapshot(&topo), before, "after {SEQUENTIAL} sequential connections");

    let start = Instant::now();
    {
        let listener = Listener::bind(server_any_port(&topo), 16).unwrap();
        let dst = listener.local_addr();
        let listener = &listener;
        std::thread::scope(|s| {
            // The server hands each request to a thread of its own; the clients all connect at
            // once and each sends its own number.
            s.spawn(move || {
                std::thread::scope(|inner| {
                    for _ in 0..CONCURRENT {
                        let req = listener.recv_request(T).unwrap();
                        inner.spawn(move || {
                            accept(req, b"", |conn, pd| {
                                let n = ping_server(&conn, pd);
                                assert!((1000..1000 + CONCURRENT).contains(&n));
                                conn.peer_disconnect().wait(T).unwrap();
                            })
                        });
                    }
                });
            });
            for i in 0..CONCURRENT {
                let topo = &topo;
                s.spawn(move || {
                    client(topo, dst, b"", |conn, pd| {
                        let conn = conn.unwrap_or_else(|e| panic!("client {i}: {e}"));
                        ping_client(&conn, pd, 1000 + i);
                        conn.disconnect().wait(T).unwrap();
                    })
                });
            }
        });
    }
    let concurrent = start.elapsed();
    assert_eq!(snapshot(&topo), before, "after {CONCURRENT} concurrent connections");
    eprintln!(
        "{SEQUENTIAL} sequential connect/ping/disconnect cycles: {sequential:?} ({:?} each); \
         {CONCURRENT} concurrent clients: {concurrent:?}",
        sequential / SEQUENTIAL as u32
    );
}
