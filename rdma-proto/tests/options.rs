//! Options no session could be served with are refused before anything is bound (no device
//! needed: the refusal comes first).
#![cfg(feature = "driver")]

use rdma_proto::driver::{Error, ReceiveOptions, Server};

/// `rdma-copy recv --max-chunk 0` was accepted, and would have granted 1-byte slots (issue 21,
/// 1.4). On the code before, this got the listener's error (no device here) instead.
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
