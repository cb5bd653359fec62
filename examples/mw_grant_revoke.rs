//! A memory window grants a peer a part of a region, and takes it back: one process, an owner on
//! one device and a peer on the other, joined by an RC connection.
//!
//! ```text
//! cargo run --example mw_grant_revoke -- [OWNER_DEVICE PEER_DEVICE]   # default: rxe0 rxe1
//! scripts/softroce run -- target/debug/examples/mw_grant_revoke      # in the Soft-RoCE VM
//! ```
//!
//! The owner registers its own `Vec<u8>` with `MW_BIND` and no remote access of its own: a peer
//! reaches it only through a window. It binds a type 2 window over 4 KiB of it with
//! `REMOTE_WRITE` (`PostScope::bind_window`) and hands the bound window's `RemoteRegion` (address,
//! the window's key, length) to the peer, here a plain function argument where a program would
//! send it over its own channel. The peer's RDMA WRITE lands. The owner then invalidates the
//! window (`PostScope::invalidate_window`, which deallocates a type 2 window's verbs window at
//! once and gives a new one back): the peer's next WRITE with the
//! same grant completes with `RemoteAccessError` and changes nothing. The owner gets its `Vec`
//! back (`into_inner`) and reads what the peer wrote.
//!
//! **Soft-RoCE's defect**: on rxe (Linux 6.1 and 6.12) a window does not confine the peer to its
//! range: a WRITE with the window's key anywhere inside the *region* lands (docs/safety.md,
//! section 7). On rxe, bind windows to a region that holds only what may be granted (this
//! example's region is larger than its window only to show the API). The invalidation is
//! enforced, as this example shows. A refused WRITE is a fatal error for the peer's RC
//! connection: its QP is in the error state afterwards, and a real peer reconnects.
//!
//! Exits with status 1 and a one-line reason if a step does not do what it should.

use std::ops::Range;
use std::time::Duration;

use rdma_verbs::*;

const T: Duration = Duration::from_secs(5);
/// The owner's region, and the part of it the window grants.
const REGION_LEN: usize = 64 << 10;
const GRANTED: Range<usize> = 4096..8192;

type BoxResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let mut args = std::env::args().skip(1);
    let owner = args.next().unwrap_or_else(|| "rxe0".into());
    let peer = args.next().unwrap_or_else(|| "rxe1".into());
    if let Err(e) = run(&owner, &peer) {
        eprintln!("mw_grant_revoke: {e}");
        std::process::exit(1);
    }
}

/// The GID index of the device's first IPv4-mapped GID (RoCE v2 on Soft-RoCE), else 0.
fn ipv4_gid(ctx: &Context) -> Result<u8> {
    Ok(ctx.gid_table()?.iter().find(|g| g.gid.to_ipv4_mapped().is_some()).map_or(0, |g| g.index))
}

/// Posts one RDMA WRITE of `src` to `to` from `qp` and returns its completion status.
fn write(
    qp: &QueuePair<'_, Rc, ReadyToSend>,
    src: &MemoryRegion<'_>,
    len: usize,
    to: RemoteRegion,
) -> Result<WcStatus> {
    qp.scope(T, |s| {
        let sge = [src.sge(..len)?];
        s.post_send(&mut [SendRequest::write(1, &sge, to)])?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        Ok(s.wait(1, &mut wcs, T)?[0].status())
    })
}

fn run(owner_dev: &str, peer_dev: &str) -> BoxResult<()> {
    let (owner_ctx, peer_ctx) = (Context::open(owner_dev)?, Context::open(peer_dev)?);
    let (owner_pd, peer_pd) = (owner_ctx.alloc_pd()?, peer_ctx.alloc_pd()?);
    let (owner_cq, peer_cq) = (owner_ctx.create_cq(16, None)?, peer_ctx.create_cq(16, None)?);
    // The owner's QP lets peers write; what they may write is up to the window's grant.
    let qp_access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE;
    let owner =
        owner_pd.create_qp::<Rc>(QpCreateAttr::new(&owner_cq, &owner_cq))?.init(InitAttr::new(1).access(qp_access))?;
    let peer = peer_pd.create_qp::<Rc>(QpCreateAttr::new(&peer_cq, &peer_cq))?.init(InitAttr::new(1))?;
    let (owner_gid, peer_gid) = (ipv4_gid(&owner_ctx)?, ipv4_gid(&peer_ctx)?);
    let (owner_ep, peer_ep) = (owner.endpoint(owner_gid, 1)?, peer.endpoint(peer_gid, 2)?);
    let owner = owner.handshake(peer_ep, owner_gid, 1)?;
    let peer = peer.handshake(owner_ep, peer_gid, 2)?;
    println!("connected: owner on {owner_dev} (QP {}), peer on {peer_dev} (QP {})", owner_ep.qp_num, peer_ep.qp_num);

    // The owner's own memory, registered as it is: windows may bind to it, nobody else may reach it.
    let region = owner_pd.register(vec![0u8; REGION_LEN], AccessFlags::LOCAL_WRITE | AccessFlags::MW_BIND)?;
    let source = peer_pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;

    // Grant: bind a type 2 window over GRANTED, write access only.
    let window = owner_pd.alloc_mw(WindowType::Type2)?;
    let bound = owner.scope(T, |s| {
        let bound = s.bind_window(1, window, &region, GRANTED, AccessFlags::REMOTE_WRITE)?;
        let mut wcs: [WorkCompletion; 1] = Default::default();
        s.wait(1, &mut wcs, T)?[0].ok()?;
        Ok::<_, Error>(bound)
    })?;
    let grant = bound.remote();
    println!(
        "granted: {} bytes at {:#x} (offset {} of the region) with the window's rkey {:#x}; the region itself grants no remote access",
        grant.len, grant.addr, GRANTED.start, grant.rkey
    );

    // The peer writes into its grant.
    let first = b"written through the window";
    source.write_at(0, first)?;
    match write(&peer, &source, first.len(), grant)? {
        WcStatus::Success => println!("peer's WRITE of {} bytes: Success", first.len()),
        other => return Err(format!("the peer's WRITE into its grant completed with {other:?}").into()),
    }

    // Revoke: invalidate the window; it comes back unbound.
    // A type 2 window is revoked at once: nothing to wait for.
    let window = owner.scope(T, |s| s.invalidate_window(2, bound))?;
    println!("revoked: the window (rkey {:#x}) is invalidated, unbound again", window.rkey());

    // The peer tries again with the grant it kept.
    let second = b"after the revocation!!!!!!";
    source.write_at(0, second)?;
    match write(&peer, &source, second.len(), grant)? {
        WcStatus::RemoteAccessError => println!("peer's WRITE with the revoked grant: RemoteAccessError"),
        other => return Err(format!("a WRITE with the revoked grant completed with {other:?}").into()),
    }

    // The owner takes its Vec back and reads what arrived.
    drop(window);
    let memory = region.into_inner()?;
    let landed = &memory[GRANTED.start..GRANTED.start + first.len()];
    if landed != first {
        return Err(format!("the granted bytes hold {:?}", String::from_utf8_lossy(landed)).into());
    }
    println!(
        "the owner's Vec holds {:?}: the first WRITE landed, the refused one changed nothing",
        String::from_utf8_lossy(landed)
    );
    Ok(())
}
