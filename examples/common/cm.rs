//! Shared by the connection-manager examples (and their interop tests): waiting for a set of
//! completions while watching for the peer's disconnect.
#![allow(dead_code)]

use std::time::{Duration, Instant};

use rdma_cm::{Connection, Event};
use rdma_verbs::{PostScope, Rc, ReadyToSend, WcStatus, WorkCompletion};

/// The examples' error type.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Waits up to `timeout` until each request in `ids` has completed, and returns each one's
/// `(wr_id, byte_len)` in completion order. `Ok(None)` when the peer disconnected first: the QP is
/// then flushed and what the scope had outstanding drained.
///
/// A peer that answers and then disconnects (rdma-core's `rdma_server` does) may have its
/// disconnect seen before the completion of the answer's receive: the CM event and the
/// completion travel separate paths (rxe does it, rarely). So the disconnect ends
/// the wait only after [`LEFT_GRACE`] more of polling found the requests still incomplete.
///
/// `ids` must name every request the scope has outstanding: a completion of any other is an
/// error, since a send and the receive of the peer's answer to it may complete in either order.
///
/// # Errors
/// A failed completion, an unknown `wr_id`, or the timeout.
pub fn await_ids(
    s: &mut PostScope<'_, '_, Rc, ReadyToSend>,
    conn: &Connection<'_>,
    ids: &[u64],
    timeout: Duration,
) -> Result<Option<Vec<(u64, u32)>>, BoxError> {
    let deadline = Instant::now() + timeout;
    let mut got = Vec::with_capacity(ids.len());
    let mut wcs: [WorkCompletion; 4] = Default::default();
    let mut left_at: Option<Instant> = None;
    while got.len() < ids.len() {
        let done = s.poll(&mut wcs)?;
        let mut flushed = false;
        for wc in done.iter() {
            // After the peer left, the QP may be flushed: that is the leaving, not a failure.
            if left_at.is_some() && wc.status() == WcStatus::WrFlushError {
                flushed = true;
                continue;
            }
            wc.ok()?;
            if !ids.contains(&wc.wr_id()) {
                return Err(format!("completion of unexpected request {}", wc.wr_id()).into());
            }
            got.push((wc.wr_id(), wc.byte_len()));
        }
        if flushed {
            conn.qp().flush()?;
            drain(s, timeout);
            return Ok(None);
        }
        if !done.is_empty() {
            continue;
        }
        if left_at.is_none()
            && (conn.peer_disconnected() || matches!(conn.try_recv_event()?, Some(Event::Disconnected)))
        {
            left_at = Some(Instant::now());
        }
        if left_at.is_some_and(|at| at.elapsed() >= LEFT_GRACE) {
            conn.qp().flush()?;
            drain(s, timeout);
            return Ok(None);
        }
        if Instant::now() >= deadline {
            return Err(format!("requests {ids:?} not complete after {timeout:?}").into());
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    Ok(Some(got))
}

/// How long [`await_ids`] still polls for completions after the peer's disconnect was seen.
pub const LEFT_GRACE: Duration = Duration::from_millis(200);

/// Polls away whatever the scope has outstanding (flushed requests), up to `timeout`.
pub fn drain(s: &mut PostScope<'_, '_, Rc, ReadyToSend>, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let mut wcs: [WorkCompletion; 4] = Default::default();
    while s.outstanding() > 0 && Instant::now() < deadline {
        match s.poll(&mut wcs) {
            Ok(done) if done.iter().all(|wc| wc.is_success() || wc.status() == WcStatus::WrFlushError) => {}
            _ => break,
        }
    }
}
