//! Device test: creating and dropping many resources leaves none behind, as the kernel counts
//! them (`rdma resource show`, iproute2).

use rdma_verbs::*;

use testkit::{resource_count as count, resource_counts as counts};

#[test]
fn ten_thousand_mrs_and_a_thousand_qps_leave_nothing_behind() {
    let topo = testkit::require_topology!();
    let dev = &topo.server.device;
    let before = counts(dev);
    {
        let ctx = Context::open(dev).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        // The counts move while resources live: the check below can fail.
        let held: Vec<_> = (0..10).map(|_| pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap()).collect();
        let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
        assert_eq!(count(dev, "mr"), count_in(&before, "mr") + 10);
        assert_eq!(count(dev, "qp"), count_in(&before, "qp") + 1);
        drop((held, qp));

        for i in 0..10_000 {
            let access = if i % 2 == 0 {
                AccessFlags::LOCAL_WRITE
            } else {
                AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE
            };
            drop(pd.alloc_mr(4096, access).unwrap());
        }
        for i in 0..1_000 {
            let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq)).unwrap();
            if i % 2 == 0 {
                // Half of them reach Init before being dropped.
                drop(qp.init(InitAttr::new(topo.port)).unwrap());
            }
        }
        // Failed creations leave nothing either.
        assert!(pd.alloc_mr(0, AccessFlags::LOCAL_WRITE).is_err());
    }
    assert_eq!(counts(dev), before, "resource counts after dropping everything");
}

fn count_in(c: &[(String, u64)], what: &str) -> u64 {
    c.iter().find(|(k, _)| k == what).map(|(_, v)| *v).unwrap_or(0)
}
