//! Protection domains: [`ProtectionDomain`].

use std::ptr::NonNull;

use rdma_sys as ffi;

use crate::context::Context;
use crate::error::{Error, Result};

/// A protection domain (`struct ibv_pd`), deallocated on drop.
///
/// Memory regions, queue pairs and address handles are made from a protection domain and borrow
/// it, so it outlives them; it borrows its [`Context`] in turn. A queue pair can only use memory
/// regions of its own protection domain.
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
pub struct ProtectionDomain<'ctx> {
    raw: NonNull<ffi::ibv_pd>,
    ctx: &'ctx Context,
}

// SAFETY: the verbs that take a PD are thread-safe; the struct is a pointer and a shared borrow.
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
        // SAFETY: `as_raw()` is an open context.
        let raw = unsafe { ffi::ibv_alloc_pd(self.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_alloc_pd", Some(self.name())))?;
        Ok(ProtectionDomain { raw, ctx: self })
    }
}

impl<'ctx> ProtectionDomain<'ctx> {
    /// The context this protection domain belongs to.
    pub fn context(&self) -> &'ctx Context {
        self.ctx
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
        let _ = unsafe { ffi::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
