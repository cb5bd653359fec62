//! Pending operations: what a transition that waits for an event returns before it waited.
//!
//! Each transition that waits for the CM ([`CmId::resolve`], [`CmId::resolve_addr`],
//! [`CmId::resolve_route`], [`CmId::connect`], [`ConnectRequest::accept`],
//! [`Connection::disconnect`], [`Connection::peer_disconnect`]) returns a value that holds
//! what it consumed and does nothing yet. Finish it one of three ways:
//!
//! - [`wait(until)`](Pending::wait) blocks the thread until the event comes or `until` passes
//!   (a [`Duration`] from now or a [`Deadline`]; [`Duration::MAX`]: no deadline of ours);
//! - `wait_async(until)` (feature `tokio`) awaits the same on a Tokio runtime, the deadline a
//!   `timerfd` on the reactor (`rdma_verbs::wait::timeout_at`): a runtime built without
//!   tokio's time driver works;
//! - `.await` it (feature `tokio`, through [`IntoFuture`](std::future::IntoFuture)): awaits
//!   without a deadline of its own.
//!
//! All run the same body: the librdmacm calls, then a wait on the identifier's event channel
//! that either blocks in `poll(2)` or awaits the reactor, until the one deadline. The wait that
//! finds the deadline passed returns [`Error::Timeout`] naming the call it waited for
//! (`"rdma_resolve_addr"`, `"rdma_connect"`, ...) and the timeout the deadline was made from,
//! as it is, whichever form ran it. Dropping a pending value, or its future, destroys what it
//! holds as an error would (the identifier, which tells the peer's CM, then the QP).
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

use std::time::Duration;

mod sealed {
    pub trait Sealed {}
}

/// An operation started by a transition and not yet waited for: [`wait`](Self::wait) blocks for
/// it; with the feature `tokio`, `wait_async` or `.await` it
/// ([`IntoFuture`](std::future::IntoFuture)).
///
/// Sealed: implemented by this crate's pending values only ([module docs](crate::pending)).
pub trait Pending: sealed::Sealed + Sized {
    /// What the operation gives once it is over (named apart from
    /// [`IntoFuture::Output`](std::future::IntoFuture::Output), which is `Result<Self::Value>`).
    type Value;

    /// Waits for the operation's event until `until`, blocking the thread: a timeout from now
    /// ([`Duration::MAX`] waits without a deadline of ours) or a [`Deadline`].
    ///
    /// # Errors
    /// Those of the transition that made the value; [`Error::Timeout`] when `until` passed,
    /// naming the call waited for and the deadline's timeout. What the value held is destroyed
    /// on error.
    fn wait(self, until: impl Into<Deadline>) -> Result<Self::Value>;

    /// [`wait`](Self::wait) on the current Tokio runtime (feature `tokio`): awaits the event
    /// on the reactor until `until`, a `timerfd` on the same reactor (no tokio timer: a runtime
    /// built without its time driver works).
    ///
    /// # Errors
    /// As [`wait`](Self::wait); [`Error::NoRuntime`] outside a runtime, before any librdmacm
    /// call.
    #[cfg(feature = "tokio")]
    fn wait_async(self, until: impl Into<Deadline>) -> impl Future<Output = Result<Self::Value>> + Send;
}

/// How a pending operation's body waits for its events: blocking the thread, or on the current
/// Tokio runtime's reactor; either until one deadline.
#[derive(Clone, Copy)]
pub(crate) struct Waiting {
    until: Deadline,
    #[cfg(feature = "tokio")]
    on_runtime: bool,
}

impl Waiting {
    /// Blocking the thread until `until`.
    pub(crate) fn blocking(until: Deadline) -> Self {
        Waiting {
            until,
            #[cfg(feature = "tokio")]
            on_runtime: false,
        }
    }

    /// On the current runtime's reactor until `until`.
    #[cfg(feature = "tokio")]
    pub(crate) fn on_runtime(until: Deadline) -> Self {
        Waiting { until, on_runtime: true }
    }

    /// The same wait, `by` later (reporting the same timeout).
    pub(crate) fn extended(&self, by: Duration) -> Self {
        let mut later = *self;
        later.until = self.until.extended(by);
        later
    }

    /// The time left.
    pub(crate) fn remaining(&self) -> Duration {
        self.until.remaining()
    }

    /// Whether the deadline passed.
    pub(crate) fn has_passed(&self) -> bool {
        self.until.has_passed()
    }

    /// The timeout error of `what`, for a wait that found its deadline passed.
    pub(crate) fn timed_out(&self, what: &'static str) -> Error {
        crate::channel::timed_out(what, self.until)
    }
}

impl RawId {
    /// Takes `step` until it gives a value, waiting as `how` says between tries, and looking
    /// again at least every `every` ([`EventChannel::wait_for_every`]).
    ///
    /// [`EventChannel::wait_for_every`]: crate::channel::EventChannel::wait_for_every
    pub(crate) async fn wait_as<T>(
        &self,
        how: &Waiting,
        every: Duration,
        what: &'static str,
        step: impl FnMut() -> Result<Option<T>>,
    ) -> Result<T> {
        #[cfg(feature = "tokio")]
        if how.on_runtime {
            return self.wait_for_async(how.until, every, what, step).await;
        }
        self.wait_for_every(how.until, every, what, step)
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

/// Runs a body whose waits all block ([`Waiting::blocking`]) with rdma-verbs' ready-once
/// executor: its future is ready when first polled.
pub(crate) fn block_on<T>(body: impl Future<Output = Result<T>>) -> Result<T> {
    // A blocking wait returns before its future does: pending is unreachable by construction.
    rdma_verbs::wait::ready_once(body).expect("a blocking CM wait is ready when polled")
}

/// The future a pending value becomes with `.await` or `wait_async` (feature `tokio`).
#[cfg(feature = "tokio")]
pub type PendingFuture<'a, T> = std::pin::Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The blocking and the async shells of a pending value around its body `run(self, &Waiting)`.
macro_rules! shells {
    ($name:ident $(<$lt:lifetime>)?, $out:ty, $what:expr) => {
        impl$(<$lt>)? sealed::Sealed for $name$(<$lt>)? {}

        impl$(<$lt>)? $name$(<$lt>)? {
            /// Waits for the operation until `until`, blocking the thread ([`Pending::wait`]: a
            /// timeout from now, [`Duration::MAX`] for no deadline of ours, or a [`Deadline`]).
            ///
            /// # Errors
            /// Those of the transition that made the value; [`Error::Timeout`] when `until`
            /// passed. What the value held is destroyed on error.
            pub fn wait(self, until: impl Into<Deadline>) -> Result<$out> {
                block_on(self.run(&Waiting::blocking(until.into())))
            }
        }

        impl$(<$lt>)? Pending for $name$(<$lt>)? {
            type Value = $out;

            fn wait(self, until: impl Into<Deadline>) -> Result<$out> {
                $name::wait(self, until)
            }

            #[cfg(feature = "tokio")]
            fn wait_async(self, until: impl Into<Deadline>) -> impl Future<Output = Result<$out>> + Send {
                $name::wait_async(self, until)
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
        #[cfg(feature = "tokio")]
        impl$(<$lt>)? $ty {
            /// Awaits the operation on the current Tokio runtime until `until` ([`Pending::wait_async`]:
            /// the deadline is a `timerfd` on the reactor, no tokio timer).
            ///
            /// # Errors
            /// As [`wait`](Self::wait); [`Error::NoRuntime`] outside a runtime, before any
            /// librdmacm call.
            pub fn wait_async(self, until: impl Into<Deadline>) -> PendingFuture<$f, $out> {
                let until = until.into();
                Box::pin(async move {
                    if tokio::runtime::Handle::try_current().is_err() {
                        return Err(Error::NoRuntime { what: $what });
                    }
                    self.run(&Waiting::on_runtime(until)).await
                })
            }
        }

        /// Awaits the operation on the current Tokio runtime, without a deadline of its own
        /// (`wait_async` takes one); [`Error::NoRuntime`] outside one, before any librdmacm
        /// call. Dropping the future destroys what the value held.
        #[cfg(feature = "tokio")]
        impl$(<$lt>)? std::future::IntoFuture for $ty {
            type Output = Result<$out>;
            type IntoFuture = PendingFuture<$f, $out>;

            fn into_future(self) -> Self::IntoFuture {
                self.wait_async(Deadline::never())
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
    /// Waits for the resolution until `until`, blocking the thread ([`Pending::wait`]: a
    /// timeout from now, [`Duration::MAX`] for no deadline of ours, or a [`Deadline`]).
    ///
    /// # Errors
    /// Those of the resolution; [`Error::Timeout`] when `until` passed. The identifier is
    /// destroyed on error.
    pub fn wait(self, until: impl Into<Deadline>) -> Result<UdId<S>> {
        self.0.wait(until).map(UdId::from_cm)
    }

    /// Awaits the resolution on the current Tokio runtime until `until`
    /// ([`Pending::wait_async`]).
    ///
    /// # Errors
    /// As [`wait`](Self::wait); [`Error::NoRuntime`] outside a runtime.
    #[cfg(feature = "tokio")]
    pub fn wait_async(self, until: impl Into<Deadline>) -> impl Future<Output = Result<UdId<S>>> + Send {
        let pending = self.0.wait_async(until);
        async move { pending.await.map(UdId::from_cm) }
    }
}

impl<S: IdState, P: Pending<Value = CmId<S>>> Pending for UdResolving<P> {
    type Value = UdId<S>;

    fn wait(self, until: impl Into<Deadline>) -> Result<UdId<S>> {
        UdResolving::wait(self, until)
    }

    #[cfg(feature = "tokio")]
    fn wait_async(self, until: impl Into<Deadline>) -> impl Future<Output = Result<UdId<S>>> + Send {
        UdResolving::wait_async(self, until)
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
