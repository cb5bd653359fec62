//! Options no session could be served with are refused before anything is bound (no device
//! needed: the refusal comes first).
#![cfg(feature = "driver")]

use rdma_proto::driver::{Error, ReceiveOptions, Server};

/// `rdma-copy recv --max-chunk 0` is refused as a usage error before anything is bound (it
/// would grant 1-byte slots); no device is needed to see it.
#[test]
fn a_receiver_with_a_max_chunk_of_zero_is_refused() {
    let mut opts = ReceiveOptions::default();
    opts.max_chunk = 0;
    match Server::bind("127.0.0.1:0".parse().unwrap(), opts) {
        Err(e @ Error::Usage(_)) => {
            assert!(e.to_string().contains("max_chunk 0"), "{e}");
            assert_eq!(e.exit_code(), 1);
        }
        Err(other) => panic!("{other:?} instead of a usage error"),
        Ok(_) => panic!("a receiver with 1-byte chunks was bound"),
    }
}

/// A /proc file reports a size of 0 and yields data: it is refused before connecting (not
/// sent as 0 bytes with exit 0), so this test gets the file's error, not the connection's
/// (no device here).
#[test]
fn a_file_that_reports_no_size_but_has_data_is_refused_before_connecting() {
    use rdma_proto::driver::{send_file, SendOptions};
    let opts = SendOptions::new("127.0.0.1:9".parse().unwrap());
    let path = std::path::Path::new("/proc/self/status");
    match send_file(path, &opts, |_, _| {}) {
        Err(e @ Error::File { .. }) => {
            assert!(e.to_string().contains("size of 0 but has data"), "{e}");
            assert_eq!(e.exit_code(), 5);
        }
        Err(other) => panic!("{other:?} instead of a file error"),
        Ok(r) => panic!("sent {} bytes of a /proc file", r.bytes),
    }
    // An empty regular file is still sendable: it gets as far as connecting.
    let empty = std::env::temp_dir().join(format!("rdma-proto-empty-{}", std::process::id()));
    std::fs::write(&empty, b"").unwrap();
    let r = send_file(&empty, &opts, |_, _| {});
    std::fs::remove_file(&empty).unwrap();
    assert!(!matches!(r, Err(Error::File { .. }) | Err(Error::Usage(_))), "{r:?}");
}

/// An ACK timeout exponent outside 1..=31 (0 would mean "never retransmit") is a usage error,
/// on both sides, before anything is bound or connected.
#[test]
fn an_ack_timeout_outside_five_bits_is_refused_on_both_sides() {
    use rdma_proto::driver::{send_file, SendOptions};
    for bad in [0u8, 32] {
        let mut opts = ReceiveOptions::default();
        opts.ack_timeout = bad;
        match Server::bind("127.0.0.1:0".parse().unwrap(), opts) {
            Err(e @ Error::Usage(_)) => assert!(e.to_string().contains("ack_timeout"), "{e}"),
            Err(other) => panic!("{bad}: {other:?} instead of a usage error"),
            Ok(_) => panic!("{bad}: a receiver was bound"),
        }
        let mut opts = SendOptions::new("127.0.0.1:9".parse().unwrap());
        opts.ack_timeout = bad;
        let path = std::env::temp_dir().join(format!("rdma-proto-ack-{}-{bad}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let r = send_file(&path, &opts, |_, _| {});
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(r, Err(Error::Usage(ref m)) if m.contains("ack_timeout")), "{bad}: {r:?}");
    }
}
