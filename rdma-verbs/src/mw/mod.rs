//! Memory windows: [`MemoryWindow`], [`BoundWindow`], [`WindowType`].
//!
//! A memory window grants a peer access to a part of a memory region, and takes it back,
//! without deregistering the region. The rules the types carry:
//!
//! - a window is allocated in a protection domain and borrows it
//!   ([`ProtectionDomain::alloc_mw`]);
//! - binding it ([`PostScope::bind_window`](crate::PostScope::bind_window)) consumes the [`MemoryWindow`] and gives a
//!   [`BoundWindow`], which **borrows the region** for as long as it lives: the region cannot be
//!   dropped, deregistered or mutably borrowed while a peer may reach it through the window;
//! - the bound window hands out a [`RemoteRegion`] limited to the bound range, with the window's
//!   own key;
//! - invalidating ([`PostScope::invalidate_window`](crate::PostScope::invalidate_window), or a peer's
//!   [`SendRequest::send_with_invalidate`](crate::SendRequest::send_with_invalidate) seen with
//!   [`BoundWindow::invalidated_by`]) gives the unbound [`MemoryWindow`] back, and dropping a
//!   bound window deallocates it, which invalidates it too;
//! - a type 2 window is revoked by deallocating its verbs window, and the [`MemoryWindow`]
//!   given back gets a new one: no local invalidate request is ever posted for it, and a key a
//!   peer kept names a deallocated window, which rxe refuses (rxe's invalidation of a type 2
//!   window that is not bound, by a local invalidate or by a peer's send with invalidate,
//!   dereferences a null pointer in the kernel);
//! - each bind gives the verbs window a key it never had (a key a peer kept stays revoked for
//!   the verbs window's life): its 8-bit tag would wrap, so the bind that would repeat a key is
//!   refused, after 128 grants of a type 1 window (a type 2 window gets a new verbs window, with
//!   a new record, at each revocation);
//! - a QP that is destroyed first deallocates the type 2 windows bound to it now, those of
//!   forgotten bound windows (rxe frees a QP a window still holds, and the window's
//!   deallocation then writes to the freed QP); should one refuse, the QP is not destroyed but
//!   left to its context, which deallocates windows before QPs.
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
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::ffi;

use crate::device_attr_ex::DeviceCapabilities;
use crate::error::{Error, Result};
use crate::mr::{AccessFlags, RemoteRegion};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;
use crate::wc::WorkCompletion;

mod bind;

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
    /// The verbs window, which the QPs a type 2 window was bound to can reach too.
    cell: Arc<WindowCell>,
    kind: WindowType,
    pd: Parent<'pd, ProtectionDomain<'pd>>,
}

// Windows move between threads and are shared: their verbs window is behind the slot's lock.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<MemoryWindow<'static>>();
    send_sync::<BoundWindow<'static, 'static>>();
};

impl fmt::Debug for MemoryWindow<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryWindow").field("kind", &self.kind).field("rkey", &self.rkey()).finish()
    }
}

/// A window's verbs object and what is known of its keys, shared between the
/// [`MemoryWindow`] that owns it and the QPs a type 2 window was bound to ([`QpWindows`]).
///
/// rxe takes a reference on the QP a type 2 window is bound to and drops it only when the
/// window is invalidated or deallocated; a QP destroyed before that is freed anyway after a
/// long wait, and the window's later deallocation writes to the freed QP (Linux 6.1, 6.12).
/// A window whose `BoundWindow` was forgotten is such a window. So a QP
/// deallocates, before it is destroyed, every type 2 window bound to it now: see
/// [`QpWindows::release`].
pub(crate) struct WindowCell(Mutex<Slot>);

struct Slot {
    /// The verbs window; `None` once deallocated for good.
    raw: Option<NonNull<ffi::ibv_mw>>,
    /// The key the window has now: a type 2 bind picks the next one itself.
    rkey: u32,
    /// The 8-bit tags of the keys binds of this verbs window handed out (bit `tag`).
    handed_out: [u64; 4],
    /// The QP (its [`QpWindows`] id) this type 2 verbs window may be bound to now: set by a
    /// bind through it, cleared when the verbs window is deallocated. Only that QP deallocates
    /// it before it is destroyed.
    bound_to: Option<u64>,
}

// SAFETY: the window is used only through verbs, which are thread-safe; the slot is behind a
// mutex.
unsafe impl Send for WindowCell {}
// SAFETY: as above.
unsafe impl Sync for WindowCell {}

impl WindowCell {
    fn slot(&self) -> MutexGuard<'_, Slot> {
        // A poisoned slot is still consistent: every change to it is a single assignment.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Slot {
    fn was_handed_out(&self, rkey: u32) -> bool {
        let tag = (rkey & 0xff) as usize;
        self.handed_out[tag / 64] & (1 << (tag % 64)) != 0
    }

    fn hand_out(&mut self, rkey: u32) {
        let tag = (rkey & 0xff) as usize;
        self.handed_out[tag / 64] |= 1 << (tag % 64);
    }
}

/// The type 2 windows that may be bound to one QP: each bind of a type 2 window through the QP
/// adds its window, and the QP deallocates those still bound to it before it is destroyed.
/// The windows are held (not just named) so that one whose deallocation failed stays known.
#[derive(Debug)]
pub(crate) struct QpWindows {
    list: Mutex<Vec<Arc<WindowCell>>>,
    /// Unique for the process's life (an address could be reused by a later QP).
    id: u64,
}

impl Default for QpWindows {
    fn default() -> Self {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        QpWindows { list: Mutex::default(), id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed) }
    }
}

impl fmt::Debug for WindowCell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WindowCell").finish_non_exhaustive()
    }
}

impl QpWindows {
    fn list(&self) -> MutexGuard<'_, Vec<Arc<WindowCell>>> {
        // A poisoned list is still the list: each change to it is a single push or retain.
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `cell`'s window is about to be bound to this QP. Called without `cell`'s
    /// lock: the list's lock is taken before a slot's, never after.
    fn add(&self, cell: &Arc<WindowCell>) {
        let mut list = self.list();
        // Keep the windows an owner still holds, and those bound here whose deallocation failed.
        list.retain(|c| {
            let slot = c.slot();
            Arc::strong_count(c) > 1 || (slot.raw.is_some() && slot.bound_to == Some(self.id))
        });
        if !list.iter().any(|c| Arc::ptr_eq(c, cell)) {
            list.push(Arc::clone(cell));
        }
    }

    /// Deallocates every type 2 window bound to this QP now, which is about to be destroyed
    /// (`pd` is its protection domain, the windows' too): windows of `BoundWindow`s that were
    /// forgotten (a live one borrows the QP). Windows bound to another QP since are not
    /// touched: their current QP deallocates them. None is replaced: its slot is left empty.
    ///
    /// Returns false if a window could not be deallocated: it stays bound and registered, and
    /// the QP must not be destroyed (the context's leftovers deallocate the window first).
    pub(crate) fn release(&self, pd: &ProtectionDomain<'_>) -> bool {
        let cells = std::mem::take(&mut *self.list());
        let mut kept = Vec::new();
        for cell in cells {
            let mut slot = cell.slot();
            if slot.bound_to != Some(self.id) {
                continue;
            }
            if let Some(raw) = slot.raw {
                if dealloc(pd, raw) != 0 {
                    drop(slot);
                    kept.push(cell);
                    continue;
                }
            }
            slot.raw = None;
            slot.bound_to = None;
        }
        let all = kept.is_empty();
        self.list().extend(kept);
        all
    }
}

/// Replaces the verbs window of `slot`, a type 2 window of `pd`, by a new one: deallocating
/// the old one revokes it whether it is bound or not, and a key a peer kept then names a
/// deallocated window, which the device refuses. A local invalidate (or a peer's send with
/// invalidate) of a type 2 window that is not bound is what rxe must never see: it dereferences
/// a null pointer in the kernel (Linux 6.1 and 6.12).
///
/// On error the slot holds the old window if its deallocation failed (still registered), or
/// none if the new one could not be allocated.
fn renew(pd: &ProtectionDomain<'_>, slot: &mut Slot) -> Result<()> {
    let device = Some(pd.context().name());
    if let Some(raw) = slot.raw {
        Error::check("ibv_dealloc_mw", device, dealloc(pd, raw))?;
        slot.raw = None;
    }
    slot.bound_to = None;
    // SAFETY: `pd` is a live protection domain, the window's, which holds it.
    let fresh = unsafe { crate::ffi_compat::alloc_mw(pd.as_raw(), WindowType::Type2.raw()) };
    let Some(fresh) = NonNull::new(fresh) else {
        return Err(Error::last_os_error("ibv_alloc_mw", device));
    };
    pd.context().registry().add(crate::registry::Kind::Mw, fresh.as_ptr());
    // SAFETY: just allocated.
    slot.rkey = unsafe { fresh.as_ref().rkey };
    slot.handed_out = [0; 4];
    slot.raw = Some(fresh);
    Ok(())
}

/// `ibv_dealloc_mw()` of `raw`, a window of `pd`'s context, unregistered if it succeeds.
fn dealloc(pd: &ProtectionDomain<'_>, raw: NonNull<ffi::ibv_mw>) -> libc::c_int {
    // SAFETY: a live window, deallocated once: its slot forgets it when this succeeds, under the
    // slot's lock. Deallocation invalidates a bound window.
    pd.context().registry().release(raw.as_ptr(), || unsafe { ffi::ibv_dealloc_mw(raw.as_ptr()) })
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
        let slot = Slot { raw: Some(raw), rkey, handed_out: [0; 4], bound_to: None };
        Ok(MemoryWindow { cell: Arc::new(WindowCell(Mutex::new(slot))), kind, pd })
    }

    /// Its type.
    pub fn kind(&self) -> WindowType {
        self.kind
    }

    /// The window's current remote key. Each bind changes it (its low 8 bits), so a key a peer
    /// kept from an earlier bind no longer works. For a type 1 window that holds for the
    /// window's whole life: the 8 bits would wrap, so [`PostScope::bind_window`](crate::PostScope::bind_window) refuses the
    /// bind that would give a key a second time (128 grants, its unbinds also changing the key).
    /// A type 2 window gets a new verbs window (a new index, a new record of keys) each time it
    /// is revoked, so a key a peer kept names a deallocated window.
    pub fn rkey(&self) -> u32 {
        self.cell.slot().rkey
    }

    /// The protection domain it was allocated in.
    pub fn pd(&self) -> &ProtectionDomain<'pd> {
        &self.pd
    }

    /// The raw `struct ibv_mw *`. It stays owned by `self`.
    ///
    /// A type 2 window gets a new verbs window each time it is revoked
    /// ([`PostScope::invalidate_window`](crate::PostScope::invalidate_window), [`BoundWindow::invalidated_by`]), and its verbs window
    /// is deallocated when the QP it is bound to is destroyed first, possibly by another
    /// thread: the pointer read earlier is then freed. It is null while the window has no
    /// verbs window (deallocated with its QP, or no new one could be allocated).
    pub fn as_raw(&self) -> *mut ffi::ibv_mw {
        self.cell.slot().raw.map_or(std::ptr::null_mut(), NonNull::as_ptr)
    }
}

impl Drop for MemoryWindow<'_> {
    #[doc(alias = "ibv_dealloc_mw")]
    fn drop(&mut self) {
        let mut slot = self.cell.slot();
        // Deallocation invalidates a bound window. Should it fail, the window may stay bound;
        // its region then refuses deregistration and leaks its buffer rather than free memory a
        // peer could reach.
        // The pointer stays in the slot on failure: a QP the window is bound to then sees it
        // and is not destroyed before it.
        if let Some(raw) = slot.raw {
            if dealloc(&self.pd, raw) == 0 {
                slot.raw = None;
            }
        }
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

    fn into_window(self) -> MemoryWindow<'pd> {
        self.window
    }

    /// The window back, unbound, if `wc` is a successful receive of a peer's send with
    /// invalidate that invalidated this window (`IBV_WC_WITH_INV` with this window's key; rxe's
    /// own form of it too, see [`WorkCompletion::invalidated_rkey`]). Otherwise the bound window
    /// is given back unchanged.
    ///
    /// The window given back has a new verbs window (the invalidated one is deallocated): a
    /// second send with invalidate of the old key, from a peer that kept it, then names a
    /// deallocated window, which rxe refuses, rather than a window that is not bound, which rxe
    /// cannot invalidate without a null dereference in the kernel. Should the new window not be
    /// allocated, the window given back binds no more.
    ///
    /// The completion is matched by key alone: a completion of another QP, context or device
    /// whose key has the same index and tag is taken for this window's. That ends the region's
    /// borrow early, but the window is deallocated here, which revokes it whatever the
    /// completion was; and while a window is bound to a region rxe refuses its `ibv_dereg_mr`,
    /// so the region's buffer leaks rather than frees.
    ///
    /// # Errors
    /// `self`, when `wc` did not invalidate this window.
    pub fn invalidated_by(self, wc: &WorkCompletion) -> std::result::Result<MemoryWindow<'pd>, Self> {
        if !wc.invalidates(self.remote.rkey) {
            return Err(self);
        }
        let window = self.into_window();
        if window.kind == WindowType::Type2 {
            // On failure the slot keeps the old window, or none: see `renew`.
            let _ = renew(&window.pd, &mut window.cell.slot());
        }
        Ok(window)
    }
}
