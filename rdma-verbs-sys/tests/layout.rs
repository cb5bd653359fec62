//! The checked-in bindings agree with the installed C headers: the size and alignment of every
//! structure the rdma crates read or write, and the offset of every field they touch, as a C
//! compiler sees them (`cc`, compiled now against `<infiniband/verbs.h>` and `<rdma/rdma_cma.h>`).
//!
//! Without a C compiler or rdma-core's headers the test prints one line and passes, unless
//! `RDMA_LAYOUT_REQUIRED=1` (set by `scripts/test`) makes that a failure.

use std::fmt::Write as _;
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use rdma_verbs_sys::*;

/// One line per structure (`NAME size align`) and per field (`NAME.FIELD offset`), as Rust sees
/// them, and the C statements that print the same lines.
struct Layout {
    rust: String,
    c: String,
}

impl Layout {
    fn structure<T>(&mut self, name: &str) {
        writeln!(self.rust, "{name} {} {}", size_of::<T>(), align_of::<T>()).unwrap();
        writeln!(self.c, "    printf(\"{name} %zu %zu\\n\", sizeof(struct {name}), _Alignof(struct {name}));").unwrap();
    }

    /// `c_field` is the C member: bindgen names anonymous unions `__bindgen_anon_N`, whose
    /// offset is that of any member of theirs in C.
    fn field(&mut self, name: &str, c_field: &str, offset: usize) {
        writeln!(self.rust, "{name}.{c_field} {offset}").unwrap();
        writeln!(self.c, "    printf(\"{name}.{c_field} %zu\\n\", offsetof(struct {name}, {c_field}));").unwrap();
    }
}

macro_rules! layout {
    ($l:ident; $($s:ident { $($f:tt $(as $c:ident)?),* $(,)? })*) => {$(
        $l.structure::<$s>(stringify!($s));
        $( $l.field(stringify!($s), layout!(@c $f $($c)?), offset_of!($s, $f)); )*
    )*};
    (@c $f:tt) => { stringify!($f) };
    (@c $f:tt $c:ident) => { stringify!($c) };
}

fn expected() -> Layout {
    let mut l = Layout { rust: String::new(), c: String::new() };
    layout! { l;
        ibv_sge { addr, length, lkey }
        ibv_send_wr { wr_id, next, sg_list, num_sge, opcode, send_flags, __bindgen_anon_1 as imm_data, wr, qp_type }
        ibv_recv_wr { wr_id, next, sg_list, num_sge }
        ibv_wc { wr_id, status, opcode, vendor_err, byte_len, __bindgen_anon_1 as imm_data, qp_num, src_qp,
                 wc_flags, pkey_index, slid, sl, dlid_path_bits }
        ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, abi_compat }
        ibv_context_ops { poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv }
        verbs_context { query_port, sz, context }
        ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type }
        ibv_cq { context, channel, cq_context, handle, cqe }
        ibv_srq { context, srq_context, pd, handle }
        ibv_comp_channel { context, fd, refcnt }
        ibv_pd { context, handle }
        ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        ibv_ah { context, pd, handle }
        ibv_qp_attr { qp_state, cur_qp_state, path_mtu, path_mig_state, qkey, rq_psn, sq_psn, dest_qp_num,
                      qp_access_flags, cap, ah_attr, alt_ah_attr, pkey_index, alt_pkey_index, en_sqd_async_notify,
                      sq_draining, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num, timeout, retry_cnt,
                      rnr_retry, alt_port_num, alt_timeout, rate_limit }
        ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        ibv_port_attr { state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, lid, sm_lid,
                        active_width, active_speed, phys_state, link_layer, flags, port_cap_flags2 }
        ibv_device_attr { fw_ver, node_guid, max_mr_size, max_qp, max_qp_wr, max_sge, max_cq, max_cqe, max_mr,
                          max_pd, max_qp_rd_atom, max_qp_init_rd_atom, max_srq, max_srq_wr, max_srq_sge, phys_port_cnt }
        ibv_srq_init_attr { srq_context, attr }
        ibv_srq_attr { max_wr, max_sge, srq_limit }
        ibv_async_event { element, event_type }
        ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        rdma_cm_id { verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
                     recv_cq_channel, recv_cq, srq, pd, qp_type }
        rdma_route { addr, path_rec, num_paths }
        rdma_addr { __bindgen_anon_1 as src_addr, __bindgen_anon_2 as dst_addr, addr }
        rdma_cm_event { id, listen_id, event, status, param }
        rdma_conn_param { private_data, private_data_len, responder_resources, initiator_depth, flow_control,
                          retry_count, rnr_retry_count, srq, qp_num }
        rdma_event_channel { fd }
    }
    l
}

#[test]
fn the_bindings_match_the_installed_headers() {
    let required = std::env::var_os("RDMA_LAYOUT_REQUIRED").is_some_and(|v| v == "1");
    let l = expected();
    let dir = std::env::temp_dir().join(format!("rdma-verbs-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (src, exe) = (dir.join("layout.c"), dir.join("layout"));
    let program = format!(
        "#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n\
         int main(void) {{\n{}    return 0;\n}}\n",
        l.c
    );
    std::fs::write(&src, program).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc).arg("-o").arg(&exe).arg(&src).output();
    let built = match built {
        Ok(out) if out.status.success() => true,
        Ok(out) => {
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!required && err.contains("No such file"), "{cc} failed on the layout program:\n{err}");
            false
        }
        Err(e) => {
            assert!(!required, "no C compiler ({cc}): {e}");
            false
        }
    };
    if !built {
        eprintln!(
            "skipped: layout check: no rdma-core headers or C compiler here (RDMA_LAYOUT_REQUIRED=1 makes it fail)"
        );
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    let out = Command::new(&exe).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(out.status.success());
    let c = String::from_utf8(out.stdout).unwrap();
    let differ: Vec<String> =
        l.rust.lines().zip(c.lines()).filter(|(r, c)| r != c).map(|(r, c)| format!("  Rust: {r:40}  C: {c}")).collect();
    assert_eq!(l.rust.lines().count(), c.lines().count());
    assert!(differ.is_empty(), "the bindings disagree with the installed headers:\n{}", differ.join("\n"));
    println!("{} structures and fields agree with the installed headers", c.lines().count());
}
