//! What a [`Context`](crate::Context) still has alive, so that closing it releases what was
//! forgotten.
//!
//! Every verbs object is registered with its context when created and unregistered when its
//! wrapper destroys it. A wrapper can only outlive its context's `Drop` by never being dropped
//! (`mem::forget`, a reference cycle): borrowed wrappers borrow the context, shared ones hold
//! an `Arc` to it. So whatever is still registered when the context drops belongs to a wrapper
//! that will never run again, and the context destroys it before closing the device. Without
//! this, a forgotten QP or CQ would keep its queues mapped, and the mapping would keep the
//! device file, and every object of the context, alive in the kernel until the process exits.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::ffi;

/// The kinds of verbs objects, in the order leftovers are destroyed (users before what they use).
/// Windows come first: a type 2 window holds the QP it is bound to (see `mw::WindowCell`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Mw,
    Qp,
    Srq,
    Ah,
    Mr,
    Cq,
    Channel,
    Pd,
}

#[derive(Debug, Default)]
pub(crate) struct Registry {
    live: Mutex<HashMap<usize, Kind>>,
}

impl Registry {
    pub(crate) fn add<T>(&self, kind: Kind, raw: *mut T) {
        self.live.lock().unwrap_or_else(|e| e.into_inner()).insert(raw as usize, kind);
    }

    /// Runs `destroy` for `raw` and unregisters it if that succeeded (returned 0), under the
    /// registry's lock: another object created at the same address meanwhile cannot have its
    /// entry removed by mistake. Returns what `destroy` returned.
    pub(crate) fn release<T>(&self, raw: *mut T, destroy: impl FnOnce() -> libc::c_int) -> libc::c_int {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let rc = destroy();
        if rc == 0 {
            live.remove(&(raw as usize));
        }
        rc
    }

    /// Destroys every object still registered; returns how many there were.
    ///
    /// # Safety
    /// Only from the context's `Drop`: no wrapper of these objects will ever run again.
    pub(crate) unsafe fn destroy_leftovers(&self) -> usize {
        let mut left: Vec<(Kind, usize)> =
            self.live.lock().unwrap_or_else(|e| e.into_inner()).drain().map(|(raw, kind)| (kind, raw)).collect();
        left.sort_unstable();
        for &(kind, raw) in &left {
            // SAFETY: each pointer is a live object of this context of the kind registered,
            // whose wrapper was forgotten (see the caller's contract): destroyed once, here.
            unsafe {
                match kind {
                    Kind::Qp => ffi::ibv_destroy_qp(raw as *mut ffi::ibv_qp),
                    Kind::Srq => ffi::ibv_destroy_srq(raw as *mut ffi::ibv_srq),
                    Kind::Ah => ffi::ibv_destroy_ah(raw as *mut ffi::ibv_ah),
                    Kind::Mw => ffi::ibv_dealloc_mw(raw as *mut ffi::ibv_mw),
                    Kind::Mr => ffi::ibv_dereg_mr(raw as *mut ffi::ibv_mr),
                    Kind::Cq => ffi::ibv_destroy_cq(raw as *mut ffi::ibv_cq),
                    Kind::Channel => ffi::ibv_destroy_comp_channel(raw as *mut ffi::ibv_comp_channel),
                    Kind::Pd => ffi::ibv_dealloc_pd(raw as *mut ffi::ibv_pd),
                };
            }
        }
        left.len()
    }
}
