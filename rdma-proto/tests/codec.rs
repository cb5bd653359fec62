//! Property tests of the control-plane codec (`rdma_proto::wire`): every message kind round-trips
//! through zero padding, decoding never panics, every truncation and every mutated header field
//! is a typed error, limits are enforced on both sides, and the layout is the one
//! `docs/protocol.md` documents byte for byte.

use proptest::prelude::*;
use rdma_proto::wire::{
    self, caps, decode, decode_header, encode, Ack, Challenge, Credit, End, Entry, EntryKind, Fin, Grant, Header,
    Hello, Kind, Knock, Lane, Lanes, Message, Proof, Ready, WireError, HEADER_LEN, MAGIC, MAX_DETAIL_LEN,
    MAX_DIGEST_LEN, MAX_MESSAGE_LEN, MAX_NAME_LEN,
};
use rdma_proto::Status;

/// Valid UTF-8 of at most `max` bytes (characters from the whole range, multi-byte included).
fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..=max).prop_map(move |chars| {
        let mut s = String::new();
        for c in chars {
            if s.len() + c.len_utf8() > max {
                break;
            }
            s.push(c);
        }
        s
    })
}

fn hello() -> impl Strategy<Value = Hello> {
    (
        any::<(u16, u16)>(),
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        text(MAX_NAME_LEN),
        any::<Option<u64>>(),
        any::<u16>(),
    )
        .prop_map(|((a, b), caps, size, chunk, depth, name, resume, lanes)| {
            // With LANES the key is always on the wire: absent reads as 0 with RESUME, and 0
            // reads as absent without it.
            let (resume, lanes) = match (caps & caps::LANES != 0, caps & caps::RESUME != 0) {
                (false, _) => (resume, 1),
                (true, true) => (Some(resume.unwrap_or(0)), lanes),
                (true, false) => (resume.filter(|&k| k != 0), lanes),
            };
            Hello { version_min: a.min(b), version_max: a.max(b), caps, size, chunk, depth, name, resume, lanes }
        })
}

fn grant() -> impl Strategy<Value = Grant> {
    (any::<(u16, u32, u64, u32, u32, u32)>(), any::<u64>(), any::<(u16, [u8; 16])>()).prop_map(
        |((version, caps, addr, rkey, slot_size, slot_count), resume_from, (count, token))| Grant {
            version,
            caps,
            addr,
            rkey,
            slot_size,
            slot_count,
            resume_from,
            // The lanes block is there exactly when LANES is granted.
            lanes: (caps & caps::LANES != 0).then_some(Lanes { count, token }),
        },
    )
}

fn fin() -> impl Strategy<Value = Fin> {
    (any::<u64>(), any::<u64>(), prop::collection::vec(any::<u8>(), 0..=MAX_DIGEST_LEN))
        .prop_map(|(chunks, size, digest)| Fin { chunks, size, digest })
}

fn ack() -> impl Strategy<Value = Ack> {
    (prop::sample::select(Status::ALL.to_vec()), any::<u64>(), text(MAX_DETAIL_LEN))
        .prop_map(|(status, received, detail)| Ack { status, received, detail })
}

/// Any valid message of any kind.
fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        hello().prop_map(Message::Hello),
        grant().prop_map(Message::Grant),
        any::<u64>().prop_map(|consumed| Message::Credit(Credit { consumed })),
        fin().prop_map(Message::Fin),
        ack().prop_map(Message::Ack),
        any::<[u8; 16]>().prop_map(|nonce| Message::Challenge(Challenge { nonce, prefix: None })),
        (any::<[u8; 16]>(), any::<u32>(), any::<u64>()).prop_map(|(nonce, index, from)| {
            Message::Challenge(Challenge { nonce, prefix: Some(wire::PrefixClaim { index, from }) })
        }),
        (any::<[u8; 16]>(), any::<[u8; 32]>()).prop_map(|(nonce, mac)| Message::Proof(Proof { nonce, mac })),
        entry().prop_map(Message::Entry),
        (any::<u32>(), any::<u64>()).prop_map(|(index, resume_from)| Message::Ready(Ready { index, resume_from })),
        any::<u32>().prop_map(|entries| Message::End(End { entries })),
        (any::<u16>(), any::<[u8; 16]>()).prop_map(|(lane, token)| Message::Lane(Lane { lane, token })),
        (any::<u64>(), any::<[u8; 16]>()).prop_map(|(time, mac)| Message::Knock(Knock { time, mac })),
        Just(Message::Cancel(wire::Cancel)),
    ]
}

fn entry() -> impl Strategy<Value = Entry> {
    let kind = prop_oneof![Just(EntryKind::File), Just(EntryKind::Directory)];
    let path = prop::collection::vec(any::<char>(), 0..=40).prop_map(|c| c.into_iter().collect::<String>());
    (any::<u32>(), kind, any::<u8>(), any::<u32>(), any::<i64>(), 0u32..1_000_000_000, any::<u64>(), any::<u64>(), path)
        .prop_map(|(index, kind, flags, mode, mtime_sec, mtime_nsec, size, resume, path)| Entry {
            index,
            kind,
            flags,
            mode,
            mtime_sec,
            mtime_nsec,
            size,
            resume,
            path,
        })
}

fn encoded(session: u64, m: &Message) -> Vec<u8> {
    let mut out = Vec::new();
    encode(session, m, &mut out).expect("a message within the limits encodes");
    out
}

fn set_len(buf: &mut [u8], len: usize) {
    buf[8..12].copy_from_slice(&(len as u32).to_be_bytes());
}

/// A header with valid magic, framing version and kind, and a length within `buf`: the body
/// decoder gets arbitrary bytes to parse.
fn framed_garbage() -> impl Strategy<Value = Vec<u8>> {
    (1u8..=5, any::<u64>(), prop::collection::vec(any::<u8>(), 0..=MAX_MESSAGE_LEN - HEADER_LEN)).prop_map(
        |(kind, session, body)| {
            let mut buf = MAGIC.to_vec();
            buf.extend_from_slice(&[wire::FRAME_VERSION, kind, 0, 0]);
            buf.extend_from_slice(&((HEADER_LEN + body.len()) as u32).to_be_bytes());
            buf.extend_from_slice(&session.to_be_bytes());
            buf.extend_from_slice(&body);
            buf
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_message_round_trips_through_zero_padding(
        session in any::<u64>(),
        m in message(),
        padding in 0usize..=MAX_MESSAGE_LEN,
    ) {
        let mut buf = encoded(session, &m);
        let len = buf.len();
        prop_assert!((HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len));
        buf.resize(len + padding, 0);
        let header = Header { kind: m.kind(), len: len as u32, session };
        prop_assert_eq!(decode_header(&buf), Ok(header));
        prop_assert_eq!(decode(&buf), Ok((header, m)));
    }

    #[test]
    fn whatever_encodes_decodes_to_itself(
        session in any::<u64>(),
        versions in any::<(u16, u16)>(),
        hello in hello(),
    ) {
        // Unsorted version ranges too: encode must not send what decode refuses.
        let m = Message::Hello(Hello { version_min: versions.0, version_max: versions.1, ..hello });
        let mut buf = Vec::new();
        match encode(session, &m, &mut buf) {
            Ok(()) => prop_assert_eq!(decode(&buf).map(|(_, back)| back), Ok(m)),
            Err(e) => prop_assert!(matches!(e, WireError::Invalid { .. }), "{:?}", e),
        }
    }

    #[test]
    fn encode_replaces_what_the_buffer_held(session in any::<u64>(), m in message(), old in prop::collection::vec(any::<u8>(), 0..64)) {
        let mut out = old;
        encode(session, &m, &mut out).unwrap();
        prop_assert_eq!(out, encoded(session, &m));
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..=MAX_MESSAGE_LEN + 64)) {
        let header = decode_header(&bytes);
        match decode(&bytes) {
            Ok((h, _)) => prop_assert_eq!(header, Ok(h)),
            Err(e) => prop_assert!(header.is_ok() || header == Err(e)),
        }
    }

    #[test]
    fn arbitrary_bodies_behind_a_valid_header_never_panic(buf in framed_garbage()) {
        if let Ok((h, _)) = decode(&buf) {
            prop_assert_eq!(h.len as usize, buf.len());
        }
    }

    #[test]
    fn every_truncation_is_truncated(session in any::<u64>(), m in message()) {
        let buf = encoded(session, &m);
        for cut in 0..buf.len() {
            let r = decode(&buf[..cut]);
            prop_assert!(matches!(r, Err(WireError::Truncated { .. })), "cut {}: {:?}", cut, r);
        }
    }

    #[test]
    fn a_length_field_cutting_into_the_body_is_truncated(session in any::<u64>(), m in message()) {
        // Every field of version 1 is mandatory: a shorter length always cuts one. The fields
        // appended since (a HELLO's resume key, a GRANT's resume_from) are whole or absent: a
        // length that ends right before one is that message without it.
        let buf = encoded(session, &m);
        let (appended, without) = match &m {
            Message::Hello(h) if h.resume.is_some() && h.caps & caps::LANES == 0 => (8, Some(Message::Hello(Hello { resume: None, ..h.clone() }))),
            Message::Grant(g) if buf.len() == 54 => (8, Some(Message::Grant(Grant { resume_from: 0, ..*g }))),
            Message::Challenge(c) if c.prefix.is_some() => (12, Some(Message::Challenge(Challenge { prefix: None, ..*c }))),
            _ => (0, None),
        };
        for len in HEADER_LEN..buf.len() {
            let mut short = buf.clone();
            set_len(&mut short, len);
            let r = decode(&short);
            if len == buf.len() - appended && without.is_some() {
                prop_assert_eq!(r.map(|(_, m)| m).ok(), without.clone(), "length {}", len);
                continue;
            }
            prop_assert!(matches!(r, Err(WireError::Truncated { .. })), "length {}: {:?}", len, r);
        }
    }

    #[test]
    fn a_mutated_length_is_a_typed_error_or_the_same_message(
        session in any::<u64>(),
        m in message(),
        len in any::<u32>(),
        padding in 0usize..64,
    ) {
        let mut buf = encoded(session, &m);
        let real = buf.len();
        buf.resize(real + padding, 0);
        set_len(&mut buf, len as usize);
        let r = decode(&buf);
        let len = len as usize;
        if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len) {
            prop_assert_eq!(r, Err(WireError::BadLength(len as u32)));
        } else if len > buf.len() || len < real {
            prop_assert!(matches!(r, Err(WireError::Truncated { .. })), "{:?}", r);
        } else {
            // A longer length takes zero padding into the body: trailing bytes are ignored.
            let (h, back) = r.unwrap();
            prop_assert_eq!(h.len as usize, len);
            prop_assert_eq!(back, m);
        }
    }

    #[test]
    fn a_mutated_magic_is_bad_magic(session in any::<u64>(), m in message(), at in 0usize..4, byte in any::<u8>()) {
        let mut buf = encoded(session, &m);
        prop_assume!(buf[at] != byte);
        buf[at] = byte;
        prop_assert_eq!(decode(&buf), Err(WireError::BadMagic));
    }

    #[test]
    fn a_mutated_framing_version_is_refused(session in any::<u64>(), m in message(), byte in any::<u8>()) {
        prop_assume!(byte != wire::FRAME_VERSION);
        let mut buf = encoded(session, &m);
        buf[4] = byte;
        prop_assert_eq!(decode(&buf), Err(WireError::FrameVersion(byte)));
    }

    #[test]
    fn a_mutated_kind_is_a_typed_error_or_a_message_of_that_kind(session in any::<u64>(), m in message(), byte in any::<u8>()) {
        let mut buf = encoded(session, &m);
        buf[5] = byte;
        match decode(&buf) {
            Ok((h, back)) => {
                prop_assert_eq!(h.kind as u8, byte);
                prop_assert_eq!(back.kind(), h.kind);
            }
            Err(WireError::UnknownKind(k)) => prop_assert!(k == byte && !(1..=12).contains(&byte)),
            Err(WireError::Truncated { .. } | WireError::Invalid { .. }) => prop_assert!((1..=12).contains(&byte)),
            Err(e) => prop_assert!(false, "kind {}: {:?}", byte, e),
        }
    }

    #[test]
    fn a_mutated_body_byte_never_panics(session in any::<u64>(), m in message(), at in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut buf = encoded(session, &m);
        // A message with no body (CANCEL) has no body byte to mutate.
        prop_assume!(buf.len() > HEADER_LEN);
        let at = HEADER_LEN + at.index(buf.len() - HEADER_LEN);
        buf[at] = byte;
        if let Ok((h, back)) = decode(&buf) {
            prop_assert_eq!((h.kind, h.len as usize, h.session), (m.kind(), buf.len(), session));
            prop_assert_eq!(back.kind(), m.kind());
        }
    }

    #[test]
    fn the_flags_and_appended_body_bytes_are_ignored(
        session in any::<u64>(),
        m in message(),
        flags in any::<[u8; 2]>(),
        extra in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        // How a later version extends a message: fields appended within the length, after every
        // field this version knows (its optional appended fields included).
        let m = match m {
            Message::Hello(h) if h.caps & caps::LANES == 0 => Message::Hello(Hello { resume: Some(h.resume.unwrap_or(0)), ..h }),
            Message::Grant(g) => Message::Grant(Grant { resume_from: g.resume_from.max(1), ..g }),
            Message::Challenge(c) => {
                let prefix = Some(c.prefix.unwrap_or(wire::PrefixClaim { index: 0, from: 1 }));
                Message::Challenge(Challenge { prefix, ..c })
            }
            m => m,
        };
        let mut buf = encoded(session, &m);
        prop_assume!(buf.len() + extra.len() <= MAX_MESSAGE_LEN);
        buf[6..8].copy_from_slice(&flags);
        buf.extend_from_slice(&extra);
        let len = buf.len();
        set_len(&mut buf, len);
        prop_assert_eq!(decode(&buf).map(|(_, back)| back), Ok(m));
    }

    #[test]
    fn a_detail_over_the_limit_is_cut_at_a_character_boundary(detail in text(4 * MAX_DETAIL_LEN), received in any::<u64>()) {
        let m = Message::Ack(Ack { status: Status::DiskIo, received, detail: detail.clone() });
        let buf = encoded(3, &m);
        let Ok((_, Message::Ack(back))) = decode(&buf) else { panic!("an ACK decodes") };
        prop_assert!(back.detail.len() <= MAX_DETAIL_LEN);
        prop_assert!(detail.starts_with(&back.detail));
        prop_assert!(back.detail.len() + 4 > MAX_DETAIL_LEN.min(detail.len()), "cut more than one character");
        prop_assert_eq!((back.status, back.received), (Status::DiskIo, received));
    }

    #[test]
    fn names_and_digests_over_the_limit_do_not_encode(
        name_len in MAX_NAME_LEN + 1..=2 * MAX_MESSAGE_LEN,
        digest_len in MAX_DIGEST_LEN + 1..=300,
    ) {
        let hello = Hello { version_min: 1, version_max: 1, caps: 1, size: 1, chunk: 1, depth: 1, name: "n".repeat(name_len), resume: None, lanes: 1 };
        let r = encode(1, &Message::Hello(hello), &mut Vec::new());
        prop_assert!(matches!(r, Err(WireError::Invalid { field: "name", .. })), "{:?}", r);
        let fin = Fin { chunks: 1, size: 1, digest: vec![7; digest_len] };
        let r = encode(1, &Message::Fin(fin), &mut Vec::new());
        prop_assert!(matches!(r, Err(WireError::Invalid { field: "digest", .. })), "{:?}", r);
    }

    #[test]
    fn a_name_length_over_the_limit_does_not_decode(name_len in MAX_NAME_LEN as u16 + 1..=u16::MAX) {
        let mut buf = encoded(1, &Message::Hello(Hello {
            version_min: 1, version_max: 1, caps: 1, size: 1, chunk: 1, depth: 1, name: String::new(),
            resume: None, lanes: 1,
        }));
        let at = buf.len() - 2;
        buf[at..].copy_from_slice(&name_len.to_be_bytes());
        buf.resize(MAX_MESSAGE_LEN, b'a');
        set_len(&mut buf, MAX_MESSAGE_LEN);
        let r = decode(&buf);
        prop_assert!(matches!(r, Err(WireError::Invalid { field: "name", .. })), "{:?}", r);
    }

    #[test]
    fn a_digest_length_over_the_limit_does_not_decode(digest_len in MAX_DIGEST_LEN as u8 + 1..=u8::MAX) {
        let mut buf = encoded(1, &Message::Fin(Fin { chunks: 1, size: 1, digest: Vec::new() }));
        let at = buf.len() - 1;
        buf[at] = digest_len;
        buf.resize(buf.len() + usize::from(digest_len), 0);
        let len = buf.len();
        set_len(&mut buf, len);
        let r = decode(&buf);
        prop_assert!(matches!(r, Err(WireError::Invalid { field: "digest", .. })), "{:?}", r);
    }

    #[test]
    fn a_detail_length_over_the_limit_does_not_decode(detail_len in MAX_DETAIL_LEN as u16 + 1..=u16::MAX) {
        let mut buf = encoded(1, &Message::Ack(Ack { status: Status::Ok, received: 0, detail: String::new() }));
        let at = buf.len() - 2;
        buf[at..].copy_from_slice(&detail_len.to_be_bytes());
        buf.resize(MAX_MESSAGE_LEN, b'd');
        set_len(&mut buf, MAX_MESSAGE_LEN);
        let r = decode(&buf);
        prop_assert!(matches!(r, Err(WireError::Invalid { field: "detail", .. })), "{:?}", r);
    }

    #[test]
    fn a_length_over_the_limit_is_bad_length(len in MAX_MESSAGE_LEN as u32 + 1..=u32::MAX, m in message()) {
        let mut buf = encoded(1, &m);
        set_len(&mut buf, len as usize);
        buf.resize(MAX_MESSAGE_LEN + 8, 0);
        prop_assert_eq!(decode(&buf), Err(WireError::BadLength(len)));
    }
}

#[test]
fn invalid_field_values_are_invalid() {
    let hello = |version_min: u16, version_max: u16, name: &[u8]| {
        let m = Message::Hello(Hello {
            version_min: 1,
            version_max: 1,
            caps: 1,
            size: 1,
            chunk: 1,
            depth: 1,
            name: "x".into(),
            resume: None,
            lanes: 1,
        });
        let mut buf = encoded(9, &m);
        buf[HEADER_LEN..HEADER_LEN + 2].copy_from_slice(&version_min.to_be_bytes());
        buf[HEADER_LEN + 2..HEADER_LEN + 4].copy_from_slice(&version_max.to_be_bytes());
        buf.truncate(buf.len() - 3);
        buf.extend_from_slice(&(name.len() as u16).to_be_bytes());
        buf.extend_from_slice(name);
        let len = buf.len();
        set_len(&mut buf, len);
        decode(&buf)
    };
    assert!(hello(1, 1, b"ok").is_ok());
    assert!(matches!(hello(3, 2, b"ok"), Err(WireError::Invalid { field: "version range", .. })));
    assert!(matches!(hello(1, 1, b"\xff\xfe"), Err(WireError::Invalid { field: "name", .. })));

    let mut ack = encoded(9, &Message::Ack(Ack { status: Status::Ok, received: 0, detail: "é".into() }));
    let status_at = HEADER_LEN;
    ack[status_at..status_at + 2].copy_from_slice(&(Status::ALL.len() as u16).to_be_bytes());
    assert!(matches!(decode(&ack), Err(WireError::Invalid { field: "status", .. })));
    ack[status_at..status_at + 2].copy_from_slice(&0u16.to_be_bytes());
    let last = ack.len() - 1;
    ack[last] = 0xff; // cuts the two-byte character
    assert!(matches!(decode(&ack), Err(WireError::Invalid { field: "detail", .. })));
}

#[test]
fn the_largest_messages_fit_the_limit() {
    let hello = Hello {
        version_min: 0,
        version_max: u16::MAX,
        caps: u32::MAX,
        size: u64::MAX,
        chunk: u32::MAX,
        depth: u32::MAX,
        name: "\u{10ffff}".repeat(MAX_NAME_LEN / 4) + "abc",
        resume: Some(u64::MAX),
        lanes: u16::MAX,
    };
    assert_eq!(hello.name.len(), MAX_NAME_LEN);
    let fin = Fin { chunks: u64::MAX, size: u64::MAX, digest: vec![0xff; MAX_DIGEST_LEN] };
    let ack = Ack { status: Status::Internal, received: u64::MAX, detail: "d".repeat(MAX_DETAIL_LEN) };
    for m in [Message::Hello(hello), Message::Fin(fin), Message::Ack(ack)] {
        let buf = encoded(u64::MAX, &m);
        assert!(buf.len() <= MAX_MESSAGE_LEN, "{:?}: {} bytes", m.kind(), buf.len());
        assert_eq!(decode(&buf).unwrap().1, m);
    }
}

/// The layout of `docs/protocol.md`, byte for byte, for one message of each kind.
#[test]
fn the_layout_is_the_documented_one() {
    let session = 0x0102_0304_0506_0708;
    let header = |kind: u8, len: u8| {
        let mut h = b"RDCP".to_vec();
        h.extend_from_slice(&[1, kind, 0, 0, 0, 0, 0, len, 1, 2, 3, 4, 5, 6, 7, 8]);
        h
    };
    let cases: [(Message, Vec<u8>); 13] = [
        (
            Message::Hello(Hello {
                version_min: 1,
                version_max: 2,
                caps: 0x0000_0101,
                size: 0x1122,
                chunk: 0x10_0000,
                depth: 16,
                name: "ab".into(),
                resume: None,
                lanes: 1,
            }),
            [
                header(1, 48),
                vec![
                    0, 1, 0, 2, 0, 0, 1, 1, 0, 0, 0, 0, 0, 0, 0x11, 0x22, 0, 0x10, 0, 0, 0, 0, 0, 16, 0, 2, b'a', b'b',
                ],
            ]
            .concat(),
        ),
        (
            Message::Grant(Grant {
                version: 1,
                caps: 1,
                addr: 0xaabb_ccdd_0000_1000,
                rkey: 0x55,
                slot_size: 4096,
                slot_count: 8,
                resume_from: 0,
                lanes: None,
            }),
            [
                header(2, 46),
                vec![0, 1, 0, 0, 0, 1, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0x10, 0, 0, 0, 0, 0x55, 0, 0, 0x10, 0, 0, 0, 0, 8],
            ]
            .concat(),
        ),
        (Message::Credit(Credit { consumed: 0x0102 }), [header(3, 28), vec![0, 0, 0, 0, 0, 0, 1, 2]].concat()),
        (
            Message::Fin(Fin { chunks: 3, size: 0x2001, digest: vec![0xde, 0xad] }),
            [header(4, 39), vec![0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0x20, 1, 2, 0xde, 0xad]].concat(),
        ),
        (
            Message::Ack(Ack { status: Status::Exists, received: 5, detail: "x".into() }),
            [header(5, 33), vec![0, 7, 0, 0, 0, 0, 0, 0, 0, 5, 0, 1, b'x']].concat(),
        ),
        (Message::Challenge(Challenge { nonce: [0xc1; 16], prefix: None }), [header(6, 36), vec![0xc1; 16]].concat()),
        // RESUME_PROOF (bit 13): a prefix CHALLENGE appends the entry's index and `from`.
        (
            Message::Challenge(Challenge {
                nonce: [0xc1; 16],
                prefix: Some(wire::PrefixClaim { index: 2, from: 0x0102_0304 }),
            }),
            [header(6, 48), vec![0xc1; 16], vec![0, 0, 0, 2], vec![0, 0, 0, 0, 1, 2, 3, 4]].concat(),
        ),
        (
            Message::Proof(Proof { nonce: [0xa1; 16], mac: [0xb2; 32] }),
            [header(7, 68), vec![0xa1; 16], vec![0xb2; 32]].concat(),
        ),
        // LANES (bit 11): the HELLO's key is then always there (0: none), the lanes after it.
        (
            Message::Hello(Hello {
                version_min: 1,
                version_max: 1,
                caps: 0x0000_0801,
                size: 0x1122,
                chunk: 0x10_0000,
                depth: 16,
                name: "ab".into(),
                resume: None,
                lanes: 4,
            }),
            [
                header(1, 58),
                vec![
                    0, 1, 0, 1, 0, 0, 8, 1, 0, 0, 0, 0, 0, 0, 0x11, 0x22, 0, 0x10, 0, 0, 0, 0, 0, 16, 0, 2, b'a', b'b',
                ],
                vec![0; 8],
                vec![0, 4],
            ]
            .concat(),
        ),
        // The GRANT's lanes block: resume_from always, the lanes granted, the token.
        (
            Message::Grant(Grant {
                version: 1,
                caps: 0x0000_0801,
                addr: 0xaabb_ccdd_0000_1000,
                rkey: 0x55,
                slot_size: 4096,
                slot_count: 8,
                resume_from: 0,
                lanes: Some(Lanes { count: 2, token: [0x7e; 16] }),
            }),
            [
                header(2, 72),
                vec![0, 1, 0, 0, 8, 1, 0xaa, 0xbb, 0xcc, 0xdd, 0, 0, 0x10, 0, 0, 0, 0, 0x55, 0, 0, 0x10, 0, 0, 0, 0, 8],
                vec![0; 8],
                vec![0, 2],
                vec![0x7e; 16],
            ]
            .concat(),
        ),
        (Message::Lane(Lane { lane: 3, token: [0x7e; 16] }), [header(11, 38), vec![0, 3], vec![0x7e; 16]].concat()),
        (
            Message::Knock(Knock { time: 0x0102_0304_0506_0708, mac: [0x5a; 16] }),
            [header(12, 44), vec![1, 2, 3, 4, 5, 6, 7, 8], vec![0x5a; 16]].concat(),
        ),
        // CANCEL (capability CANCEL, bit 14): the header alone.
        (Message::Cancel(wire::Cancel), header(13, 20)),
    ];
    for (m, bytes) in cases {
        assert_eq!(encoded(session, &m), bytes, "{:?}", m.kind());
        assert_eq!(decode(&bytes).unwrap(), (Header { kind: m.kind(), len: bytes.len() as u32, session }, m));
    }
    assert_eq!(
        [
            Kind::Hello,
            Kind::Grant,
            Kind::Credit,
            Kind::Fin,
            Kind::Ack,
            Kind::Challenge,
            Kind::Proof,
            Kind::Lane,
            Kind::Knock,
            Kind::Cancel
        ]
        .map(|k| k as u8),
        [1, 2, 3, 4, 5, 6, 7, 11, 12, 13],
        "kind bytes"
    );
}

#[test]
fn a_grant_whose_lanes_disagree_with_its_caps_does_not_encode() {
    let g = Grant {
        version: 1,
        caps: 1,
        addr: 0,
        rkey: 0,
        slot_size: 1,
        slot_count: 1,
        resume_from: 0,
        lanes: Some(Lanes { count: 2, token: [0; 16] }),
    };
    let mut out = Vec::new();
    assert!(matches!(encode(1, &Message::Grant(g), &mut out), Err(WireError::Invalid { field: "lanes", .. })));
    let g = Grant { caps: 1 | caps::LANES, lanes: None, ..g };
    assert!(matches!(encode(1, &Message::Grant(g), &mut out), Err(WireError::Invalid { field: "lanes", .. })));
    // A LANE fits a connect request's private data (56 bytes).
    let lane = encoded(1, &Message::Lane(Lane { lane: 1, token: [0; 16] }));
    assert_eq!(lane.len(), wire::LANE_LEN);
    assert!(lane.len() <= 56);
    // So does a KNOCK.
    let knock = encoded(1, &Message::Knock(Knock { time: 1, mac: [0; 16] }));
    assert_eq!(knock.len(), wire::KNOCK_LEN);
    assert!(knock.len() <= 56);
}
