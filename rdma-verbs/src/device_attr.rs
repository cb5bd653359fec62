//! Device attributes and limits: [`DeviceAttr`].

use std::ffi::CStr;

use crate::ffi;

/// A device's attributes and limits, from [`Context::query_device`](crate::Context::query_device).
///
/// Limits are what the device accepts at most; this crate checks requests against them and
/// reports [`Error::InvalidArgument`](crate::Error::InvalidArgument) before calling a verb.
///
/// # References
/// - [`ibv_query_device(3)`](https://man7.org/linux/man-pages/man3/ibv_query_device.3.html)
#[doc(alias = "ibv_device_attr")]
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttr {
    /// Firmware version string.
    pub fw_ver: String,
    /// Node GUID, host byte order.
    pub node_guid: u64,
    /// System image GUID, host byte order.
    pub sys_image_guid: u64,
    /// Largest memory region, in bytes.
    pub max_mr_size: u64,
    /// Page sizes the device supports (a bit per size).
    pub page_size_cap: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor's part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Most queue pairs.
    pub max_qp: u32,
    /// Most outstanding work requests on one queue.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries in one work request.
    pub max_sge: u32,
    /// Most completion queues.
    pub max_cq: u32,
    /// Most entries in one completion queue.
    pub max_cqe: u32,
    /// Most memory regions.
    pub max_mr: u32,
    /// Most protection domains.
    pub max_pd: u32,
    /// Most outstanding RDMA READ / atomic requests a QP can be the target of.
    pub max_qp_rd_atom: u32,
    /// Most outstanding RDMA READ / atomic requests a QP can initiate.
    pub max_qp_init_rd_atom: u32,
    /// Most shared receive queues.
    pub max_srq: u32,
    /// Most outstanding work requests on one SRQ.
    pub max_srq_wr: u32,
    /// Most address handles.
    pub max_ah: u32,
    /// Number of physical ports (numbered from 1).
    pub phys_port_cnt: u8,
}

fn limit(v: libc::c_int) -> u32 {
    u32::try_from(v).unwrap_or(0)
}

impl DeviceAttr {
    pub(crate) fn from_raw(raw: &ffi::ibv_device_attr) -> Self {
        // SAFETY: `fw_ver` is a NUL-terminated string in a fixed array (zeroed before the verb).
        let fw_ver = unsafe { CStr::from_ptr(raw.fw_ver.as_ptr()) };
        DeviceAttr {
            fw_ver: fw_ver.to_string_lossy().into_owned(),
            node_guid: u64::from_be(raw.node_guid),
            sys_image_guid: u64::from_be(raw.sys_image_guid),
            max_mr_size: raw.max_mr_size,
            page_size_cap: raw.page_size_cap,
            vendor_id: raw.vendor_id,
            vendor_part_id: raw.vendor_part_id,
            hw_ver: raw.hw_ver,
            max_qp: limit(raw.max_qp),
            max_qp_wr: limit(raw.max_qp_wr),
            max_sge: limit(raw.max_sge),
            max_cq: limit(raw.max_cq),
            max_cqe: limit(raw.max_cqe),
            max_mr: limit(raw.max_mr),
            max_pd: limit(raw.max_pd),
            max_qp_rd_atom: limit(raw.max_qp_rd_atom),
            max_qp_init_rd_atom: limit(raw.max_qp_init_rd_atom),
            max_srq: limit(raw.max_srq),
            max_srq_wr: limit(raw.max_srq_wr),
            max_ah: limit(raw.max_ah),
            phys_port_cnt: raw.phys_port_cnt,
        }
    }
}
