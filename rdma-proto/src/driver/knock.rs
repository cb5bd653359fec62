//! KNOCK ([`wire::Knock`]): the early proof of the secret that a sender puts in its session's
//! first connect request, and the receiver's check of it.
//!
//! A receiver decides who gets a connection place when the request arrives, before any
//! message can be exchanged; the challenge-response of [`crate::auth`] comes later. A request
//! whose KNOCK proves the secret is a secret holder's: it keeps its place from the start, and
//! takes the place of a connection that has proved nothing, however young (`places.rs`). So
//! peers without the secret cannot keep a secret holder out, at any rate of new connections.
//!
//! The proof binds a random id and the sender's clock. The receiver takes a knock only within
//! [`KNOCK_WINDOW`] of its own clock, and each id once ([`Knocks`]), so a knock seen on the
//! path cannot be used again. A knock the receiver does not take (clocks too far apart, a
//! repeated id, no secret here) costs nothing: the request is served as one without a knock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::auth::Secret;
use crate::wire::{self, Knock, Message};

/// How far apart the two sides' clocks may be for a knock to be taken (as Kerberos's default
/// skew); also how long a receiver remembers the knocks it took.
pub(super) const KNOCK_WINDOW: Duration = Duration::from_secs(300);

/// The most knocks a receiver remembers at once: past that, a new knock (from a holder of the
/// secret, who alone can make valid ones) is served as a request without one.
const REMEMBERED: usize = 4096;

/// Seconds since the Unix epoch (0 for a clock before it).
fn unix_seconds(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The private data of a session's first connect request for a sender with `secret`, made
/// at `now`.
pub(super) fn knock(secret: &Secret, now: SystemTime) -> Vec<u8> {
    let id = u64::from_be_bytes(super::random_bytes());
    let time = unix_seconds(now);
    let mut out = Vec::with_capacity(wire::KNOCK_LEN);
    wire::encode(id, &Message::Knock(Knock { time, mac: secret.knock_mac(id, time) }), &mut out)
        .expect("a KNOCK always encodes");
    out
}

/// The knocks a receiver took within the window, by id: each is taken once.
#[derive(Debug, Default)]
pub(super) struct Knocks(Mutex<HashMap<u64, u64>>);

impl Knocks {
    /// Whether the connect request whose private data is `private_data` proves `secret` by a
    /// knock made within [`KNOCK_WINDOW`] of `now` whose id was not taken before (it is taken
    /// now). `false` without a secret, and for anything else.
    pub(super) fn vouches(&self, secret: Option<&Secret>, private_data: &[u8], now: SystemTime) -> bool {
        let Some(secret) = secret else { return false };
        let Ok((h, Message::Knock(k))) = wire::decode(private_data) else { return false };
        let now = unix_seconds(now);
        if now.abs_diff(k.time) > KNOCK_WINDOW.as_secs() || !secret.verify_knock(&k.mac, h.session, k.time) {
            return false;
        }
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        seen.retain(|_, t| now.abs_diff(*t) <= KNOCK_WINDOW.as_secs());
        if seen.len() >= REMEMBERED || seen.contains_key(&h.session) {
            tracing::info!(id = format_args!("{:016x}", h.session), "a knock not taken (repeated, or too many)");
            return false;
        }
        seen.insert(h.session, k.time);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(b: u8) -> Secret {
        Secret::new(&[b; 32]).unwrap()
    }

    #[test]
    fn a_knock_vouches_once_with_the_same_secret_and_a_near_clock() {
        let now = SystemTime::now();
        let knocks = Knocks::default();
        let k = knock(&secret(1), now);
        assert_eq!(k.len(), wire::KNOCK_LEN);
        assert!(!knocks.vouches(None, &k, now), "no secret here: no vouching");
        assert!(!knocks.vouches(Some(&secret(2)), &k, now), "another secret");
        assert!(knocks.vouches(Some(&secret(1)), &k, now + Duration::from_secs(200)));
        assert!(!knocks.vouches(Some(&secret(1)), &k, now), "a knock is taken once");
        let late = knock(&secret(1), now);
        assert!(!knocks.vouches(Some(&secret(1)), &late, now + KNOCK_WINDOW + Duration::from_secs(2)));
        let early = knock(&secret(1), now + KNOCK_WINDOW + Duration::from_secs(2));
        assert!(!knocks.vouches(Some(&secret(1)), &early, now));
    }

    #[test]
    fn a_changed_knock_does_not_vouch() {
        let now = SystemTime::now();
        let k = knock(&secret(1), now);
        for i in wire::HEADER_LEN - 8..k.len() {
            let mut bad = k.clone();
            bad[i] ^= 1;
            assert!(!Knocks::default().vouches(Some(&secret(1)), &bad, now), "byte {i} changed");
        }
        assert!(!Knocks::default().vouches(Some(&secret(1)), &k[..k.len() - 1], now));
    }
}
