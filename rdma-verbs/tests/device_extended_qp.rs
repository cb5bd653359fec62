//! Device tests: extended QPs (`ibv_create_qp_ex`) and their batches of work requests
//! (`ibv_wr_start` / `ibv_wr_*` / `ibv_wr_complete`), on rxe.

mod common;

use common::*;
use rdma_verbs::*;

/// Every operation rxe's provider builds (rdma-core 44), atomic write aside.
const OPS: SendOps = SendOps::SEND
    .union(SendOps::SEND_WITH_IMM)
    .union(SendOps::RDMA_WRITE)
    .union(SendOps::RDMA_WRITE_WITH_IMM)
    .union(SendOps::RDMA_READ)
    .union(SendOps::ATOMIC_CMP_AND_SWP)
    .union(SendOps::ATOMIC_FETCH_AND_ADD)
    .union(SendOps::LOCAL_INV)
    .union(SendOps::BIND_MW)
    .union(SendOps::SEND_WITH_INV);

#[test]
fn a_batch_posts_every_kind_of_request_with_one_complete() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(OPS), |a, b| {
            assert_eq!(a.qp.send_ops(), Some(OPS));
            let data = pattern(8192, 5);
            a.mr.write_at(0, &data).unwrap();
            b.mr.write_at(60_000, &7u64.to_ne_bytes()).unwrap();
            let got =
                b.qp.scope(T, |sb| {
                    let bufs = [b.mr.sge(32_768..36_864)?];
                    sb.post_recv(&mut [RecvRequest::new(40, &bufs), RecvRequest::new(41, &[])])?;
                    a.qp.scope(T, |sa| {
                        let src = [a.mr.sge(..4096)?];
                        let src2 = [a.mr.sge(4096..8192)?];
                        let back = [a.mr.sge(16_384..20_480)?];
                        let old = [a.mr.sge(24_576..24_584)?];
                        let mut batch = sa.batch()?;
                        batch.push(&SendRequest::write(1, &src, b.remote().slice(0, 4096).unwrap()))?;
                        batch.push(&SendRequest::send(2, &src2))?;
                        batch.push(&SendRequest::read(3, &back, b.remote().slice(0, 4096).unwrap()))?;
                        batch.push(&SendRequest::fetch_add(4, &old, b.remote().slice(60_000, 8).unwrap(), 5))?;
                        let tail = [a.mr.sge(0..16)?];
                        batch
                            .push(&SendRequest::write(5, &tail, b.remote().slice(50_000, 16).unwrap()).with_imm(99))?;
                        assert_eq!(batch.len(), 5);
                        assert_eq!(batch.complete()?, 5);
                        assert_eq!(sa.outstanding(), 5);
                        let done = complete(sa, 5);
                        let ids: Vec<(u64, WcOpcode)> = done.iter().map(|c| (c.0, c.1)).collect();
                        assert_eq!(
                            ids,
                            [
                                (1, WcOpcode::RdmaWrite),
                                (2, WcOpcode::Send),
                                (3, WcOpcode::RdmaRead),
                                (4, WcOpcode::FetchAdd),
                                (5, WcOpcode::RdmaWrite)
                            ],
                            "{da}->{db}"
                        );
                        Ok::<_, Error>(())
                    })?;
                    Ok::<_, Error>(complete(sb, 2))
                })
                .unwrap();
            assert_eq!(got[0], (40, WcOpcode::Recv, 4096, None), "{da}->{db}");
            assert_eq!(got[1].3, Some(99), "{da}->{db}: the write with immediate");
            assert_eq!(read(&b.mr, 0, 4096), data[..4096], "{da}->{db}: the WRITE");
            assert_eq!(read(&b.mr, 32_768, 4096), data[4096..], "{da}->{db}: the SEND");
            assert_eq!(read(&a.mr, 16_384, 4096), data[..4096], "{da}->{db}: the READ");
            assert_eq!(read(&a.mr, 24_576, 8), 7u64.to_ne_bytes(), "{da}->{db}: the old value");
            assert_eq!(read(&b.mr, 60_000, 8), 12u64.to_ne_bytes(), "{da}->{db}: the sum");
        });
    }
}

#[test]
fn a_dropped_batch_posts_nothing_and_frees_the_queue() {
    let topo = testkit::require_topology!();
    let (da, db) = (topo.client.device.clone(), topo.server.device.clone());
    with_rc_pair_ops(&topo, &da, &db, ALL, Some(OPS), |a, b| {
        a.mr.write_at(0, &[0x5a; 64]).unwrap();
        a.qp.scope(T, |sa| {
            let src = [a.mr.sge(..64)?];
            let mut batch = sa.batch()?;
            batch.push(&SendRequest::write(1, &src, b.remote().slice(0, 64).unwrap()))?;
            drop(batch);
            assert_eq!(sa.outstanding(), 0, "an aborted batch posts nothing");
            // A panic with a batch open aborts it too.
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut batch = sa.batch().unwrap();
                batch.push(&SendRequest::write(2, &src, b.remote().slice(0, 64).unwrap())).unwrap();
                panic!("in the middle of a batch");
            }));
            assert!(panicked.is_err());
            assert_eq!(sa.outstanding(), 0);
            std::thread::sleep(std::time::Duration::from_millis(200));
            Ok::<_, Error>(())
        })
        .unwrap();
        assert_eq!(read(&b.mr, 0, 64), vec![0; 64], "nothing of the aborted batches reached the peer");
        // The send queue's lock was released: classic posts and a new batch both work.
        scoped_send_then_batch(a, b);
    });
}

fn scoped_send_then_batch(a: &End<'_>, b: &End<'_>) {
    a.qp.scope(T, |sa| {
        let src = [a.mr.sge(..64)?];
        sa.post_send(&mut [SendRequest::write(3, &src, b.remote().slice(0, 64).unwrap())])?;
        let mut batch = sa.batch()?;
        batch.push(&SendRequest::write(4, &src, b.remote().slice(64, 64).unwrap()))?;
        batch.complete()?;
        complete(sa, 2);
        Ok::<_, Error>(())
    })
    .unwrap();
    assert_eq!(read(&b.mr, 0, 128), vec![0x5a; 128]);
}

#[test]
fn requests_a_batch_cannot_take_are_refused_and_leave_it_open() {
    let topo = testkit::require_topology!();
    let d = topo.server.device.clone();
    let only_writes = SendOps::RDMA_WRITE;
    with_rc_pair_ops(&topo, &d, &d, ALL, Some(only_writes), |a, b| {
        a.qp.scope(T, |sa| {
            let src = [a.mr.sge(..64)?];
            let long = [a.mr.sge(..8192)?];
            let mut batch = sa.batch()?;
            let invalid = |e: Error| assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
            invalid(batch.push(&SendRequest::send(1, &src)).unwrap_err());
            invalid(batch.push(&SendRequest::read(1, &src, b.remote().slice(0, 64).unwrap())).unwrap_err());
            invalid(batch.push(&SendRequest::write(1, &long, b.remote().slice(0, 64).unwrap())).unwrap_err());
            invalid(batch.push(&SendRequest::write(1 << 62, &src, b.remote().slice(0, 64).unwrap())).unwrap_err());
            // rxe's builders (rdma-core 44) get the length of several SGEs wrong: refused there.
            let two = [a.mr.sge(..32)?, a.mr.sge(32..64)?];
            invalid(batch.push(&SendRequest::write(1, &two, b.remote().slice(0, 64).unwrap())).unwrap_err());
            assert!(batch.is_empty());
            batch.push(&SendRequest::write(2, &src, b.remote().slice(0, 64).unwrap()))?;
            assert_eq!(batch.complete()?, 1);
            complete(sa, 1);
            Ok::<_, Error>(())
        })
        .unwrap();
    });
    // A QP made with ibv_create_qp has no batches.
    with_rc_pair(&topo, &d, &d, ALL, |a, _b| {
        assert_eq!(a.qp.send_ops(), None);
        let e = a.qp.scope(T, |sa| sa.batch().map(|_| ())).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    });
}

#[test]
fn a_batch_fills_the_queue_no_further_than_the_scope_allows() {
    let topo = testkit::require_topology!();
    let d = topo.server.device.clone();
    with_rc_pair_ops(&topo, &d, &d, ALL, Some(OPS), |a, b| {
        a.qp.scope(T, |sa| {
            let src = [a.mr.sge(..8)?];
            let cap = a.qp.caps().max_send_wr as usize;
            let mut batch = sa.batch()?;
            for i in 0..cap {
                batch.push(&SendRequest::write(i as u64, &src, b.remote().slice(0, 8).unwrap()))?;
            }
            let e = batch.push(&SendRequest::write(999, &src, b.remote().slice(0, 8).unwrap())).unwrap_err();
            // The requests the batch holds are in use: the error counts them.
            let Error::QueueFull { capacity, outstanding, .. } = e else { panic!("{e}") };
            assert_eq!((outstanding as usize, capacity as usize), (cap, cap), "{e}");
            assert!(e.to_string().contains(&format!("({cap} of {cap} entries in use)")), "{e}");
            assert_eq!(batch.complete()?, cap);
            let mut wcs = vec![WorkCompletion::default(); cap];
            let got = sa.wait(cap, &mut wcs, T)?;
            assert!(got.iter().all(WorkCompletion::is_success));
            Ok::<_, Error>(())
        })
        .unwrap();
    });
}

/// Atomic write is rxe's from Linux 6.2: on 6.12 it writes the 8 bytes; on 6.1, whose rxe does
/// not advertise it, the QP is refused with `Error::Unsupported` before any verb is called.
#[test]
fn atomic_write_where_the_device_has_it_and_a_typed_refusal_where_not() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let has_it = ctx.capabilities().contains(DeviceCapabilities::ATOMIC_WRITE);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    // The harness's kernels: 6.1 (no atomic write in rxe) and 6.12 (atomic write).
    assert_eq!(has_it, !kernel.starts_with("6.1."), "kernel {kernel}: rxe's ATOMIC_WRITE bit");
    drop(ctx);
    let ops = SendOps::RDMA_WRITE | SendOps::ATOMIC_WRITE;
    if !has_it {
        let ctx = Context::open(&topo.server.device).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let cq = ctx.create_cq(16, None).unwrap();
        let e = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq).send_ops(ops)).unwrap_err();
        assert!(matches!(e, Error::Unsupported { errno: None, .. }), "{e}");
        return;
    }
    for (da, db) in device_pairs(&topo) {
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(ops), |a, b| {
            let value = 0x0123_4567_89ab_cdef_u64.to_ne_bytes();
            a.qp.scope(T, |sa| {
                let mut batch = sa.batch()?;
                batch.push(&SendRequest::atomic_write(7, b.remote().slice(4096, 8).unwrap(), value))?;
                batch.complete()?;
                let done = complete(sa, 1);
                assert_eq!((done[0].0, done[0].1), (7, WcOpcode::AtomicWrite), "{da}->{db}");
                // The classic path refuses it; a misaligned target is refused before posting.
                let e = sa.post_send(&mut [SendRequest::atomic_write(8, b.remote().slice(0, 8).unwrap(), value)]);
                assert!(matches!(e, Err(Error::InvalidArgument { .. })), "{e:?}");
                let mut batch = sa.batch()?;
                let e = batch.push(&SendRequest::atomic_write(9, b.remote().slice(4, 8).unwrap(), value));
                assert!(matches!(e, Err(Error::InvalidArgument { .. })), "{e:?}");
                drop(batch);
                Ok::<_, Error>(())
            })
            .unwrap();
            assert_eq!(read(&b.mr, 4096, 8), value, "{da}->{db}: the atomic write landed");
        });
    }
}

#[test]
fn inline_sends_in_a_batch_carry_their_bytes() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(OPS), |a, b| {
            let msg = *b"inline through ibv_wr_set_inline_data";
            let got =
                b.qp.scope(T, |sb| {
                    let buf = [b.mr.sge(0..64)?];
                    sb.post_recv(&mut [RecvRequest::new(1, &buf)])?;
                    a.qp.scope(T, |sa| {
                        let mut batch = sa.batch()?;
                        batch.push(&SendRequest::send_inline(2, &msg))?;
                        batch.complete()?;
                        complete(sa, 1);
                        Ok::<_, Error>(())
                    })?;
                    Ok::<_, Error>(complete(sb, 1))
                })
                .unwrap();
            assert_eq!(got[0].2 as usize, msg.len(), "{da}->{db}");
            assert_eq!(read(&b.mr, 0, msg.len()), msg, "{da}->{db}");
        });
    }
}

/// Requests of no bytes (a send, the usual notify: a write of nothing with immediate data) go
/// through a batch like any other, each completing on both sides.
#[test]
fn a_batch_posts_requests_of_no_bytes() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(OPS), |a, b| {
            let got =
                b.qp.scope(T, |sb| {
                    sb.post_recv(&mut [RecvRequest::new(1, &[]), RecvRequest::new(2, &[])])?;
                    a.qp.scope(T, |sa| {
                        let mut batch = sa.batch()?;
                        batch.push(&SendRequest::send(1, &[]))?;
                        batch.push(&SendRequest::write(2, &[], b.remote().slice(0, 0).unwrap()).with_imm(5))?;
                        batch.push(&SendRequest::read(3, &[], b.remote().slice(0, 0).unwrap()))?;
                        assert_eq!(batch.complete()?, 3);
                        let done = complete(sa, 3);
                        let ids: Vec<(u64, u32)> = done.iter().map(|c| (c.0, c.2)).collect();
                        assert_eq!(ids, [(1, 0), (2, 0), (3, 0)], "{da}->{db}");
                        Ok::<_, Error>(())
                    })?;
                    Ok::<_, Error>(complete(sb, 2))
                })
                .unwrap();
            let seen: Vec<(u64, WcOpcode, u32, Option<u32>)> = got;
            assert_eq!(seen[0].0, 1, "{da}->{db}");
            assert_eq!((seen[0].2, seen[0].3), (0, None), "{da}->{db}: the empty send");
            assert_eq!(seen[1].0, 2, "{da}->{db}");
            assert_eq!(seen[1].1, WcOpcode::RecvRdmaWithImm, "{da}->{db}");
            assert_eq!(seen[1].3, Some(5), "{da}->{db}: the notify's immediate");
        });
    }
}

/// A batch leaked with `mem::forget` holds the provider's send-queue lock; its scope aborts it
/// before it posts again, so the next post goes through instead of spinning for ever, and the
/// forgotten batch posts nothing.
#[test]
fn a_forgotten_batch_is_aborted_by_its_scope_before_the_next_post() {
    const MSG: &[u8] = b"after the forgotten batch";
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        // A post that spins on the lock cannot be interrupted: a watchdog ends the process.
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let watch = std::sync::Arc::clone(&done);
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_secs(30));
            if !watch.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!("a post after a forgotten batch did not return in 30 s: the QP's lock is still held");
                std::process::exit(101);
            }
        });
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(OPS), |a, b| {
            let got =
                b.qp.scope(T, |sb| {
                    let buf = [b.mr.sge(0..64)?];
                    sb.post_recv(&mut [RecvRequest::new(1, &buf)])?;
                    a.mr.write_at(0, MSG).unwrap();
                    a.mr.write_at(100, b"in the forgotten batch").unwrap();
                    a.qp.scope(T, |sa| {
                        let forgotten = [a.mr.sge(100..122)?];
                        let mut batch = sa.batch()?;
                        batch.push(&SendRequest::send(1, &forgotten))?;
                        std::mem::forget(batch);
                        let msg = [a.mr.sge(..MSG.len())?];
                        sa.post_send(&mut [SendRequest::send(2, &msg)])?;
                        let sent = complete(sa, 1);
                        assert_eq!(sent[0].0, 2, "{da}->{db}: only the post after the batch completed");
                        assert_eq!(sa.outstanding(), 0, "{da}->{db}");
                        // The scope takes batches again.
                        sa.batch()?.complete()?;
                        Ok::<_, Error>(())
                    })?;
                    Ok::<_, Error>(complete(sb, 1))
                })
                .unwrap();
            assert_eq!(got.len(), 1, "{da}->{db}: one message arrived");
            assert_eq!(got[0].2 as usize, MSG.len(), "{da}->{db}");
            assert_eq!(read(&b.mr, 0, MSG.len()), MSG, "{da}->{db}");
        });
        done.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The operations a [`SendQueue`] posts.
const QUEUE_OPS: SendOps = SendOps::SEND
    .union(SendOps::SEND_WITH_IMM)
    .union(SendOps::RDMA_WRITE)
    .union(SendOps::RDMA_WRITE_WITH_IMM)
    .union(SendOps::RDMA_READ);

#[test]
fn a_send_queue_on_an_extended_qp_posts_batches_of_every_kind_of_request() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair_ops(&topo, &da, &db, ALL, Some(QUEUE_OPS), |a, b| {
            let data = pattern(4096, 9);
            b.mr.write_at(8192, &pattern(4096, 3)).unwrap();
            let pool = SlotPool::new(a.pd, 4096, 4, AccessFlags::LOCAL_WRITE).unwrap();
            let mut sq = SendQueue::new(&a.qp, T).unwrap();
            assert_eq!(sq.posting(), Posting::Batch, "an extended QP's queue posts batches");
            let (received, mut done) =
                b.qp.scope(T, |sb| {
                    let (r1, r3) = ([b.mr.sge(32_768..36_864)?], [b.mr.sge(40_000..40_064)?]);
                    sb.post_recv(&mut [
                        RecvRequest::new(40, &r1),
                        RecvRequest::new(41, &[]),
                        RecvRequest::new(42, &r3),
                    ])?;
                    let slot = || pool.try_take().expect("a free slot");
                    let mut s1 = slot();
                    s1.write_at(0, &data).unwrap();
                    let mut s2 = slot();
                    s2.write_at(0, &data[..100]).unwrap();
                    sq.push(SlotRequest::write(s1, 4096, b.remote().slice(0, 4096).unwrap()).with_wr_id(1))
                        .map_err(|r| r.error)?;
                    sq.push(SlotRequest::send(s2, 100).with_imm(7).with_wr_id(2)).map_err(|r| r.error)?;
                    sq.push(SlotRequest::read(slot(), 4096, b.remote().slice(8192, 4096).unwrap()).with_wr_id(3))
                        .map_err(|r| r.error)?;
                    sq.push(SlotRequest::write(slot(), 0, b.remote()).with_imm(8).with_wr_id(4))
                        .map_err(|r| r.error)?;
                    assert_eq!(sq.submit()?, 4);
                    // An inline send after them, through a batch of its own.
                    sq.send_inline(b"inline!", Some(9), 5)?;
                    let mut done = Vec::new();
                    while done.len() < 5 {
                        sq.wait(T, |c| done.push((c.wr_id, c.status, c.slot)))?;
                    }
                    Ok::<_, Error>((complete(sb, 3), done))
                })
                .unwrap();
            let ids: Vec<(u64, WcStatus)> = done.iter().map(|d| (d.0, d.1)).collect();
            let ok = WcStatus::Success;
            assert_eq!(ids, [(1, ok), (2, ok), (3, ok), (4, ok), (5, ok)], "{da}->{db}");
            assert!(done[4].2.is_none(), "{da}->{db}: inline data carries no slot");
            let read_back = done[2].2.take().expect("the READ's slot comes back");
            assert_eq!(read_back.as_slice().unwrap(), &pattern(4096, 3)[..], "{da}->{db}: the READ");
            assert_eq!(read(&b.mr, 0, 4096), data, "{da}->{db}: the WRITE");
            assert_eq!(received[0], (40, WcOpcode::Recv, 100, Some(7)), "{da}->{db}: the send");
            assert_eq!(read(&b.mr, 32_768, 100), data[..100], "{da}->{db}: the send's bytes");
            assert_eq!(received[1], (41, WcOpcode::RecvRdmaWithImm, 0, Some(8)), "{da}->{db}: the write's immediate");
            assert_eq!(received[2], (42, WcOpcode::Recv, 7, Some(9)), "{da}->{db}: the inline send");
            assert_eq!(read(&b.mr, 40_000, 7), b"inline!", "{da}->{db}: the inline bytes");
        });
    }
}

#[test]
fn a_send_queue_posts_chains_where_a_batch_cannot_go() {
    let topo = testkit::require_topology!();
    let d = topo.server.device.clone();
    // A classic QP has no batches.
    with_rc_pair_ops(&topo, &d, &d, ALL, None, |a, _| {
        let mut sq = SendQueue::new(&a.qp, T).unwrap();
        assert_eq!(sq.posting(), Posting::Chain);
        let err = sq.set_posting(Posting::Batch).unwrap_err();
        assert!(matches!(err, Error::InvalidArgument { .. }), "{err:?}");
        assert_eq!(sq.posting(), Posting::Chain, "a refused choice changes nothing");
    });
    // An extended QP created for writes only: a READ goes by ibv_post_send, and lands; the
    // queue can also be told to post chains.
    with_rc_pair_ops(&topo, &d, &d, ALL, Some(SendOps::RDMA_WRITE), |a, b| {
        b.mr.write_at(0, &pattern(64, 4)).unwrap();
        let pool = SlotPool::new(a.pd, 64, 2, AccessFlags::LOCAL_WRITE).unwrap();
        let mut sq = SendQueue::new(&a.qp, T).unwrap();
        for posting in [Posting::Batch, Posting::Chain] {
            sq.set_posting(posting).unwrap();
            let mut slot = pool.try_take().unwrap();
            slot.write_at(0, &[0; 64]).unwrap();
            sq.post(SlotRequest::read(slot, 64, b.remote().slice(0, 64).unwrap())).unwrap();
            let mut back = None;
            assert_eq!(sq.wait(T, |c| back = c.slot).unwrap(), 1);
            assert_eq!(back.unwrap().as_slice().unwrap(), &pattern(64, 4)[..], "{posting:?}");
        }
    });
}
