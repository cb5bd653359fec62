//! Pending operations: what a transition that waits for an event returns before it waited.
//!
//! Each transition that waits for the CM ([`CmId::resolve`], [`CmId::resolve_addr`],
//! [`CmId::resolve_route`], [`CmId::connect`], [`ConnectRequest::accept`],
//! [`Connection::disconnect`], [`Connection::peer_disconnect`]) returns a value that holds
//! what it consumed and does nothing yet. Finish it one of two ways:
//!
//! - [`wait(timeout)`](Pending::wait) blocks the thread until the event comes or `timeout`
//!   passes ([`Duration::MAX`]: no deadline of ours);
//! - `.await` it (feature `tokio`, through [`IntoFuture`](std::future::IntoFuture)) on a Tokio
//!   runtime, without a timeout of its own: bound it with `tokio::time::timeout`.
//!
//! Both run the same body: the librdmacm calls, then a wait on the identifier's event channel
//! that either blocks in `poll(2)` or awaits the reactor. Dropping a pending value, or its
//! future, destroys what it holds as an error would (the identifier, which tells the peer's CM,
//! then the QP).
//!
//! ```no_run
//! # fn f(qp: rdma_cm::verbs::QueuePair<'_, rdma_cm::verbs::Rc, rdma_cm::verbs::Init>,
//! #      id: rdma_cm::CmId<rdma_cm::RouteResolved>) -> rdma_cm::Result<()> {
//! use rdma_cm::ConnParams;
//! use std::time::Duration;
//! let conn = id.connect(qp, &ConnParams::new()).wait(Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! [`CmId::resolve`]: crate::CmId::resolve
//! [`CmId::resolve_addr`]: crate::CmId::resolve_addr
//! [`CmId::resolve_route`]: crate::CmId::resolve_route
//! [`CmId::connect`]: crate::CmId::connect
//! [`ConnectRequest::accept`]: crate::ConnectRequest::accept
//! [`Connection::disconnect`]: crate::Connection::disconnect
//! [`Connection::peer_disconnect`]: crate::Connection::peer_disconnect

use crate::error::{Error, Result};
use crate::event::RawEvent;
use crate::raw_id::RawId;
use crate::{
    AddressResolved, ClosedConnection, CmId, ConnParams, ConnectRequest, Connection, IdState, Membership,
    RouteResolved, UdId, UdPeer,
};
use rdma_verbs::{Deadline, Init, QueuePair, Rc, ReadyToSend, Ud};
use std::future::Future;
use std::net::SocketAddr;

use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

mod sealed {
    pub trait Sealed {}
}

/// An operation started by a transition and not yet waited for: [`wait`](Self::wait) blocks for
/// it; with the feature `tokio`, `.await` it ([`IntoFuture`](std::future::IntoFuture)).
///
/// Sealed: implemented by this crate's pending values only ([module docs](crate::pending)).
pub trait Pending: sealed::Sealed + Sized {
    /// What the operation gives once it is over (named apart from
    /// [`IntoFuture::Output`](std::future::IntoFuture::Output), which is `Result<Self::Value>`).
    type Value;

    /// Waits up to `timeout` for the operation's event, blocking the thread
    /// ([`Duration::MAX`] waits without a deadline of ours).
    ///
    /// # Errors
    /// Those of the transition that made the value; [`Error::Timeout`] when `timeout` passed.
    /// What the value held is destroyed on error.
    fn wait(self, timeout: Duration) -> Result<Self::Value>;
}

/// How a pending operation's body waits for its events.
pub(crate) enum Waiting {
    /// Blocking the thread until `deadline`; errors report `timeout`, the whole wait.
    Until { deadline: Deadline, timeout: Duration },
    /// On the current Tokio runtime's reactor, without a deadline.
    #[cfg(feature = "tokio")]
    Runtime,
}

impl Waiting {
    pub(crate) fn until(timeout: Duration) -> Self {
        Waiting::Until { deadline: Deadline::after(timeout), timeout }
    }

    /// The same wait with `by` more time (the same timeout reported).
    pub(crate) fn extended(&self, by: Duration) -> Self {
        match self {
            Waiting::Until { deadline, timeout } => {
                Waiting::Until { deadline: Deadline::after(deadline.remaining().saturating_add(by)), timeout: *timeout }
            }
            #[cfg(feature = "tokio")]
            Waiting::Runtime => Waiting::Runtime,
        }
    }

    /// The time left: all there is on the runtime (the caller bounds the future).
    pub(crate) fn remaining(&self) -> Duration {
        match self {
            Waiting::Until { deadline, .. } => deadline.remaining(),
            #[cfg(feature = "tokio")]
            Waiting::Runtime => Duration::MAX,
        }
    }

    /// Whether the deadline passed (never on the runtime).
    pub(crate) fn has_passed(&self) -> bool {
        match self {
            Waiting::Until { deadline, .. } => deadline.has_passed(),
            #[cfg(feature = "tokio")]
            Waiting::Runtime => false,
        }
    }

    /// The timeout error of `what`, for the whole wait.
    pub(crate) fn timed_out(&self, what: &'static str) -> Error {
        let after = match self {
            Waiting::Until { timeout, .. } => *timeout,
            #[cfg(feature = "tokio")]
            Waiting::Runtime => Duration::MAX,
        };
        Error::Timeout { what, device: None, after }
    }
}

impl RawId {
    /// Takes `step` until it gives a value, waiting as `how` says between tries, and looking
    /// again at least every `every` while blocking ([`EventChannel::wait_for_every`]; the
    /// async form wakes only for the channel).
    ///
    /// [`EventChannel::wait_for_every`]: crate::channel::EventChannel::wait_for_every
    pub(crate) async fn wait_as<T>(
        &self,
        how: &Waiting,
        every: Duration,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        match how {
            Waiting::Until { deadline, .. } => match self.wait_for_every(deadline.remaining(), every, what, step) {
                Err(Error::Timeout { .. }) => Err(how.timed_out(what)),
                waited => waited,
            },
            #[cfg(feature = "tokio")]
            Waiting::Runtime => self.wait_for_async(what, step).await,
        }
    }

    /// Waits as `how` says for an event of kind `want` ([`expect`](RawId::expect)).
    pub(crate) async fn expect_as(
        &self,
        how: &Waiting,
        want: crate::EventKind,
        what: &'static str,
        state: &'static str,
        peer: SocketAddr,
    ) -> Result<RawEvent> {
        self.wait_as(how, Duration::MAX, what, || self.expect_step(want, state, peer)).await
    }

    /// [`expect_as`](Self::expect_as), with a failure event read by `refusal` first
    /// ([`RawId::expect_step_or`]).
    pub(crate) async fn expect_as_or(
        &self,
        how: &Waiting,
        want: crate::EventKind,
        (what, state): (&'static str, &'static str),
        peer: SocketAddr,
        refusal: impl Fn(&RawEvent) -> Option<Error>,
    ) -> Result<RawEvent> {
        self.wait_as(how, Duration::MAX, what, || self.expect_step_or(want, state, peer, &refusal)).await
    }
}

/// Runs a body whose waits all block (`Waiting::Until`): its future is ready when first polled.
pub(crate) fn block_on<F: Future>(body: F) -> F::Output {
    /// No task to wake: nothing in a blocking body is pending.
    struct Nobody;
    impl Wake for Nobody {
        fn wake(self: std::sync::Arc<Self>) {}
    }
    let waker = Waker::from(std::sync::Arc::new(Nobody));
    let mut body = std::pin::pin!(body);
    match body.as_mut().poll(&mut Context::from_waker(&waker)) {
        Poll::Ready(out) => out,
        // A blocking wait returns before its future does: unreachable by construction.
        Poll::Pending => unreachable!("a blocking CM wait was pending"),
    }
}

/// The future a pending value becomes with `.await` (feature `tokio`).
#[cfg(feature = "tokio")]
pub type PendingFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The blocking and the async shell of a pending value around its body `run(self, &Waiting)`.
macro_rules! shells {
    ($name:ident $(<$lt:lifetime>)?, $out:ty, $what:expr) => {
        impl$(<$lt>)? sealed::Sealed for $name$(<$lt>)? {}

        impl$(<$lt>)? $name$(<$lt>)? {
            /// Waits up to `timeout` for the operation, blocking the thread ([`Pending::wait`];
            /// [`Duration::MAX`] waits without a deadline of ours).
            ///
            /// # Errors
            /// Those of the transition that made the value; [`Error::Timeout`] when `timeout`
            /// passed. What the value held is destroyed on error.
            pub fn wait(self, timeout: Duration) -> Result<$out> {
                block_on(self.run(&Waiting::until(timeout)))
            }
        }

        impl$(<$lt>)? Pending for $name$(<$lt>)? {
            type Value = $out;

            fn wait(self, timeout: Duration) -> Result<$out> {
                $name::wait(self, timeout)
            }
        }

        shells!(@future $name $(<$lt>)?, $out, $what);
    };
    (@future $name:ident <$lt:lifetime>, $out:ty, $what:expr) => {
        shells!(@future_impl [$lt] $name<$lt>, $lt, $out, $what);
    };
    (@future $name:ident, $out:ty, $what:expr) => {
        shells!(@future_impl [] $name, 'static, $out, $what);
    };
    (@future_impl [$($lt:lifetime)?] $ty:ty, $f:lifetime, $out:ty, $what:expr) => {
        /// Awaits the operation on the current Tokio runtime, without a timeout of its own
        /// (bound it with `tokio::time::timeout`); [`Error::NoRuntime`] outside one, before any
        /// librdmacm call. Dropping the future destroys what the value held.
        #[cfg(feature = "tokio")]
        impl$(<$lt>)? std::future::IntoFuture for $ty {
            type Output = Result<$out>;
            type IntoFuture = PendingFuture<$f, $out>;

            fn into_future(self) -> Self::IntoFuture {
                Box::pin(async move {
                    if tokio::runtime::Handle::try_current().is_err() {
                        return Err(Error::NoRuntime { what: $what });
                    }
                    self.run(&Waiting::Runtime).await
                })
            }
        }
    };
}

/// The connection parameters a pending connect or accept uses when it runs, its private data
/// copied (at most [`MAX_ACCEPT_PRIVATE_DATA`](crate::MAX_ACCEPT_PRIVATE_DATA) bytes are sent).
#[derive(Debug)]
pub(crate) struct OwnedParams {
    private: Vec<u8>,
    params: ConnParams<'static>,
}

impl OwnedParams {
    pub(crate) fn new(params: &ConnParams<'_>) -> Self {
        let private = params.private_data.to_vec();
        OwnedParams { private, params: ConnParams { private_data: &[], ..*params } }
    }

    pub(crate) fn get(&self) -> ConnParams<'_> {
        ConnParams { private_data: &self.private, ..self.params }
    }
}

/// [`CmId::resolve_addr`]'s pending resolution of an address: gives the identifier in
/// [`AddressResolved`] ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct ResolvingAddress {
    pub(crate) id: CmId<crate::Idle>,
    pub(crate) src: Option<SocketAddr>,
    pub(crate) dst: SocketAddr,
}
shells!(ResolvingAddress, CmId<AddressResolved>, "rdma_resolve_addr");

/// [`CmId::resolve_route`]'s pending resolution of a route: gives the identifier in
/// [`RouteResolved`] ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct ResolvingRoute {
    pub(crate) id: CmId<AddressResolved>,
}
shells!(ResolvingRoute, CmId<RouteResolved>, "rdma_resolve_route");

/// [`CmId::resolve`]'s pending resolution of an address, then its route, within one wait: gives
/// the identifier in [`RouteResolved`] ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct Resolving {
    pub(crate) addr: ResolvingAddress,
}
shells!(Resolving, CmId<RouteResolved>, "rdma_resolve_addr");

impl Resolving {
    async fn run(self, how: &Waiting) -> Result<CmId<RouteResolved>> {
        let id = self.addr.run(how).await?;
        ResolvingRoute { id }.run(how).await
    }
}

/// [`CmId::connect`]'s pending connection: gives the [`Connection`] once the peer accepted and
/// the QP is ready ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct Connecting<'res> {
    pub(crate) id: CmId<RouteResolved>,
    pub(crate) qp: QueuePair<'res, Rc, Init>,
    pub(crate) params: OwnedParams,
}
shells!(Connecting<'res>, Connection<'res>, "rdma_connect");

/// [`ConnectRequest::accept`]'s pending acceptance: gives the [`Connection`] once it is
/// established ([`Pending`]; a blocking wait may also give up on a check,
/// [`wait_while`](Accepting::wait_while)).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct Accepting<'res> {
    pub(crate) req: ConnectRequest,
    pub(crate) qp: QueuePair<'res, Rc, Init>,
    pub(crate) params: OwnedParams,
}
shells!(Accepting<'res>, Connection<'res>, "rdma_accept");

/// [`Connection::disconnect`]'s pending disconnect: gives the [`ClosedConnection`] once the
/// peer answered ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct Disconnecting<'res> {
    pub(crate) conn: Connection<'res>,
}
shells!(Disconnecting<'res>, ClosedConnection<'res>, "rdma_disconnect");

/// [`Connection::peer_disconnect`]'s pending wait for the peer to leave: gives the
/// [`ClosedConnection`] once it did ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct PeerDisconnect<'res> {
    pub(crate) conn: Connection<'res>,
}
shells!(PeerDisconnect<'res>, ClosedConnection<'res>, "rdma_disconnect");

/// A pending resolution of a [`UdId`]'s address or route: the same body as the connection
/// identifier's ([`ResolvingAddress`], [`ResolvingRoute`], [`Resolving`]), giving the UD
/// identifier in the next state ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct UdResolving<P>(pub(crate) P);

impl<S: IdState, P: Pending<Value = CmId<S>>> sealed::Sealed for UdResolving<P> {}

impl<S: IdState, P: Pending<Value = CmId<S>>> UdResolving<P> {
    /// Waits up to `timeout` for the resolution, blocking the thread ([`Pending::wait`];
    /// [`Duration::MAX`] waits without a deadline of ours).
    ///
    /// # Errors
    /// Those of the resolution; [`Error::Timeout`] when `timeout` passed. The identifier is
    /// destroyed on error.
    pub fn wait(self, timeout: Duration) -> Result<UdId<S>> {
        self.0.wait(timeout).map(UdId::from_cm)
    }
}

impl<S: IdState, P: Pending<Value = CmId<S>>> Pending for UdResolving<P> {
    type Value = UdId<S>;

    fn wait(self, timeout: Duration) -> Result<UdId<S>> {
        UdResolving::wait(self, timeout)
    }
}

/// Awaits the resolution on the current Tokio runtime, as the connection identifier's does.
#[cfg(feature = "tokio")]
impl<S, P> std::future::IntoFuture for UdResolving<P>
where
    S: IdState,
    P: Pending<Value = CmId<S>> + std::future::IntoFuture<Output = Result<CmId<S>>> + Send + 'static,
    P::IntoFuture: Send,
{
    type Output = Result<UdId<S>>;
    type IntoFuture = PendingFuture<'static, UdId<S>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move { self.0.await.map(UdId::from_cm) })
    }
}

/// [`UdId::resolve_peer`]'s pending service ID resolution: gives the [`UdPeer`] once the peer's
/// CM answered ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct ResolvingPeer {
    pub(crate) id: UdId<RouteResolved>,
    pub(crate) private_data: Vec<u8>,
}
shells!(ResolvingPeer, UdPeer, "rdma_connect");

/// [`UdId::join`]'s pending join of a multicast group: gives the [`Membership`] once the CM
/// answered and the QP is attached ([`Pending`]).
#[derive(Debug)]
#[must_use = "a pending operation does nothing until it is waited for or awaited"]
pub struct Joining<'a> {
    pub(crate) id: &'a mut UdId<AddressResolved>,
    pub(crate) qp: &'a QueuePair<'a, Ud, ReadyToSend>,
    pub(crate) group: SocketAddr,
}
shells!(Joining<'a>, Membership<'a>, "rdma_join_multicast");
