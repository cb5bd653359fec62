//! The README's first program: a loopback send and receive on Soft-RoCE's `rxe0` (port 1, GID
//! index 1), all through the safe layer. `tests/readme.rs` checks that the README shows this
//! file's code as it is, so the README's program always compiles.
//!
//! ```text
//! cargo run --example loopback        # in the Soft-RoCE VM (scripts/softroce run -- ...)
//! ```

use std::time::Duration;

use rdma_verbs::*;

fn main() -> rdma_verbs::Result<()> {
    let ctx = Context::open("rxe0")?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq_with_channel(64)?; // waits sleep on its channel, or are awaited
    let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    let qp = pd.create_qp::<Rc>(QpCreateAttr::new(&cq, &cq))?.init(InitAttr::new(1))?;
    let me = qp.endpoint(1, 0)?; // a loopback connection: the QP is its own peer
    let qp = qp.handshake(me, 1, 0)?; // to RTS: GID index 1, the PSN `me` announced
    mr.write_at(0, b"hello")?;
    qp.scope(Duration::from_secs(1), |s| -> rdma_verbs::Result<()> {
        let (buf, msg) = ([mr.sge(2048..)?], [mr.sge(..5)?]);
        s.post_recv(&mut [RecvRequest::new(1, &buf)])?;
        s.post_send(&mut [SendRequest::send(2, &msg)])?;
        let mut wcs: [WorkCompletion; 2] = Default::default();
        for wc in s.wait(2, &mut wcs, Duration::from_secs(1))?.iter() {
            wc.ok()?;
        }
        Ok(())
    })?;
    let mut got = [0u8; 5];
    mr.read_at(2048, &mut got)?;
    assert_eq!(&got, b"hello");
    Ok(())
}
