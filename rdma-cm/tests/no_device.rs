//! Without RDMA (no `/dev/infiniband/rdma_cm`), creating an identifier fails with a typed error
//! that names the call and `ENODEV`; with it, creation succeeds. Either way nothing panics.

use std::path::Path;

use rdma_cm::{CmId, Error, Listener};

#[test]
fn creating_an_identifier_reports_a_missing_rdma_cm_device() {
    if Path::new("/dev/infiniband/rdma_cm").exists() {
        assert!(CmId::new().is_ok(), "rdma_cm is present: creating an identifier must work");
        return;
    }
    match CmId::new() {
        Err(Error::Cm { verb: "rdma_create_event_channel", device: None, errno }) => {
            assert_eq!(errno, libc::ENODEV, "{}", std::io::Error::from_raw_os_error(errno));
        }
        other => panic!("expected ENODEV from rdma_create_event_channel, got {other:?}"),
    }
    let err = Listener::bind("127.0.0.1:0".parse().unwrap(), 1).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENODEV));
    assert!(err.to_string().starts_with("rdma_create_event_channel: "), "{err}");
}
