//! Without RDMA (no `/dev/infiniband/rdma_cm`), creating an identifier fails with a typed error
//! that names the call and `ENODEV` and says what to do, in `rdma-verbs`' own words when there is
//! no device at all; with it, creation succeeds. Either way nothing panics.

use std::path::Path;

use rdma_cm::{CmId, Error, Listener};

#[test]
fn creating_an_identifier_reports_a_missing_rdma_cm_device() {
    if Path::new("/dev/infiniband/rdma_cm").exists() {
        assert!(CmId::new().is_ok(), "rdma_cm is present: creating an identifier must work");
        return;
    }
    let available = rdma_verbs::DeviceList::available().map(|l| l.names()).unwrap_or_default();
    let err = CmId::new().unwrap_err();
    match &err {
        Error::NoDevice { verb: "rdma_create_event_channel", errno, available: listed } => {
            assert_eq!(*errno, libc::ENODEV, "{}", std::io::Error::from_raw_os_error(*errno));
            assert_eq!(listed, &available);
        }
        other => panic!("expected NoDevice from rdma_create_event_channel, got {other:?}"),
    }
    // What rdma-verbs says when it finds no device, or (devices, but no CM) what to load.
    let advice = if available.is_empty() {
        rdma_verbs::Error::NoDevice { name: None, available: vec![] }.to_string()
    } else {
        "is the rdma_ucm module loaded?".to_owned()
    };
    assert!(err.to_string().contains(&advice), "{err}");
    let err = Listener::bind("127.0.0.1:0".parse().unwrap(), 1).unwrap_err();
    assert_eq!(err.errno(), Some(libc::ENODEV));
    assert!(err.to_string().starts_with("rdma_create_event_channel: "), "{err}");
    assert!(err.to_string().contains(&advice), "{err}");
}
