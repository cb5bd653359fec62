//! Device tests: RC data path on rxe, loopback (rxe0 -> rxe0) and across the wire (rxe1 -> rxe0).

mod common;

use common::*;
use rdma_verbs::*;

#[test]
fn send_recv_and_send_with_immediate() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, AccessFlags::LOCAL_WRITE, |a, b| {
            let msg = pattern(3000, 1);
            a.mr.write_at(0, &msg).unwrap();
            b.qp.scope(T, |sb| -> rdma_verbs::Result<_> {
                let bufs = [b.mr.sge(0..4096).unwrap()];
                let bufs2 = [b.mr.sge(4096..8192).unwrap()];
                sb.post_recv(&mut [RecvRequest::new(10, &bufs), RecvRequest::new(11, &bufs2)]).unwrap();
                a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                    let src = [a.mr.sge(0..3000).unwrap()];
                    sa.post_send(&mut [
                        SendRequest::send(1, &src),
                        SendRequest::send(2, &src[..]).with_imm(0xdead_beef),
                    ])
                    .unwrap();
                    let sent = complete(sa, 2);
                    assert!(sent.iter().all(|c| c.1 == WcOpcode::Send), "{sent:?}");
                    Ok(())
                })
                .unwrap();
                let got = complete(sb, 2);
                assert_eq!(got[0], (10, WcOpcode::Recv, 3000, None), "{da}->{db}");
                assert_eq!(got[1], (11, WcOpcode::Recv, 3000, Some(0xdead_beef)), "{da}->{db}");
                Ok(())
            })
            .unwrap();
            assert_eq!(read(&b.mr, 0, 3000), msg, "{da}->{db}: first message");
            assert_eq!(read(&b.mr, 4096, 3000), msg, "{da}->{db}: second message");
        });
    }
}

#[test]
fn rdma_write_and_write_with_immediate() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let data = pattern(MR_LEN / 2, 7);
            a.mr.write_at(0, &data).unwrap();
            let dst = b.remote().slice(100, data.len() as u64).unwrap();
            b.qp.scope(T, |sb| -> rdma_verbs::Result<_> {
                sb.post_recv(&mut [RecvRequest::new(20, &[])]).unwrap();
                a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                    let src = [a.mr.sge(..data.len()).unwrap()];
                    sa.post_send(&mut [SendRequest::write(3, &src, dst)]).unwrap();
                    assert_eq!(complete(sa, 1)[0].1, WcOpcode::RdmaWrite);
                    let one = [a.mr.sge(0..16).unwrap()];
                    let tail = b.remote().slice(40_000, 16).unwrap();
                    sa.post_send(&mut [SendRequest::write(4, &one, tail).with_imm(77)]).unwrap();
                    complete(sa, 1);
                    Ok(())
                })
                .unwrap();
                let got = complete(sb, 1);
                assert_eq!((got[0].0, got[0].1, got[0].3), (20, WcOpcode::RecvRdmaWithImm, Some(77)));
                Ok(())
            })
            .unwrap();
            assert_eq!(read(&b.mr, 100, data.len()), data, "{da}->{db}");
            assert_eq!(read(&b.mr, 40_000, 16), data[..16], "{da}->{db}");
        });
    }
}

#[test]
fn rdma_read() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let data = pattern(20_000, 3);
            b.mr.write_at(5000, &data).unwrap();
            a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                let dst = [a.mr.sge(0..20_000).unwrap()];
                sa.post_send(&mut [SendRequest::read(5, &dst, b.remote().slice(5000, 20_000).unwrap())]).unwrap();
                let c = complete(sa, 1);
                assert_eq!((c[0].1, c[0].2), (WcOpcode::RdmaRead, 20_000));
                Ok(())
            })
            .unwrap();
            assert_eq!(read(&a.mr, 0, 20_000), data, "{da}->{db}");
        });
    }
}

#[test]
fn atomic_compare_swap_and_fetch_add() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let target = b.remote().slice(64, 8).unwrap();
            b.mr.write_at(64, &41u64.to_ne_bytes()).unwrap();
            a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                let old = [a.mr.sge(0..8).unwrap()];
                // Compare fails (41 != 5): nothing changes, the old value comes back.
                sa.post_send(&mut [SendRequest::compare_swap(1, &old, target, 5, 1000)]).unwrap();
                assert_eq!(complete(sa, 1)[0].1, WcOpcode::CompareSwap);
                assert_eq!(read(&a.mr, 0, 8), 41u64.to_ne_bytes());
                // Compare succeeds: 41 becomes 1000.
                sa.post_send(&mut [SendRequest::compare_swap(2, &old, target, 41, 1000)]).unwrap();
                complete(sa, 1);
                assert_eq!(read(&a.mr, 0, 8), 41u64.to_ne_bytes());
                let old2 = [a.mr.sge(8..16).unwrap()];
                sa.post_send(&mut [SendRequest::fetch_add(3, &old2, target, 23)]).unwrap();
                assert_eq!(complete(sa, 1)[0].1, WcOpcode::FetchAdd);
                assert_eq!(read(&a.mr, 8, 8), 1000u64.to_ne_bytes());
                Ok(())
            })
            .unwrap();
            assert_eq!(read(&b.mr, 64, 8), 1023u64.to_ne_bytes(), "{da}->{db}");
        });
    }
}

#[test]
fn inline_send_needs_no_memory_region() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, AccessFlags::LOCAL_WRITE, |a, b| {
            b.qp.scope(T, |sb| -> rdma_verbs::Result<_> {
                let buf = [b.mr.sge(0..64).unwrap()];
                sb.post_recv(&mut [RecvRequest::new(1, &buf)]).unwrap();
                a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                    let mut msg = *b"inline: copied at post time";
                    sa.post_send(&mut [SendRequest::send_inline(9, &msg)]).unwrap();
                    msg.fill(0); // reusable at once
                    complete(sa, 1);
                    Ok(())
                })
                .unwrap();
                assert_eq!(complete(sb, 1)[0].2, 27);
                Ok(())
            })
            .unwrap();
            assert_eq!(read(&b.mr, 0, 27), b"inline: copied at post time");
            // More inline bytes than the QP allows is refused before posting.
            a.qp.scope(T, |sa| -> rdma_verbs::Result<_> {
                let big = [0u8; 65];
                let err = sa.post_send(&mut [SendRequest::send_inline(1, &big)]).unwrap_err();
                assert!(matches!(err, Error::InvalidArgument { verb: "ibv_post_send", .. }), "{err}");
                assert_eq!(sa.outstanding(), 0);
                Ok(())
            })
            .unwrap();
        });
    }
}

#[test]
fn unsignaled_chain_with_one_doorbell_completes_once() {
    let topo = testkit::require_topology!();
    for (da, db) in device_pairs(&topo) {
        with_rc_pair(&topo, &da, &db, ALL, |a, b| {
            let data = pattern(4 * 1024, 9);
            a.mr.write_at(0, &data).unwrap();
            let src: Vec<[Sge<'_>; 1]> = (0..4).map(|i| [a.mr.sge(i * 1024..(i + 1) * 1024).unwrap()]).collect();
            // Three unsignaled writes, then a signaled one.
            let mut chain: Vec<SendRequest<'_, '_>> = (0..4)
                .map(|i| {
                    let wr = SendRequest::write(i as u64, &src[i], b.remote().slice(i as u64 * 2048, 1024).unwrap());
                    if i < 3 {
                        wr.unsignaled()
                    } else {
                        wr
                    }
                })
                .collect();
            // SAFETY: `a.mr` is not sliced while the chain is in flight; we wait for the last,
            // signaled request, whose completion implies the others'.
            unsafe { a.qp.post_send(&mut chain).unwrap() };
            let mut wcs: [WorkCompletion; 8] = Default::default();
            let deadline = std::time::Instant::now() + T;
            let mut got = Vec::new();
            while got.is_empty() && std::time::Instant::now() < deadline {
                got.extend(a.qp.send_cq().poll(&mut wcs).unwrap().iter().map(|wc| (wc.wr_id(), wc.status())));
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
            got.extend(a.qp.send_cq().poll(&mut wcs).unwrap().iter().map(|wc| (wc.wr_id(), wc.status())));
            assert_eq!(got, vec![(3, WcStatus::Success)], "{da}->{db}: only the last request is signaled");
            for i in 0..4 {
                assert_eq!(read(&b.mr, i * 2048, 1024), data[i * 1024..(i + 1) * 1024], "{da}->{db}: write {i}");
            }
        });
    }
}
