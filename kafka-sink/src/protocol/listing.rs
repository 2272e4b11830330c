//! The brokers a cluster lists, and the transactions they list (ListTransactions).

use super::*;

impl Wire {
    /// `host:port` of every broker the cluster lists now (Metadata without topics), from the
    /// first bootstrap server that answers.
    pub(crate) async fn live_brokers(&self) -> Result<Vec<String>> {
        let req = MetadataRequest::default().with_topics(Some(Vec::new()));
        let mut last = String::from("no bootstrap server");
        for (i, addr) in self.bootstrap_servers() {
            match self.send(addr, &req, METADATA_VERSION).await {
                Ok(r) => {
                    self.answered(i);
                    return Ok(r
                        .brokers
                        .iter()
                        .map(|b| format!("{}:{}", b.host.as_str(), b.port))
                        .collect());
                }
                Err(e @ SinkError::Config(_)) => return Err(e),
                Err(e) => last = e.to_string(),
            }
        }
        Err(SinkError::Protocol(format!("asking for the cluster's brokers: {last}")))
    }

    /// Every transaction every broker of the cluster coordinates, starting from `brokers`. While a
    /// broker does not answer (or is still loading its transactions), the listing starts again
    /// after a pause at the brokers the cluster's metadata lists then — a dead broker drops out of
    /// it once fenced, and the one that took over its transactions is listed afresh — for up to
    /// [`FAILOVER`].
    pub(crate) async fn list(&self, brokers: &[String]) -> Result<Vec<ListedTxn>> {
        let mut failover = Failover::new();
        let mut brokers = brokers.to_vec();
        loop {
            let failure = match self.list_once(&brokers).await {
                Ok(listed) => return Ok(listed),
                Err((SinkError::Protocol(e), true)) => e,
                Err((e, _)) => return Err(e),
            };
            failover
                .pause(failure, || "listing transactions: not every broker answered".to_owned(), |failure| {
                    warn!(error = %failure, "Listing the brokers' transactions failed; listing again at the brokers the cluster lists now (a broker failing over?) for up to {FAILOVER:?}.")
                })
                .await?;
            match self.live_brokers().await {
                Ok(now) if !now.is_empty() => brokers = now,
                Ok(_) => {}
                Err(e @ SinkError::Config(_)) => return Err(e),
                Err(_) => {}
            }
        }
    }

    /// One ListTransactions at each of `brokers`; a failure says whether trying again may help
    /// (an unreachable broker, one loading its transactions).
    async fn list_once(&self, brokers: &[String]) -> std::result::Result<Vec<ListedTxn>, (SinkError, bool)> {
        let mut out = Vec::new();
        for addr in brokers {
            let resp = self
                .send(addr, &ListTransactionsRequest::default(), LIST_TRANSACTIONS_VERSION)
                .await
                .map_err(|e| (e, true))?;
            if resp.error_code != code::NONE {
                return Err((
                    SinkError::Protocol(format!("ListTransactions at {addr}: error code {}", resp.error_code)),
                    code::coordinator_moving(resp.error_code),
                ));
            }
            out.extend(resp.transaction_states.into_iter().map(|s| ListedTxn {
                transactional_id: s.transactional_id.0.as_str().to_owned(),
                producer_id: s.producer_id.0,
                state: s.transaction_state.as_str().to_owned(),
            }));
        }
        Ok(out)
    }
}
