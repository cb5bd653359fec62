//! Lists the RDMA devices with their ports and GID tables, like rdma-core's `ibv_devinfo`.
//!
//! ```text
//! cargo run --example devinfo              # every device
//! cargo run --example devinfo -- rxe0      # one device
//! scripts/demo                             # both Soft-RoCE ports, inside the VM
//! ```
//! Exits with status 1 and a one-line reason when there is no device (or not the one named).

use std::process::ExitCode;

use rdma_verbs::{Context, DeviceList};

fn show(ctx: &Context) -> rdma_verbs::Result<()> {
    let dev = ctx.query_device()?;
    println!(
        "{}: node GUID {:016x}, firmware {:?}, {} port(s)",
        ctx.name(),
        dev.node_guid,
        dev.fw_ver,
        dev.phys_port_cnt
    );
    println!(
        "  limits: {} QPs x {} WRs, {} CQs x {} CQEs, {} MRs up to {} bytes, {} SGEs",
        dev.max_qp, dev.max_qp_wr, dev.max_cq, dev.max_cqe, dev.max_mr, dev.max_mr_size, dev.max_sge
    );
    for port in 1..=ctx.port_count() {
        let attr = ctx.query_port(port)?;
        println!(
            "  port {port}: {:?}, link layer {:?}, active MTU {}, max MTU {}",
            attr.state,
            attr.link_layer,
            attr.active_mtu.bytes().unwrap_or(0),
            attr.max_mtu.bytes().unwrap_or(0)
        );
    }
    for gid in ctx.gid_table()? {
        println!("    GID[{}] port {}: {} ({:?})", gid.index, gid.port, gid.gid, gid.gid_type);
    }
    Ok(())
}

fn run(wanted: Option<String>) -> rdma_verbs::Result<()> {
    let list = DeviceList::available()?;
    let names = match wanted {
        Some(name) => vec![name],
        None if list.is_empty() => return Err(rdma_verbs::Error::NoDevice { name: None, available: vec![] }),
        None => list.names(),
    };
    drop(list);
    for name in names {
        show(&Context::open(&name)?)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(std::env::args().nth(1)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("devinfo: {e}");
            ExitCode::FAILURE
        }
    }
}
