//! The simulation the machine tests run: both state machines, a simulated driver for each (a
//! file, a slot ring, an output file, a fake clock) and a simulated network between them, with
//! the protocol's rules checked at every action (`Sim::drain_sender`, `Sim::drain_receiver`) and
//! at the end (`Sim::check_end`). Seeded, so every case replays.
#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use rdma_proto::receiver::{self, Receiver, ReceiverConfig};
use rdma_proto::sender::{self, Sender, SenderConfig};
use rdma_proto::wire::{self, Credit, Message};
use rdma_proto::{Outcome, Status};

/// Address of slot 0 of the receiver's ring, as the simulated driver registers it.
pub const RING_ADDR: u64 = 0x7f3a_0000_4000;
/// The ring's rkey.
pub const RKEY: u32 = 0xbeef;
/// The session id every test sender uses.
pub const SESSION: u64 = 0x5e55_1011_0000_0001;

/// The test's whole-file digest of XXH3-128's size: FNV-1a on 128 bits (the core does not
/// hash; the driver does).
pub fn digest(data: &[u8]) -> Vec<u8> {
    digest_of(rdma_proto::Digest::Xxh3_128, None, data)
}

/// The test's stand-in for digest `d` keyed with `key` (the key's bytes hashed first): FNV-1a
/// on 128 bits, repeated to `d`'s size. Sides whose keys differ disagree, as with BLAKE3.
pub fn digest_of(d: rdma_proto::Digest, key: Option<&rdma_proto::digest::DigestKey>, data: &[u8]) -> Vec<u8> {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut h = OFFSET;
    for &b in key.map_or(&[][..], |k| &k.as_bytes()[..]).iter().chain(data) {
        h ^= u128::from(b);
        h = h.wrapping_mul(PRIME);
    }
    h.to_be_bytes().iter().cycle().take(d.size()).copied().collect()
}

/// The proof of a prefix as the simulated drivers compute it: a stand-in for BLAKE3 keyed with
/// `key` (the machines only compare the bytes); what matters is that both sides compute it over
/// the bytes they hold.
pub fn prefix_proof(key: &rdma_proto::digest::DigestKey, data: &[u8]) -> [u8; 32] {
    let d = digest_of(rdma_proto::Digest::Blake3Keyed, Some(key), data);
    d.try_into().expect("32 bytes")
}

/// xorshift64*: the seeded randomness of the simulation.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so that seeds 0, 1, 2... start far apart (and never at 0).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// True with probability `per_mille` / 1000.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }
    pub fn pick<T: Copy>(&mut self, of: &[T]) -> T {
        of[self.below(of.len() as u64) as usize]
    }
}

/// What the network does to packets, each in events per thousand packets (per thousand steps
/// for `clock_jump`).
#[derive(Debug, Clone, Copy, Default)]
pub struct Faults {
    /// Deliver a random packet in flight instead of the oldest.
    pub reorder: u32,
    /// Lose a packet (a lost WRITE may still complete at the sender).
    pub drop: u32,
    /// Deliver a packet twice (the copy at a random later point).
    pub duplicate: u32,
    /// Cut a packet short.
    pub truncate: u32,
    /// Flip a byte of a WRITE's data.
    pub corrupt: u32,
    /// A WRITE's data lands but its arrival (the receive completion) is lost.
    pub lose_arrival: u32,
    /// Jump the clock to the earliest deadline, so that a timeout fires mid-session.
    pub clock_jump: u32,
}

impl Faults {
    pub fn any(&self) -> bool {
        let f = *self;
        f.reorder + f.drop + f.duplicate + f.truncate + f.corrupt + f.lose_arrival + f.clock_jump > 0
    }
}

/// Hooks of the simulated receiver driver.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    /// Answer the Open with this failure.
    pub open_fails: Option<Status>,
    /// Flip a byte of this chunk's slot just before it is stored.
    pub corrupt_slot_of: Option<u64>,
    /// Fail storing this chunk with this status.
    pub store_fails: Option<(u64, Status)>,
    /// Deliver nothing more to either side after this many packets reached the receiver.
    pub blackout_after: Option<u64>,
    /// The receiver holds the file's first bytes from an earlier session (a partial): when the
    /// HELLO offers to resume, the driver answers the Open with `Resumed { from }` and the
    /// output starts with those bytes.
    pub resume_from: Option<u64>,
    /// With `resume_from`: the held prefix has one byte that differs from the file.
    pub corrupt_prefix: bool,
}

pub enum Packet {
    Control(Vec<u8>),
    Write { seq: u64, imm: u32, remote_addr: u64, rkey: u32, data: Vec<u8> },
}

pub struct InFlight {
    pub packet: Packet,
    /// A duplicate made by the network (never duplicated again).
    pub copy: bool,
}

impl InFlight {
    pub fn duplicate(&self) -> InFlight {
        let packet = match &self.packet {
            Packet::Control(b) => Packet::Control(b.clone()),
            Packet::Write { seq, imm, remote_addr, rkey, data } => {
                Packet::Write { seq: *seq, imm: *imm, remote_addr: *remote_addr, rkey: *rkey, data: data.clone() }
            }
        };
        InFlight { packet, copy: true }
    }
}

pub enum SendJob {
    Read { seq: u64, offset: u64, len: u32 },
    Digest,
    Prove { from: u64, key: rdma_proto::digest::DigestKey },
}

pub enum RecvJob {
    Open { size: u64, slot_size: u32, slot_count: u32 },
    StartOver,
    Store { seq: u64, slot: u32, offset: u64, len: u32 },
    Finalize { digest: Vec<u8> },
}

/// The receiver's temporary file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Temp {
    None,
    Open,
    Committed,
    Discarded,
}

/// Both machines, both drivers, the network between them and the clock.
pub struct Sim {
    pub label: String,
    pub rng: Rng,
    pub faults: Faults,
    pub hooks: Hooks,
    pub now: Instant,
    pub steps: u64,
    pub trace: VecDeque<String>,

    pub file: Vec<u8>,
    pub depth: u32,
    pub sender: Sender,
    pub send_jobs: VecDeque<SendJob>,
    /// Chunks read into local slots and not yet handed to the network.
    pub local: BTreeMap<u64, Vec<u8>>,
    pub reads_asked: u64,
    /// WRITEs delivered (or lost) whose completion the sender has not been told.
    pub completions: Vec<u64>,
    /// Chunks whose WRITE completion the sender was told (`WriteDone` of the last one).
    pub write_done: u64,
    /// The highest CREDIT delivered to the sender.
    pub credit_seen: u64,
    pub max_local_slots: u64,
    pub sender_outcome: Option<Outcome>,

    pub to_receiver: VecDeque<InFlight>,
    pub to_sender: VecDeque<InFlight>,
    pub delivered_to_receiver: u64,

    pub receiver: Receiver,
    pub recv_jobs: VecDeque<RecvJob>,
    pub ring: Vec<u8>,
    pub geometry: Option<(u32, u32)>,
    pub output: Vec<u8>,
    pub temp: Temp,
    /// The partial a sender that could not prove its bytes left alone (`StartOver`): what it
    /// held then.
    pub partial: Option<Vec<u8>>,
    /// How many times the receiver started the file over.
    pub started_over: u32,
    pub stores_asked: u64,
    pub stored: u64,
    pub max_ring_in_use: u64,
    pub acks_sent: Vec<Status>,
    pub receiver_outcome: Option<Outcome>,
}

impl Sim {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        label: String,
        seed: u64,
        file: Vec<u8>,
        name: &str,
        sender_cfg: SenderConfig,
        receiver_cfg: ReceiverConfig,
        faults: Faults,
        hooks: Hooks,
    ) -> Sim {
        let now = Instant::now();
        let depth = sender_cfg.depth;
        let sender =
            Sender::new(SESSION, name, file.len() as u64, sender_cfg, now).expect("a valid sender").with_nonce([1; 16]);
        Sim {
            label,
            rng: Rng::new(seed),
            faults,
            hooks,
            now,
            steps: 0,
            trace: VecDeque::new(),
            file,
            depth,
            sender,
            send_jobs: VecDeque::new(),
            local: BTreeMap::new(),
            reads_asked: 0,
            completions: Vec::new(),
            write_done: 0,
            credit_seen: 0,
            max_local_slots: 0,
            sender_outcome: None,
            to_receiver: VecDeque::new(),
            to_sender: VecDeque::new(),
            delivered_to_receiver: 0,
            receiver: Receiver::new(receiver_cfg, now).with_nonce([2; 16]),
            recv_jobs: VecDeque::new(),
            ring: Vec::new(),
            geometry: None,
            output: Vec::new(),
            temp: Temp::None,
            partial: None,
            started_over: 0,
            stores_asked: 0,
            stored: 0,
            max_ring_in_use: 0,
            acks_sent: Vec::new(),
            receiver_outcome: None,
        }
    }

    pub fn note(&mut self, event: String) {
        if self.trace.len() == 48 {
            self.trace.pop_front();
        }
        self.trace.push_back(event);
    }

    /// Panics with the case's label and its last events unless `ok`.
    #[track_caller]
    pub fn check(&self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            let trace: Vec<&str> = self.trace.iter().map(String::as_str).collect();
            panic!("{}: {}\nlast events:\n  {}", self.label, what(), trace.join("\n  "));
        }
    }

    pub fn done(&self) -> bool {
        self.sender.is_done() && self.receiver.is_done()
    }

    /// Runs both sides until both are done; panics past `max_steps`.
    pub fn run(&mut self, max_steps: u64) {
        self.drain_sender();
        self.drain_receiver();
        while !self.done() {
            self.steps += 1;
            self.check(self.steps <= max_steps, || format!("not done after {max_steps} steps"));
            self.now += Duration::from_micros(self.rng.below(2_000));
            if self.rng.chance(self.faults.clock_jump) {
                self.jump_clock();
                continue;
            }
            self.step();
        }
        self.check_end();
    }

    /// One move, chosen at random among those possible: a delivery in either direction, a
    /// job of either driver, the sender's completions; the clock jumps when none is possible.
    pub fn step(&mut self) {
        let blackout = self.hooks.blackout_after.is_some_and(|n| self.delivered_to_receiver >= n);
        let mut moves: Vec<u8> = Vec::with_capacity(5);
        if !self.to_receiver.is_empty() && !blackout {
            moves.push(0);
        }
        if !self.to_sender.is_empty() && !blackout {
            moves.push(1);
        }
        if !self.send_jobs.is_empty() {
            moves.push(2);
        }
        if !self.recv_jobs.is_empty() {
            moves.push(3);
        }
        if !self.completions.is_empty() {
            moves.push(4);
        }
        if moves.is_empty() {
            self.jump_clock();
            return;
        }
        match self.rng.pick(&moves) {
            0 => self.deliver_to_receiver(),
            1 => self.deliver_to_sender(),
            2 => self.sender_job(),
            3 => self.receiver_job(),
            _ => self.report_completions(),
        }
        self.drain_sender();
        self.drain_receiver();
    }

    pub fn jump_clock(&mut self) {
        let deadline = [self.sender.poll_timeout(), self.receiver.poll_timeout()].into_iter().flatten().min();
        let Some(deadline) = deadline else { return };
        self.now = self.now.max(deadline);
        self.note(format!("clock jumps to the deadline (step {})", self.steps));
        self.sender.handle_timeout(self.now);
        self.receiver.handle_timeout(self.now);
        self.drain_sender();
        self.drain_receiver();
    }

    /// Takes the next packet of `queue`: the oldest, or any when the network reorders.
    pub fn take(rng: &mut Rng, faults: &Faults, queue: &mut VecDeque<InFlight>) -> InFlight {
        let at = if rng.chance(faults.reorder) { rng.below(queue.len() as u64) as usize } else { 0 };
        queue.remove(at).expect("a packet in flight")
    }

    /// Puts a duplicate of `p` somewhere in `queue`, if the network duplicates it.
    pub fn maybe_duplicate(rng: &mut Rng, faults: &Faults, queue: &mut VecDeque<InFlight>, p: &InFlight) -> bool {
        if p.copy || !rng.chance(faults.duplicate) {
            return false;
        }
        let at = rng.below(queue.len() as u64 + 1) as usize;
        queue.insert(at, p.duplicate());
        true
    }

    /// A control message as the network hands it over: cut short (exactly), or whole with the
    /// zero padding of a receive slot.
    pub fn wire_bytes(&mut self, mut bytes: Vec<u8>) -> Vec<u8> {
        if self.rng.chance(self.faults.truncate) {
            bytes.truncate(self.rng.below(bytes.len() as u64) as usize);
        } else {
            let padding = self.rng.below(24) as usize;
            bytes.resize(bytes.len() + padding, 0);
        }
        bytes
    }

    pub fn deliver_to_receiver(&mut self) {
        let p = Self::take(&mut self.rng, &self.faults, &mut self.to_receiver);
        self.delivered_to_receiver += 1;
        if Self::maybe_duplicate(&mut self.rng, &self.faults, &mut self.to_receiver, &p) {
            self.note("network duplicates a packet to the receiver".into());
        }
        let dropped = self.rng.chance(self.faults.drop);
        match p.packet {
            Packet::Control(bytes) => {
                if dropped {
                    self.note(format!("network drops {}", describe(&bytes)));
                    return;
                }
                let bytes = self.wire_bytes(bytes);
                self.note(format!("receiver gets {}", describe(&bytes)));
                self.receiver.handle(receiver::Input::Message(&bytes), self.now);
            }
            Packet::Write { seq, imm, remote_addr, rkey, mut data } => {
                if dropped {
                    self.note(format!("network drops the WRITE of chunk {seq}"));
                    if !p.copy && self.rng.chance(500) {
                        self.completions.push(seq);
                    }
                    return;
                }
                if !data.is_empty() && self.rng.chance(self.faults.truncate) {
                    data.truncate(self.rng.below(data.len() as u64) as usize);
                    self.note(format!("network cuts the WRITE of chunk {seq} to {} bytes", data.len()));
                }
                if !data.is_empty() && self.rng.chance(self.faults.corrupt) {
                    let at = self.rng.below(data.len() as u64) as usize;
                    data[at] ^= 1 << self.rng.below(8);
                    self.note(format!("network flips a bit of chunk {seq} at {at}"));
                }
                // The NIC checks the rkey and the range before placing a byte.
                self.check(rkey == RKEY, || format!("WRITE with rkey {rkey:#x}"));
                let at = remote_addr.checked_sub(RING_ADDR).map(|a| a as usize);
                let fits = at.is_some_and(|a| a + data.len() <= self.ring.len());
                self.check(fits, || format!("WRITE at {remote_addr:#x} of {} bytes outside the ring", data.len()));
                let at = at.unwrap_or(0);
                self.ring[at..at + data.len()].copy_from_slice(&data);
                if !p.copy {
                    self.completions.push(seq);
                }
                if self.rng.chance(self.faults.lose_arrival) {
                    self.note(format!("network loses the arrival of chunk {seq}"));
                    return;
                }
                self.note(format!("receiver gets WRITE imm {imm} of {} bytes", data.len()));
                let len = data.len() as u32;
                self.receiver.handle(receiver::Input::WriteArrived { imm, len }, self.now);
            }
        }
    }

    pub fn deliver_to_sender(&mut self) {
        let p = Self::take(&mut self.rng, &self.faults, &mut self.to_sender);
        if Self::maybe_duplicate(&mut self.rng, &self.faults, &mut self.to_sender, &p) {
            self.note("network duplicates a packet to the sender".into());
        }
        let Packet::Control(bytes) = p.packet else { unreachable!("the receiver sends control messages only") };
        if self.rng.chance(self.faults.drop) {
            self.note(format!("network drops {}", describe(&bytes)));
            return;
        }
        let bytes = self.wire_bytes(bytes);
        if let Ok((_, Message::Credit(Credit { consumed }))) = wire::decode(&bytes) {
            self.credit_seen = self.credit_seen.max(consumed);
        }
        self.note(format!("sender gets {}", describe(&bytes)));
        self.sender.handle(sender::Input::Message(&bytes), self.now);
    }

    pub fn report_completions(&mut self) {
        let last = self.completions.drain(..).max().expect("a completion");
        // A send queue completes in order: report only what is newer than the last report.
        if last >= self.write_done {
            self.write_done = last + 1;
            self.note(format!("sender: WRITEs up to chunk {last} completed"));
            self.sender.handle(sender::Input::WriteDone { seq: last }, self.now);
        }
    }

    pub fn sender_job(&mut self) {
        match self.send_jobs.pop_front().expect("a job") {
            SendJob::Read { seq, offset, len } => {
                let start = offset as usize;
                self.local.insert(seq, self.file[start..start + len as usize].to_vec());
                self.sender.handle(sender::Input::ChunkRead { seq }, self.now);
            }
            SendJob::Digest => {
                let d = digest_of(self.sender.digest(), self.sender.digest_key().as_ref(), &self.file);
                self.sender.handle(sender::Input::Digest(d), self.now);
            }
            SendJob::Prove { from, key } => {
                let mac = prefix_proof(&key, &self.file[..from as usize]);
                self.sender.handle(sender::Input::PrefixProof { mac }, self.now);
            }
        }
    }

    pub fn receiver_job(&mut self) {
        match self.recv_jobs.pop_front().expect("a job") {
            RecvJob::Open { size, slot_size, slot_count } => {
                if let Some(status) = self.hooks.open_fails {
                    let input = receiver::Input::OpenFailed(status, "the simulated driver refuses".into());
                    self.receiver.handle(input, self.now);
                    return;
                }
                self.temp = Temp::Open;
                self.output = vec![0; size as usize];
                self.ring = vec![0; slot_size as usize * slot_count as usize];
                self.geometry = Some((slot_size, slot_count));
                if let (Some(from), Some(_)) = (self.hooks.resume_from, self.receiver.resume_key()) {
                    let from = from.min(size) as usize;
                    self.output[..from].copy_from_slice(&self.file[..from]);
                    if self.hooks.corrupt_prefix && from > 0 {
                        self.output[from / 2] ^= 0x40;
                    }
                    // The proof the sender must show: of the bytes this side holds.
                    let proof = prefix_proof(&self.receiver.prefix_key(), &self.output[..from]);
                    self.receiver.handle(receiver::Input::Resumed { from: from as u64, proof }, self.now);
                }
                self.receiver.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, self.now);
            }
            RecvJob::StartOver => {
                // The partial is left to its owner (`partial`, unchanged); the file starts over
                // in a new temporary.
                self.partial = Some(std::mem::replace(&mut self.output, vec![0; self.file.len()]));
                self.started_over += 1;
                self.receiver.handle(receiver::Input::Ready { addr: RING_ADDR, rkey: RKEY }, self.now);
            }
            RecvJob::Store { seq, slot, offset, len } => {
                if let Some((bad, status)) = self.hooks.store_fails {
                    if bad == seq {
                        let input = receiver::Input::StoreFailed(status, "the simulated disk fails".into());
                        self.receiver.handle(input, self.now);
                        return;
                    }
                }
                let (slot_size, _) = self.geometry.expect("a ring");
                let at = slot as usize * slot_size as usize;
                if self.hooks.corrupt_slot_of == Some(seq) {
                    self.ring[at] ^= 0x40;
                }
                // Copy out of the peer-writable slot once; store (and later hash) that copy.
                let copy = self.ring[at..at + len as usize].to_vec();
                let start = offset as usize;
                self.output[start..start + copy.len()].copy_from_slice(&copy);
                self.stored += 1;
                self.receiver.handle(receiver::Input::ChunkStored { seq }, self.now);
            }
            RecvJob::Finalize { digest: theirs } => {
                let (status, detail) =
                    if digest_of(self.receiver.digest(), self.receiver.digest_key().as_ref(), &self.output) == theirs {
                        self.temp = Temp::Committed;
                        (Status::Ok, String::new())
                    } else {
                        (Status::ChecksumMismatch, "the data does not match the sender's digest".into())
                    };
                self.receiver.handle(receiver::Input::Finalized(status, detail), self.now);
            }
        }
    }

    /// Performs the sender's actions, checking each against the protocol's rules.
    pub fn drain_sender(&mut self) {
        while let Some(action) = self.sender.poll_action() {
            self.check(self.sender_outcome.is_none(), || format!("sender action {action:?} after Finish"));
            match action {
                sender::Action::NextEntry | sender::Action::EntryDone { .. } => {
                    self.check(false, || format!("{action:?} in a session of one file"))
                }
                sender::Action::Send => {
                    let mut bytes = Vec::new();
                    let had = self.sender.transmit(&mut bytes);
                    self.check(had, || "a Send without its message".into());
                    self.check(wire::decode(&bytes).is_ok(), || "the sender sent an undecodable message".into());
                    self.note(format!("sender sends {}", describe(&bytes)));
                    self.to_receiver.push_back(InFlight { packet: Packet::Control(bytes), copy: false });
                }
                sender::Action::ReadChunk { seq, offset, len } => {
                    let g = *self.sender.grant().expect("reads follow the grant");
                    let slot = u64::from(g.slot_size);
                    let base = g.resume_from;
                    let want = (self.file.len() as u64 - base - seq * slot).min(slot);
                    self.check(
                        seq == self.reads_asked && offset == base + seq * slot && u64::from(len) == want,
                        || {
                            format!(
                                "read of chunk {seq} at {offset} ({len} bytes), expected chunk {}",
                                self.reads_asked
                            )
                        },
                    );
                    self.reads_asked += 1;
                    let in_use = self.reads_asked - self.write_done;
                    self.max_local_slots = self.max_local_slots.max(in_use);
                    self.check(in_use <= u64::from(self.depth), || {
                        format!("{in_use} local slots in use, depth {}", self.depth)
                    });
                    self.send_jobs.push_back(SendJob::Read { seq, offset, len });
                }
                sender::Action::WriteChunk { seq, len, remote_addr, rkey, imm } => {
                    let g = *self.sender.grant().expect("WRITEs follow the grant");
                    let count = u64::from(g.slot_count);
                    let data = self.local.remove(&seq);
                    self.check(data.as_ref().is_some_and(|d| d.len() == len as usize), || {
                        format!("WRITE of chunk {seq} ({len} bytes) that was not read")
                    });
                    self.check(remote_addr == g.addr + (seq % count) * u64::from(g.slot_size), || {
                        format!("chunk {seq} written at {remote_addr:#x}")
                    });
                    self.check(rkey == g.rkey && imm == seq as u32, || format!("chunk {seq}: rkey {rkey}, imm {imm}"));
                    // Flow control: only into a slot the receiver credited, hence emptied.
                    self.check(seq < self.credit_seen + count, || {
                        format!("chunk {seq} written with credit for {} of {count} slots", self.credit_seen)
                    });
                    self.check(seq < self.stored + count, || {
                        format!("chunk {seq} written over chunk {} not yet stored", seq - count)
                    });
                    self.note(format!("sender WRITEs chunk {seq}"));
                    let data = data.unwrap_or_default();
                    self.to_receiver.push_back(InFlight {
                        packet: Packet::Write { seq, imm, remote_addr, rkey, data },
                        copy: false,
                    });
                }
                sender::Action::NeedDigest => self.send_jobs.push_back(SendJob::Digest),
                sender::Action::ProvePrefix { from, key } => {
                    self.check(from > 0 && from <= self.file.len() as u64, || format!("a proof of {from} bytes"));
                    self.send_jobs.push_back(SendJob::Prove { from, key });
                }
                sender::Action::Finish(o) => {
                    self.note(format!("sender finishes: {o:?}"));
                    self.send_jobs.clear();
                    self.sender_outcome = Some(o);
                }
            }
        }
    }

    /// Performs the receiver's actions, checking each against the protocol's rules.
    pub fn drain_receiver(&mut self) {
        while let Some(action) = self.receiver.poll_action() {
            self.check(self.receiver_outcome.is_none(), || format!("receiver action {action:?} after Finish"));
            match action {
                receiver::Action::Reserve { .. }
                | receiver::Action::OpenEntry(_)
                | receiver::Action::EntryDone { .. } => {
                    self.check(false, || format!("{action:?} in a session of one file"))
                }
                receiver::Action::Open { name, size, slot_size, slot_count } => {
                    self.check(self.temp == Temp::None && slot_size > 0 && slot_count > 0, || {
                        format!("open of {name:?}: {slot_count} slots of {slot_size}")
                    });
                    self.recv_jobs.push_back(RecvJob::Open { size, slot_size, slot_count });
                }
                receiver::Action::Send => {
                    let mut bytes = Vec::new();
                    let had = self.receiver.transmit(&mut bytes);
                    self.check(had, || "a Send without its message".into());
                    let decoded = wire::decode(&bytes);
                    self.check(decoded.is_ok(), || "the receiver sent an undecodable message".into());
                    if let Ok((_, Message::Ack(a))) = decoded {
                        self.acks_sent.push(a.status);
                    }
                    self.note(format!("receiver sends {}", describe(&bytes)));
                    self.to_sender.push_back(InFlight { packet: Packet::Control(bytes), copy: false });
                }
                receiver::Action::StoreChunk { seq, slot, offset, len } => {
                    let (slot_size, count) = self.geometry.expect("stores follow the open");
                    let fits = offset + u64::from(len) <= self.output.len() as u64;
                    self.check(
                        seq == self.stores_asked && slot < count && u64::from(slot) == seq % u64::from(count),
                        || format!("store of chunk {seq} from slot {slot} of {count}"),
                    );
                    let base = self.receiver.resumed_from();
                    self.check(offset == base + seq * u64::from(slot_size) && len <= slot_size && fits, || {
                        format!("store of chunk {seq}: {len} bytes at {offset}")
                    });
                    self.stores_asked += 1;
                    let in_ring = self.stores_asked - self.stored;
                    self.max_ring_in_use = self.max_ring_in_use.max(in_ring);
                    self.check(in_ring <= u64::from(count), || format!("{in_ring} chunks in a ring of {count}"));
                    self.recv_jobs.push_back(RecvJob::Store { seq, slot, offset, len });
                }
                receiver::Action::Finalize { digest } => {
                    self.check(self.stored == self.stores_asked && self.temp == Temp::Open, || {
                        format!("finalize with {} of {} chunks stored", self.stored, self.stores_asked)
                    });
                    self.recv_jobs.push_back(RecvJob::Finalize { digest });
                }
                receiver::Action::StartOver => {
                    self.check(self.temp == Temp::Open && self.stored == 0, || {
                        format!("start over with the temporary {:?} and {} chunks stored", self.temp, self.stored)
                    });
                    self.recv_jobs.push_back(RecvJob::StartOver);
                }
                receiver::Action::Discard => {
                    self.check(self.temp == Temp::Open, || format!("discard of a temporary that is {:?}", self.temp));
                    // A driver commits when asked (the real one at once, before it reads the
                    // next action): a discard after that comes too late.
                    self.check(!self.commit_pending(), || "discard while the commit asked for is under way".into());
                    self.temp = Temp::Discarded;
                }
                receiver::Action::Finish(o) => {
                    // The verdict must be the commit's: the session cannot end before it.
                    self.check(!self.commit_pending(), || format!("{o:?} while the commit asked for is under way"));
                    self.note(format!("receiver finishes: {o:?}"));
                    self.recv_jobs.clear();
                    self.receiver_outcome = Some(o);
                }
            }
        }
    }

    /// Whether the receiver asked for a commit whose answer it has not had.
    pub fn commit_pending(&self) -> bool {
        self.recv_jobs.iter().any(|j| matches!(j, RecvJob::Finalize { .. }))
    }

    /// What must hold once both sides are done.
    pub fn check_end(&self) {
        let (Some(sent), Some(received)) = (&self.sender_outcome, &self.receiver_outcome) else {
            self.check(false, || "done without a Finish".into());
            return;
        };
        self.check(self.sender.poll_timeout().is_none() && self.receiver.poll_timeout().is_none(), || {
            "a done machine still wants a timeout".into()
        });
        match received {
            Outcome::Acked { status: Status::Ok, .. } => {
                self.check(self.output == self.file, || "the receiver acknowledged bytes that differ".into());
                self.check(self.temp == Temp::Committed, || format!("OK with the temporary {:?}", self.temp));
                self.check(self.receiver.bytes_stored() == self.file.len() as u64, || "bytes stored".into());
            }
            Outcome::Acked { status, .. } => {
                self.check(self.acks_sent.last() == Some(status), || format!("verdict {status} without its ACK"));
                self.check(matches!(self.temp, Temp::None | Temp::Discarded), || {
                    format!("{status}: the temporary is {:?}", self.temp)
                });
            }
            Outcome::Failed(_) => {
                self.check(matches!(self.temp, Temp::None | Temp::Discarded), || {
                    format!("failure: the temporary is {:?}", self.temp)
                });
            }
        }
        if let Outcome::Acked { status, .. } = sent {
            // Only the receiver makes verdicts: the sender's is one the receiver sent.
            self.check(self.acks_sent.contains(status), || format!("the sender saw {status}, never sent"));
            if *status == Status::Ok {
                self.check(matches!(received, Outcome::Acked { status: Status::Ok, .. }), || {
                    "the sender saw OK, the receiver did not store".into()
                });
            }
        }
    }
}

/// A control message in a trace line.
pub fn describe(bytes: &[u8]) -> String {
    match wire::decode(bytes) {
        Ok((_, Message::Hello(h))) => format!("HELLO {} bytes", h.size),
        Ok((_, Message::Grant(g))) => format!("GRANT {} slots of {}", g.slot_count, g.slot_size),
        Ok((_, Message::Credit(c))) => format!("CREDIT {}", c.consumed),
        Ok((_, Message::Fin(f))) => format!("FIN {} chunks", f.chunks),
        Ok((_, Message::Ack(a))) => format!("ACK {}", a.status),
        Ok((_, Message::Challenge(_))) => "CHALLENGE".into(),
        Ok((_, Message::Proof(_))) => "PROOF".into(),
        Ok((_, Message::Entry(e))) => format!("ENTRY {} {}", e.index, e.path),
        Ok((_, Message::Ready(r))) => format!("READY {} from {}", r.index, r.resume_from),
        Ok((_, Message::End(e))) => format!("END {}", e.entries),
        Ok((_, Message::Lane(l))) => format!("LANE {}", l.lane),
        Ok((_, Message::Knock(k))) => format!("KNOCK at {}", k.time),
        Ok((_, Message::Cancel(_))) => "CANCEL".into(),
        Err(e) => format!("{} bytes that do not decode ({e})", bytes.len()),
    }
}

pub fn file_of(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0xf11e);
    (0..size).map(|_| rng.next() as u8).collect()
}

pub fn sender_cfg(chunk: u32, depth: u32) -> SenderConfig {
    SenderConfig::new(chunk, depth, Duration::from_secs(10))
}

pub fn receiver_cfg(max_slots: u32) -> ReceiverConfig {
    receiver_config(1 << 30, 1 << 20, 1 << 24, max_slots, Duration::from_secs(10))
}

pub fn receiver_config(
    max_size: u64,
    max_chunk: u32,
    memory_budget: u64,
    max_slots: u32,
    timeout: Duration,
) -> ReceiverConfig {
    let mut c = ReceiverConfig::default();
    (c.max_size, c.max_chunk, c.memory_budget, c.max_slots, c.timeout, c.hello_timeout) =
        (max_size, max_chunk, memory_budget, max_slots, timeout, timeout);
    // These files are bytes long, far below any pace floor: the floor (`min_rate`) has its own
    // tests (tests/batch.rs, the fuzzed receiver), and here only the phase timeouts count.
    c.min_rate = 0;
    c
}

/// Runs one transfer over a faithful network (in order, nothing lost), the drivers' work and
/// the deliveries interleaved as `seed` says.
pub fn transfer(file: Vec<u8>, sender: SenderConfig, receiver: ReceiverConfig, hooks: Hooks, seed: u64) -> Sim {
    let label = format!("{} bytes, chunk {}, depth {}, seed {seed}", file.len(), sender.chunk, sender.depth);
    let chunks = file.len() as u64 / u64::from(sender.chunk.min(receiver.max_chunk)) + 1;
    let mut sim = Sim::new(label, seed, file, "file.bin", sender, receiver, Faults::default(), hooks);
    sim.run(64 * (chunks + 8));
    sim
}

pub fn assert_ok(sim: &Sim) {
    let ok = |o: &Option<Outcome>| matches!(o, Some(Outcome::Acked { status: Status::Ok, .. }));
    sim.check(ok(&sim.sender_outcome) && ok(&sim.receiver_outcome), || {
        format!("outcomes {:?} / {:?}", sim.sender_outcome, sim.receiver_outcome)
    });
    sim.check(sim.output == sim.file, || "the output differs".into());
}

pub fn acked(o: &Option<Outcome>) -> Option<Status> {
    match o {
        Some(Outcome::Acked { status, .. }) => Some(*status),
        _ => None,
    }
}
