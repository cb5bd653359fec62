//! A UD queue pair's multicast attachments (`ibv_attach_mcast`, `ibv_detach_mcast`), which the
//! QP itself keeps: [`QueuePair::attach_multicast`], [`QueuePair::detach_multicast`].
//!
//! The kernel refuses to destroy a QP that is still attached to a group (`EBUSY`), and a QP
//! that is not destroyed may still receive into the memory of its receives. So the QP counts
//! its attachments and detaches what is left before it is destroyed: a caller that forgets
//! to detach (a leaked guard, a failed detach) leaks nothing but the attachment.
//!
//! # References
//! - [`ibv_attach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)

use std::sync::Mutex;

use crate::ffi;

use super::state::{TypeState, Ud};
use super::{Inner, QueuePair};
use crate::error::{Error, Result};
use crate::gid::Gid;

/// The groups a QP is attached to, each with how many attach calls hold it.
#[derive(Debug, Default)]
pub(crate) struct Attachments(Mutex<Vec<(Gid, u16, u32)>>);

impl Attachments {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<(Gid, u16, u32)>) -> R) -> R {
        // A poisoned list is still the list: the calls below leave it consistent at each step.
        let mut list = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut list)
    }
}

/// The `errno` of a libibverbs call that returns it (or -1 with `errno` set).
fn errno_of(rc: libc::c_int) -> i32 {
    if rc > 0 {
        rc
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
    }
}

impl<S: TypeState> QueuePair<'_, Ud, S> {
    /// Attaches the QP to the multicast group `gid` (LID `lid`, 0 on RoCE): its receives then
    /// take the group's datagrams too. `ibv_attach_mcast()`.
    ///
    /// Attachments are counted: attaching to a group the QP is attached to already adds a hold
    /// (the kernel keeps one attachment), and only the last
    /// [`detach_multicast`](Self::detach_multicast) of it detaches. The QP detaches from every
    /// group still attached before it is destroyed.
    ///
    /// # Errors
    /// [`Error::Verb`] with the `errno` the verb returned.
    ///
    /// # References
    /// - [`ibv_attach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
    #[doc(alias = "ibv_attach_mcast")]
    pub fn attach_multicast(&self, gid: Gid, lid: u16) -> Result<()> {
        let inner = &self.inner;
        inner.multicast.with(|list| {
            if let Some(entry) = list.iter_mut().find(|(g, l, _)| (*g, *l) == (gid, lid)) {
                entry.2 += 1;
                return Ok(());
            }
            let raw = gid.as_raw();
            // SAFETY: a live UD QP; `raw` is a readable GID the call copies.
            let rc = unsafe { ffi::ibv_attach_mcast(inner.raw(), &raw, lid) };
            if rc != 0 {
                return Err(Error::from_errno("ibv_attach_mcast", Some(inner.device()), errno_of(rc)));
            }
            list.push((gid, lid, 1));
            Ok(())
        })
    }

    /// Gives up one hold of the group `gid` (see [`attach_multicast`](Self::attach_multicast)),
    /// detaching the QP from it with the last: `ibv_detach_mcast()`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the QP holds no attachment to the group;
    /// [`Error::Verb`] when the verb fails (the QP then stays attached, and detaches before it
    /// is destroyed).
    ///
    /// # References
    /// - [`ibv_detach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
    #[doc(alias = "ibv_detach_mcast")]
    pub fn detach_multicast(&self, gid: Gid, lid: u16) -> Result<()> {
        let inner = &self.inner;
        inner.multicast.with(|list| {
            let Some(at) = list.iter().position(|(g, l, holds)| (*g, *l) == (gid, lid) && *holds > 0) else {
                let reason = format!("the QP is not attached to group {gid} (LID {lid})");
                return Err(Error::invalid("ibv_detach_mcast", Some(inner.device()), reason));
            };
            list[at].2 -= 1;
            if list[at].2 > 0 {
                return Ok(());
            }
            detach(inner, gid, lid)?;
            list.remove(at);
            Ok(())
        })
    }
}

/// `ibv_detach_mcast()` of one group.
fn detach(inner: &Inner<'_>, gid: Gid, lid: u16) -> Result<()> {
    let raw = gid.as_raw();
    // SAFETY: a live UD QP attached to the group; `raw` is a readable GID.
    let rc = unsafe { ffi::ibv_detach_mcast(inner.raw(), &raw, lid) };
    if rc != 0 {
        return Err(Error::from_errno("ibv_detach_mcast", Some(inner.device()), errno_of(rc)));
    }
    Ok(())
}

/// Detaches the QP from every group it is still attached to: before it is destroyed.
pub(crate) fn detach_all(inner: &Inner<'_>) {
    let left = inner.multicast.with(std::mem::take);
    for (gid, lid, _) in left {
        let _ = detach(inner, gid, lid);
    }
}
