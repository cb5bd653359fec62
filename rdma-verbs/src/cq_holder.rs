//! Who holds a completion queue's completions: [`CqHolder`] (the rules of holding are in
//! `cq_owner.rs`).

use std::fmt;

/// Who holds a completion queue (see [`Error::Busy`](crate::Error::Busy)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
#[repr(u8)]
pub enum CqHolder {
    /// A posting scope ([`QueuePair::scope`](crate::QueuePair::scope)) on a QP of the CQ.
    PostingScope = 1,
    /// A [`SendQueue`](crate::SendQueue) of a QP of the CQ.
    SendQueue = 2,
    /// A [`RecvRing`](crate::RecvRing) whose receives complete on the CQ.
    RecvRing = 3,
}

impl CqHolder {
    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(CqHolder::PostingScope),
            2 => Some(CqHolder::SendQueue),
            3 => Some(CqHolder::RecvRing),
            _ => None,
        }
    }
}

impl fmt::Display for CqHolder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CqHolder::PostingScope => "a posting scope",
            CqHolder::SendQueue => "a SendQueue",
            CqHolder::RecvRing => "a RecvRing",
        })
    }
}
