//! Address vectors and handles: [`AddressVector`], [`AddressHandle`].

use std::ptr::NonNull;

use crate::ffi;

use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::parent::Parent;
use crate::pd::ProtectionDomain;

/// Where packets go: the remote port's GID (RoCE) or LID (InfiniBand), and how to get there
/// (`struct ibv_ah_attr`). Used by connected QPs' `ReadyToReceive` transition and by UD address
/// handles.
#[doc(alias = "ibv_ah_attr")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressVector {
    /// The local port the packets leave from.
    pub port: u8,
    /// The destination GID (RoCE: the peer's IP address as a GID).
    pub dgid: Gid,
    /// The index of the local GID to send from (perftest's `-x`).
    pub sgid_index: u8,
    /// IP hop limit (TTL); 64 unless routing needs more.
    pub hop_limit: u8,
    /// IP traffic class.
    pub traffic_class: u8,
    /// Service level (RoCE: priority).
    pub service_level: u8,
    /// Destination LID: InfiniBand only, 0 on RoCE.
    pub dlid: u16,
}

impl AddressVector {
    /// A RoCE (global) address: to `dgid`, from local GID `sgid_index` of `port`.
    pub fn roce(port: u8, dgid: Gid, sgid_index: u8) -> Self {
        AddressVector { port, dgid, sgid_index, hop_limit: 64, traffic_class: 0, service_level: 0, dlid: 0 }
    }

    pub(crate) fn to_raw(self) -> ffi::ibv_ah_attr {
        ffi::ibv_ah_attr {
            grh: ffi::ibv_global_route {
                dgid: self.dgid.as_raw(),
                flow_label: 0,
                sgid_index: self.sgid_index,
                hop_limit: self.hop_limit,
                traffic_class: self.traffic_class,
            },
            dlid: self.dlid,
            sl: self.service_level,
            src_path_bits: 0,
            static_rate: 0,
            is_global: u8::from(!self.dgid.is_zero()),
            port_num: self.port,
        }
    }
}

/// An address handle (`struct ibv_ah`) for UD sends; destroyed on drop.
///
/// # References
/// - [`ibv_create_ah(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah.3.html)
#[doc(alias = "ibv_ah")]
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct AddressHandle<'pd> {
    raw: NonNull<ffi::ibv_ah>,
    pd: Parent<'pd, ProtectionDomain<'pd>>,
}

// SAFETY: an AH is immutable after creation; verbs using it are thread-safe.
unsafe impl Send for AddressHandle<'_> {}
// SAFETY: as above.
unsafe impl Sync for AddressHandle<'_> {}

impl ProtectionDomain<'_> {
    /// Creates an address handle: `ibv_create_ah()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a port the device does not have; [`Error::Verb`] when the
    /// destination cannot be resolved or creation fails.
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah(&self, av: &AddressVector) -> Result<AddressHandle<'_>> {
        AddressHandle::new(self, av)
    }
}

impl<'pd> AddressHandle<'pd> {
    /// Creates an address handle in `pd`, borrowed or shared (see [`Parent`]): `ibv_create_ah()`.
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_ah`].
    ///
    /// # References
    /// - [`ibv_create_ah(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah.3.html)
    #[doc(alias = "ibv_create_ah")]
    pub fn new(pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>, av: &AddressVector) -> Result<Self> {
        let pd = pd.into();
        pd.context().check_port_arg("ibv_create_ah", av.port)?;
        let mut attr = av.to_raw();
        // SAFETY: live PD (held by `pd`) and a fully initialised attribute struct.
        let raw = unsafe { ffi::ibv_create_ah(pd.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_create_ah", Some(pd.context().name())))?;
        pd.context().registry().add(crate::registry::Kind::Ah, raw.as_ptr());
        Ok(AddressHandle { raw, pd })
    }
}

impl AddressHandle<'_> {
    /// The raw `struct ibv_pd *` of the protection domain it was made in.
    pub(crate) fn pd_raw(&self) -> *mut ffi::ibv_pd {
        self.pd.as_raw()
    }

    /// The raw `struct ibv_ah *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_ah {
        self.raw.as_ptr()
    }
}

impl Drop for AddressHandle<'_> {
    #[doc(alias = "ibv_destroy_ah")]
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_ah`, destroyed only here. Requests in flight do not use
        // the handle's memory (providers copy the address, or look the handle up by number, at
        // post time), so destroying it can at worst make such a request fail.
        let _ = self
            .pd
            .context()
            .registry()
            .release(self.raw.as_ptr(), || unsafe { ffi::ibv_destroy_ah(self.raw.as_ptr()) });
    }
}
