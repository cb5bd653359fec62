//! [`Status`]: the outcome an ACK carries, and the sender's exit code for it.

use std::fmt;

/// The receiver's verdict on a transfer (the ACK's status code).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Stored under its final name, digest matched.
    Ok,
    /// The whole-file digest did not match the data received.
    ChecksumMismatch,
    /// The receiver could not write or sync the file.
    DiskIo,
    /// The receiver's filesystem is full.
    NoSpace,
    /// No protocol version or required capability in common, or a message out of order.
    ProtocolMismatch,
    /// The file is larger than the receiver accepts.
    TooLarge,
    /// The name is not one valid path component.
    BadName,
    /// A file of that name exists and the receiver does not replace files.
    Exists,
    /// The receiver has no room for another transfer now.
    Busy,
    /// The sender is not allowed to send (reserved for authentication).
    NotAuthorized,
    /// The receiver failed for a reason of its own.
    Internal,
}

impl Status {
    /// Every status, in code order.
    pub const ALL: [Status; 11] = [
        Status::Ok,
        Status::ChecksumMismatch,
        Status::DiskIo,
        Status::NoSpace,
        Status::ProtocolMismatch,
        Status::TooLarge,
        Status::BadName,
        Status::Exists,
        Status::Busy,
        Status::NotAuthorized,
        Status::Internal,
    ];

    /// The status's code on the wire.
    pub fn code(self) -> u16 {
        match self {
            Status::Ok => 0,
            Status::ChecksumMismatch => 1,
            Status::DiskIo => 2,
            Status::NoSpace => 3,
            Status::ProtocolMismatch => 4,
            Status::TooLarge => 5,
            Status::BadName => 6,
            Status::Exists => 7,
            Status::Busy => 8,
            Status::NotAuthorized => 9,
            Status::Internal => 10,
        }
    }

    /// The status of a wire code; `None` for codes this version does not know.
    pub fn from_code(code: u16) -> Option<Self> {
        Status::ALL.get(usize::from(code)).copied()
    }

    /// The process exit code a sender uses for this status: 0 for [`Status::Ok`], `10 + code`
    /// otherwise (1..9 are left for the tool's own failures: usage, connection, timeout).
    pub fn exit_code(self) -> i32 {
        if self == Status::Ok {
            0
        } else {
            10 + i32::from(self.code())
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::ChecksumMismatch => "checksum mismatch",
            Status::DiskIo => "disk I/O error",
            Status::NoSpace => "no space left on the receiver",
            Status::ProtocolMismatch => "protocol mismatch",
            Status::TooLarge => "file too large for the receiver",
            Status::BadName => "bad file name",
            Status::Exists => "file exists on the receiver",
            Status::Busy => "receiver busy",
            Status::NotAuthorized => "not authorized",
            Status::Internal => "receiver internal error",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_codes_are_none() {
        for s in Status::ALL {
            assert_eq!(Status::from_code(s.code()), Some(s));
        }
        assert_eq!(Status::from_code(11), None);
        assert_eq!(Status::Ok.exit_code(), 0);
        assert_eq!(Status::Exists.exit_code(), 17);
    }
}
