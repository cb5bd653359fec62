//! On-demand paging: the capability check of [`AccessFlags::ON_DEMAND`] and
//! [`MemoryRegion::advise`] (`ibv_advise_mr`).
//!
//! # References
//! - [`ibv_reg_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_reg_mr.3.html) (`IBV_ACCESS_ON_DEMAND`)
//! - [`ibv_advise_mr(3)`](https://man7.org/linux/man-pages/man3/ibv_advise_mr.3.html)

use std::ops::RangeBounds;

use crate::ffi;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::mr::{region_sge, AccessFlags, MemoryRegion, RegisteredBuffer};

/// Refuses `ON_DEMAND` access on a device whose extended attributes say it has no on-demand
/// paging (`odp_caps.general_caps` without `IBV_ODP_SUPPORT`): no verb is called.
pub(crate) fn check_on_demand(ctx: &Context, access: AccessFlags, verb: &'static str) -> Result<()> {
    if access.contains(AccessFlags::ON_DEMAND) && !ctx.odp().supported {
        let reason = "the device has no on-demand paging (odp_caps.general_caps lacks IBV_ODP_SUPPORT)";
        return Err(Error::unsupported(verb, Some(ctx.name()), reason));
    }
    Ok(())
}

/// What [`MemoryRegion::advise`] tells the device (`enum ibv_advise_mr_advice`).
#[doc(alias = "ibv_advise_mr_advice")]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MrAdvice {
    /// Fault the pages in for reading (`IBV_ADVISE_MR_ADVICE_PREFETCH`).
    Prefetch,
    /// Fault the pages in for writing (`IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`).
    PrefetchWrite,
    /// Map the pages already present, without faulting any in
    /// (`IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT`).
    PrefetchNoFault,
}

impl<B: RegisteredBuffer> MemoryRegion<'_, B> {
    /// Advises the device about `range` of this on-demand-paging region: `ibv_advise_mr()`,
    /// synchronously (`IBV_ADVISE_MR_FLAG_FLUSH`: it returns when the advice is carried out).
    ///
    /// # Errors
    /// [`Error::OutOfBounds`] for a range outside the region; [`Error::Unsupported`] when the
    /// provider takes no advice (`EOPNOTSUPP`; rxe on Linux 6.1 and 6.12); [`Error::Verb`]
    /// otherwise.
    #[doc(alias = "ibv_advise_mr")]
    pub fn advise(&self, advice: MrAdvice, range: impl RangeBounds<usize>) -> Result<()> {
        const VERB: &str = "ibv_advise_mr";
        let device = self.pd().context().name();
        let sge = region_sge("MemoryRegion::advise", self.addr(), self.lkey(), self.len(), range)?;
        let advice = match advice {
            MrAdvice::Prefetch => ffi::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH,
            MrAdvice::PrefetchWrite => ffi::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            MrAdvice::PrefetchNoFault => ffi::ib_uverbs_advise_mr_advice::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT,
        };
        let mut raw = sge.as_raw();
        // `IB_UVERBS_ADVISE_MR_FLAG_FLUSH` (rdma-sys has no name for it).
        let flush = 1;
        // SAFETY: the PD is live (held by the region) and `raw` names this live region.
        let rc = unsafe { ffi::ibv_advise_mr(self.pd().as_raw(), advice, flush, &mut raw, 1) };
        match rc {
            0 => Ok(()),
            libc::EOPNOTSUPP | libc::ENOSYS => Err(Error::Unsupported {
                verb: VERB,
                device: Some(device.to_owned()),
                reason: "the provider takes no memory advice".into(),
                errno: Some(rc),
            }),
            _ => Err(Error::from_errno(VERB, Some(device), rc)),
        }
    }
}
