//! Runs anywhere, with or without RDMA: what a program sees when the device it wants is absent.

use rdma_verbs::{Context, DeviceList, Error};

#[test]
fn missing_device_is_a_typed_error_naming_it() {
    // On a host whose kernel has no RDMA, libibverbs returns a NULL list: this must not crash.
    let present = DeviceList::available().expect("listing devices").names();
    match Context::open("no-such-rdma-device") {
        Err(e @ Error::NoDevice { .. }) => {
            let Error::NoDevice { name, available } = &e else { unreachable!() };
            assert_eq!(name.as_deref(), Some("no-such-rdma-device"));
            assert_eq!(available, &present);
            assert!(e.to_string().contains("no-such-rdma-device"), "{e}");
        }
        other => panic!("expected NoDevice, got {other:?}"),
    }
}
