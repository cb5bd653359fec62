//! Binding and revoking windows through a posting scope: [`PostScope::bind_window`] and
//! [`PostScope::invalidate_window`]. A bind is a request on the QP's send queue, counted and
//! drained by the scope like any other.

use std::marker::PhantomData;
use std::ops::RangeBounds;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::ffi;
use crate::mr::{bounds, AccessFlags, MemoryRegion, RegisteredBuffer, RemoteRegion};
use crate::qp::state::{Connected, ReadyToSend};
use crate::scope::PostScope;
use crate::wr::SendRequest;

use super::{dealloc, renew, BoundWindow, MemoryWindow, WindowType};

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
    /// A type 2 window is noted by the QP from this bind until it is revoked: when the QP is
    /// destroyed first (the [`BoundWindow`] forgotten), it deallocates the window, because rxe
    /// frees a QP a window still holds.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for any of the rules above, an empty or out-of-region range,
    /// or reserved `wr_id` bits, and for a bind that would give the window a key it handed out
    /// before (nothing posted; the window is deallocated): a key changes only in its low 8 bits,
    /// so a window gives 256 grants (type 2) or 128 (type 1, whose unbinds also change the key),
    /// then a new window is needed. Should a provider give a type 1 bind a key of its own
    /// choosing that was handed out before, the bind is posted and the window deallocated at
    /// once, with the same error;
    /// [`Error::QueueFull`] as [`post_send`](Self::post_send); [`Error::Verb`] or
    /// [`Error::PostFailed`] when the provider refuses the bind.
    #[doc(alias = "ibv_bind_mw")]
    #[doc(alias = "IBV_WR_BIND_MW")]
    pub fn bind_window<'pd, 'mr, B: RegisteredBuffer>(
        &mut self,
        wr_id: u64,
        window: MemoryWindow<'pd>,
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
        let cell = Arc::clone(&window.cell);
        if window.kind == WindowType::Type2 {
            // Noted before posting (and before the slot is locked, the list's lock coming
            // first): from the moment the request may be queued, the window may end up bound to
            // this QP.
            qp.shared().windows.add(&cell);
        }
        let mut slot = cell.slot();
        let Some(raw_mw) = slot.raw else {
            return Err(invalid(
                "the window has no verbs window: the QP it was bound to was destroyed, or no new one could be \
                 allocated when it was revoked"
                    .into(),
            ));
        };
        // The key the bind will give: `ibv_inc_rkey` of the current one (what a type 2 bind
        // names itself, and what providers give a type 1 bind). A key handed out before may
        // still be held by a peer, so a bind that would give it again is refused: revocation
        // holds for the window's life.
        let next = crate::ffi_compat::inc_rkey(slot.rkey);
        if slot.was_handed_out(next) {
            return Err(invalid(key_wrapped(window.kind, next)));
        }
        let rkey = match window.kind {
            WindowType::Type1 => {
                let raw_qp = qp.as_raw();
                self.post_one(wr_id, verb, |tagged| {
                    let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                    let mut bind = ffi::ibv_mw_bind { wr_id: tagged, send_flags: flags, bind_info: info };
                    // SAFETY: the QP, the window (its slot locked) and the region are live
                    // (borrowed by this call); the region stays registered while the window is
                    // bound (borrowed by the `BoundWindow`). The provider copies the request.
                    let rc = unsafe { ffi::ibv_bind_mw(raw_qp, raw_mw.as_ptr(), &mut bind) };
                    Error::check("ibv_bind_mw", Some(device), rc)
                })?;
                // SAFETY: the provider set the key the bind gives (ibv_bind_mw(3)).
                let rkey = unsafe { raw_mw.as_ref().rkey };
                if slot.was_handed_out(rkey) {
                    // A provider that picked a key of its own, one handed out before: take the
                    // grant back at once. Deallocating invalidates the window.
                    slot.rkey = rkey;
                    if dealloc(&window.pd, raw_mw) == 0 {
                        slot.raw = None;
                    }
                    return Err(invalid(key_wrapped(window.kind, rkey)));
                }
                rkey
            }
            WindowType::Type2 => {
                let rkey = next;
                slot.bound_to = Some(qp.shared().windows.id);
                self.post_send(&mut [SendRequest::bind_window(wr_id, raw_mw.as_ptr(), rkey, info)])?;
                // The provider names the window by its current key in the next bind or
                // invalidate, and does not update it for a bind request (ibv_bind_mw does, for
                // type 1): without this, rxe refuses every bind after the first.
                // SAFETY: the window is live and owned by `window` (its slot locked); nothing
                // else writes it.
                unsafe { (*raw_mw.as_ptr()).rkey = rkey };
                rkey
            }
        };
        slot.rkey = rkey;
        slot.hand_out(rkey);
        drop(slot);
        let remote = RemoteRegion { addr: info.addr, rkey, len: info.length };
        Ok(BoundWindow { window, remote, access, region: region.as_raw() as usize, _region: PhantomData })
    }

    /// Invalidates a bound window and gives it back.
    ///
    /// A type 1 window is unbound by a zero-length `ibv_bind_mw()`: like a bind, a request on
    /// the send queue (a peer's request ordered before it may still use the window, none after
    /// it), whose completion carries `wr_id`.
    ///
    /// A type 2 window is revoked at once by deallocating its verbs window, and given back with
    /// a new one (new keys): nothing is posted and no completion comes (`wr_id` is unused). A
    /// local invalidate request could find the window already invalidated by the peer (a send
    /// with invalidate the owner has not seen yet), and rxe's invalidation of a window that is
    /// not bound dereferences a null pointer in the kernel; after deallocation, a key the peer
    /// kept names a deallocated window, which rxe refuses.
    ///
    /// # Errors
    /// As [`bind_window`](Self::bind_window); [`Error::Verb`] when `ibv_dealloc_mw` or
    /// `ibv_alloc_mw` fails for a type 2 window. The window is deallocated on error (which
    /// invalidates it too).
    #[doc(alias = "ibv_dealloc_mw")]
    pub fn invalidate_window<'pd>(&mut self, wr_id: u64, bound: BoundWindow<'pd, '_>) -> Result<MemoryWindow<'pd>> {
        let region = bound.region;
        let window = bound.into_window();
        if window.pd.as_raw() != self.qp().pd().as_raw() {
            let device = self.qp().pd().context().name();
            return Err(Error::invalid(
                "ibv_post_send",
                Some(device),
                "the window belongs to another protection domain",
            ));
        }
        let cell = Arc::clone(&window.cell);
        let mut slot = cell.slot();
        match window.kind {
            WindowType::Type1 => {
                let raw_qp = self.qp().as_raw();
                let device = self.qp().pd().context().name();
                let Some(mw) = slot.raw else {
                    return Err(Error::invalid("ibv_bind_mw", Some(device), "the window was deallocated"));
                };
                self.post_one(wr_id, "ibv_bind_mw", |tagged| {
                    let flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
                    // A zero length is the unbind. The region is still named: rxe's provider
                    // reads its key whatever the length (a null region crashes it).
                    let mr = region as *mut ffi::ibv_mr;
                    let info = ffi::ibv_mw_bind_info { mr, addr: 0, length: 0, mw_access_flags: 0 };
                    let mut bind = ffi::ibv_mw_bind { wr_id: tagged, send_flags: flags, bind_info: info };
                    // SAFETY: the QP, the window (its slot locked) and the region (borrowed by
                    // `bound` until this returns) are live.
                    let rc = unsafe { ffi::ibv_bind_mw(raw_qp, mw.as_ptr(), &mut bind) };
                    Error::check("ibv_bind_mw", Some(device), rc)
                })?;
                // SAFETY: the provider set the window's new key.
                slot.rkey = unsafe { mw.as_ref().rkey };
            }
            WindowType::Type2 => {
                let _ = wr_id;
                renew(&window.pd, &mut slot)?;
            }
        }
        Ok(window)
    }
}

/// Why a bind that would give the key `rkey` again is refused.
fn key_wrapped(kind: WindowType, rkey: u32) -> String {
    format!(
        "the {kind:?} window handed out key {rkey:#x} before, and a peer may still hold it: a window hands out each \
         of its 256 key tags once (a type 2 window 256 grants, a type 1 window 128, its unbinds taking the others); \
         allocate a new window"
    )
}
