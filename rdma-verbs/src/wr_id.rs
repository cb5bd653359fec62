//! The bits of a `wr_id`: who posted a request, and which of its requests it is. Every bit any
//! layer of this crate sets is defined here, and nowhere else.
//!
//! | bits 63..62 | 61 | 60..40 | 39..0 | posted by |
//! |---|---|---|---|---|
//! | `00` | the caller's | | | the caller (raw posts, and every request's own `wr_id` in a scope) |
//! | `10` | the caller's | | | a posting scope, a send ([`SCOPE_SEND`]) |
//! | `11` | the caller's | | | a posting scope, a receive ([`SCOPE_RECV`]) |
//! | `01` | `0` | generation | sequence number | a [`SendQueue`](crate::SendQueue) ([`Space::Send`]) |
//! | `01` | `1` | generation | position in the ring | a [`RecvRing`](crate::RecvRing) ([`Space::Recv`]) |
//!
//! Bits 62-63 ([`RESERVED_WR_ID_BITS`]) are refused in the caller's own `wr_id`s, so no request
//! of the caller's is ever taken for a scope's, a queue's or a ring's. A scope sets its bits on
//! the caller's `wr_id` and clears them when it hands the completion back.
//!
//! The generation tells a queue's or ring's requests from those of the previous 2^21 queues and
//! rings. It wraps, so it is defence in depth only: soundness rests on a CQ having one owner at
//! a time, which leaves it empty of its completions before letting go (`cq_owner.rs`, `CqOwner`).

use std::sync::atomic::{AtomicU64, Ordering};

/// The `wr_id` bits (62 and 63) this crate tags requests with. Requests posted outside a
/// [posting scope](crate::QueuePair::scope) must leave them clear (a scope, a
/// [`SendQueue`](crate::SendQueue) and a [`RecvRing`](crate::RecvRing) set them on their own
/// requests, to tell them from anyone else's); posting refuses a request that sets them.
pub const RESERVED_WR_ID_BITS: u64 = 0b11 << 62;

/// Bits 63..62 = `10`: a send posted by a posting scope.
pub(crate) const SCOPE_SEND: u64 = 0b10 << 62;
/// Bits 63..62 = `11`: a receive posted by a posting scope.
pub(crate) const SCOPE_RECV: u64 = 0b11 << 62;
/// Bits 63..62 = `01`: a request of a send queue or a receive ring.
const OWNED: u64 = 0b01 << 62;
/// Bit 61 of an owned request: a receive. Sends and receives never take each other's `wr_id`s,
/// whatever their generations, so a receive completion that lands on a send queue's CQ is never
/// counted.
const RECV_SPACE: u64 = 1 << 61;
const GEN_SHIFT: u32 = 40;
const GEN_MASK: u64 = (1 << 21) - 1;
/// The low bits of an owned request: a request's sequence number, or a receive's position in
/// its ring.
pub(crate) const LOW_MASK: u64 = (1 << GEN_SHIFT) - 1;

/// Whether a scope's tag is on `wr_id`, and which: `Some(true)` for a receive.
#[inline]
pub(crate) fn scope_tag(wr_id: u64) -> Option<bool> {
    match wr_id & RESERVED_WR_ID_BITS {
        SCOPE_SEND => Some(false),
        SCOPE_RECV => Some(true),
        _ => None,
    }
}

/// The caller's own `wr_id` under a scope's tag.
#[inline]
pub(crate) fn untag_scope(wr_id: u64) -> u64 {
    wr_id & !RESERVED_WR_ID_BITS
}

/// Which owned requests a tag is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Send,
    Recv,
}

/// A new generation, for a new send queue or receive ring.
pub(crate) fn next_generation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) & GEN_MASK
}

/// The `wr_id` of an owned request: `low` (a sequence number or position, kept to 40 bits) of
/// the queue or ring of `generation`.
#[inline]
pub(crate) fn tag(space: Space, generation: u64, low: u64) -> u64 {
    let space = if space == Space::Recv { RECV_SPACE } else { 0 };
    OWNED | space | generation << GEN_SHIFT | (low & LOW_MASK)
}

/// The low bits of a `wr_id` tagged in `space` by `generation`, or `None` for anyone else's.
#[inline]
pub(crate) fn untag(space: Space, wr_id: u64, generation: u64) -> Option<u64> {
    (wr_id & !(GEN_MASK << GEN_SHIFT | LOW_MASK) == tag(space, 0, 0) && (wr_id >> GEN_SHIFT) & GEN_MASK == generation)
        .then_some(wr_id & LOW_MASK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_tell_generations_spaces_and_scopes_apart() {
        let (a, b) = (next_generation(), next_generation());
        assert_ne!(a, b);
        let id = tag(Space::Send, a, 12345);
        assert_eq!(untag(Space::Send, id, a), Some(12345));
        assert_eq!(untag(Space::Send, id, b), None);
        assert_eq!(untag(Space::Recv, id, a), None, "a send is never a receive");
        assert_eq!(untag(Space::Send, tag(Space::Recv, a, 5), a), None, "a receive is never a send");
        assert_eq!(untag(Space::Recv, tag(Space::Recv, a, 5), a), Some(5));
        assert_eq!(scope_tag(id), None, "an owned request is not a scope's");
        assert_eq!(untag(Space::Send, 12345, a), None, "an untagged wr_id is nobody's");
        assert_eq!(untag(Space::Send, SCOPE_RECV | a << GEN_SHIFT | 5, a), None, "a scope's receive is not ours");
        assert_eq!(untag(Space::Send, tag(Space::Send, a, LOW_MASK + 7), a), Some(6), "sequences wrap in the low bits");
        // Generations repeat only after 2^21 queues and rings.
        let g = next_generation();
        let mut later = g;
        for _ in 0..GEN_MASK {
            later = next_generation();
        }
        assert_eq!(later, g.wrapping_sub(1) & GEN_MASK);
    }

    #[test]
    fn scope_tags_round_trip_and_stay_apart_from_owned_tags() {
        assert_eq!(scope_tag(7 | SCOPE_SEND), Some(false));
        assert_eq!(scope_tag(7 | SCOPE_RECV), Some(true));
        assert_eq!(scope_tag(7), None, "the caller's own wr_id");
        assert_eq!(untag_scope(7 | SCOPE_RECV), 7);
        assert_eq!(SCOPE_SEND | SCOPE_RECV | OWNED, RESERVED_WR_ID_BITS, "every tag lies in the reserved bits");
    }
}
