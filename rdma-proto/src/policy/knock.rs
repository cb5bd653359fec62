//! KNOCK ([`wire::Knock`]): the early proof of the secret that a sender puts in its session's
//! first connect request, and the receiver's check of it.
//!
//! A receiver decides who gets a connection place when the request arrives, before any
//! message can be exchanged; the challenge-response of [`crate::auth`] comes later. A request
//! whose KNOCK proves the secret is a secret holder's: it keeps its place from the start, and
//! takes the place of a connection that has proved nothing, however young ([`super::places`]). So
//! connections that prove nothing cannot take a secret holder's place.
//!
//! The proof binds a random id, the sender's clock, the sender's address and the listener's
//! address and port (`Secret::knock_mac`). A receiver takes a knock only for a request from
//! that address to that listener, made within [`KNOCK_WINDOW`] of its own clock and not
//! before the receiver started (by its clock), and each id once ([`Knocks`]). Both addresses
//! are read from the request, which the sender writes: a request crafted to claim them can
//! replay a harvested knock at another receiver with the secret on the same port that listens
//! on a wildcard address (one bound to its own address checks the destination), and a restart
//! within the knock's second, or a sender's clock ahead of the receiver's, lets a knock be
//! used again after a restart. Each such use gives one request a place for at most
//! `hello_timeout`. A knock the receiver does not take costs nothing: the request is served
//! as one without it.
//!
//! No I/O: the knock's id and both clocks are given.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::auth::Secret;
use crate::wire::{self, Knock, Message};

/// How far apart the two sides' clocks may be for a knock to be taken; also how long a
/// receiver remembers the knocks it took.
pub const KNOCK_WINDOW: Duration = Duration::from_secs(120);

/// The most knocks a receiver remembers at once (about 136 knocked requests a second over the
/// window): past that, a new knock (from a holder of the secret, who alone can make valid ones)
/// is served as a request without one, and the receiver says so once.
const REMEMBERED: usize = 16384;

/// Seconds since the Unix epoch (0 for a clock before it).
fn unix_seconds(now: SystemTime) -> u64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The private data of a session's first connect request for a sender with `secret` at
/// `from`, to the listener `to`, made at `now`; `id` is random (the receiver takes each id
/// once).
pub fn knock(secret: &Secret, id: u64, now: SystemTime, from: IpAddr, to: SocketAddr) -> Vec<u8> {
    let time = unix_seconds(now);
    let mut out = Vec::with_capacity(wire::KNOCK_LEN);
    wire::encode(id, &Message::Knock(Knock { time, mac: secret.knock_mac(id, time, from, to) }), &mut out)
        .expect("a KNOCK always encodes");
    out
}

/// The knocks a receiver took within the window, by id: each is taken once.
#[derive(Debug)]
pub struct Knocks {
    /// When the receiver started (Unix seconds): an older knock is not taken, so that one
    /// used before a restart cannot be used again.
    started: u64,
    /// Ids taken, with their knocks' times.
    seen: Mutex<HashMap<u64, u64>>,
    /// Whether the receiver said that it remembers no more.
    said_full: AtomicBool,
}

impl Knocks {
    /// The knocks of a receiver started at `started`.
    pub fn new(started: SystemTime) -> Self {
        Knocks { started: unix_seconds(started), seen: Mutex::new(HashMap::new()), said_full: AtomicBool::new(false) }
    }

    /// Whether the connect request from `from` to the listener `to` whose private data is
    /// `private_data` proves `secret` by a knock made within [`KNOCK_WINDOW`] of `now`, not
    /// before this receiver started, whose id was not taken before (it is taken now). `false`
    /// without a secret, and for anything else.
    pub fn vouches(
        &self,
        secret: Option<&Secret>,
        private_data: &[u8],
        from: IpAddr,
        to: SocketAddr,
        now: SystemTime,
    ) -> bool {
        let Some(secret) = secret else { return false };
        let Ok((h, Message::Knock(k))) = wire::decode(private_data) else { return false };
        let now = unix_seconds(now);
        if now.abs_diff(k.time) > KNOCK_WINDOW.as_secs()
            || k.time < self.started
            || !secret.verify_knock(&k.mac, h.session, k.time, from, to)
        {
            return false;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= REMEMBERED {
            seen.retain(|_, t| now.abs_diff(*t) <= KNOCK_WINDOW.as_secs());
        }
        if seen.contains_key(&h.session) {
            log!(info, id = format_args!("{:016x}", h.session), "a knock used before: not taken");
            return false;
        }
        if seen.len() >= REMEMBERED {
            if !self.said_full.swap(true, Ordering::Relaxed) {
                log!(
                    warn,
                    "{REMEMBERED} knocks taken within {KNOCK_WINDOW:?}: more are served as requests without one"
                );
            }
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

    const FROM: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 77, 0, 2));

    fn to() -> SocketAddr {
        "10.77.0.1:7471".parse().unwrap()
    }

    fn knocks(started: SystemTime) -> Knocks {
        Knocks::new(started)
    }

    #[test]
    fn a_knock_vouches_once_with_the_same_secret_and_a_near_clock() {
        let now = SystemTime::now();
        let taken = knocks(now - Duration::from_secs(10));
        let k = knock(&secret(1), 1, now, FROM, to());
        assert_eq!(k.len(), wire::KNOCK_LEN);
        assert!(!taken.vouches(None, &k, FROM, to(), now), "no secret here: no vouching");
        assert!(!taken.vouches(Some(&secret(2)), &k, FROM, to(), now), "another secret");
        assert!(taken.vouches(Some(&secret(1)), &k, FROM, to(), now + Duration::from_secs(100)));
        assert!(!taken.vouches(Some(&secret(1)), &k, FROM, to(), now), "a knock is taken once");
        let late = knock(&secret(1), 2, now, FROM, to());
        assert!(!taken.vouches(Some(&secret(1)), &late, FROM, to(), now + KNOCK_WINDOW + Duration::from_secs(2)));
        let early = knock(&secret(1), 3, now + KNOCK_WINDOW + Duration::from_secs(2), FROM, to());
        assert!(!taken.vouches(Some(&secret(1)), &early, FROM, to(), now));
    }

    #[test]
    fn a_knock_vouches_only_from_its_address_to_its_listener_after_the_receiver_started() {
        let now = SystemTime::now();
        let k = knock(&secret(1), 4, now, FROM, to());
        let other_ip: IpAddr = "10.77.0.3".parse().unwrap();
        assert!(!knocks(now).vouches(Some(&secret(1)), &k, other_ip, to(), now), "another sender address");
        let other_port: SocketAddr = "10.77.0.1:7472".parse().unwrap();
        assert!(!knocks(now).vouches(Some(&secret(1)), &k, FROM, other_port, now), "another listener");
        // The same knock at a receiver started after it was made (a restart): not taken.
        assert!(!knocks(now + Duration::from_secs(1)).vouches(Some(&secret(1)), &k, FROM, to(), now));
        // An IPv4 sender seen as IPv4-mapped IPv6 by a listener on [::] is the same sender.
        let mapped = IpAddr::V6(std::net::Ipv4Addr::new(10, 77, 0, 2).to_ipv6_mapped());
        let to_mapped = SocketAddr::new(IpAddr::V6(std::net::Ipv4Addr::new(10, 77, 0, 1).to_ipv6_mapped()), 7471);
        assert!(knocks(now).vouches(Some(&secret(1)), &k, mapped, to_mapped, now));
    }

    #[test]
    fn a_changed_knock_does_not_vouch() {
        let now = SystemTime::now();
        let k = knock(&secret(1), 5, now, FROM, to());
        for i in wire::HEADER_LEN - 8..k.len() {
            let mut bad = k.clone();
            bad[i] ^= 1;
            assert!(!knocks(now).vouches(Some(&secret(1)), &bad, FROM, to(), now), "byte {i} changed");
        }
        assert!(!knocks(now).vouches(Some(&secret(1)), &k[..k.len() - 1], FROM, to(), now));
    }
}
