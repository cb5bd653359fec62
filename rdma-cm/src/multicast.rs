//! Multicast: a UD identifier's membership of a group, its QP attached, left on drop.

use std::net::SocketAddr;

use rdma_verbs::ffi;
use rdma_verbs::{AddressHandle, Gid, MulticastAttachment, ProtectionDomain, QueuePair, ReadyToSend, Ud};

use crate::addr::RawAddr;
use crate::error::{Error, Result};
use crate::event::{EventKind, RawEvent, UdParams};
use crate::id::AddressResolved;
use crate::pending::{Joining, Waiting};
use crate::raw_id::RawId;
use crate::ud::UdId;

/// The call and the state a join names in its errors.
const JOIN: &str = "rdma_join_multicast";
const JOINING: &str = "joining a multicast group";

/// A joined group, left (`rdma_leave_multicast()`) on drop. Holds the identifier borrowed.
struct Joined<'a> {
    id: &'a UdId<AddressResolved>,
    group: SocketAddr,
}

impl Drop for Joined<'_> {
    #[doc(alias = "rdma_leave_multicast")]
    fn drop(&mut self) {
        let mut raw = RawAddr::new(self.group);
        // SAFETY: live identifier (borrowed) that joined `group`. librdmacm's leave waits until
        // every event of the group it read was acknowledged; this crate acknowledges each event
        // in the step that reads it, and the identifier is borrowed by nothing else that reads,
        // so it does not wait. An error (the kernel left already) changes nothing.
        unsafe { ffi::rdma_leave_multicast(self.id.as_raw(), raw.as_mut_ptr()) };
    }
}

/// A UD identifier's membership of a multicast group, with its queue pair attached: what
/// [`UdId::join`] gives. Dropping it gives up its hold of the group on the QP, which detaches
/// (`ibv_detach_mcast()`) with the QP's last hold, and leaves the group
/// (`rdma_leave_multicast()`).
///
/// It borrows the identifier (exclusively: one group per identifier at a time) and the QP, so
/// neither can go while it lives, and the group is left before the identifier is destroyed
/// (which would leave it too). The QP keeps the attachment itself, counted, as a hold only the
/// membership gives up ([`QueuePair::attach_multicast_held`]): the QP's own
/// [`detach_multicast`](QueuePair::detach_multicast) cannot detach a group a membership holds.
/// The QP detaches before it is destroyed (the kernel refuses to destroy an attached QP,
/// `EBUSY`): forgetting a membership (`mem::forget`) leaves the group joined for the
/// identifier's life, and nothing else.
///
/// Sends to the group go to its address vector ([`create_ah`](Self::create_ah)), to QP number
/// `0xFFFFFF` ([`qp_num`](Self::qp_num)), with its Q_Key ([`qkey`](Self::qkey)).
///
/// # References
/// - [`rdma_join_multicast(3)`](https://man7.org/linux/man-pages/man3/rdma_join_multicast.3.html)
/// - [`rdma_leave_multicast(3)`](https://man7.org/linux/man-pages/man3/rdma_leave_multicast.3.html)
/// - [`ibv_attach_mcast(3)`](https://man7.org/linux/man-pages/man3/ibv_attach_mcast.3.html)
#[must_use = "dropping it at once leaves the group"]
pub struct Membership<'a> {
    // Fields drop in order: the QP's hold first (detaching it with the last hold), then the
    // group is left.
    _attachment: MulticastAttachment<'a>,
    joined: Joined<'a>,
    qp: &'a QueuePair<'a, Ud, ReadyToSend>,
    params: UdParams,
}

impl std::fmt::Debug for Membership<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Membership")
            .field("group", &self.joined.group)
            .field("qp", &self.qp.qp_num())
            .field("params", &self.params)
            .finish()
    }
}

impl Membership<'_> {
    /// The group joined.
    pub fn group(&self) -> SocketAddr {
        self.joined.group
    }

    /// The group's GID (its multicast GID: on RoCE v2 the group's IPv4 address mapped into
    /// IPv6), what the QP is attached to.
    pub fn mgid(&self) -> Gid {
        self.params.address.dgid
    }

    /// The group's LID (0 on RoCE).
    pub fn mlid(&self) -> u16 {
        self.params.address.dlid
    }

    /// Everything the join's event carried: the group's address vector, QP number `0xFFFFFF`
    /// and Q_Key.
    pub fn params(&self) -> &UdParams {
        &self.params
    }

    /// The QP number sends to the group go to: `0xFFFFFF`, as the CM gives.
    pub fn qp_num(&self) -> u32 {
        self.params.qp_num
    }

    /// The group's Q_Key (the `remote_qkey` of sends to it).
    pub fn qkey(&self) -> u32 {
        self.params.qkey
    }

    /// The RDMA device of the identifier that joined.
    pub fn device_name(&self) -> &str {
        self.joined.id.device_name()
    }

    /// Creates the address handle of sends to the group in `pd` (`ibv_create_ah()` with the
    /// group's address vector). It borrows `pd`, so it cannot outlive it; it does not borrow
    /// the membership (sends to a group need no membership of the sender's own QP).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] when `pd` is on another device than the identifier;
    /// [`Error::Verbs`] when `ibv_create_ah` fails.
    #[doc(alias = "ibv_create_ah")]
    pub fn create_ah<'pd>(&self, pd: &'pd ProtectionDomain<'_>) -> Result<AddressHandle<'pd>> {
        crate::ud::create_ah(&self.params, self.device_name(), pd)
    }
}

/// The kernel's `ENOTSUPP` (`include/linux/errno.h`; not in libc).
const ENOTSUPP: i32 = 524;

/// The error of a refused `rdma_join_multicast()` call.
fn join_refused(group: SocketAddr, device: &str, errno: i32) -> Error {
    let device = Some(device.to_owned());
    match errno {
        // `cma_iboe_join_multicast` (drivers/infiniband/core/cma.c): an IPv6 group on a port
        // whose CM speaks RoCE v2.
        ENOTSUPP if group.is_ipv6() => Error::Unsupported {
            verb: JOIN,
            device,
            reason: format!(
                "the kernel's CM joins no IPv6 group ({group}) on a RoCE v2 port (ENOTSUPP from cma_iboe_join_multicast)"
            ),
            errno: Some(errno),
        },
        ENOTSUPP | libc::EOPNOTSUPP | libc::ENOSYS => Error::Unsupported {
            verb: JOIN,
            device,
            reason: format!("joining {group}: errno {errno}"),
            errno: Some(errno),
        },
        _ => Error::Multicast { verb: JOIN, group, device, errno },
    }
}

impl<'a> Joining<'a> {
    /// `rdma_join_multicast()`, the wait for `RDMA_CM_EVENT_MULTICAST_JOIN`,
    /// `ibv_attach_mcast()`.
    pub(crate) async fn run(self, how: &Waiting) -> Result<Membership<'a>> {
        let Joining { id, qp, group } = self;
        // Exclusive for the membership's life; shared from here on.
        let id: &'a UdId<AddressResolved> = id;
        let device = id.device_name();
        let on_device = |e: Error| e.on_device(device);
        RawId::check_device(qp, device)?;
        if how.has_passed() {
            return Err(how.timed_out(JOIN).on_device(device));
        }
        let mut raw = RawAddr::new(group);
        // SAFETY: live identifier with a resolved address; `raw` is a valid sockaddr librdmacm
        // copies; no context pointer.
        let rc = unsafe { ffi::rdma_join_multicast(id.as_raw(), raw.as_mut_ptr(), std::ptr::null_mut()) };
        if rc != 0 {
            let errno = Error::last_os_error(JOIN).errno().unwrap_or(libc::EIO);
            return Err(join_refused(group, device, errno));
        }
        // Joined (or joining) from here on: an error, or a dropped future, leaves.
        let joined = Joined { id, group };
        let refusal = |ev: &RawEvent| {
            (ev.kind() == EventKind::MulticastError).then(|| Error::Multicast {
                verb: "RDMA_CM_EVENT_MULTICAST_ERROR",
                group,
                device: None,
                errno: ev.errno().unwrap_or(libc::EIO),
            })
        };
        let ev = id
            .raw_id()
            .expect_as_or(how, EventKind::MulticastJoin, (JOIN, JOINING), group, refusal)
            .await
            .map_err(on_device)?;
        // The event's private-data pointer is the join's context, not data.
        let params = ev.ud(false);
        drop(ev);
        // The QP keeps the attachment: it detaches before it is destroyed even if the membership
        // is forgotten, and only the membership gives its hold up.
        let attachment = match qp.attach_multicast_held(params.address.dgid, params.address.dlid) {
            Ok(attachment) => attachment,
            Err(e) => {
                let errno = e.errno().unwrap_or(libc::EIO);
                let device = Some(device.to_owned());
                return Err(Error::Multicast { verb: "ibv_attach_mcast", group, device, errno });
            }
        };
        Ok(Membership { _attachment: attachment, joined, qp, params })
    }
}
