//! Device test: creating and dropping many resources leaves none behind, as the kernel counts
//! them (`rdma resource show`, iproute2).

use std::process::Command;

use rdma_verbs::*;

/// The kernel's count of each resource of `device`: `rdma resource show` prints
/// `0: rxe0: pd 1 cq 2 qp 1 cm_id 0 mr 0 ctx 0 srq 0`.
fn counts(device: &str) -> Vec<(String, u64)> {
    let out = Command::new("rdma").args(["resource", "show"]).output().expect("running `rdma resource show`");
    assert!(out.status.success(), "rdma resource show: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(&format!("{device}:")))
        .unwrap_or_else(|| panic!("{device} not in `rdma resource show`:\n{text}"));
    let words: Vec<&str> = line.split_whitespace().skip(2).collect();
    words.chunks(2).map(|kv| (kv[0].to_string(), kv[1].parse().unwrap())).collect()
}

fn count(device: &str, what: &str) -> u64 {
    counts(device).into_iter().find(|(k, _)| k == what).map(|(_, v)| v).unwrap_or_else(|| panic!("no {what} count"))
}

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
        let qp = pd.create_qp::<Rc>(QpInit::new(&cq, &cq)).unwrap();
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
            let qp = pd.create_qp::<Rc>(QpInit::new(&cq, &cq)).unwrap();
            if i % 2 == 0 {
                // Half of them reach Init before being dropped.
                qp.init(InitAttr::new(topo.port)).unwrap();
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
