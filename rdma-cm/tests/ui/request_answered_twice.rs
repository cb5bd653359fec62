// A connection request is answered once: after `reject` it is gone.
use std::time::Duration;

use rdma_cm::Listener;

fn main() {
    let listener = Listener::bind("10.77.0.1:0".parse().unwrap(), 1).unwrap();
    let req = listener.recv_request(Duration::from_secs(1)).unwrap();
    req.reject(b"no").unwrap();
    req.reject(b"still no").unwrap();
}
