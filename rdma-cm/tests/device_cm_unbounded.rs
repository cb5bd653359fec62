//! Device test: every rdma-cm wait takes `Duration::MAX` ("no deadline") without panicking
//! (a deadline of `now + Duration::MAX` would overflow `Instant`).

mod common;

use std::time::Duration;

use common::*;
use rdma_cm::*;
use rdma_verbs::*;

const NO_DEADLINE: Duration = Duration::MAX;

#[test]
fn connect_accept_and_disconnect_with_no_deadline() {
    let topo = testkit::require_topology!();
    let listener = Listener::bind(server_any_port(&topo), 8).unwrap();
    let dst = listener.local_addr();
    std::thread::scope(|s| {
        s.spawn(|| {
            let req = listener.recv_request(NO_DEADLINE).unwrap();
            let ctx = req.open_context().unwrap();
            let pd = ctx.alloc_pd().unwrap();
            let cq = ctx.create_cq(256, None).unwrap();
            let qp =
                req.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty()).unwrap();
            let conn = req.accept(qp, &ConnParams::new()).wait(NO_DEADLINE).unwrap();
            // The connection's event wait, then the disconnect it saw.
            assert_eq!(conn.recv_event(NO_DEADLINE).unwrap(), Event::Disconnected);
            assert!(conn.peer_disconnected());
            conn.peer_disconnect().wait(NO_DEADLINE).unwrap();
        });
        let id = CmId::new().unwrap().resolve(Some(client_src(&topo)), dst).wait(NO_DEADLINE).unwrap();
        let ctx = id.open_context().unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(256, None).unwrap();
        let qp = id.init_qp(pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap(), AccessFlags::empty()).unwrap();
        let conn = id.connect(qp, &ConnParams::new()).wait(NO_DEADLINE).unwrap();
        conn.disconnect().wait(NO_DEADLINE).unwrap();
    });
}
