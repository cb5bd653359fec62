//! What travels on the wire: the hello in the CM's private data, and the immediate value of
//! every message. docs/stream.md describes the protocol these carry.

/// The first bytes of a stream's hello.
const MAGIC: [u8; 4] = *b"RDst";
/// The protocol version this crate speaks.
const VERSION: u8 = 1;
/// The hello's length: magic, version, three bytes reserved (zero), message size (u32 LE),
/// messages (u32 LE).
pub(crate) const HELLO_LEN: usize = 16;

/// The end of a direction (a half-close) rides on the last message of that direction.
const FIN: u32 = 1 << 31;
/// The part of the immediate that counts freed receives.
pub(crate) const COUNT_MASK: u32 = FIN - 1;

/// What a side tells its peer when it connects or accepts: how its receives are made.
/// The peer sends messages of at most `message_size` bytes, and keeps at most `messages`
/// of them unreturned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    pub(crate) message_size: u32,
    pub(crate) messages: u32,
}

impl Hello {
    /// The hello's bytes, for the CM's private data.
    pub(crate) fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[8..12].copy_from_slice(&self.message_size.to_le_bytes());
        b[12..16].copy_from_slice(&self.messages.to_le_bytes());
        b
    }

    /// The hello in a peer's private data, if it is one of this version. The private data may
    /// be longer than the hello (the CM pads it).
    pub(crate) fn decode(data: &[u8]) -> Option<Hello> {
        let b = data.get(..HELLO_LEN)?;
        if b[..4] != MAGIC || b[4] != VERSION {
            return None;
        }
        let word = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"));
        Some(Hello { message_size: word(8), messages: word(12) })
    }

    /// Whether a stream can be built with this hello: messages of at least a byte, and a window
    /// of 3..=[`MAX_MESSAGES`](crate::MAX_MESSAGES) of them.
    pub(crate) fn in_range(&self) -> bool {
        self.message_size > 0 && (3..=crate::options::MAX_MESSAGES).contains(&self.messages)
    }
}

/// The immediate value of a message: the sender's count of receives it has freed since the
/// connection began (modulo 2^31), and whether the message ends the sender's direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Imm {
    pub(crate) freed: u32,
    pub(crate) fin: bool,
}

impl Imm {
    pub(crate) fn encode(self) -> u32 {
        (self.freed & COUNT_MASK) | if self.fin { FIN } else { 0 }
    }

    pub(crate) fn decode(imm: u32) -> Imm {
        Imm { freed: imm & COUNT_MASK, fin: imm & FIN != 0 }
    }
}

/// `later - earlier` of two counts modulo 2^31: how far a count moved on.
pub(crate) fn count_diff(later: u32, earlier: u32) -> u32 {
    later.wrapping_sub(earlier) & COUNT_MASK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_decodes_to_what_was_encoded_and_refuses_other_bytes() {
        let h = Hello { message_size: 65536, messages: 16 };
        let mut padded = h.encode().to_vec();
        padded.extend_from_slice(&[0; 40]);
        assert_eq!(Hello::decode(&padded), Some(h));
        assert_eq!(Hello::decode(&padded[..15]), None);
        let mut other = h.encode();
        other[4] = 2;
        assert_eq!(Hello::decode(&other), None);
        assert_eq!(Hello::decode(b"ECHO\0\0\0\0\0\0\0\0\0\0\0\0"), None);
    }

    #[test]
    fn an_immediate_carries_the_count_modulo_2_31_and_the_end() {
        for (freed, fin) in [(0, false), (1, true), (COUNT_MASK, false), (COUNT_MASK, true)] {
            assert_eq!(Imm::decode(Imm { freed, fin }.encode()), Imm { freed, fin });
        }
        assert_eq!(Imm::decode(Imm { freed: COUNT_MASK + 5, fin: false }.encode()).freed, 4);
        assert_eq!(count_diff(3, COUNT_MASK - 1), 5);
        assert_eq!(count_diff(7, 7), 0);
    }
}
