//! A polling loop's idle step that also wakes for other file descriptors (`CqWaiter::idle_with`,
//! `idle_async_with`): it sleeps until a completion ([`Idle::Woken`]), one of them
//! ([`Idle::Signalled`]) or its deadline ([`Idle::Slept`]), on rxe's completion channel.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use common::*;
use rdma_verbs::*;

/// A non-blocking eventfd.
fn eventfd() -> OwnedFd {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).unwrap()
}

/// Writes 1 to `fd` after `after`, on a thread of `scope`.
fn ring_later<'s>(scope: &'s std::thread::Scope<'s, '_>, fd: &'s OwnedFd, after: Duration) {
    scope.spawn(move || {
        std::thread::sleep(after);
        rustix::io::write(fd, &1u64.to_ne_bytes()).unwrap();
    });
}

/// Steps `waiter` until it sleeps (a step that spun or armed returns at once): what ended the
/// sleep, and when.
fn idle_until_asleep(
    waiter: &mut CqWaiter,
    cqs: &[&CompletionQueue<'_>],
    until: Deadline,
    also: &[std::os::fd::BorrowedFd<'_>],
) -> (Idle, Duration) {
    let start = Instant::now();
    loop {
        match waiter.idle_with(cqs, until, also).unwrap() {
            Idle::Spun | Idle::Armed => continue,
            other => return (other, start.elapsed()),
        }
    }
}

#[test]
fn an_idle_step_sleeps_until_one_of_its_other_fds_its_deadline_or_a_completion() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let channel = ctx.create_completion_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&channel)).unwrap();
    let bell = eventfd();
    let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
    // Another fd, written at 0.3 s: signalled then, not at the 5 s deadline.
    std::thread::scope(|s| {
        ring_later(s, &bell, Duration::from_millis(300));
        let (idle, took) =
            idle_until_asleep(&mut waiter, &[&cq], Deadline::after(Duration::from_secs(5)), &[bell.as_fd()]);
        assert_eq!(idle, Idle::Signalled);
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
    });
    let mut n = [0u8; 8];
    rustix::io::read(&bell, &mut n).unwrap();
    // Quiet: the deadline ends the sleep.
    let (idle, took) =
        idle_until_asleep(&mut waiter, &[&cq], Deadline::after(Duration::from_millis(200)), &[bell.as_fd()]);
    assert_eq!((idle, took >= Duration::from_millis(150)), (Idle::Slept, true), "{took:?}");
    // A completion wakes it as `idle` does.
    let pd = ctx.alloc_pd().unwrap();
    let qp = self_connected(&pd, &cq, caps(4, 4));
    std::thread::scope(|s| {
        let (done, polled) = std::sync::mpsc::channel::<()>();
        let (qp, pd) = (&qp, &pd);
        // The region is made on the writing thread (it is not `Sync`), kept until the write's
        // completion was polled.
        s.spawn(move || {
            let mr = pd.alloc_mr(4096, ALL).unwrap();
            std::thread::sleep(Duration::from_millis(300));
            let src = [mr.sge(0..8).unwrap()];
            // SAFETY: `mr` outlives the write: it drops after its completion was polled.
            unsafe { qp.post_send(&mut [SendRequest::write(1, &src, mr.remote().slice(64, 8).unwrap())]).unwrap() };
            let _ = polled.recv_timeout(Duration::from_secs(30));
        });
        let until = Deadline::after(Duration::from_secs(5));
        let (idle, took) = idle_until_asleep(&mut waiter, &[&cq], until, &[bell.as_fd()]);
        let mut wcs: [WorkCompletion; 1] = Default::default();
        let t = Instant::now();
        while cq.poll(&mut wcs).unwrap().is_empty() {
            assert!(t.elapsed() < Duration::from_secs(5), "no completion");
        }
        let _ = done.send(());
        assert_eq!(idle, Idle::Woken, "after {took:?}");
    });
}

#[cfg(feature = "tokio")]
#[test]
fn an_async_idle_step_wakes_for_a_registered_fd() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let channel = ctx.create_completion_channel().unwrap();
    let cq = ctx.create_cq(16, Some(&channel)).unwrap();
    let bell = eventfd();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let readiness = wait::Readiness::new(bell.as_fd()).unwrap();
        let mut waiter = CqWaiter::new(WaitPolicy::sleep_at_once());
        let writer = {
            let fd = bell.try_clone().unwrap();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                rustix::io::write(&fd, &1u64.to_ne_bytes()).unwrap();
            })
        };
        let start = Instant::now();
        let idle = loop {
            match waiter.idle_async_with(&[&cq], Some(Duration::from_secs(5)), &[&readiness]).await.unwrap() {
                Idle::Spun | Idle::Armed => continue,
                other => break other,
            }
        };
        let took = start.elapsed();
        writer.join().unwrap();
        assert_eq!(idle, Idle::Signalled, "after {took:?}");
        assert!(took < Duration::from_secs(3), "{took:?}");
        // Its readiness was cleared: read, it is quiet, and the next step sleeps to its re-check.
        let mut n = [0u8; 8];
        rustix::io::read(&bell, &mut n).unwrap();
        let start = Instant::now();
        let idle = loop {
            match waiter.idle_async_with(&[&cq], Some(Duration::from_millis(200)), &[&readiness]).await.unwrap() {
                Idle::Spun | Idle::Armed => continue,
                other => break other,
            }
        };
        assert_eq!(idle, Idle::Slept, "after {:?}", start.elapsed());
    });
}
