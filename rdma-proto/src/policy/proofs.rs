//! Wrong proofs of the secret by address (the driver's `ReceiveOptions::auth_attempts` within
//! `auth_window`): a token bucket per address that holds back the answers to an address that
//! keeps guessing, so that guessing the secret online is slow, while an honest sender that
//! mistyped it a few times is answered at once. No I/O: the time is given.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Wrong proofs of the secret by address: when each address's window began, and its count.
#[derive(Debug, Default)]
pub struct WrongProofs(Mutex<HashMap<IpAddr, (Instant, u32)>>);

impl WrongProofs {
    /// Addresses remembered at most: past it, the one with the fewest wrong proofs is forgotten.
    /// Entries are pruned only then, not on every call, so that a call costs no scan of them
    /// all while wrong proofs from many addresses still cannot grow the table without bound.
    pub const MOST: usize = 4096;

    /// Counts a wrong proof from `ip` at `now`; how long its answer is held back: nothing for
    /// the first `attempts` within `window`, then 1 s doubling, up to the time the bucket takes
    /// to refill one (`window / attempts`).
    pub fn wrong_proof(&self, ip: IpAddr, now: Instant, attempts: u32, window: Duration) -> Duration {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= Self::MOST && !map.contains_key(&ip) {
            map.retain(|_, (since, _)| now.saturating_duration_since(*since) < window);
            // The address with the fewest wrong proofs goes (the oldest of them), never one that
            // is held back while others have fewer.
            let least = map.iter().min_by_key(|(_, (since, n))| (*n, *since)).map(|(ip, _)| *ip);
            if let (Some(least), true) = (least, map.len() >= Self::MOST) {
                map.remove(&least);
            }
        }
        let e = map.entry(ip).or_insert((now, 0));
        if now.saturating_duration_since(e.0) >= window {
            *e = (now, 0);
        }
        e.1 = e.1.saturating_add(1);
        let past = e.1.saturating_sub(attempts);
        if past == 0 {
            return Duration::ZERO;
        }
        let most = window / attempts.max(1);
        Duration::from_secs(1u64 << (past - 1).min(16)).min(most)
    }

    /// Addresses remembered now.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no address is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    const WINDOW: Duration = Duration::from_secs(60);

    #[test]
    fn answers_are_held_back_past_the_attempts_allowed_doubling_up_to_the_refill_time() {
        let (proofs, t0, me) = (WrongProofs::default(), Instant::now(), IpAddr::V6(Ipv6Addr::LOCALHOST));
        let holds: Vec<u64> = (0..12).map(|_| proofs.wrong_proof(me, t0, 5, WINDOW).as_secs()).collect();
        assert_eq!(holds, [0, 0, 0, 0, 0, 1, 2, 4, 8, 12, 12, 12], "12 s: the window over 5 attempts");
        assert_eq!(proofs.wrong_proof(me, t0 + WINDOW, 5, WINDOW), Duration::ZERO, "a new window");
    }

    /// The wrong proofs of many addresses are remembered up to a bound, while each address's
    /// own count still holds its answers back.
    #[test]
    fn wrong_proofs_from_many_addresses_are_remembered_up_to_a_bound() {
        let (proofs, now) = (WrongProofs::default(), Instant::now());
        let ip = |n: u32| IpAddr::V6(Ipv6Addr::from(u128::from(n)));
        for n in 0..WrongProofs::MOST as u32 + 100 {
            assert_eq!(proofs.wrong_proof(ip(n), now, 5, WINDOW), Duration::ZERO);
        }
        assert_eq!(proofs.len(), WrongProofs::MOST);
        let me = ip(u32::MAX);
        let holds: Vec<_> = (0..7).map(|_| proofs.wrong_proof(me, now, 5, WINDOW)).collect();
        assert!(holds[..5].iter().all(|h| h.is_zero()), "{holds:?}");
        assert_eq!(holds[5..], [Duration::from_secs(1), Duration::from_secs(2)]);
        assert!(proofs.len() <= WrongProofs::MOST);
        // A flood from as many new addresses does not make it forget the one held back.
        for n in 0..WrongProofs::MOST as u32 {
            proofs.wrong_proof(ip(1 << 20 | n), now, 5, WINDOW);
        }
        assert_eq!(proofs.wrong_proof(me, now, 5, WINDOW), Duration::from_secs(4));
    }
}
