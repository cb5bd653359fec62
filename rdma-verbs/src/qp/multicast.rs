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

use std::fmt;
use std::sync::Mutex;

use crate::ffi;

use super::state::{TypeState, Ud};
use super::{Inner, QueuePair};
use crate::error::{Error, Result};
use crate::gid::Gid;

/// One group a QP is attached to, with the holds that keep it attached: the QP's own
/// ([`QueuePair::attach_multicast`]) and those of [`MulticastAttachment`] guards, counted
/// apart so that neither kind can give up the other's.
#[derive(Debug)]
struct Group {
    gid: Gid,
    lid: u16,
    /// Holds of `attach_multicast`, which `detach_multicast` gives up.
    own: u32,
    /// Holds of live (or forgotten) `MulticastAttachment`s, which only their drop gives up.
    guarded: u32,
}

/// The groups a QP is attached to, each with its holds.
#[derive(Debug, Default)]
pub(crate) struct Attachments(Mutex<Vec<Group>>);

impl Attachments {
    fn with<R>(&self, f: impl FnOnce(&mut Vec<Group>) -> R) -> R {
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

/// Adds a hold of `(gid, lid)` to the QP, attaching it with the first: `ibv_attach_mcast()`.
fn hold(inner: &Inner<'_>, gid: Gid, lid: u16, guarded: bool) -> Result<()> {
    inner.multicast.with(|list| {
        let at = match list.iter().position(|g| (g.gid, g.lid) == (gid, lid)) {
            Some(at) => at,
            None => {
                let raw = gid.as_raw();
                // SAFETY: a live UD QP; `raw` is a readable GID the call copies.
                let rc = unsafe { ffi::ibv_attach_mcast(inner.raw(), &raw, lid) };
                if rc != 0 {
                    return Err(Error::from_errno("ibv_attach_mcast", Some(inner.device()), errno_of(rc)));
                }
                list.push(Group { gid, lid, own: 0, guarded: 0 });
                list.len() - 1
            }
        };
        let count = if guarded { &mut list[at].guarded } else { &mut list[at].own };
        *count += 1;
        Ok(())
    })
}

/// Gives up a hold of `(gid, lid)` of the kind `guarded` names, detaching the QP with the last
/// hold of either kind: `ibv_detach_mcast()`.
fn release(inner: &Inner<'_>, gid: Gid, lid: u16, guarded: bool) -> Result<()> {
    inner.multicast.with(|list| {
        let found =
            list.iter().position(|g| (g.gid, g.lid) == (gid, lid) && if guarded { g.guarded > 0 } else { g.own > 0 });
        let Some(at) = found else {
            let held = list.iter().any(|g| (g.gid, g.lid) == (gid, lid) && g.guarded > 0);
            let reason = if held {
                format!(
                    "the QP holds group {gid} (LID {lid}) only through a MulticastAttachment (such as rdma-cm's \
                     Membership), which gives its hold up when it is dropped"
                )
            } else {
                format!("the QP is not attached to group {gid} (LID {lid})")
            };
            return Err(Error::invalid("ibv_detach_mcast", Some(inner.device()), reason));
        };
        let g = &mut list[at];
        if guarded {
            g.guarded -= 1;
        } else {
            g.own -= 1;
        }
        if g.own + g.guarded > 0 {
            return Ok(());
        }
        detach(inner, gid, lid)?;
        list.remove(at);
        Ok(())
    })
}

impl<S: TypeState> QueuePair<'_, Ud, S> {
    /// Attaches the QP to the multicast group `gid` (LID `lid`, 0 on RoCE): its receives then
    /// take the group's datagrams too. `ibv_attach_mcast()`.
    ///
    /// Attachments are counted: attaching to a group the QP is attached to already adds a hold
    /// (the kernel keeps one attachment), and only the last
    /// [`detach_multicast`](Self::detach_multicast) of it detaches. The holds of
    /// [`MulticastAttachment`] guards ([`attach_multicast_held`](Self::attach_multicast_held))
    /// are counted apart and keep the QP attached too. The QP detaches from every group still
    /// attached before it is destroyed.
    ///
    /// # Errors
    /// [`Error::Verb`] with the `errno` the verb returned.
    ///
    /// # References
    /// - [`ibv_attach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
    #[doc(alias = "ibv_attach_mcast")]
    pub fn attach_multicast(&self, gid: Gid, lid: u16) -> Result<()> {
        hold(&self.inner, gid, lid, false)
    }

    /// Attaches the QP to the group `gid` (LID `lid`) as [`attach_multicast`](Self::attach_multicast)
    /// does, with a hold that only the returned guard gives up, when it is dropped:
    /// [`detach_multicast`](Self::detach_multicast) cannot take it. What a library keeps for
    /// as long as one of its own values lives (rdma-cm's `Membership`) holds a group this way.
    ///
    /// # Errors
    /// As [`attach_multicast`](Self::attach_multicast).
    #[doc(alias = "ibv_attach_mcast")]
    pub fn attach_multicast_held(&self, gid: Gid, lid: u16) -> Result<MulticastAttachment<'_>> {
        hold(&self.inner, gid, lid, true)?;
        Ok(MulticastAttachment { inner: &self.inner, gid, lid })
    }

    /// Gives up one hold of the group `gid` that [`attach_multicast`](Self::attach_multicast)
    /// added, detaching the QP from it with the last hold: `ibv_detach_mcast()`. The holds of
    /// [`MulticastAttachment`] guards are not its to give up.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when the QP holds no attachment to the group of its own
    /// (none, or only through guards); [`Error::Verb`] when the verb fails (the QP then stays
    /// attached, and detaches before it is destroyed).
    ///
    /// # References
    /// - [`ibv_detach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
    #[doc(alias = "ibv_detach_mcast")]
    pub fn detach_multicast(&self, gid: Gid, lid: u16) -> Result<()> {
        release(&self.inner, gid, lid, false)
    }
}

/// A hold of a multicast group on a UD QP ([`QueuePair::attach_multicast_held`]), given up
/// when it is dropped: the QP detaches from the group with its last hold
/// (`ibv_detach_mcast()`). It borrows the QP. Forgetting it keeps the QP attached until the
/// QP is destroyed, which detaches first.
#[doc(alias = "ibv_detach_mcast")]
#[must_use = "dropping it at once gives the hold up"]
pub struct MulticastAttachment<'q> {
    inner: &'q Inner<'q>,
    gid: Gid,
    lid: u16,
}

impl fmt::Debug for MulticastAttachment<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MulticastAttachment").field("gid", &self.gid).field("lid", &self.lid).finish()
    }
}

impl MulticastAttachment<'_> {
    /// The group's GID.
    pub fn gid(&self) -> Gid {
        self.gid
    }

    /// The group's LID (0 on RoCE).
    pub fn lid(&self) -> u16 {
        self.lid
    }
}

impl Drop for MulticastAttachment<'_> {
    fn drop(&mut self) {
        // A failed detach leaves the attachment with the QP, which detaches before it is
        // destroyed.
        let _ = release(self.inner, self.gid, self.lid, true);
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
    for g in left {
        let _ = detach(inner, g.gid, g.lid);
    }
}
