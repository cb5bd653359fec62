// A transition that waits returns a pending value that does nothing until it is waited for or
// awaited: dropping it unused is caught (with `unused_must_use` denied, as in this crate's
// users' CI), not a silent no-op.
#![deny(unused_must_use)]
use rdma_cm::CmId;

fn main() {
    let id = CmId::new().unwrap();
    id.resolve(None, "10.77.0.1:7471".parse().unwrap());
}
