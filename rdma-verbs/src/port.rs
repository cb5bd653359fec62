//! Port attributes: [`PortAttr`], [`PortState`], [`Mtu`], [`LinkLayer`].

use crate::ffi;

/// The attributes of one port, from [`Context::query_port`](crate::Context::query_port).
///
/// # References
/// - [`ibv_query_port(3)`](https://man7.org/linux/man-pages/man3/ibv_query_port.3.html)
#[doc(alias = "ibv_port_attr")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttr {
    /// The logical port state.
    pub state: PortState,
    /// The largest MTU the port supports.
    pub max_mtu: Mtu,
    /// The MTU in use: the path MTU a connected QP on this port may use.
    pub active_mtu: Mtu,
    /// The number of entries of the port's GID table.
    pub gid_table_len: u32,
    /// The largest message the port can send, in bytes.
    pub max_msg_size: u32,
    /// The port's LID (InfiniBand only; 0 on RoCE).
    pub lid: u16,
    /// The physical state (`5` is `LinkUp`).
    pub phys_state: u8,
    /// InfiniBand or Ethernet (RoCE).
    pub link_layer: LinkLayer,
    /// The port's capabilities (`port_cap_flags`, `enum ibv_port_cap_flags`: bit 16
    /// `IBV_PORT_CM_SUP` says the connection manager works on it).
    pub port_cap_flags: u32,
    /// More capabilities (`port_cap_flags2`, `enum ibv_port_cap_flags2`): from the extended
    /// query, 0 where the provider has only the original one.
    pub port_cap_flags2: u16,
    /// The link width (`active_width`: 1 1x, 2 4x, 4 8x, 8 12x, 16 2x).
    pub active_width: u8,
    /// The lane speed (`active_speed`: 1 SDR 2.5 Gb/s, 2 DDR, 4 QDR, 8 FDR10, 16 FDR, 32 EDR,
    /// 64 HDR, 128 NDR).
    pub active_speed: u8,
    /// Whether the port needs a GRH on every packet (`flags` & `IBV_QPF_GRH_REQUIRED`).
    pub grh_required: bool,
    /// The partition key table's length.
    pub pkey_table_len: u16,
    /// How many virtual lanes the port has (`max_vl_num`).
    pub max_vl_num: u8,
    /// The subnet manager's LID (InfiniBand; 0 on RoCE).
    pub sm_lid: u16,
    /// The subnet manager's service level (InfiniBand).
    pub sm_sl: u8,
    /// The LID mask count (InfiniBand).
    pub lmc: u8,
    /// Packets dropped for a bad partition key (`bad_pkey_cntr`).
    pub bad_pkey_counter: u32,
    /// Packets dropped for a bad Q_Key (`qkey_viol_cntr`).
    pub qkey_violation_counter: u32,
}

/// `IB_UVERBS_QPF_GRH_REQUIRED`, a bit of `ibv_port_attr::flags`.
const GRH_REQUIRED: u8 = 1;

impl PortAttr {
    pub(crate) fn from_raw(raw: &ffi::ibv_port_attr) -> Self {
        PortAttr {
            state: PortState::from_raw(raw.state),
            max_mtu: Mtu::from_raw(raw.max_mtu),
            active_mtu: Mtu::from_raw(raw.active_mtu),
            gid_table_len: u32::try_from(raw.gid_tbl_len).unwrap_or(0),
            max_msg_size: raw.max_msg_sz,
            lid: raw.lid,
            phys_state: raw.phys_state,
            link_layer: LinkLayer::from_raw(raw.link_layer),
            port_cap_flags: raw.port_cap_flags,
            port_cap_flags2: raw.port_cap_flags2,
            active_width: raw.active_width,
            active_speed: raw.active_speed,
            grh_required: raw.flags & GRH_REQUIRED != 0,
            pkey_table_len: raw.pkey_tbl_len,
            max_vl_num: raw.max_vl_num,
            sm_lid: raw.sm_lid,
            sm_sl: raw.sm_sl,
            lmc: raw.lmc,
            bad_pkey_counter: raw.bad_pkey_cntr,
            qkey_violation_counter: raw.qkey_viol_cntr,
        }
    }
}

/// A port's logical state (`enum ibv_port_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PortState {
    /// `IBV_PORT_NOP`: reserved.
    Nop,
    /// `IBV_PORT_DOWN`: the link is down.
    Down,
    /// `IBV_PORT_INIT`: the link is up but not yet configured by a subnet manager.
    Init,
    /// `IBV_PORT_ARMED`: configured, not yet active.
    Armed,
    /// `IBV_PORT_ACTIVE`: ready to carry traffic.
    Active,
    /// `IBV_PORT_ACTIVE_DEFER`: active, but deferring to a failover.
    ActiveDefer,
    /// A value this crate does not know.
    Other(u32),
}

impl PortState {
    fn from_raw(raw: ffi::ibv_port_state::Type) -> Self {
        use ffi::ibv_port_state::*;
        match raw {
            IBV_PORT_NOP => PortState::Nop,
            IBV_PORT_DOWN => PortState::Down,
            IBV_PORT_INIT => PortState::Init,
            IBV_PORT_ARMED => PortState::Armed,
            IBV_PORT_ACTIVE => PortState::Active,
            IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
            other => PortState::Other(other),
        }
    }
}

/// A path MTU (`enum ibv_mtu`): the payload size of one RDMA packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Mtu {
    /// 256 bytes (`IBV_MTU_256`).
    Mtu256,
    /// 512 bytes (`IBV_MTU_512`).
    Mtu512,
    /// 1024 bytes (`IBV_MTU_1024`).
    Mtu1024,
    /// 2048 bytes (`IBV_MTU_2048`).
    Mtu2048,
    /// 4096 bytes (`IBV_MTU_4096`).
    Mtu4096,
    /// A value this crate does not know.
    Other(u32),
}

impl Mtu {
    pub(crate) fn from_raw(raw: ffi::ibv_mtu::Type) -> Self {
        use ffi::ibv_mtu::*;
        match raw {
            IBV_MTU_256 => Mtu::Mtu256,
            IBV_MTU_512 => Mtu::Mtu512,
            IBV_MTU_1024 => Mtu::Mtu1024,
            IBV_MTU_2048 => Mtu::Mtu2048,
            IBV_MTU_4096 => Mtu::Mtu4096,
            other => Mtu::Other(other),
        }
    }

    /// The `enum ibv_mtu` value, as QP attributes take it.
    pub fn as_raw(self) -> ffi::ibv_mtu::Type {
        use ffi::ibv_mtu::*;
        match self {
            Mtu::Mtu256 => IBV_MTU_256,
            Mtu::Mtu512 => IBV_MTU_512,
            Mtu::Mtu1024 => IBV_MTU_1024,
            Mtu::Mtu2048 => IBV_MTU_2048,
            Mtu::Mtu4096 => IBV_MTU_4096,
            Mtu::Other(raw) => raw,
        }
    }

    /// The MTU in bytes, or `None` for a value this crate does not know.
    pub fn bytes(self) -> Option<u32> {
        match self {
            Mtu::Other(_) => None,
            known => Some(128 << known.as_raw()),
        }
    }
}

/// What a port's link runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum LinkLayer {
    /// `IBV_LINK_LAYER_UNSPECIFIED`: older drivers report this for InfiniBand.
    Unspecified,
    /// `IBV_LINK_LAYER_INFINIBAND`.
    InfiniBand,
    /// `IBV_LINK_LAYER_ETHERNET`: RoCE, including Soft-RoCE (rxe).
    Ethernet,
    /// A value this crate does not know.
    Other(u8),
}

impl LinkLayer {
    fn from_raw(raw: u8) -> Self {
        // The IBV_LINK_LAYER_* values are #defines in verbs.h, which bindgen does not carry.
        match raw {
            0 => LinkLayer::Unspecified,
            1 => LinkLayer::InfiniBand,
            2 => LinkLayer::Ethernet,
            other => LinkLayer::Other(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtu_bytes_match_the_enum() {
        assert_eq!(Mtu::from_raw(1).bytes(), Some(256));
        assert_eq!(Mtu::from_raw(3).bytes(), Some(1024));
        assert_eq!(Mtu::from_raw(5), Mtu::Mtu4096);
        assert_eq!(Mtu::Mtu4096.bytes(), Some(4096));
        assert_eq!(Mtu::from_raw(9), Mtu::Other(9));
        assert_eq!(Mtu::Other(9).bytes(), None);
        for raw in 1..=5 {
            assert_eq!(Mtu::from_raw(raw).as_raw(), raw);
        }
    }
}
