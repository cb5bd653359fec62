//! Protection domains: [`ProtectionDomain`].

use std::ptr::NonNull;

use crate::ffi;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::parent::Parent;

/// A protection domain (`struct ibv_pd`), deallocated on drop.
///
/// Memory regions, queue pairs and address handles are made from a protection domain and borrow
/// it (or hold it by reference count, see [`Parent`]), so it outlives them; it holds its
/// [`Context`] in turn. A queue pair can only use memory regions of its own protection domain.
///
/// ```compile_fail
/// # use rdma_verbs::Context;
/// let pd = {
///     let ctx = Context::open("rxe0").unwrap();
///     ctx.alloc_pd().unwrap()
/// }; // error: `ctx` does not live long enough
/// ```
///
/// # References
/// - [`ibv_alloc_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_pd.3.html)
#[doc(alias = "ibv_pd")]
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct ProtectionDomain<'ctx> {
    raw: NonNull<ffi::ibv_pd>,
    ctx: Parent<'ctx, Context>,
}

// SAFETY: the verbs that take a PD are thread-safe; the struct is a pointer and a handle to a
// `Sync` context.
unsafe impl Send for ProtectionDomain<'_> {}
// SAFETY: as above.
unsafe impl Sync for ProtectionDomain<'_> {}

impl Context {
    /// Allocates a protection domain: `ibv_alloc_pd()`.
    ///
    /// # Errors
    /// [`Error::Verb`] with `errno` (`ENOMEM` when the device has no more).
    ///
    /// # References
    /// - [`ibv_alloc_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_pd.3.html)
    #[doc(alias = "ibv_alloc_pd")]
    pub fn alloc_pd(&self) -> Result<ProtectionDomain<'_>> {
        ProtectionDomain::new(self)
    }
}

impl<'ctx> ProtectionDomain<'ctx> {
    /// Allocates a protection domain of `ctx`, borrowed (`&ctx`) or shared (`Arc<Context>`,
    /// giving a `ProtectionDomain<'static>` that keeps the context open): `ibv_alloc_pd()`.
    ///
    /// # Errors
    /// [`Error::Verb`] with `errno` (`ENOMEM` when the device has no more).
    ///
    /// # References
    /// - [`ibv_alloc_pd(3)`](https://man7.org/linux/man-pages/man3/ibv_alloc_pd.3.html)
    #[doc(alias = "ibv_alloc_pd")]
    pub fn new(ctx: impl Into<Parent<'ctx, Context>>) -> Result<Self> {
        let ctx = ctx.into();
        // SAFETY: `as_raw()` is an open context, kept open by `ctx` for the PD's life.
        let raw = unsafe { ffi::ibv_alloc_pd(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_alloc_pd", Some(ctx.name())))?;
        ctx.registry().add(crate::registry::Kind::Pd, raw.as_ptr());
        Ok(ProtectionDomain { raw, ctx })
    }

    /// The context this protection domain belongs to.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// The raw `struct ibv_pd *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_pd {
        self.raw.as_ptr()
    }
}

impl Drop for ProtectionDomain<'_> {
    #[doc(alias = "ibv_dealloc_pd")]
    fn drop(&mut self) {
        // SAFETY: allocated by `ibv_alloc_pd`, deallocated only here; everything made from it
        // borrows `self` and is gone. A failure (EBUSY) cannot happen for that reason.
        let _ = self.ctx.registry().release(self.raw.as_ptr(), || unsafe { ffi::ibv_dealloc_pd(self.raw.as_ptr()) });
    }
}
