//! An identifier that is part of a connection, and what dropping it must tell the peer.

use std::sync::atomic::{AtomicU8, Ordering};

use rdma_verbs::ffi;

use crate::raw_id::RawId;

/// A connection request not yet answered: dropping it rejects.
pub(crate) const REQUESTED: u8 = 0;
/// Connected: dropping it disconnects.
pub(crate) const CONNECTED: u8 = 1;
/// Answered or disconnected: dropping it only destroys the identifier.
pub(crate) const DONE: u8 = 2;

/// A connection's identifier and its phase. Drop answers for the phase (reject or disconnect),
/// then destroys the identifier and its channel.
pub(crate) struct ConnId {
    pub(crate) id: RawId,
    phase: AtomicU8,
}

impl ConnId {
    pub(crate) fn new(id: RawId, phase: u8) -> Self {
        ConnId { id, phase: AtomicU8::new(phase) }
    }

    pub(crate) fn set_phase(&self, phase: u8) {
        self.phase.store(phase, Ordering::Release);
    }

    pub(crate) fn phase(&self) -> u8 {
        self.phase.load(Ordering::Acquire)
    }
}

impl std::fmt::Debug for ConnId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnId").field("id", &self.id).field("phase", &self.phase()).finish()
    }
}

impl Drop for ConnId {
    fn drop(&mut self) {
        match self.phase() {
            // SAFETY: live identifier of an unanswered request; no private data.
            REQUESTED => unsafe {
                ffi::rdma_reject(self.id.as_ptr(), std::ptr::null(), 0);
            },
            // SAFETY: live, connected identifier. Errors (the peer already left) change nothing.
            CONNECTED => unsafe {
                ffi::rdma_disconnect(self.id.as_ptr());
            },
            _ => {}
        }
    }
}
