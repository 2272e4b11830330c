//! Transactions at their coordinator: described (with the answer a node cut off from its peers
//! may give checked) and ended.

use super::*;

impl Wire {
    /// Describes `transactional_id` at its coordinator; an id the coordinator does not know is
    /// an error (use [`Wire::describe_known`] where that is an answer).
    pub(crate) async fn describe(&self, transactional_id: &str) -> Result<TxnDescription> {
        self.describe_known(transactional_id).await?.ok_or_else(|| {
            SinkError::Protocol(format!(
                "DescribeTransactions of {transactional_id}: the coordinator does not know this id"
            ))
        })
    }

    /// Describes `transactional_id`, whose producer has a transaction open (pre-commit): an answer
    /// that the coordinator does not know the id contradicts that, and comes from a node that no
    /// longer coordinates it — back from a stall, answering from its old view of the cluster
    /// (seen on the three-node cluster right after a SIGSTOPped node resumed: the attempt
    /// restarted). Asked again, as while a coordinator moves, for up to [`FAILOVER`].
    pub(crate) async fn describe_open(&self, transactional_id: &str) -> Result<TxnDescription> {
        let mut failover = Failover::new();
        loop {
            if let Some(d) = self.describe_known(transactional_id).await? {
                return Ok(d);
            }
            failover
                .pause(
                    "the coordinator does not know this id".into(),
                    || format!("DescribeTransactions of {transactional_id} (a transaction open): every answer said the id is unknown"),
                    |failure| warn!(transactional_id, error = %failure, "The coordinator does not know the id of an open transaction (a node back from a stall, answering from an old view?); asking again for up to {FAILOVER:?}."),
                )
                .await?;
        }
    }

    /// Describes `transactional_id` at its coordinator; `None` when the coordinator does not know
    /// the id (never used, or expired after `transactional.id.expiration.ms`).
    pub(crate) async fn describe_known(&self, transactional_id: &str) -> Result<Option<TxnDescription>> {
        let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(
            StrBytes::from_string(transactional_id.to_owned()),
        )]);
        let resp = self
            .at_coordinator(
                transactional_id,
                "DescribeTransactions",
                &req,
                DESCRIBE_TRANSACTIONS_VERSION,
                true,
                |r| r.transaction_states.first().map_or(code::NONE, |s| s.error_code),
            )
            .await?;
        let s =
            resp.transaction_states.into_iter().next().ok_or_else(|| {
                SinkError::Protocol(format!("DescribeTransactions of {transactional_id}: empty answer"))
            })?;
        if s.error_code == code::TRANSACTIONAL_ID_NOT_FOUND {
            return Ok(None);
        }
        if s.error_code != code::NONE {
            return Err(SinkError::Protocol(format!(
                "DescribeTransactions of {transactional_id}: error code {}",
                s.error_code
            )));
        }
        Ok(Some(TxnDescription {
            state: s.transaction_state.as_str().to_owned(),
            producer_id: s.producer_id.0,
            producer_epoch: s.producer_epoch,
            timeout_ms: s.transaction_timeout_ms,
            start_time_ms: s.transaction_start_time_ms,
            partitions: s.topics.iter().map(|t| t.partitions.len()).sum(),
            topic_partitions: s
                .topics
                .iter()
                .flat_map(|t| t.partitions.iter().map(move |p| format!("{}-{p}", t.topic.as_str())))
                .collect(),
        }))
    }

    /// Sends EndTxn (commit or abort) for the given producer id and epoch; returns the error code.
    /// Sent again only while it cannot have left: an answer that the coordinator moved or is
    /// loading is returned like any other (it may follow a transaction-log append that was
    /// written), and a lost answer is an error; either way, describe the transaction before
    /// sending another.
    pub(crate) async fn end_txn(
        &self,
        transactional_id: &str,
        producer_id: i64,
        epoch: i16,
        commit: bool,
    ) -> Result<i16> {
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(StrBytes::from_string(transactional_id.to_owned())))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(epoch)
            .with_committed(commit);
        Ok(self
            .at_coordinator(transactional_id, "EndTxn", &req, END_TXN_VERSION, false, |r| {
                r.error_code
            })
            .await?
            .error_code)
    }
}
