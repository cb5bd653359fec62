//! Connection parameters (`struct rdma_conn_param`) for connecting and accepting.

use crate::error::{Error, Result};
use rdma_verbs::ffi;

/// Most private-data bytes a connect request carries (an InfiniBand CM REQ holds 92, of which the
/// RDMA CM's own header takes 36).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private-data bytes an acceptance carries (IB CM REP).
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private-data bytes a rejection carries (IB CM REJ).
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// Most private-data bytes a service ID resolution's request carries
/// ([`UdId::resolve_peer`](crate::UdId::resolve_peer)): the SIDR REQ's 216 less the RDMA CM's
/// 36-byte header (`IB_CM_SIDR_REQ_PRIVATE_DATA_SIZE`, `struct cma_hdr`). They arrive
/// zero-padded to this size.
pub const MAX_SIDR_REQUEST_PRIVATE_DATA: usize = 180;

/// Most private-data bytes a service ID resolution's reply carries
/// ([`UdRequest::accept`](crate::UdRequest::accept), [`reject`](crate::UdRequest::reject)):
/// `IB_CM_SIDR_REP_PRIVATE_DATA_SIZE`. They arrive zero-padded to this size.
pub const MAX_SIDR_REPLY_PRIVATE_DATA: usize = 136;

/// Refuses more than `max` bytes of private data for `verb`, before anything is sent.
pub(crate) fn check_private_data(verb: &'static str, data: &[u8], max: usize) -> Result<()> {
    if data.len() > max {
        return Err(Error::invalid(verb, format!("{} bytes of private data: at most {max} fit", data.len())));
    }
    Ok(())
}

/// The `rdma_conn_param` of a UD identifier's `rdma_connect` or `rdma_accept`: only private
/// data (checked against `max`) and a QP number count.
pub(crate) fn ud_conn_param(
    verb: &'static str,
    private_data: &[u8],
    max: usize,
    qp_num: u32,
) -> Result<ffi::rdma_conn_param> {
    check_private_data(verb, private_data, max)?;
    // SAFETY: all-zero is a valid `rdma_conn_param` (a null pointer and integers).
    let mut raw: ffi::rdma_conn_param = unsafe { std::mem::zeroed() };
    raw.qp_num = qp_num;
    if !private_data.is_empty() {
        raw.private_data = private_data.as_ptr().cast();
        // At most `max`, which is under 256.
        raw.private_data_len = private_data.len() as u8;
    }
    Ok(raw)
}

/// What this side asks for when connecting or accepting (`struct rdma_conn_param`).
///
/// Defaults: no private data; READ/atomic depths chosen automatically (the device's limits when
/// connecting, the peer's offer capped by the device's when accepting); 7 transport retries;
/// 7 RNR retries (retry forever: a send that finds no receive posted waits rather than fails).
///
/// # References
/// - [`rdma_connect(3)`](https://man7.org/linux/man-pages/man3/rdma_connect.3.html)
/// - [`rdma_accept(3)`](https://man7.org/linux/man-pages/man3/rdma_accept.3.html)
#[doc(alias = "rdma_conn_param")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a builder does nothing until it is used"]
pub struct ConnParams<'a> {
    /// Bytes for the peer (at most [`MAX_CONNECT_PRIVATE_DATA`] when connecting,
    /// [`MAX_ACCEPT_PRIVATE_DATA`] when accepting).
    pub private_data: &'a [u8],
    /// RDMA READ / atomic requests this side accepts outstanding from the peer; `None`: automatic.
    pub responder_resources: Option<u8>,
    /// RDMA READ / atomic requests this side will have outstanding at the peer; `None`: automatic.
    pub initiator_depth: Option<u8>,
    /// Transport retries after a timeout (at most 7).
    pub retry_count: u8,
    /// Retries after an RNR NAK (7 = forever).
    pub rnr_retry_count: u8,
    /// Local ACK timeout of the QP (`ibv_qp_attr.timeout`): a request not acknowledged within
    /// 4.096 µs × 2^n is retransmitted. `None`: the CM's value, derived from the path's packet
    /// lifetime. Set with [`ack_timeout`](Self::ack_timeout).
    pub ack_timeout: Option<u8>,
}

impl Default for ConnParams<'_> {
    fn default() -> Self {
        ConnParams {
            private_data: &[],
            responder_resources: None,
            initiator_depth: None,
            retry_count: 7,
            rnr_retry_count: 7,
            ack_timeout: None,
        }
    }
}

impl<'a> ConnParams<'a> {
    /// The defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sends `data` to the peer with the request or acceptance.
    pub fn private_data(mut self, data: &'a [u8]) -> Self {
        self.private_data = data;
        self
    }

    /// Sets how many READ/atomic requests the peer may have outstanding here.
    pub fn responder_resources(mut self, n: u8) -> Self {
        self.responder_resources = Some(n);
        self
    }

    /// Sets how many READ/atomic requests this side may have outstanding at the peer.
    pub fn initiator_depth(mut self, n: u8) -> Self {
        self.initiator_depth = Some(n);
        self
    }

    /// Sets the transport retry count (0..=7).
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n;
        self
    }

    /// Sets the RNR retry count (0..=7, 7 = forever).
    pub fn rnr_retry_count(mut self, n: u8) -> Self {
        self.rnr_retry_count = n;
        self
    }

    /// Sets the local ACK timeout exponent (1..=31; 4.096 µs × 2^n), in place of the CM's.
    /// perftest uses 14 (67 ms).
    pub fn ack_timeout(mut self, n: u8) -> Self {
        self.ack_timeout = Some(n);
        self
    }

    /// Checks the ACK timeout exponent (5 bits; 0 would mean an infinite timeout).
    pub(crate) fn checked_ack_timeout(&self, verb: &'static str) -> Result<Option<u8>> {
        match self.ack_timeout {
            Some(n) if n == 0 || n > 31 => {
                Err(Error::invalid(verb, format!("ACK timeout exponent {n}: must be 1..=31")))
            }
            t => Ok(t),
        }
    }

    /// Checks the parameters and lays them out for C.
    pub(crate) fn to_raw(
        self,
        verb: &'static str,
        max_private: usize,
        responder_resources: u8,
        initiator_depth: u8,
        qp_num: u32,
    ) -> Result<ffi::rdma_conn_param> {
        check_private_data(verb, self.private_data, max_private)?;
        if self.retry_count > 7 || self.rnr_retry_count > 7 {
            return Err(Error::invalid(
                verb,
                format!("retry counts are 3-bit: got {} and {}", self.retry_count, self.rnr_retry_count),
            ));
        }
        self.checked_ack_timeout(verb)?;
        Ok(ffi::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                std::ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources,
            initiator_depth,
            flow_control: 1,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_data_over_the_limit_is_a_typed_error() {
        let data = [7u8; MAX_CONNECT_PRIVATE_DATA + 1];
        let err = ConnParams::new().private_data(&data).to_raw("rdma_connect", MAX_CONNECT_PRIVATE_DATA, 1, 1, 5);
        assert!(matches!(err, Err(Error::InvalidArgument { verb: "rdma_connect", .. })), "{:?}", err.err());
        let ok = ConnParams::new().private_data(&data[..56]).to_raw("rdma_connect", MAX_CONNECT_PRIVATE_DATA, 1, 2, 5);
        let raw = ok.unwrap();
        assert_eq!((raw.private_data_len, raw.responder_resources, raw.initiator_depth, raw.qp_num), (56, 1, 2, 5));
    }

    #[test]
    fn ack_timeouts_outside_five_bits_are_refused() {
        for bad in [0u8, 32, 255] {
            let err = ConnParams::new().ack_timeout(bad).to_raw("rdma_connect", MAX_CONNECT_PRIVATE_DATA, 1, 1, 5);
            assert!(matches!(err, Err(Error::InvalidArgument { verb: "rdma_connect", .. })), "{bad}: {:?}", err.err());
        }
        for good in [1u8, 14, 31] {
            assert_eq!(ConnParams::new().ack_timeout(good).checked_ack_timeout("rdma_accept").unwrap(), Some(good));
        }
        assert_eq!(ConnParams::new().checked_ack_timeout("rdma_accept").unwrap(), None);
    }

    #[test]
    fn retry_counts_over_seven_are_refused() {
        let err = ConnParams::new().rnr_retry_count(8).to_raw("rdma_accept", MAX_ACCEPT_PRIVATE_DATA, 1, 1, 1);
        assert!(matches!(err, Err(Error::InvalidArgument { .. })));
    }
}
