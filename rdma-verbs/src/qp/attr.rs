//! Attributes for creating a queue pair and for each state transition.

use crate::ah::AddressVector;
use crate::gid::Gid;
use crate::mr::AccessFlags;
use crate::port::Mtu;

/// The sizes of a queue pair's queues (`struct ibv_qp_cap`).
///
/// The defaults: 64 sends and 64 receives outstanding, 1 SGE each, no inline data.
#[doc(alias = "ibv_qp_cap")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Most send requests outstanding.
    pub max_send_wr: u32,
    /// Most receive requests outstanding.
    pub max_recv_wr: u32,
    /// Most SGEs in one send request.
    pub max_send_sge: u32,
    /// Most SGEs in one receive request.
    pub max_recv_sge: u32,
    /// Most bytes of inline data in one send request.
    pub max_inline_data: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps { max_send_wr: 64, max_recv_wr: 64, max_send_sge: 1, max_recv_sge: 1, max_inline_data: 0 }
    }
}

/// The `Reset -> Init` transition's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until it is used"]
pub struct InitAttr {
    /// The port the QP uses (from 1).
    pub port: u8,
    /// Index into the port's P_Key table.
    pub pkey_index: u16,
    /// What peers may do to this side's memory through this QP (connected transports).
    pub access: AccessFlags,
    /// The Q_Key datagrams must carry (UD).
    pub qkey: u32,
}

impl InitAttr {
    /// On `port`, P_Key index 0, no remote access, Q_Key 0.
    pub fn new(port: u8) -> Self {
        InitAttr { port, pkey_index: 0, access: AccessFlags::empty(), qkey: 0 }
    }

    /// Allows the peer `access` (RDMA WRITE, READ, atomics) through this QP.
    pub fn access(mut self, access: AccessFlags) -> Self {
        self.access = access;
        self
    }

    /// Sets the Q_Key (UD).
    pub fn qkey(mut self, qkey: u32) -> Self {
        self.qkey = qkey;
        self
    }
}

/// What one side of a connection tells the other so that both can reach `ReadyToReceive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpEndpoint {
    /// The QP number.
    pub qp_num: u32,
    /// The first packet sequence number it sends with.
    pub psn: u32,
    /// Its port's GID (RoCE).
    pub gid: Gid,
    /// Its port's LID (InfiniBand; 0 on RoCE).
    pub lid: u16,
}

/// The `Init -> ReadyToReceive` transition's attributes for connected QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until it is used"]
pub struct RtrAttr {
    /// The peer's QP number and starting PSN.
    pub remote: QpEndpoint,
    /// How to reach the peer.
    pub path: AddressVector,
    /// The path MTU, at most both ports' active MTU.
    pub path_mtu: Mtu,
    /// Most RDMA READ / atomic requests the peer may have outstanding here (RC).
    pub max_dest_rd_atomic: u8,
    /// The RNR NAK timer code sent when no receive is posted (RC; 12 = 0.64 ms).
    pub min_rnr_timer: u8,
}

impl RtrAttr {
    /// To `remote`, leaving `port` from local GID `sgid_index`, with `path_mtu`.
    /// RC defaults: 16 outstanding READ/atomics, RNR timer 12.
    pub fn new(remote: QpEndpoint, port: u8, sgid_index: u8, path_mtu: Mtu) -> Self {
        let mut path = AddressVector::roce(port, remote.gid, sgid_index);
        path.dlid = remote.lid;
        RtrAttr { remote, path, path_mtu, max_dest_rd_atomic: 16, min_rnr_timer: 12 }
    }

    /// Sets how many READ/atomic requests the peer may have outstanding here.
    pub fn max_dest_rd_atomic(mut self, n: u8) -> Self {
        self.max_dest_rd_atomic = n;
        self
    }

    /// Sets the RNR NAK timer code.
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.min_rnr_timer = code;
        self
    }
}

/// The `ReadyToReceive -> ReadyToSend` transition's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until it is used"]
pub struct RtsAttr {
    /// The first PSN this side sends (what it told the peer in its [`QpEndpoint`]).
    pub sq_psn: u32,
    /// Local ACK timeout code: 4.096 us * 2^timeout (RC; 14 = 67 ms).
    pub timeout: u8,
    /// Retries after a timeout (RC, at most 7).
    pub retry_cnt: u8,
    /// Retries after an RNR NAK (RC; 7 = forever).
    pub rnr_retry: u8,
    /// Most RDMA READ / atomic requests outstanding from this side (RC).
    pub max_rd_atomic: u8,
}

impl RtsAttr {
    /// Starting at `sq_psn`. RC defaults: timeout 14, 7 retries, 7 RNR retries, 16 READ/atomics.
    pub fn new(sq_psn: u32) -> Self {
        RtsAttr { sq_psn, timeout: 14, retry_cnt: 7, rnr_retry: 7, max_rd_atomic: 16 }
    }

    /// Sets the ACK timeout code.
    pub fn timeout(mut self, code: u8) -> Self {
        self.timeout = code;
        self
    }

    /// Sets the retry count after a timeout.
    pub fn retry_cnt(mut self, n: u8) -> Self {
        self.retry_cnt = n;
        self
    }

    /// Sets the retry count after an RNR NAK.
    pub fn rnr_retry(mut self, n: u8) -> Self {
        self.rnr_retry = n;
        self
    }

    /// Sets how many READ/atomic requests may be outstanding from this side.
    pub fn max_rd_atomic(mut self, n: u8) -> Self {
        self.max_rd_atomic = n;
        self
    }
}
