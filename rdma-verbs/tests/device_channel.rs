//! Device tests: event-driven completion waiting through a completion channel.

mod common;

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::T;
use rdma_verbs::*;

#[test]
fn channel_wait_returns_on_a_completion_and_times_out_without_one() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_completion_channel().unwrap();
    assert!(channel.as_raw_fd() >= 0);
    let cq = ctx.create_cq(16, Some(&channel)).unwrap();
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap().init(InitAttr::new(topo.port)).unwrap();
    let me = qp.endpoint(topo.gid_index, 1).unwrap();
    let qp = qp.handshake(me, topo.gid_index, 1).unwrap();

    // Nothing posted: the wait must end with a timeout, close to the time asked.
    let start = Instant::now();
    match cq.wait(Duration::from_millis(300)) {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    let waited = start.elapsed();
    assert!(waited >= Duration::from_millis(290) && waited < Duration::from_secs(3), "{waited:?}");

    // A loopback send: the event comes, then the completions are polled.
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let mut wcs: [WorkCompletion; 4] = Default::default();
    qp.scope(T, |s| -> rdma_verbs::Result<_> {
        let (buf, msg) = ([mr.sge(2048..).unwrap()], [mr.sge(..100).unwrap()]);
        s.post_recv(&mut [RecvRequest::new(1, &buf)]).unwrap();
        cq.arm(false).unwrap();
        s.post_send(&mut [SendRequest::send(2, &msg)]).unwrap();
        let got = channel.recv(T).expect("an event for the completion");
        assert!(got.is_for(&cq));
        let mut n = s.poll(&mut wcs).unwrap().len();
        while n < 2 {
            // The second completion may land after the event; wait for its own event.
            if s.poll(&mut wcs[n..]).map(|w| w.len()).unwrap_or(0) == 0 {
                let _ = cq.wait(Duration::from_millis(200));
            }
            n = 2 - s.outstanding();
        }
        Ok(())
    })
    .unwrap();

    // A CQ without a channel cannot be waited on.
    let plain = ctx.create_cq(4, None).unwrap();
    assert!(matches!(plain.wait(Duration::from_millis(1)), Err(Error::InvalidArgument { .. })));
}
