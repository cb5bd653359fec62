//! The control messages a state machine has encoded and its driver has not taken yet.

use std::collections::VecDeque;

use crate::seal::Seal;
use crate::wire::{self, Message, WireError};

/// Encoded messages in one byte buffer reused for the whole session: after the first few
/// messages, encoding and handing them over allocate nothing. The machine announces each with
/// an `Action::Send`, and the driver takes it with the machine's `transmit` into a buffer of its
/// own.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    bytes: Vec<u8>,
    /// The length of each message in `bytes`, oldest first, from `head` on.
    lens: VecDeque<usize>,
    head: usize,
    scratch: Vec<u8>,
}

impl Outbox {
    /// Encodes `m` of `session` behind the messages already waiting, sealed with `seal` if
    /// given ([`crate::seal`]).
    pub(crate) fn push(&mut self, session: u64, m: &Message, seal: Option<&mut Seal>) -> Result<(), WireError> {
        wire::encode(session, m, &mut self.scratch)?;
        if let Some(seal) = seal {
            seal.seal(&mut self.scratch);
        }
        self.bytes.extend_from_slice(&self.scratch);
        self.lens.push_back(self.scratch.len());
        Ok(())
    }

    /// Moves the oldest message into `out` (replacing its contents); `false` when none waits.
    pub(crate) fn take(&mut self, out: &mut Vec<u8>) -> bool {
        let Some(len) = self.lens.pop_front() else { return false };
        out.clear();
        out.extend_from_slice(&self.bytes[self.head..self.head + len]);
        self.head += len;
        if self.lens.is_empty() {
            self.bytes.clear();
            self.head = 0;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Credit, Message};

    #[test]
    fn messages_come_out_whole_and_in_order_and_the_buffer_is_reused() {
        let mut o = Outbox::default();
        let mut out = Vec::new();
        assert!(!o.take(&mut out), "nothing waits");
        for n in 0..3 {
            o.push(7, &Message::Credit(Credit { consumed: n }), None).unwrap();
        }
        for n in 0..3 {
            assert!(o.take(&mut out));
            let (h, m) = wire::decode(&out).unwrap();
            assert_eq!((h.session, m), (7, Message::Credit(Credit { consumed: n })));
        }
        assert!(!o.take(&mut out));
        let cap = o.bytes.capacity();
        o.push(7, &Message::Credit(Credit { consumed: 9 }), None).unwrap();
        assert_eq!(o.bytes.capacity(), cap, "the buffer is reused once drained");
    }
}
