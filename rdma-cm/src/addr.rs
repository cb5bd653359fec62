//! Conversions between `std::net::SocketAddr` and the C socket addresses librdmacm takes.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A socket address laid out for C: `struct sockaddr_storage`.
pub(crate) struct RawAddr(libc::sockaddr_storage);

impl RawAddr {
    pub(crate) fn new(addr: SocketAddr) -> Self {
        // SAFETY: `sockaddr_storage` is plain integers: all-zero is a valid (AF_UNSPEC) value.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from(*a.ip()).to_be() },
                    sin_zero: [0; 8],
                };
                // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in`.
                unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin) };
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: `sockaddr_storage` is larger than and aligned for `sockaddr_in6`.
                unsafe { std::ptr::write(std::ptr::addr_of_mut!(storage).cast(), sin6) };
            }
        }
        RawAddr(storage)
    }

    /// A pointer for librdmacm, which takes `struct sockaddr *` (and only reads through it).
    pub(crate) fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        std::ptr::addr_of_mut!(self.0).cast()
    }
}

/// Reads a socket address that librdmacm filled in. `None` for families other than IPv4 and IPv6
/// (or `AF_UNSPEC`, not yet set).
///
/// # Safety
/// `sa` must point to a readable `struct sockaddr_storage`-sized buffer.
pub(crate) unsafe fn from_raw(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees a readable storage-sized buffer; every field read is an
    // integer, so any bit pattern is valid, and `read_unaligned` copes with any alignment.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let sin: libc::sockaddr_in = std::ptr::read_unaligned(sa.cast());
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                let sin6: libc::sockaddr_in6 = std::ptr::read_unaligned(sa.cast());
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    sin6.sin6_flowinfo,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_survive_the_round_trip_through_c() {
        for text in ["10.77.0.1:7471", "0.0.0.0:0", "[fe80::1%3]:20886", "[::1]:1"] {
            let addr: SocketAddr = text.parse().unwrap();
            let mut raw = RawAddr::new(addr);
            // SAFETY: `raw` is a whole sockaddr_storage.
            assert_eq!(unsafe { from_raw(raw.as_mut_ptr()) }, Some(addr), "{text}");
        }
    }

    #[test]
    fn ports_are_in_network_order() {
        let mut raw = RawAddr::new("1.2.3.4:258".parse().unwrap());
        // SAFETY: an AF_INET address was written.
        let sin: libc::sockaddr_in = unsafe { std::ptr::read(raw.as_mut_ptr().cast()) };
        assert_eq!(sin.sin_port.to_ne_bytes(), [1, 2]);
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [1, 2, 3, 4]);
    }
}
