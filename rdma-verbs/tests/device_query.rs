//! Device test: the device layer against the harness's two RoCE ports.
//!
//! Runs in the Soft-RoCE VM (`scripts/test`); skips with one line where there is no RDMA device.

use rdma_verbs::{Context, DeviceList, Error, GidType, LinkLayer, PortState};

#[test]
fn both_devices_are_listed_and_open() {
    let topo = testkit::require_topology!();
    let list = DeviceList::available().expect("ibv_get_device_list");
    for end in topo.endpoints() {
        let device = list.find(&end.device).unwrap_or_else(|| panic!("{} not in {:?}", end.device, list.names()));
        assert_ne!(device.guid(), 0, "{} has no node GUID", end.device);
        let ctx = device.open().expect("ibv_open_device");
        assert_eq!(ctx.name(), end.device);
    }
    drop(list);
}

#[test]
fn ports_are_active_ethernet_with_the_topology_mtu() {
    let topo = testkit::require_topology!();
    for end in topo.endpoints() {
        let ctx = Context::open(&end.device).unwrap();
        let dev = ctx.query_device().unwrap();
        assert!(dev.phys_port_cnt >= topo.port, "{}: {} ports", end.device, dev.phys_port_cnt);
        assert!(dev.max_qp > 0 && dev.max_cqe > 0 && dev.max_mr_size > 0, "{}: {dev:?}", end.device);
        let port = ctx.query_port(topo.port).unwrap();
        assert_eq!(port.state, PortState::Active, "{} port {}", end.device, topo.port);
        assert_eq!(port.link_layer, LinkLayer::Ethernet, "{} is not RoCE", end.device);
        assert_eq!(port.active_mtu.bytes(), Some(topo.mtu), "{} active MTU", end.device);
        assert!(port.gid_table_len > u32::from(topo.gid_index), "{}: GID table of {}", end.device, port.gid_table_len);
        // The extended attributes: rxe's port says the connection manager works on it
        // (IBV_PORT_CM_SUP), and has a link width and speed (from its netdev's).
        assert_ne!(port.port_cap_flags & (1 << 16), 0, "{}: {port:?}", end.device);
        assert!(port.active_width != 0 && port.active_speed != 0, "{}: {port:?}", end.device);
        assert_eq!((port.lid, port.sm_lid), (0, 0), "{}: RoCE has no LIDs", end.device);
    }
}

#[test]
fn the_device_clock_is_a_typed_refusal_on_rxe() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    let ex = ctx.query_device_ex().unwrap();
    let soft_roce = ex.attr.vendor_id == 0xFF_FFFF;
    match ctx.query_rt_values() {
        // rxe's provider has no query_rt_values (and its device no core clock).
        Err(Error::Unsupported { verb: "ibv_query_rt_values_ex", errno: Some(libc::EOPNOTSUPP), .. }) if soft_roce => {
            assert_eq!(ex.hca_core_clock_khz, 0, "rxe keeps no core clock");
        }
        Ok(v) if !soft_roce => assert!(v.raw_clock > 0),
        other => panic!("{}: {other:?}", topo.server.device),
    }
}

#[test]
fn roce_v2_gid_of_each_address_is_at_the_topology_index() {
    let topo = testkit::require_topology!();
    for end in topo.endpoints() {
        let ctx = Context::open(&end.device).unwrap();
        let entry = ctx.query_gid(topo.port, topo.gid_index).unwrap();
        assert_eq!(entry.gid_type, GidType::RoceV2, "{} GID[{}] = {}", end.device, topo.gid_index, entry.gid);
        assert_eq!(entry.gid.to_ipv4_mapped(), Some(end.addr), "{} GID[{}]", end.device, topo.gid_index);
        assert_eq!((entry.index, entry.port), (topo.gid_index, topo.port));
        assert!(entry.netdev_ifindex.is_some(), "a RoCE GID belongs to a netdev");

        let table = ctx.gid_table().unwrap();
        assert!(table.contains(&entry), "{}: table {table:?} lacks {entry:?}", end.device);
        assert!(table.iter().all(|e| !e.gid.is_zero()), "the table lists only valid entries");
    }
}

#[test]
fn bad_port_gid_index_and_name_are_typed_errors() {
    let topo = testkit::require_topology!();
    let ctx = Context::open(&topo.server.device).unwrap();
    for port in [0, ctx.port_count() + 1] {
        match ctx.query_port(port) {
            Err(Error::InvalidArgument { verb: "ibv_query_port", device: Some(d), .. }) => {
                assert_eq!(d, topo.server.device)
            }
            other => panic!("port {port}: {other:?}"),
        }
    }
    let len = ctx.query_port(topo.port).unwrap().gid_table_len;
    // Past the table: refused by name (rxe's table has 1024 entries, more than a u8 can name).
    if let Ok(len) = u8::try_from(len) {
        let r = ctx.query_gid(topo.port, len);
        assert!(matches!(r, Err(Error::InvalidArgument { verb: "ibv_query_gid_ex", .. })), "{r:?}");
    }

    match Context::open("no-such-rdma-device") {
        Err(Error::NoDevice { name: Some(n), available }) => {
            assert_eq!(n, "no-such-rdma-device");
            assert!(
                available.contains(&topo.server.device) && available.contains(&topo.client.device),
                "{available:?}"
            );
        }
        other => panic!("{other:?}"),
    }
}
