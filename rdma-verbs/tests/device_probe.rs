//! Device test of `SendQueue::probe`: a WRITE lost on the wire is sent again once a probe
//! follows it, where the QP's own ACK timeout (set to its longest) would not fire within the
//! test. The loss is made by netem on the client's interface dropping every packet while the
//! WRITE goes out (the harness runs the tests as root in the VM).

mod common;

use std::process::Command;
use std::time::Duration;

use common::*;
use rdma_verbs::*;

/// netem on `dev` while it lives: `tc qdisc replace dev DEV root netem ARGS...`, removed on drop.
struct Netem(String);

impl Netem {
    fn new(dev: &str, args: &[&str]) -> Netem {
        let out = Command::new("tc").args(["qdisc", "replace", "dev", dev, "root", "netem"]).args(args).output();
        let out = out.unwrap_or_else(|e| panic!("running tc: {e}"));
        assert!(out.status.success(), "tc on {dev}: {}", String::from_utf8_lossy(&out.stderr));
        Netem(dev.to_owned())
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        let _ = Command::new("tc").args(["qdisc", "del", "dev", &self.0, "root"]).output();
    }
}

/// The network interface that holds `addr` (`ip -o -4 addr show to ADDR`).
fn interface_of(addr: std::net::Ipv4Addr) -> String {
    let out = Command::new("ip").args(["-o", "-4", "addr", "show", "to", &addr.to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let name = text.split_whitespace().nth(1).unwrap_or_else(|| panic!("no interface holds {addr}: {text:?}"));
    name.trim_end_matches(':').to_owned()
}

/// The probe recovers what the timer would: with a local ACK timeout of 2^31 x 4.096 us (2.4
/// hours), a WRITE whose packets the wire dropped stays unacknowledged (no completion in 2 s),
/// and a probe posted after it, once the wire carries packets again, is answered with a
/// sequence NAK: the QP sends the WRITE again, both complete, and the bytes landed.
#[test]
fn a_write_lost_on_the_wire_is_sent_again_after_a_probe_not_after_the_ack_timeout() {
    let topo = testkit::require_topology!();
    let ctx_a = Context::open(&topo.client.device).unwrap();
    let ctx_b = Context::open(&topo.server.device).unwrap();
    let (pd_a, pd_b) = (ctx_a.alloc_pd().unwrap(), ctx_b.alloc_pd().unwrap());
    let (cq_a, cq_b) = (ctx_a.create_cq(64, None).unwrap(), ctx_b.create_cq(64, None).unwrap());
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let attr = |cq| QpCreateAttr::new(cq, cq).caps(caps(16, 16));
    let qp_a = pd_a.create_qp::<Rc>(attr(&cq_a)).unwrap().init(InitAttr::new(topo.port).access(access)).unwrap();
    let qp_b = pd_b.create_qp::<Rc>(attr(&cq_b)).unwrap().init(InitAttr::new(topo.port).access(access)).unwrap();
    let (ep_a, ep_b) = (qp_a.endpoint(topo.gid_index, 100).unwrap(), qp_b.endpoint(topo.gid_index, 200).unwrap());
    let tune = |rtr, rts: RtsAttr| (rtr, rts.timeout(31).retry_cnt(7));
    let qp_a = qp_a.handshake_with(ep_b, topo.gid_index, 100, tune).unwrap();
    let _qp_b = qp_b.handshake_with(ep_a, topo.gid_index, 200, tune).unwrap();
    let target = pd_b.alloc_mr(4096, access).unwrap();
    let pool = SlotPool::new(&pd_a, 4096, 1, AccessFlags::LOCAL_WRITE).unwrap();
    let mut sq = SendQueue::new(&qp_a, T).unwrap();

    let mut slot = pool.try_take().unwrap();
    slot.as_mut_slice().unwrap().fill(0x5a);
    {
        let _drop_all = Netem::new(&interface_of(topo.client.addr), &["loss", "100%"]);
        sq.post(SlotRequest::write(slot, 4096, target.remote()).with_wr_id(1)).unwrap();
        std::thread::sleep(Duration::from_millis(300));
    }
    match sq.wait(Duration::from_secs(2), |c| panic!("completed though its packets were dropped: {:?}", c.ok())) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("the lost WRITE: {other:?}"),
    }
    assert!(read(&target, 0, 4096).iter().all(|&b| b == 0), "nothing landed while the wire dropped it");

    assert!(sq.probe(2).unwrap(), "no probe was in flight");
    let mut done = Vec::new();
    while done.len() < 2 {
        sq.wait(Duration::from_secs(10), |c| {
            c.ok().unwrap();
            done.push(c.wr_id);
        })
        .expect("the WRITE and the probe complete after the probe");
    }
    assert_eq!(done, [1, 2]);
    assert!(read(&target, 0, 4096).iter().all(|&b| b == 0x5a), "the WRITE sent again landed");
}
