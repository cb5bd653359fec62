//! Device tests of waits on completion channels: a wait over several channels sleeps on every
//! channel it armed, an async waiter follows the channel it is given (not an address a dropped
//! one had), and closing a send queue asynchronously needs no timer of the runtime.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// Posts one signaled RDMA WRITE of 8 bytes on `qp` (connected to itself) from and to `mr`: its
/// completion comes on the QP's send CQ.
fn write_to_self(qp: &QueuePair<'_, Rc, ReadyToSend>, mr: &MemoryRegion<'_>) {
    let src = [mr.sge(0..8).unwrap()];
    let remote = mr.remote();
    // SAFETY: `mr` outlives the write, whose completion the caller waits for before dropping it;
    // the bytes it overwrites are read by nobody.
    unsafe { qp.post_send(&mut [SendRequest::write(7, &src, remote.slice(64, 8).unwrap())]).unwrap() };
}

/// On a thread of `scope`: after 0.3 s, [`write_to_self`] from a region of its own, kept until
/// `done` says the write completed (a region is not `Sync`).
fn write_later<'s, 'r: 's>(
    scope: &'s std::thread::Scope<'s, '_>,
    qp: &'s QueuePair<'r, Rc, ReadyToSend>,
    pd: &'s ProtectionDomain<'r>,
    done: std::sync::mpsc::Receiver<()>,
) {
    scope.spawn(move || {
        let mr = pd.alloc_mr(4096, ALL).unwrap();
        std::thread::sleep(Duration::from_millis(300));
        write_to_self(qp, &mr);
        let _ = done.recv_timeout(Duration::from_secs(30));
    });
}

/// Polls `cq` once: the status of one completion, if one came.
fn poll_one(cq: &CompletionQueue<'_>) -> Result<Option<WcStatus>> {
    let mut wcs: [WorkCompletion; 1] = Default::default();
    Ok(cq.poll(&mut wcs)?.first().map(|wc| wc.status()))
}

/// A blocking wait over CQs of three completion channels sleeps on all three: a completion on
/// the third wakes it (a wait that slept on only the first two would sleep to its deadline, 5 s
/// here, or for ever with `Deadline::never()`).
#[test]
fn a_blocking_wait_over_three_channels_wakes_for_the_third() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let channels = [(); 3].map(|_| ctx.create_completion_channel().unwrap());
    let cqs: Vec<_> = channels.iter().map(|ch| ctx.create_cq(16, Some(ch)).unwrap()).collect();
    for last in [2, 0] {
        let qp = self_connected(&pd, &cqs[last], caps(4, 4));
        let all: Vec<&CompletionQueue<'_>> = cqs.iter().collect();
        let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
        std::thread::scope(|s| {
            let (done, written) = std::sync::mpsc::channel();
            write_later(s, &qp, &pd, written);
            let start = Instant::now();
            let got = waiter.wait(&all, Deadline::after(Duration::from_secs(5)), || poll_one(&cqs[last])).unwrap();
            let took = start.elapsed();
            let _ = done.send(());
            assert_eq!(got, Some(WcStatus::Success), "the write on channel {last} completed");
            assert!(took < Duration::from_secs(2), "woken {took:?} after the wait began, for a write made at 0.3 s");
        });
    }
}

/// A waiter that keeps an arm it made before (its event not read since) still wakes when
/// another wait on the same channel reads that event just before this one sleeps: the event
/// spent the arm, and the reader's wake-up came before this waiter registered, or went to every
/// sleeper but the reader's own thread. Here the other wait runs inside this wait's steps (the
/// same thread, a nested wait over another CQ of the channel): in the step after arming, and in
/// the last step before the sleep. A waiter that slept on the spent arm would see the next
/// completion only at its deadline (5 s), or never with `Deadline::never()`.
#[test]
fn a_kept_arm_whose_event_another_wait_read_is_armed_again_before_the_sleep() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let channel = ctx.create_completion_channel().unwrap();
    let (mine, other) = (ctx.create_cq(16, Some(&channel)).unwrap(), ctx.create_cq(16, Some(&channel)).unwrap());
    let qp = self_connected(&pd, &mine, caps(4, 4));
    let mr = pd.alloc_mr(4096, ALL).unwrap();
    for nested_at in [2, 3] {
        let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
        // First wait: the step after arming writes and takes the completion, whose event stays
        // pending on the channel; the waiter's arm of `mine` counts as standing.
        let mut steps = 0;
        let first = waiter
            .wait(&[&mine], Deadline::after(Duration::from_secs(5)), || {
                steps += 1;
                if steps == 2 {
                    write_to_self(&qp, &mr);
                    let until = Instant::now() + Duration::from_secs(5);
                    while Instant::now() < until {
                        if let Some(status) = poll_one(&mine)? {
                            return Ok(Some(status));
                        }
                    }
                }
                Ok(None)
            })
            .unwrap();
        assert_eq!(first, Some(WcStatus::Success));
        std::thread::scope(|s| {
            let (done, written) = std::sync::mpsc::channel();
            let mut written = Some(written);
            let mut steps = 0;
            let mut others = CqWaiter::new(WaitPolicy::sleep_at_once());
            let start = Instant::now();
            let got = waiter
                .wait(&[&mine], Deadline::after(Duration::from_secs(5)), || {
                    steps += 1;
                    if steps == nested_at {
                        // Another wait reads the pending event (not its own CQ's), then a write
                        // comes 0.3 s later.
                        let slept =
                            others.wait(&[&other], Deadline::after(Duration::from_millis(100)), || poll_one(&other))?;
                        assert_eq!(slept, None, "nothing completes on the other CQ");
                        write_later(s, &qp, &pd, written.take().expect("the nested wait runs once"));
                    }
                    poll_one(&mine)
                })
                .unwrap();
            let took = start.elapsed();
            let _ = done.send(());
            assert_eq!(got, Some(WcStatus::Success));
            assert!(
                took < Duration::from_secs(3),
                "nested in step {nested_at}: woken {took:?} after the wait began, for a write made at about 0.4 s"
            );
        });
    }
}

#[cfg(feature = "tokio")]
mod with_tokio {
    use super::*;

    /// `CqWaiter::idle_async` registers the channel it is given, not one found by its address:
    /// a new channel made at the address of a dropped one wakes the waiter (a registration kept
    /// by address would sleep for ever on a file nothing signals again).
    #[test]
    fn an_idle_async_waiter_wakes_on_a_new_channel_at_a_dropped_one_s_address() {
        let topo = testkit::require_topology!();
        let ctx = Context::open(&topo.server.device).unwrap();
        let pd = ctx.alloc_pd().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
        // One place, so that the second channel lives where the first did.
        let mut place: Option<CompletionChannel<'_>>;
        let mut addresses = Vec::new();
        for round in 0..2 {
            place = None;
            let channel: &CompletionChannel<'_> = place.insert(ctx.create_completion_channel().unwrap());
            addresses.push(std::ptr::from_ref(channel) as usize);
            let cq = ctx.create_cq(16, Some(channel)).unwrap();
            let qp = self_connected(&pd, &cq, caps(4, 4));
            waiter.reset();
            std::thread::scope(|s| {
                let (done, written) = std::sync::mpsc::channel();
                if round == 1 {
                    write_later(s, &qp, &pd, written);
                }
                rt.block_on(async {
                    assert_eq!(waiter.idle_async(&[&cq], None).await.unwrap(), Idle::Armed);
                    assert_eq!(poll_one(&cq).unwrap(), None);
                    if round == 0 {
                        // The first sleep registers the channel; nothing comes.
                        let slept = waiter.idle_async(&[&cq], Some(Duration::from_millis(50))).await.unwrap();
                        assert_eq!(slept, Idle::Slept);
                        return;
                    }
                    let woken = tokio::time::timeout(Duration::from_secs(5), waiter.idle_async(&[&cq], None)).await;
                    assert_eq!(woken.ok().map(Result::unwrap), Some(Idle::Woken), "asleep 5 s past the write");
                    assert_eq!(poll_one(&cq).unwrap(), Some(WcStatus::Success));
                });
                let _ = done.send(());
            });
        }
        assert_eq!(addresses[0], addresses[1], "the second channel was made where the first was");
    }

    /// `SendQueue::close_async` with requests in flight closes in a runtime built without
    /// timers, without the panic "A Tokio 1.x context was found, but timers are disabled".
    /// The queue's drain timeout is 1 s (`T`, 5 s, in the other tests): what is tested is that
    /// the close waits it out on a runtime without timers, not its length.
    #[test]
    fn close_async_in_a_runtime_without_timers_closes() {
        let topo = testkit::require_topology!();
        let drain = Duration::from_secs(1);
        let (client, mut server) = echo_links_draining(&topo, 1, true, false, drain).pop().unwrap();
        // The client's ring holds 16 receives and takes none: the other 8 sends stay in flight,
        // retrying (RNR) until the close ends them.
        for i in 0..24u32 {
            send_bytes(&mut server, &i.to_le_bytes());
        }
        std::thread::sleep(Duration::from_millis(200));
        let Link { sq, ring, pool } = server;
        assert!(sq.in_flight() >= 8, "{} in flight", sq.in_flight());
        let rt = tokio::runtime::Builder::new_current_thread().enable_io().build().unwrap();
        let start = Instant::now();
        let closed = rt.block_on(sq.close_async());
        assert!(closed.is_ok(), "{closed:?}");
        // It waited for the drain timeout, then flushed.
        let took = start.elapsed();
        eprintln!("closed after {took:?}, with a drain timeout of {drain:?}");
        assert!(took < Duration::from_secs(30), "closed after {took:?}");
        drop((ring, pool, client));
    }
}
