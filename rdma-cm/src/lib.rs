//! The rdma_cm connection manager as a typed state machine, on top of `rdma-verbs`.
//!
//! Not written yet: this release only reserves the crate and its place in the workspace
//! (it depends on `rdma-verbs`; `rdma-proto` depends on it). Its design is in the workspace's
//! `docs/architecture.md`.

/// The `rdma-verbs` crate this crate's queue pairs come from.
pub use rdma_verbs as verbs;
