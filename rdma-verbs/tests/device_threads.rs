//! Device test: resources a thread can own. A server runs one thread per connection; each
//! thread owns its QP, queue, ring and pool (`'static`, through shared parents) in one struct.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

const CLIENTS: u64 = 8;
const REQUESTS: u64 = 300;

fn caps() -> QpCaps {
    QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 64 }
}

/// Everything one connection needs, owned: no borrow, no `Box::leak`.
struct Connection {
    ring: RecvRing<'static>,
    sends: SendQueue<'static, Rc>,
    _qp: QueuePair<'static, Rc, ReadyToSend>,
}

impl Connection {
    fn new(pd: &Arc<ProtectionDomain<'static>>, qp: QueuePair<'static, Rc, ReadyToSend>) -> Self {
        let pool = SlotPool::new(pd.clone(), 64, 16, AccessFlags::LOCAL_WRITE).unwrap();
        Connection { ring: RecvRing::new(&qp, pool, 16, T).unwrap(), sends: SendQueue::new(&qp, T).unwrap(), _qp: qp }
    }

    fn send(&mut self, value: u64) {
        while self.sends.room() == 0 {
            self.sends.wait(T, |c| c.ok().unwrap()).unwrap();
        }
        self.sends.send_inline(&value.to_le_bytes(), None, value).unwrap();
        self.sends.poll(|c| c.ok().unwrap()).unwrap();
    }

    fn receive(&mut self) -> u64 {
        let msg = self.ring.recv(Duration::from_secs(30)).unwrap();
        msg.ok().unwrap();
        let value = u64::from_le_bytes(msg.bytes().try_into().unwrap());
        self.ring.release(msg).unwrap();
        value
    }
}

#[test]
fn a_thread_per_connection_server_serves_8_clients_at_once() {
    let topo = testkit::require_topology!();
    let (server_ctx, server_pd) = open_shared(&topo.server.device);
    let (client_ctx, client_pd) = open_shared(&topo.client.device);
    let start = Instant::now();
    let mut threads = Vec::new();
    for id in 0..CLIENTS {
        // The "accept": both QPs made and connected here, then each moved into its own thread.
        let server_qp = owned_qp(&topo, &server_ctx, &server_pd, caps(), 64, AccessFlags::LOCAL_WRITE);
        let client_qp = owned_qp(&topo, &client_ctx, &client_pd, caps(), 64, AccessFlags::LOCAL_WRITE);
        let (client_qp, server_qp) = connect_pair(&topo, client_qp, server_qp);
        let pd = server_pd.clone();
        threads.push(std::thread::spawn(move || {
            // The server's connection thread: doubles what it is sent, plus its client's id.
            let mut conn = Connection::new(&pd, server_qp);
            for _ in 0..REQUESTS {
                let v = conn.receive();
                conn.send(v * 2 + (v >> 32));
            }
            conn.sends.drain(T, |c| c.ok().unwrap()).unwrap();
            0
        }));
        let pd = client_pd.clone();
        threads.push(std::thread::spawn(move || {
            let mut conn = Connection::new(&pd, client_qp);
            for n in 0..REQUESTS {
                let v = id << 32 | n;
                conn.send(v);
                assert_eq!(conn.receive(), v * 2 + id, "client {id}, request {n}");
            }
            conn.sends.drain(T, |c| c.ok().unwrap()).unwrap();
            REQUESTS
        }));
    }
    // The parents' handles can go: the threads' resources keep them alive.
    drop((server_ctx, server_pd, client_ctx, client_pd));
    let answered: u64 = threads.into_iter().map(|t| t.join().expect("a connection thread failed")).sum();
    assert_eq!(answered, CLIENTS * REQUESTS);
    println!("{CLIENTS} clients x {REQUESTS} round trips in {:.1} s", start.elapsed().as_secs_f64());
}
