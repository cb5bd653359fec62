//! GIDs: [`Gid`], [`GidType`], [`GidEntry`].

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::ffi;

/// A 128-bit global identifier (`union ibv_gid`). On RoCE it is an IPv6 address; a RoCE v2 GID
/// of an IPv4 address is that address mapped into IPv6 (`::ffff:a.b.c.d`).
#[doc(alias = "ibv_gid")]
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The GID as an IPv6 address.
    pub fn to_ipv6(self) -> Ipv6Addr {
        Ipv6Addr::from(self.0)
    }

    /// The IPv4 address this GID maps (`::ffff:a.b.c.d`), if it is an IPv4-mapped GID.
    pub fn to_ipv4_mapped(self) -> Option<Ipv4Addr> {
        self.to_ipv6().to_ipv4_mapped()
    }

    /// Whether every byte is zero (an unused table slot).
    pub fn is_zero(self) -> bool {
        self.0 == [0; 16]
    }

    /// The GID in libibverbs' representation.
    pub fn as_raw(self) -> ffi::ibv_gid {
        ffi::ibv_gid { raw: self.0 }
    }

    pub(crate) fn from_raw(raw: &ffi::ibv_gid) -> Self {
        // SAFETY: every variant of the union is 16 plain bytes.
        Gid(unsafe { raw.raw })
    }
}

impl From<Ipv6Addr> for Gid {
    fn from(addr: Ipv6Addr) -> Self {
        Gid(addr.octets())
    }
}

impl From<Ipv4Addr> for Gid {
    /// The RoCE v2 GID of an IPv4 address: `::ffff:a.b.c.d`.
    fn from(addr: Ipv4Addr) -> Self {
        Gid(addr.to_ipv6_mapped().octets())
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.to_ipv6(), f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

/// Which protocol a GID table entry is for (`enum ibv_gid_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GidType {
    /// `IBV_GID_TYPE_IB`: InfiniBand.
    InfiniBand,
    /// `IBV_GID_TYPE_ROCE_V1`: RoCE v1 (Ethernet frames, not routable).
    RoceV1,
    /// `IBV_GID_TYPE_ROCE_V2`: RoCE v2 (UDP/IP, routable).
    RoceV2,
    /// A value this crate does not know.
    Other(u32),
}

impl GidType {
    fn from_raw(raw: u32) -> Self {
        use crate::ffi_compat::{IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2};
        match raw {
            IBV_GID_TYPE_IB => GidType::InfiniBand,
            IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            other => GidType::Other(other),
        }
    }
}

/// One valid entry of a port's GID table (`struct ibv_gid_entry`).
///
/// # References
/// - [`ibv_query_gid_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_gid_ex.3.html)
#[doc(alias = "ibv_gid_entry")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GidEntry {
    /// The GID.
    pub gid: Gid,
    /// Its index in the port's table: what QP attributes call `sgid_index` (perftest's `-x`).
    pub index: u8,
    /// The port it belongs to.
    pub port: u8,
    /// The protocol it is for.
    pub gid_type: GidType,
    /// The network interface (ifindex) it belongs to on RoCE; `None` on InfiniBand.
    pub netdev_ifindex: Option<u32>,
}

impl GidEntry {
    /// `None` for an entry past index 255 or port 255, which no QP or address handle can name
    /// (their `sgid_index` and `port_num` are 8 bits).
    pub(crate) fn from_raw(raw: &ffi::ibv_gid_entry) -> Option<Self> {
        Some(GidEntry {
            gid: Gid::from_raw(&raw.gid),
            index: u8::try_from(raw.gid_index).ok()?,
            port: u8::try_from(raw.port_num).ok()?,
            gid_type: GidType::from_raw(raw.gid_type),
            netdev_ifindex: (raw.ndev_ifindex != 0).then_some(raw.ndev_ifindex),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_maps_to_roce_v2_gid_and_back() {
        let addr = Ipv4Addr::new(10, 77, 0, 1);
        let gid = Gid::from(addr);
        assert_eq!(gid.0[10..], [0xff, 0xff, 10, 77, 0, 1]);
        assert_eq!(gid.to_string(), "::ffff:10.77.0.1");
        assert_eq!(gid.to_ipv4_mapped(), Some(addr));
        assert!(!gid.is_zero());
    }

    #[test]
    fn link_local_gid_is_not_ipv4() {
        let gid = Gid::from("fe80::24:13ff:fec5:518f".parse::<Ipv6Addr>().unwrap());
        assert_eq!(gid.to_ipv4_mapped(), None);
        assert_eq!(Gid::from_raw(&gid.as_raw()), gid);
        assert!(Gid::default().is_zero());
    }
}
