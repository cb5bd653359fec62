//! Shared receive queues: [`SharedReceiveQueue`].

use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::ffi;

use crate::error::{Error, Result};
use crate::parent::Parent;
use crate::pd::ProtectionDomain;
use crate::pool::Slot;
use crate::wr::RecvRequest;

/// A shared receive queue (`struct ibv_srq`): receives that several QPs consume. Destroyed on
/// drop; QPs using it borrow it.
///
/// # References
/// - [`ibv_create_srq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_srq.3.html)
/// - [`ibv_post_srq_recv(3)`](https://man7.org/linux/man-pages/man3/ibv_post_srq_recv.3.html)
#[doc(alias = "ibv_srq")]
#[derive(Debug)]
#[must_use = "dropping it at once releases what was just made"]
pub struct SharedReceiveQueue<'pd> {
    raw: NonNull<ffi::ibv_srq>,
    max_wr: u32,
    max_sge: u32,
    device: String,
    pd: Parent<'pd, ProtectionDomain<'pd>>,
    /// The receive CQ its QPs complete on (the pointer), [`MIXED`] once two differ, plus
    /// [`RING`] while a [`RecvRing`](crate::RecvRing) owns the SRQ.
    binding: AtomicUsize,
    /// Slots still posted here by a ring dropped while others held the SRQ (see
    /// [`adopt_orphans`](Self::adopt_orphans)): returned to their pool once the SRQ is destroyed.
    orphans: Mutex<Vec<Slot<'static>>>,
}

const MIXED: usize = 1;
const RING: usize = 4;
const FLAGS: usize = 7;

/// Why [`SharedReceiveQueue::attach_ring`] refused.
pub(crate) enum RingRefusal {
    Busy,
    OtherCq,
}

// SAFETY: ibv_post_srq_recv is thread-safe; the struct owns the pointer.
unsafe impl Send for SharedReceiveQueue<'_> {}
// SAFETY: as above.
unsafe impl Sync for SharedReceiveQueue<'_> {}

impl ProtectionDomain<'_> {
    /// Creates a shared receive queue holding up to `max_wr` receives of up to `max_sge` SGEs:
    /// `ibv_create_srq()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] over the device's `max_srq_wr` / `max_sge`; [`Error::Verb`].
    #[doc(alias = "ibv_create_srq")]
    pub fn create_srq(&self, max_wr: u32, max_sge: u32) -> Result<SharedReceiveQueue<'_>> {
        SharedReceiveQueue::new(self, max_wr, max_sge)
    }
}

impl<'pd> SharedReceiveQueue<'pd> {
    /// Creates a shared receive queue of `pd`, borrowed or shared (see [`Parent`]), holding up
    /// to `max_wr` receives of up to `max_sge` SGEs: `ibv_create_srq()`.
    ///
    /// # Errors
    /// As [`ProtectionDomain::create_srq`].
    ///
    /// # References
    /// - [`ibv_create_srq(3)`](https://man7.org/linux/man-pages/man3/ibv_create_srq.3.html)
    #[doc(alias = "ibv_create_srq")]
    pub fn new(pd: impl Into<Parent<'pd, ProtectionDomain<'pd>>>, max_wr: u32, max_sge: u32) -> Result<Self> {
        let pd = pd.into();
        let ctx = pd.context();
        let dev = ctx.attr();
        if max_wr == 0 || max_wr > dev.max_srq_wr || max_sge > dev.max_sge {
            let reason =
                format!("{max_wr} requests x {max_sge} SGEs: the device allows {} x {}", dev.max_srq_wr, dev.max_sge);
            return Err(Error::invalid("ibv_create_srq", Some(ctx.name()), reason));
        }
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: std::ptr::null_mut(),
            attr: ffi::ibv_srq_attr { max_wr, max_sge, srq_limit: 0 },
        };
        // SAFETY: live PD, initialised attributes.
        let raw = unsafe { ffi::ibv_create_srq(pd.as_raw(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last_os_error("ibv_create_srq", Some(ctx.name())))?;
        let device = ctx.name().to_owned();
        ctx.registry().add(crate::registry::Kind::Srq, raw.as_ptr());
        Ok(SharedReceiveQueue {
            raw,
            max_wr: attr.attr.max_wr.max(max_wr),
            max_sge: attr.attr.max_sge.max(max_sge),
            device,
            pd,
            binding: AtomicUsize::new(0),
            orphans: Mutex::new(Vec::new()),
        })
    }
}

impl<'pd> SharedReceiveQueue<'pd> {
    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain<'pd> {
        &self.pd
    }

    /// The most receives it holds.
    pub fn max_wr(&self) -> u32 {
        self.max_wr
    }

    /// Records that a QP completes this SRQ's receives on `cq`; `false` if a ring owns the SRQ
    /// and polls another CQ (the ring would never see those completions).
    pub(crate) fn note_qp_cq(&self, cq: *mut ffi::ibv_cq) -> bool {
        let cq = cq as usize;
        let mut cur = self.binding.load(Ordering::Acquire);
        loop {
            let (bound, ring) = (cur & !FLAGS, cur & RING != 0);
            let next = match () {
                _ if cur & MIXED != 0 || bound == cq => return true,
                _ if bound == 0 => cq | (cur & RING),
                _ if ring => return false,
                _ => MIXED,
            };
            match self.binding.compare_exchange(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return true,
                Err(now) => cur = now,
            }
        }
    }

    /// Lets one ring own the SRQ, polling `cq`, which every QP of the SRQ must use.
    pub(crate) fn attach_ring(&self, cq: *mut ffi::ibv_cq) -> std::result::Result<(), RingRefusal> {
        let cq = cq as usize;
        let mut cur = self.binding.load(Ordering::Acquire);
        loop {
            if cur & RING != 0 {
                return Err(RingRefusal::Busy);
            }
            let bound = cur & !FLAGS;
            if cur & MIXED != 0 || (bound != 0 && bound != cq) {
                return Err(RingRefusal::OtherCq);
            }
            match self.binding.compare_exchange(cur, cq | RING, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(now) => cur = now,
            }
        }
    }

    /// Ends a ring's ownership (only when none of its receives is left posted).
    pub(crate) fn detach_ring(&self) {
        self.binding.fetch_and(!RING, Ordering::AcqRel);
    }

    /// Takes the slots a dropping ring still has posted here, to return them to their pool when
    /// the SRQ is destroyed (the only point after which the device is certainly done with
    /// them: an SRQ's receives cannot be flushed or taken back one by one). The ring stays
    /// attached: no other ring may own the SRQ, whose QPs may still complete those receives.
    ///
    /// The caller checked that the slots' pool is registered with this SRQ's protection domain
    /// (`RecvRing::with_srq`).
    pub(crate) fn adopt_orphans(&self, slots: impl Iterator<Item = Slot<'pd>>) {
        // SAFETY: only the lifetime changes. A slot borrows nothing but its pool's protection
        // domain (and, through it, the context); that PD is this SRQ's own (checked when the
        // ring was made), which the SRQ holds for as long as it lives. The orphans are dropped
        // in `Drop`/`destroy` before the SRQ lets go of its PD, so no slot outlives a borrow.
        let slots = slots.map(|slot| unsafe { std::mem::transmute::<Slot<'pd>, Slot<'static>>(slot) });
        self.orphans.lock().unwrap_or_else(|e| e.into_inner()).extend(slots);
    }

    /// After the SRQ was destroyed (`destroyed`) its orphaned slots return to their pool;
    /// otherwise the device may still write them: leaked, never handed out again.
    fn release_orphans(orphans: &mut Mutex<Vec<Slot<'static>>>, destroyed: bool) {
        let slots = std::mem::take(orphans.get_mut().unwrap_or_else(|e| e.into_inner()));
        if destroyed {
            drop(slots);
        } else {
            std::mem::forget(slots);
        }
    }

    /// The device's name.
    pub(crate) fn device(&self) -> &str {
        &self.device
    }

    /// Destroys the SRQ, reporting failure (then it stays alive, leaked: its receives may
    /// still be used).
    pub(crate) fn destroy(self) -> Result<()> {
        let mut this = std::mem::ManuallyDrop::new(self);
        // SAFETY: created by `ibv_create_srq`; `this` is never dropped, so this is the only
        // destruction. On failure the SRQ is leaked on purpose.
        let rc = this
            .pd
            .context()
            .registry()
            .release(this.raw.as_ptr(), || unsafe { ffi::ibv_destroy_srq(this.raw.as_ptr()) });
        Self::release_orphans(&mut this.orphans, rc == 0);
        Error::check("ibv_destroy_srq", Some(&this.device), rc)?;
        // SAFETY: the fields are moved out once, from a value that is never dropped; the
        // orphans went first, before the PD they borrow.
        drop(unsafe { (std::ptr::read(&this.orphans), std::ptr::read(&this.device), std::ptr::read(&this.pd)) });
        Ok(())
    }

    /// The most SGEs a receive may have.
    pub fn max_sge(&self) -> u32 {
        self.max_sge
    }

    /// Posts a chain of receives with one doorbell: `ibv_post_srq_recv()`.
    ///
    /// # Safety
    /// As for [`QueuePair::post_recv`](crate::QueuePair::post_recv): until each request has
    /// completed, no Rust reference to the bytes it names may be alive.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for too many SGEs; [`Error::PostFailed`] when the provider
    /// refuses a request (`ENOMEM`: full).
    #[doc(alias = "ibv_post_srq_recv")]
    pub unsafe fn post_recv(&self, wrs: &mut [RecvRequest<'_, '_>]) -> Result<()> {
        let Some(first) = crate::wr::link_recv(wrs, self.max_sge, "ibv_post_srq_recv", &self.device, false)? else {
            return Ok(());
        };
        // SAFETY: a valid chain inside `wrs`; the caller keeps the named memory untouched.
        let posted = unsafe {
            crate::post::raw::post_srq_recv(self.raw.as_ptr(), first, wrs.len(), |bad| {
                crate::wr::index_of_recv(wrs, bad)
            })
        };
        posted.result("ibv_post_srq_recv", || &self.device).map(drop)
    }

    /// The raw `struct ibv_srq *`. It stays owned by `self`.
    pub fn as_raw(&self) -> *mut ffi::ibv_srq {
        self.raw.as_ptr()
    }
}

impl Drop for SharedReceiveQueue<'_> {
    #[doc(alias = "ibv_destroy_srq")]
    fn drop(&mut self) {
        // SAFETY: created by `ibv_create_srq`, destroyed only here, after the QPs borrowing it.
        let rc = self
            .pd
            .context()
            .registry()
            .release(self.raw.as_ptr(), || unsafe { ffi::ibv_destroy_srq(self.raw.as_ptr()) });
        // Before the PD field goes: the orphans borrow it.
        Self::release_orphans(&mut self.orphans, rc == 0);
    }
}
