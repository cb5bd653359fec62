//! A receiver's limits on one session, from its options: its share of the memory budget, how
//! long its connection may take to be established, and how long its teardown waits.

use std::time::Duration;

use super::seats::DISPLACED_TEARDOWN;

/// How long a session's teardown waits for its ACK to complete, and for the sender to
/// disconnect.
pub const TEARDOWN_WAIT: Duration = Duration::from_secs(5);

/// One session's share of a receiver's `memory_budget` shared by `max_sessions`: the largest
/// chunk it may be granted (at most `max_chunk`) and the budget of its ring. A session holds
/// its ring (`slot_count × slot_size`, within the ring's budget) and one slot-sized copy
/// buffer; the two together stay within `memory_budget / max_sessions`, so all sessions
/// together stay within `memory_budget`. The chunk is at most half the share, so that a ring
/// of at least one slot fits beside its copy.
pub fn session_memory(memory_budget: u64, max_sessions: usize, max_chunk: u32) -> (u32, u64) {
    let share = memory_budget / max_sessions.max(1) as u64;
    let chunk = u64::from(max_chunk).min(share / 2).max(1);
    (chunk as u32, share.saturating_sub(chunk).max(chunk))
}

/// How long a new connection may take to be established: its HELLO's clock
/// (`hello_timeout`) runs from its request on, so that a peer that never completes the
/// connection holds its place no longer than one that completes it and sends nothing.
pub fn hello_bound(accept_timeout: Duration, hello_timeout: Duration) -> Duration {
    accept_timeout.min(hello_timeout)
}

/// How long a session's teardown waits in all: [`TEARDOWN_WAIT`] (at most the session's
/// `timeout`), and not at all for a connection that gave its place to a newer one
/// (`displaced`): it proved nothing, and its peer's pace must not keep it among the
/// connections still leaving. A session that gave its seat to a newer one (`gave_way`) waits
/// [`DISPLACED_TEARDOWN`] at most: the newer one waits for that seat.
pub fn teardown_wait(displaced: bool, gave_way: bool, timeout: Duration) -> Duration {
    if displaced {
        Duration::ZERO
    } else if gave_way {
        DISPLACED_TEARDOWN.min(timeout)
    } else {
        TEARDOWN_WAIT.min(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn every_session_s_ring_and_copy_stay_within_its_share_of_the_budget() {
        for (budget, sessions, max_chunk) in
            [(256 * MIB, 8, 1 << 20), (256 * MIB, 8, 64 << 20), (MIB, 64, 1 << 20), (0, 0, 1 << 20), (100, 3, 7)]
        {
            let (chunk, ring) = session_memory(budget, sessions, max_chunk);
            let share = budget / sessions.max(1) as u64;
            assert!(chunk >= 1 && chunk <= max_chunk, "{budget} {sessions}: chunk {chunk}");
            assert!(ring >= u64::from(chunk), "a ring of at least one slot");
            if share >= 2 {
                assert!(u64::from(chunk) <= share / 2 && ring + u64::from(chunk) <= share, "{budget} {sessions}");
            }
        }
        assert_eq!(session_memory(256 * MIB, 8, 1 << 20), (1 << 20, 31 * MIB), "the defaults: 32 MiB each");
    }

    #[test]
    fn a_displaced_connection_waits_for_nothing_and_one_that_gave_way_less_than_others() {
        let timeout = Duration::from_secs(30);
        assert_eq!(teardown_wait(true, true, timeout), Duration::ZERO);
        assert_eq!(teardown_wait(false, true, timeout), DISPLACED_TEARDOWN);
        assert_eq!(teardown_wait(false, false, timeout), TEARDOWN_WAIT);
        assert_eq!(teardown_wait(false, false, Duration::from_secs(1)), Duration::from_secs(1), "at most timeout");
        assert_eq!(hello_bound(Duration::from_secs(30), Duration::from_secs(10)), Duration::from_secs(10));
    }
}
