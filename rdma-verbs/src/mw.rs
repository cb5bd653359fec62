//! Memory windows: [`MemoryWindow`], [`BoundWindow`], [`WindowType`].
//!
//! A memory window grants a peer access to a part of a memory region, and takes it back,
//! without deregistering the region. The rules the types carry:
//!
//! - a window is allocated in a protection domain and borrows it
//!   ([`ProtectionDomain::alloc_mw`]);
//! - binding it ([`PostScope::bind_window`]) consumes the [`MemoryWindow`] and gives a
//!   [`BoundWindow`], which **borrows the region** for as long as it lives: the region cannot be
//!   dropped, deregistered or mutably borrowed while a peer may reach it through the window;
//! - the bound window hands out a [`RemoteRegion`] limited to the bound range, with the window's
//!   own key;
//! - invalidating ([`PostScope::invalidate_window`], or a peer's
//!   [`SendRequest::send_with_invalidate`](crate::SendRequest::send_with_invalidate) seen with
//!   [`BoundWindow::invalidated_by`]) gives the unbound [`MemoryWindow`] back, and dropping a
//!   bound window deallocates it, which invalidates it too.
//!
//! What the types cannot carry: a peer's request that passed the window's check before the
//! invalidation may still be running. Regions a window can be bound to must be registered with
//! [`AccessFlags::MW_BIND`], which counts as remotely writable: such a region never hands out a
//! plain slice ([`MemoryRegion::as_mut_slice`]), only copies, before or after invalidation
//! ([`docs/safety.md`](https://github.com/rdma-rs/rdma-rs/blob/main/docs/safety.md),
//! "Memory windows").
//!
//! A bound window cannot outlive its region:
//!
//! ```compile_fail
//! # use rdma_verbs::*;
//! # use std::time::Duration;
//! # fn f(qp: &QueuePair<'_, Rc, ReadyToSend>) -> Result<()> {
//! let pd = qp.pd();
//! let window = pd.alloc_mw(WindowType::Type2)?;
//! let bound = qp.scope(Duration::from_secs(1), |s| {
//!     let region = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
//!     s.bind_window(1, window, &region, .., AccessFlags::REMOTE_READ) // error: `region` dropped while borrowed
//! })?;
//! # Ok(()) }
//! ```
//!
//! # References
//! - [`ibv_alloc_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html)
//! - [`ibv_bind_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_bind_mw.3.html)

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::ptr::NonNull;

use crate::ffi;

use crate::device_attr_ex::DeviceCapabilities;
use crate::error::{Error, Result};
use crate::mr::{bounds, AccessFlags, MemoryRegion, RegisteredBuffer, RemoteRegion};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;
use crate::qp::state::{Connected, ReadyToSend};
use crate::scope::PostScope;
use crate::wc::WorkCompletion;
use crate::wr::SendRequest;

/// The two kinds of memory windows (`enum ibv_mw_type`).
#[doc(alias = "ibv_mw_type")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WindowType {
    /// Type 1 (`IBV_MW_TYPE_1`): bound with `ibv_bind_mw()`, usable through any QP of its
    /// protection domain, unbound by a zero-length bind. Its key changes at every bind.
    Type1,
    /// Type 2 (`IBV_MW_TYPE_2`, 2B on rxe): bound by a work request (`IBV_WR_BIND_MW`) to the
    /// QP that posted it and usable through that QP only; invalidated by a local invalidate or
    /// by the peer's send with invalidate.
    Type2,
}

impl WindowType {
    fn raw(self) -> ffi::ibv_mw_type::Type {
        match self {
            WindowType::Type1 => ffi::ibv_mw_type::IBV_MW_TYPE_1,
            WindowType::Type2 => ffi::ibv_mw_type::IBV_MW_TYPE_2,
        }
    }
}

/// An unbound memory window (`struct ibv_mw`); deallocated on drop.
///
/// # References
/// - [`ibv_alloc_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html)
#[doc(alias = "ibv_mw")]
#[must_use = "dropping it at once releases what was just made"]
pub struct MemoryWindow<'pd> {
    raw: NonNull<ffi::ibv_mw>,
    kind: WindowType,
    /// The key the window has now: a type 2 bind picks the next one itself.
    rkey: u32,
    pd: Parent<'pd, ProtectionDomain<'pd>>,
}

// SAFETY: the window is used only through verbs, which are thread-safe; `&self` reads plain
// fields.
unsafe impl Send for MemoryWindow<'_> {}
// SAFETY: as above.
unsafe impl Sync for MemoryWindow<'_> {}

impl fmt::Debug for MemoryWindow<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow").field("kind", &self.kind).field("rkey", &self.rkey).finish()
    }
}

impl<'ctx> ProtectionDomain<'ctx> {
    /// Allocates a memory window of `kind` in this protection domain: `ibv_alloc_mw()`.
    ///
    /// # Errors
    /// [`Error::Unsupported`] when the device has no windows of that type (it does not advertise
    /// them: nothing called; or the verb refused with `EOPNOTSUPP`); [`Error::Verb`] otherwise.
    ///
    /// # References
    /// - [`ibv_alloc_mw(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_mw.3.html)
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc_mw(&self, kind: WindowType) -> Result<MemoryWindow<'_>> {
        MemoryWindow::alloc(self, kind)
    }
}

impl<'pd> MemoryWindow<'pd> {
    /// Allocates a memory window of `kind` in `pd`, borrowed or shared (see [`Parent`]):
    /// `ibv_alloc_mw()`.
    ///
    /// # Errors
    /// As [`ProtectionDomain::alloc_mw`].
    #[doc(alias = "ibv_alloc_mw")]
    pub fn alloc(pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>, kind: WindowType) -> Result<Self> {
        let pd = pd.into();
        let ctx = pd.context();
        let device = Some(ctx.name());
        let caps = ctx.capabilities();
        let (advertised, bits) = match kind {
            WindowType::Type1 => (caps.contains(DeviceCapabilities::MEM_WINDOW), "MEM_WINDOW"),
            WindowType::Type2 => (
                caps.intersects(DeviceCapabilities::MEM_WINDOW_TYPE_2A | DeviceCapabilities::MEM_WINDOW_TYPE_2B),
                "MEM_WINDOW_TYPE_2A or _2B",
            ),
        };
        if !advertised {
            let reason = format!("the device does not advertise {kind:?} memory windows ({bits})");
            return Err(Error::unsupported("ibv_alloc_mw", device, reason));
        }
        // SAFETY: `pd` is a live protection domain, held for the window's life.
        let raw = unsafe { crate::ffi_compat::alloc_mw(pd.as_raw(), kind.raw()) };
        let Some(raw) = NonNull::new(raw) else {
            let e = Error::last_os_error("ibv_alloc_mw", device);
            return Err(match e.errno() {
                Some(errno @ (libc::EOPNOTSUPP | libc::ENOSYS)) => Error::Unsupported {
                    verb: "ibv_alloc_mw",
                    device: device.map(str::to_owned),
                    reason: format!("the provider has no {kind:?} memory windows"),
                    errno: Some(errno),
                },
                _ => e,
            });
        };
        ctx.registry().add(crate::registry::Kind::Mw, raw.as_ptr());
        // SAFETY: just allocated.
        let rkey = unsafe { raw.as_ref().rkey };
        Ok(MemoryWindow { raw, kind, rkey, pd })
    }

    /// Its type.
    pub fn kind(&self) -> WindowType {
        self.kind
    }

    /// The window's current remote key. Each bind changes it (its low 8 bits), so a key a peer
    /// kept from an earlier bind no longer works.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The protection domain it was allocated in.
    pub fn pd(&self) -> &ProtectionDomain<'pd> {
        &self.pd
    }

    /// The raw `struct ibv_mw *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.raw.as_ptr()
    }
}

impl Drop for MemoryWindow<'_> {
    #[doc(alias = "ibv_dealloc_mw")]
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_mw`, deallocated only here. Deallocation invalidates
        // a bound window. Should it fail, the window may stay bound; its region then refuses
        // deregistration and leaks its buffer rather than free memory a peer could reach.
        let _ = self
            .pd
            .context()
            .registry()
            .release(self.raw.as_ptr(), || unsafe { ffi::ibv_dealloc_mw(self.raw.as_ptr()) });
    }
}

/// A memory window bound to a part of a region: a peer holding [`remote`](Self::remote) may
/// access that part, as the bind's access flags allow, until the window is invalidated or
/// dropped. It borrows the region for `'mr`.
///
/// Dropping it deallocates the window (`ibv_dealloc_mw`), which invalidates it.
#[must_use = "dropping a bound window deallocates it, revoking the peer's access"]
pub struct BoundWindow<'pd, 'mr> {
    window: MemoryWindow<'pd>,
    remote: RemoteRegion,
    access: AccessFlags,
    /// The region's `struct ibv_mr *`, as an address: live while `'mr` borrows the region.
    region: usize,
    _region: PhantomData<&'mr ()>,
}

impl fmt::Debug for BoundWindow<'_, '_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundWindow")
            .field("kind", &self.window.kind)
            .field("remote", &self.remote)
            .field("access", &self.access)
            .finish()
    }
}

impl<'pd> BoundWindow<'pd, '_> {
    /// The bound range as a peer names it: its address, the window's key, its length.
    pub fn remote(&self) -> RemoteRegion {
        self.remote
    }

    /// The window's key (the key of [`remote`](Self::remote)).
    pub fn rkey(&self) -> u32 {
        self.remote.rkey
    }

    /// What the bind lets a peer do.
    pub fn access(&self) -> AccessFlags {
        self.access
    }

    /// The window.
    pub fn window(&self) -> &MemoryWindow<'pd> {
        &self.window
    }

    /// The window back, unbound, if `wc` is a successful receive of a peer's send with
    /// invalidate that invalidated this window (`IBV_WC_WITH_INV` with this window's key; rxe's
    /// own form of it too, see [`WorkCompletion::invalidated_rkey`]). Otherwise the bound window
    /// is given back unchanged.
    ///
    /// # Errors
    /// `self`, when `wc` did not invalidate this window.
    pub fn invalidated_by(self, wc: &WorkCompletion) -> std::result::Result<MemoryWindow<'pd>, Self> {
        if wc.invalidates(self.remote.rkey) {
            Ok(self.window)
        } else {
            Err(self)
        }
    }
}

impl<'s, 'env, T: Connected> PostScope<'s, 'env, T, ReadyToSend> {
    /// Binds `window` to the part `range` of `region`, granting what `access` allows
    /// (`REMOTE_READ`, `REMOTE_WRITE`, `REMOTE_ATOMIC`): `ibv_bind_mw()` for a type 1 window,
    /// an `IBV_WR_BIND_MW` request for a type 2 window (bound to this QP). The bind is a
    /// request on the send queue, counted by the scope like any other: it takes effect when it
    /// completes, before any later request of this QP. Its completion carries `wr_id`.
    ///
    /// The region must be registered with [`AccessFlags::MW_BIND`] in the window's protection
    /// domain, which must be this QP's; remote write and atomic access need its `LOCAL_WRITE`.
    /// It stays borrowed for the scope too (`'mr: 's`), so it cannot be deregistered while the
    /// bind request is queued.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any of the rules above, an empty or out-of-region range,
    /// or reserved `wr_id` bits (nothing posted; the window is deallocated);
    /// [`Error::QueueFull`] as [`post_send`](Self::post_send); [`Error::Verb`] or
    /// [`Error::PostFailed`] when the provider refuses the bind.
    #[doc(alias = "ibv_bind_mw")]
    #[doc(alias = "IBV_WR_BIND_MW")]
    pub fn bind_window<'pd, 'mr, B: RegisteredBuffer>(
        &mut self,
        wr_id: u64,
        mut window: MemoryWindow<'pd>,
        region: &'mr MemoryRegion<'_, B>,
        range: impl RangeBounds<usize>,
        access: AccessFlags,
    ) -> Result<BoundWindow<'pd, 'mr>>
    where
        'env: 'mr,
        'mr: 's,
    {
        let qp = self.qp();
        let verb = match window.kind {
            WindowType::Type1 => "ibv_bind_mw",
            WindowType::Type2 => "ibv_post_send",
        };
        let device = qp.pd().context().name();
        let invalid = |reason: String| Error::invalid(verb, Some(device), reason);
        if window.pd.as_raw() != qp.pd().as_raw() || region.pd().as_raw() != qp.pd().as_raw() {
            return Err(invalid("the window, the region and the QP must share one protection domain".into()));
        }
        if !region.access().contains(AccessFlags::MW_BIND) {
            return Err(invalid("the region was not registered with MW_BIND".into()));
        }
        let remote_bits = AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_ATOMIC;
        if access.is_empty() || !remote_bits.contains(access) {
            return Err(invalid(format!("a window grants REMOTE_READ, REMOTE_WRITE or REMOTE_ATOMIC, not {access:?}")));
        }
        if access.remotely_writable() && !region.access().contains(AccessFlags::LOCAL_WRITE) {
            return Err(invalid("remote write or atomic access needs a region with LOCAL_WRITE".into()));
        }
        let Some((start, end)) = bounds(range, region.len()).filter(|(s, e)| s < e) else {
            return Err(invalid(format!("the range is empty or outside the {}-byte region", region.len())));
        };
        let info = ffi::ibv_mw_bind_info {
            mr: region.as_raw(),
            addr: region.addr() + start as u64,
            length: (end - start) as u64,
            mw_access_flags: access.bits(),
        };
        let rkey = match window.kind {
            WindowType::Type1 => {
                let raw_qp = qp.as_raw();
                let mw = window.as_raw();
                self.post_one(wr_id, verb, |tagged| {
                    let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                    let mut bind = ffi::ibv_mw_bind { wr_id: tagged, send_flags: flags, bind_info: info };
                    // SAFETY: the QP, the window and the region are live (borrowed by this
                    // call); the region stays registered while the window is bound (borrowed by
                    // the `BoundWindow`). The provider copies the request.
                    let rc = unsafe { ffi::ibv_bind_mw(raw_qp, mw, &mut bind) };
                    Error::check("ibv_bind_mw", Some(device), rc)
                })?;
                // SAFETY: the provider set the key the bind gives (ibv_bind_mw(3)).
                unsafe { window.raw.as_ref().rkey }
            }
            WindowType::Type2 => {
                let rkey = crate::ffi_compat::inc_rkey(window.rkey);
                self.post_send(&mut [SendRequest::bind_window(wr_id, window.as_raw(), rkey, info)])?;
                // The provider names the window by its current key in the next bind or
                // invalidate, and does not update it for a bind request (ibv_bind_mw does, for
                // type 1): without this, rxe refuses every bind after the first.
                // SAFETY: the window is live and owned by `window`; nothing else writes it.
                unsafe { (*window.raw.as_ptr()).rkey = rkey };
                rkey
            }
        };
        window.rkey = rkey;
        let remote = RemoteRegion { addr: info.addr, rkey, len: info.length };
        Ok(BoundWindow { window, remote, access, region: region.as_raw() as usize, _region: PhantomData })
    }

    /// Invalidates a bound window and gives it back: a local invalidate request
    /// (`IBV_WR_LOCAL_INV`) for a type 2 window, a zero-length `ibv_bind_mw()` for a type 1
    /// window. Like a bind, it is a request on the send queue: a peer's request ordered before
    /// it may still use the window, none after it. Its completion carries `wr_id`.
    ///
    /// # Errors
    /// As [`bind_window`](Self::bind_window). The window is deallocated on error (which
    /// invalidates it too).
    #[doc(alias = "IBV_WR_LOCAL_INV")]
    pub fn invalidate_window<'pd>(&mut self, wr_id: u64, bound: BoundWindow<'pd, '_>) -> Result<MemoryWindow<'pd>> {
        let region = bound.region;
        let mut window = bound.window;
        if window.pd.as_raw() != self.qp().pd().as_raw() {
            let device = self.qp().pd().context().name();
            return Err(Error::invalid(
                "ibv_post_send",
                Some(device),
                "the window belongs to another protection domain",
            ));
        }
        match window.kind {
            WindowType::Type1 => {
                let (raw_qp, mw) = (self.qp().as_raw(), window.as_raw());
                let device = self.qp().pd().context().name();
                self.post_one(wr_id, "ibv_bind_mw", |tagged| {
                    let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                    // A zero length is the unbind. The region is still named: rxe's provider
                    // reads its key whatever the length (a null region crashes it).
                    let mr = region as *mut ffi::ibv_mr;
                    let info = ffi::ibv_mw_bind_info { mr, addr: 0, length: 0, mw_access_flags: 0 };
                    let mut bind = ffi::ibv_mw_bind { wr_id: tagged, send_flags: flags, bind_info: info };
                    // SAFETY: the QP, the window and the region (borrowed by `bound` until
                    // this returns) are live.
                    let rc = unsafe { ffi::ibv_bind_mw(raw_qp, mw, &mut bind) };
                    Error::check("ibv_bind_mw", Some(device), rc)
                })?;
                // SAFETY: the provider set the window's new key.
                window.rkey = unsafe { window.raw.as_ref().rkey };
            }
            WindowType::Type2 => {
                self.post_send(&mut [SendRequest::local_invalidate(wr_id, window.rkey)])?;
            }
        }
        Ok(window)
    }
}
