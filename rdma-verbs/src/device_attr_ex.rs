//! A device's extended attributes: [`DeviceAttrEx`], [`DeviceCapabilities`],
//! [`OdpCapabilities`].

use crate::device_attr::DeviceAttr;
use crate::error::{Error, Result};
use crate::ffi;

bitflags::bitflags! {
    /// What a device can do: `device_cap_flags_ex` of `struct ibv_device_attr_ex`, the kernel's
    /// `enum ib_uverbs_device_cap_flags` (its low 32 bits are `ibv_device_attr::device_cap_flags`).
    ///
    /// Bits this crate has no name for are kept (`bits()` has them all).
    ///
    /// # References
    /// - [`ibv_query_device_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device_ex.3.html)
    /// - `include/uapi/rdma/ib_user_verbs.h` in Linux
    #[doc(alias = "ib_uverbs_device_cap_flags")]
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct DeviceCapabilities: u64 {
        /// `IB_UVERBS_DEVICE_RESIZE_MAX_WR`.
        const RESIZE_MAX_WR = 1;
        /// `IB_UVERBS_DEVICE_BAD_PKEY_CNTR`.
        const BAD_PKEY_CNTR = 1 << 1;
        /// `IB_UVERBS_DEVICE_BAD_QKEY_CNTR`.
        const BAD_QKEY_CNTR = 1 << 2;
        /// `IB_UVERBS_DEVICE_RAW_MULTI`.
        const RAW_MULTI = 1 << 3;
        /// `IB_UVERBS_DEVICE_AUTO_PATH_MIG`.
        const AUTO_PATH_MIG = 1 << 4;
        /// `IB_UVERBS_DEVICE_CHANGE_PHY_PORT`.
        const CHANGE_PHY_PORT = 1 << 5;
        /// `IB_UVERBS_DEVICE_UD_AV_PORT_ENFORCE`.
        const UD_AV_PORT_ENFORCE = 1 << 6;
        /// `IB_UVERBS_DEVICE_CURR_QP_STATE_MOD`.
        const CURR_QP_STATE_MOD = 1 << 7;
        /// `IB_UVERBS_DEVICE_SHUTDOWN_PORT`.
        const SHUTDOWN_PORT = 1 << 8;
        /// `IB_UVERBS_DEVICE_PORT_ACTIVE_EVENT`.
        const PORT_ACTIVE_EVENT = 1 << 10;
        /// `IB_UVERBS_DEVICE_SYS_IMAGE_GUID`.
        const SYS_IMAGE_GUID = 1 << 11;
        /// `IB_UVERBS_DEVICE_RC_RNR_NAK_GEN`.
        const RC_RNR_NAK_GEN = 1 << 12;
        /// `IB_UVERBS_DEVICE_SRQ_RESIZE`.
        const SRQ_RESIZE = 1 << 13;
        /// `IB_UVERBS_DEVICE_N_NOTIFY_CQ`.
        const N_NOTIFY_CQ = 1 << 14;
        /// Memory windows (type 1): `IB_UVERBS_DEVICE_MEM_WINDOW`.
        const MEM_WINDOW = 1 << 17;
        /// `IB_UVERBS_DEVICE_UD_IP_CSUM`.
        const UD_IP_CSUM = 1 << 18;
        /// XRC transport: `IB_UVERBS_DEVICE_XRC`.
        const XRC = 1 << 20;
        /// Fast registration, local invalidate, send with invalidate:
        /// `IB_UVERBS_DEVICE_MEM_MGT_EXTENSIONS`.
        const MEM_MGT_EXTENSIONS = 1 << 21;
        /// Type 2A memory windows: `IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2A`.
        const MEM_WINDOW_TYPE_2A = 1 << 23;
        /// Type 2B memory windows: `IB_UVERBS_DEVICE_MEM_WINDOW_TYPE_2B`.
        const MEM_WINDOW_TYPE_2B = 1 << 24;
        /// `IB_UVERBS_DEVICE_RC_IP_CSUM`.
        const RC_IP_CSUM = 1 << 25;
        /// `IB_UVERBS_DEVICE_RAW_IP_CSUM`.
        const RAW_IP_CSUM = 1 << 26;
        /// `IB_UVERBS_DEVICE_MANAGED_FLOW_STEERING`.
        const MANAGED_FLOW_STEERING = 1 << 29;
        /// `IB_UVERBS_DEVICE_RAW_SCATTER_FCS`.
        const RAW_SCATTER_FCS = 1 << 34;
        /// `IB_UVERBS_DEVICE_PCI_WRITE_END_PADDING`.
        const PCI_WRITE_END_PADDING = 1 << 36;
        /// RDMA FLUSH of global visibility: `IB_UVERBS_DEVICE_FLUSH_GLOBAL` (Linux 6.2).
        const FLUSH_GLOBAL = 1 << 38;
        /// RDMA FLUSH to persistence: `IB_UVERBS_DEVICE_FLUSH_PERSISTENT` (Linux 6.2).
        const FLUSH_PERSISTENT = 1 << 39;
        /// RDMA atomic write: `IB_UVERBS_DEVICE_ATOMIC_WRITE` (Linux 6.2).
        const ATOMIC_WRITE = 1 << 40;
        // Bits without a name here are kept, not dropped.
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// The operations a transport can run on on-demand-paging memory (`enum
    /// ibv_odp_transport_cap_bits`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct OdpOperations: u32 {
        /// `IBV_ODP_SUPPORT_SEND`.
        const SEND = 1;
        /// `IBV_ODP_SUPPORT_RECV`.
        const RECV = 1 << 1;
        /// `IBV_ODP_SUPPORT_WRITE`.
        const WRITE = 1 << 2;
        /// `IBV_ODP_SUPPORT_READ`.
        const READ = 1 << 3;
        /// `IBV_ODP_SUPPORT_ATOMIC`.
        const ATOMIC = 1 << 4;
        /// `IBV_ODP_SUPPORT_SRQ_RECV`.
        const SRQ_RECV = 1 << 5;
        const _ = !0;
    }
}

/// On-demand paging support (`struct ibv_odp_caps`).
#[doc(alias = "ibv_odp_caps")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct OdpCapabilities {
    /// The device pages memory in on demand at all (`IBV_ODP_SUPPORT`).
    pub supported: bool,
    /// Implicit ODP: one region over the whole address space (`IBV_ODP_SUPPORT_IMPLICIT`).
    pub implicit: bool,
    /// What RC QPs can do on ODP memory.
    pub rc: OdpOperations,
    /// What UC QPs can do on ODP memory.
    pub uc: OdpOperations,
    /// What UD QPs can do on ODP memory.
    pub ud: OdpOperations,
}

/// A device's extended attributes, from
/// [`Context::query_device_ex`](crate::Context::query_device_ex) (`struct ibv_device_attr_ex`).
///
/// On a provider without the extended query, every field past [`attr`](Self::attr) is zero, so
/// every capability reads as absent.
///
/// # References
/// - [`ibv_query_device_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device_ex.3.html)
#[doc(alias = "ibv_device_attr_ex")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttrEx {
    /// The classic attributes (`orig_attr`), as [`Context::query_device`](crate::Context::query_device) gives them.
    pub attr: DeviceAttr,
    /// What the device can do (`device_cap_flags_ex`).
    pub capabilities: DeviceCapabilities,
    /// On-demand paging (`odp_caps`).
    pub odp: OdpCapabilities,
    /// The bits of a completion's timestamp that are valid; 0 when completions carry none
    /// (`completion_timestamp_mask`).
    pub completion_timestamp_mask: u64,
    /// The frequency of the device's clock, in kHz; 0 when it has none (`hca_core_clock`).
    pub hca_core_clock_khz: u64,
    /// Most bytes of device memory one allocation may take (`max_dm_size`).
    pub max_dm_size: u64,
    /// Most memory windows (`orig_attr.max_mw`).
    pub max_mw: u32,
    /// Number of physical ports, beyond 255 too (`phys_port_cnt_ex`; 0 when the provider leaves
    /// it to [`DeviceAttr::phys_port_cnt`]).
    pub phys_port_cnt: u32,
}

impl DeviceAttrEx {
    pub(crate) fn from_raw(raw: &ffi::ibv_device_attr_ex) -> Self {
        let odp = &raw.odp_caps;
        let general = odp.general_caps;
        let per = &odp.per_transport_caps;
        DeviceAttrEx {
            attr: DeviceAttr::from_raw(&raw.orig_attr),
            capabilities: DeviceCapabilities::from_bits_retain(
                raw.device_cap_flags_ex | u64::from(raw.orig_attr.device_cap_flags),
            ),
            odp: OdpCapabilities {
                supported: general & 1 != 0,
                implicit: general & 2 != 0,
                rc: OdpOperations::from_bits_retain(per.rc_odp_caps),
                uc: OdpOperations::from_bits_retain(per.uc_odp_caps),
                ud: OdpOperations::from_bits_retain(per.ud_odp_caps),
            },
            completion_timestamp_mask: raw.completion_timestamp_mask,
            hca_core_clock_khz: raw.hca_core_clock,
            max_dm_size: raw.max_dm_size,
            max_mw: u32::try_from(raw.orig_attr.max_mw).unwrap_or(0),
            phys_port_cnt: raw.phys_port_cnt_ex,
        }
    }
}

/// A device's real-time values, from [`Context::query_rt_values`](crate::Context::query_rt_values).
///
/// # References
/// - [`ibv_query_rt_values_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_rt_values_ex.3.html)
#[doc(alias = "ibv_values_ex")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RtValues {
    /// The device's free-running clock (`raw_clock`), in the device's own units: cycles of
    /// [`DeviceAttrEx::hca_core_clock_khz`] on the devices that keep one (which report them as
    /// nanoseconds of a `timespec`, as `tv_sec * 10^9 + tv_nsec` here).
    pub raw_clock: u64,
}

impl crate::Context {
    /// The device's clock now: `ibv_query_rt_values_ex()` with `IBV_VALUES_MASK_RAW_CLOCK`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the provider has no such query or keeps no clock
    /// (`EOPNOTSUPP`: rxe on Linux 6.1 and 6.12, whose provider has no `query_rt_values`);
    /// [`Error::Verb`] with the `errno` the verb returned otherwise.
    ///
    /// # References
    /// - [`ibv_query_rt_values_ex(3)`](https://man7.org/linux/man-pages/man3/ibv_query_rt_values_ex.3.html)
    #[doc(alias = "ibv_query_rt_values_ex")]
    pub fn query_rt_values(&self) -> Result<RtValues> {
        const VERB: &str = "ibv_query_rt_values_ex";
        const RAW_CLOCK: u32 = ffi::ibv_values_mask::IBV_VALUES_MASK_RAW_CLOCK.0;
        // SAFETY: `ibv_values_ex` is integers: zero is valid.
        let mut values: ffi::ibv_values_ex = unsafe { std::mem::zeroed() };
        values.comp_mask = RAW_CLOCK;
        // SAFETY: the context is open (borrowed) and `values` is writable.
        let rc = unsafe { ffi::ibv_query_rt_values_ex(self.as_raw(), &mut values) };
        let device = Some(self.name());
        match rc {
            0 if values.comp_mask & RAW_CLOCK != 0 => {
                let t = values.raw_clock;
                let ns = u64::try_from(t.tv_sec).unwrap_or(0).saturating_mul(1_000_000_000);
                Ok(RtValues { raw_clock: ns.saturating_add(u64::try_from(t.tv_nsec).unwrap_or(0)) })
            }
            0 => Err(Error::unsupported(VERB, device, "the device did not report its raw clock")),
            libc::EOPNOTSUPP | libc::ENOSYS => Err(Error::Unsupported {
                verb: VERB,
                device: device.map(str::to_owned),
                reason: "the provider keeps no device clock (no query_rt_values)".into(),
                errno: Some(rc),
            }),
            _ => Err(Error::from_errno(VERB, device, rc)),
        }
    }
}
