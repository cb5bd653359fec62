//! A receiver's own policy (`ReceiveOptions::policy` of the driver): an
//! embedder's rule that sees each file or directory a sender offers, before anything is opened
//! or made for it, and accepts or refuses it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::Status;

/// What a sender offers: a single file, or one entry of a batch. A policy is asked once per
/// offer, after the receiver's own checks (names, sizes, the secret) passed and before
/// anything is opened or made for it.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Offer<'a> {
    /// The sender's address.
    pub peer: SocketAddr,
    /// Whether the sender proved the receiver's secret (always `false` without one).
    pub authenticated: bool,
    /// Where it would be stored, relative to the destination: a single file's name, or a
    /// batch entry's path (components separated by `/`).
    pub path: &'a str,
    /// A directory (a batch's directory entry), else a file.
    pub directory: bool,
    /// The file's size in bytes (0 for a directory).
    pub size: u64,
    /// An entry of a batch (else the session's single file).
    pub in_batch: bool,
}

/// A policy's answer to an [`Offer`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Decision {
    /// Receive it, as the receiver's own limits allow.
    Accept,
    /// Refuse it: the sender is answered `status` (never [`Status::Ok`]: that is taken as
    /// [`Status::NotAuthorized`]) with `detail`, and nothing is opened. In a batch only this
    /// entry is refused; the batch goes on.
    Refuse {
        /// The verdict the sender hears.
        status: Status,
        /// Why, in a sentence (cut to [`crate::wire::MAX_DETAIL_LEN`] bytes on the wire).
        detail: String,
    },
}

impl Decision {
    /// A refusal with `status` and `detail`.
    pub fn refuse(status: Status, detail: impl Into<String>) -> Decision {
        Decision::Refuse { status, detail: detail.into() }
    }
}

/// An embedder's policy: a function from an [`Offer`] to a [`Decision`], called from the
/// session's thread (or task), so it must be quick and must not block. Cheap to clone.
///
/// # Examples
/// ```
/// # #[cfg(feature = "driver")] {
/// use rdma_proto::driver::{Decision, Policy, ReceiveOptions};
/// use rdma_proto::Status;
///
/// let mut opts = ReceiveOptions::default();
/// // Only senders that proved the secret may store anything larger than 1 GiB.
/// opts.policy = Some(Policy::new(|offer| {
///     if offer.size > 1 << 30 && !offer.authenticated {
///         Decision::refuse(Status::TooLarge, "files over 1 GiB need the secret")
///     } else {
///         Decision::Accept
///     }
/// }));
/// # }
/// ```
#[derive(Clone)]
pub struct Policy(Arc<dyn Fn(&Offer<'_>) -> Decision + Send + Sync>);

impl Policy {
    /// A policy that answers with `f`.
    pub fn new(f: impl Fn(&Offer<'_>) -> Decision + Send + Sync + 'static) -> Policy {
        Policy(Arc::new(f))
    }

    /// Asks the policy about `offer`: `None` to go on, or the refusal's status (never `Ok`)
    /// and detail.
    #[cfg_attr(not(feature = "driver"), allow(dead_code))]
    pub(crate) fn judge(&self, offer: &Offer<'_>) -> Option<(Status, String)> {
        match (self.0)(offer) {
            Decision::Accept => None,
            Decision::Refuse { status: Status::Ok, detail } => Some((Status::NotAuthorized, detail)),
            Decision::Refuse { status, detail } => Some((status, detail)),
        }
    }
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Policy(..)")
    }
}
