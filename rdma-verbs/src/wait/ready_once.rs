//! [`ready_once`]: the executor of a body whose every wait blocks inside its calls.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// Polls `body` once, on the calling thread, with a waker that does nothing: its output, or
/// `None` when it was pending (it is then dropped).
///
/// The executor of the blocking form of a wait written once as an `async fn`, for both forms:
/// `rdma-cm`'s pending operations (`Pending::wait`) and `rdma-proto`'s transfer driver run
/// their one body with it. In the blocking form every wait of the body blocks the thread
/// inside its call and returns a ready future, so the body is ready the first time it is
/// polled, and nothing needs to wake it. A body that awaits anything else is pending: that is
/// a bug of the body's, which `None` reports.
///
/// ```
/// use rdma_verbs::wait::ready_once;
///
/// async fn blocking_step() -> u32 { 7 } // blocks inside, if at all
/// assert_eq!(ready_once(async { blocking_step().await + 1 }), Some(8));
/// assert_eq!(ready_once(std::future::pending::<()>()), None);
/// ```
pub fn ready_once<F: Future>(body: F) -> Option<F::Output> {
    /// No one wakes a body that never waits outside its calls.
    struct Nobody;
    impl Wake for Nobody {
        fn wake(self: Arc<Self>) {}
    }
    let waker = Waker::from(Arc::new(Nobody));
    match std::pin::pin!(body).poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(out) => Some(out),
        Poll::Pending => None,
    }
}
