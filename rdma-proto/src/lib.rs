//! A file-transfer protocol over RDMA: a Send/Recv control plane (HELLO, MR, FIN, ACK) and a
//! pipelined one-sided RDMA WRITE data plane.
//!
//! Not written yet: this release only reserves the crate and its place in the workspace
//! (it depends on `rdma-verbs` and `rdma-cm`). Its design is in the workspace's
//! `docs/architecture.md`.

/// The connection manager crate this protocol connects with.
pub use rdma_cm as cm;
/// The verbs crate this protocol moves data with.
pub use rdma_verbs as verbs;
