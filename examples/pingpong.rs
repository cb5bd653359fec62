//! A loopback ping-pong on one device: two RC queue pairs on rxe0 send a message back and
//! forth through the safe posting scope, and the round-trip time is printed.
//!
//! ```text
//! cargo run --example pingpong -- [DEVICE] [ROUNDS]        # default: the first device, 1000
//! ```

use std::time::{Duration, Instant};

use rdma_verbs::*;

const T: Duration = Duration::from_secs(5);

fn main() {
    let mut args = std::env::args().skip(1);
    let device = args.next();
    let rounds: usize = args.next().map(|r| r.parse().expect("ROUNDS is a number")).unwrap_or(1000);
    if let Err(e) = run(device.as_deref(), rounds) {
        eprintln!("pingpong: {e}");
        std::process::exit(1);
    }
}

fn run(device: Option<&str>, rounds: usize) -> Result<(), Box<dyn std::error::Error>> {
    let ctx = match device {
        Some(d) => Context::open(d)?,
        None => Context::open_first()?,
    };
    let pd = ctx.alloc_pd()?;
    let (cq_a, cq_b) = (ctx.create_cq(16, None)?, ctx.create_cq(16, None)?);
    let gid_index = ctx.gid_table()?.iter().find(|g| g.gid.to_ipv4_mapped().is_some()).map_or(0, |g| g.index);
    let a = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_a, &cq_a))?.init(InitAttr::new(1))?;
    let b = pd.create_qp::<Rc>(QpCreateAttr::new(&cq_b, &cq_b))?.init(InitAttr::new(1))?;
    let (ea, eb) = (a.endpoint(gid_index, 1)?, b.endpoint(gid_index, 2)?);
    let a = a.handshake(eb, gid_index, 1)?;
    let b = b.handshake(ea, gid_index, 2)?;
    let (ma, mb) = (pd.alloc_mr(128, AccessFlags::LOCAL_WRITE)?, pd.alloc_mr(128, AccessFlags::LOCAL_WRITE)?);

    let mut wcs: [WorkCompletion; 4] = Default::default();
    let start = Instant::now();
    for round in 0..rounds as u64 {
        ma.write_at(0, &round.to_le_bytes())?;
        // a -> b, then b echoes it back to a.
        for (from, to, mfrom, mto) in [(&a, &b, &ma, &mb), (&b, &a, &mb, &ma)] {
            to.scope(T, |rs| -> Result<()> {
                let inbox = [mto.sge(64..128)?];
                rs.post_recv(&mut [RecvRequest::new(round, &inbox)])?;
                from.scope(T, |ss| -> Result<()> {
                    let msg = [mfrom.sge(0..8)?];
                    ss.post_send(&mut [SendRequest::send(round, &msg)])?;
                    ss.wait(1, &mut wcs, T)?[0].ok()?;
                    Ok(())
                })?;
                rs.wait(1, &mut wcs, T)?[0].ok()?;
                let mut got = [0u8; 8];
                mto.read_at(64, &mut got)?;
                mto.write_at(0, &got)?;
                Ok(())
            })?;
        }
        let mut back = [0u8; 8];
        ma.read_at(64, &mut back)?;
        if u64::from_le_bytes(back) != round {
            return Err(format!("round {round}: got {} back", u64::from_le_bytes(back)).into());
        }
    }
    let rtt = start.elapsed() / rounds.max(1) as u32;
    println!(
        "pingpong on {}: {rounds} round trips verified, {:.1} us per round trip",
        ctx.name(),
        rtt.as_secs_f64() * 1e6
    );
    Ok(())
}
