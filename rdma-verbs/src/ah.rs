//! Address vectors and handles: [`AddressVector`], [`AddressHandle`].

use std::ptr::NonNull;

use crate::ffi;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::gid::Gid;
use crate::parent::Parent;
use crate::pd::ProtectionDomain;
use crate::wc::{WcOpcode, WorkCompletion};

/// The size of the Global Routing Header that starts every UD receive's buffer (`struct
/// ibv_grh`): on RoCE v2 over IPv4 its last 20 bytes are the packet's IPv4 header.
pub const GRH_LEN: usize = 40;

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

    /// The address that answers the sender of a received UD datagram: the reverse of the path
    /// its completion and Global Routing Header describe (`ibv_init_ah_from_wc()`; the GID the
    /// datagram came from, the local GID it was sent to, the traffic class and flow label).
    /// `port` is the local port of the QP that received it; `grh` is the receive buffer's
    /// first [`GRH_LEN`] bytes (more may follow: the payload, which is not read), as
    /// [`SlotMessage::bytes`](crate::SlotMessage::bytes) gives them. Both are copied before
    /// libibverbs reads them.
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(ctx: &Context, msg: &SlotMessage<'_>) -> Result<()> {
    /// let back = AddressVector::from_wc(ctx, 1, msg.completion(), msg.bytes())?;
    /// println!("from {:?}", back.dgid.to_ipv4_mapped());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `wc` is not a successful receive, when it carries a GRH
    /// and `grh` is shorter than [`GRH_LEN`], or for a port the device does not have;
    /// [`Error::Verb`] when libibverbs cannot make an address of it (no local GID matches the
    /// datagram's destination, say).
    ///
    /// # References
    /// - [`ibv_init_ah_from_wc(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah_from_wc.3.html)
    ///   (with `ibv_create_ah_from_wc`)
    #[doc(alias = "ibv_init_ah_from_wc")]
    pub fn from_wc(ctx: &Context, port: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<Self> {
        let verb = "ibv_init_ah_from_wc";
        let (mut wc, mut grh) = reply_args(ctx, verb, port, wc, grh)?;
        // SAFETY: all-zero is a valid `ibv_ah_attr` (integers and a struct of them).
        let mut attr: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: a live context; `wc` is a copy with `ibv_wc`'s layout (`WorkCompletion` is
        // `repr(transparent)` over it), `grh` a whole `ibv_grh` of our own, `attr` a valid
        // out-pointer; libibverbs reads the first two and writes the third, keeping none.
        let rc = unsafe {
            ffi::ibv_init_ah_from_wc(ctx.as_raw(), port, (&mut wc as *mut WorkCompletion).cast(), &mut grh, &mut attr)
        };
        if rc != 0 {
            // libibverbs returns -1 with errno set, or a positive errno.
            let errno =
                if rc > 0 { rc } else { std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EINVAL) };
            return Err(Error::from_errno(verb, Some(ctx.name()), errno));
        }
        Ok(AddressVector::from_raw(&attr))
    }

    /// The address an `ibv_ah_attr` describes (its flow label, path bits and static rate,
    /// which this type does not carry, dropped).
    pub(crate) fn from_raw(attr: &ffi::ibv_ah_attr) -> Self {
        AddressVector {
            port: attr.port_num,
            dgid: if attr.is_global != 0 { Gid::from_raw(&attr.grh.dgid) } else { Gid::default() },
            sgid_index: attr.grh.sgid_index,
            hop_limit: attr.grh.hop_limit,
            traffic_class: attr.grh.traffic_class,
            service_level: attr.sl,
            dlid: attr.dlid,
        }
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

    /// Creates the address handle that answers the sender of a received UD datagram:
    /// `ibv_create_ah_from_wc()` ([`AddressHandle::from_wc`]).
    ///
    /// # Errors
    /// As [`AddressHandle::from_wc`].
    #[doc(alias = "ibv_create_ah_from_wc")]
    pub fn create_ah_from_wc(&self, port: u8, wc: &WorkCompletion, grh: &[u8]) -> Result<AddressHandle<'_>> {
        AddressHandle::from_wc(self, port, wc, grh)
    }
}

/// Checks the arguments of a reply's address (see [`AddressVector::from_wc`]) and copies them:
/// the completion, and the GRH into a whole `ibv_grh` (zeroed when the completion has none).
fn reply_args(
    ctx: &Context,
    verb: &'static str,
    port: u8,
    wc: &WorkCompletion,
    grh: &[u8],
) -> Result<(WorkCompletion, ffi::ibv_grh)> {
    ctx.check_port_arg(verb, port)?;
    let invalid = |reason: String| Error::invalid(verb, Some(ctx.name()), reason);
    if !wc.is_success() || wc.opcode() != WcOpcode::Recv {
        let what = if wc.is_success() { format!("{:?}", wc.opcode()) } else { format!("{:?}", wc.status()) };
        return Err(invalid(format!("the completion (wr_id {}) is not a successful receive: {what}", wc.wr_id())));
    }
    // SAFETY: all-zero is a valid `ibv_grh` (integers and GID unions of bytes).
    let mut raw: ffi::ibv_grh = unsafe { std::mem::zeroed() };
    if wc.has_grh() {
        let Some(bytes) = grh.get(..GRH_LEN) else {
            return Err(invalid(format!(
                "the completion carries a GRH, the first {GRH_LEN} bytes of the receive buffer; {} given",
                grh.len()
            )));
        };
        // SAFETY: `raw` is `GRH_LEN` bytes (the bindings check `ibv_grh`'s size), `bytes` as
        // many, and they cannot overlap (`raw` is a local).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut raw as *mut ffi::ibv_grh).cast::<u8>(), GRH_LEN) };
    }
    Ok((*wc, raw))
}

const _: () = assert!(std::mem::size_of::<ffi::ibv_grh>() == GRH_LEN);

impl<'pd> AddressHandle<'pd> {
    /// Creates the address handle that answers the sender of a received UD datagram, in `pd`
    /// (borrowed or shared, see [`Parent`]): `ibv_create_ah_from_wc()`. `port`, `wc` and `grh`
    /// are as for [`AddressVector::from_wc`]; send the reply to `wc.src_qp()` with the Q_Key
    /// the two sides agreed on.
    ///
    /// ```no_run
    /// # use rdma_verbs::*;
    /// # fn f(pd: &ProtectionDomain<'_>, msg: &SlotMessage<'_>, qkey: u32) -> Result<()> {
    /// let back = AddressHandle::from_wc(pd, 1, msg.completion(), msg.bytes())?;
    /// // ... SendRequest::send(id, &sges).to(&back, msg.src_qp(), qkey)
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`AddressVector::from_wc`]; [`Error::Verb`] (`ibv_create_ah_from_wc`) when the handle
    /// cannot be made.
    ///
    /// # References
    /// - [`ibv_create_ah_from_wc(3)`](https://man7.org/linux/man-pages/man3/ibv_create_ah_from_wc.3.html)
    #[doc(alias = "ibv_create_ah_from_wc")]
    pub fn from_wc(
        pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>,
        port: u8,
        wc: &WorkCompletion,
        grh: &[u8],
    ) -> Result<Self> {
        let verb = "ibv_create_ah_from_wc";
        let pd = pd.into();
        let (mut wc, mut grh) = reply_args(pd.context(), verb, port, wc, grh)?;
        // SAFETY: a live PD (held by `pd`); `wc` and `grh` are our own copies with libibverbs'
        // layouts (see `AddressVector::from_wc`), read during the call only.
        let raw =
            unsafe { ffi::ibv_create_ah_from_wc(pd.as_raw(), (&mut wc as *mut WorkCompletion).cast(), &mut grh, port) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error(verb, Some(pd.context().name())))?;
        pd.context().registry().add(crate::registry::Kind::Ah, raw.as_ptr());
        Ok(AddressHandle { raw, pd })
    }

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
