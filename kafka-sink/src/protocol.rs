//! The Kafka wire-protocol requests librdkafka does not expose: finding a transaction's
//! coordinator, describing, listing and ending transactions by (transactional id, producer id,
//! epoch). Requests and responses are encoded by the `kafka-protocol` crate and sent over
//! connections secured like every other client of the job (`exactly_kafka_client::wire`). One
//! short-lived connection per request: these run at checkpoints and recovery, never per record.
//!
//! A coordinator or broker that dies moves its role to another broker once the controller fences
//! it (`broker.session.timeout.ms`, 9 s by default) and the new leader has loaded the transaction
//! log. Meanwhile the dead one refuses connections, or FindCoordinator still names it, or the new
//! one answers NOT_COORDINATOR / COORDINATOR_LOAD_IN_PROGRESS: requests to a coordinator, and the
//! listing of every broker's transactions, try again (the coordinator found again, the brokers
//! read again from the cluster's metadata) for up to [`FAILOVER`] before they fail. EndTxn is the
//! exception: sent again only while it cannot have left ([`send_again`]); its other failures
//! return to the recovery, which describes the transaction before any other EndTxn.
//!
//! A node that stops answering with its connections open (a network stall, a long pause) costs a
//! request timeout per request sent to it: the bootstrap server that answered last is asked
//! first, so a silent one costs one timeout, not one per request. Back from such a stall, a node
//! answers for a moment from its old view of the cluster: a transaction that a live producer has
//! open is then asked about again when the answer says the id is unknown
//! ([`Wire::describe_open`]). A node cut off from its peers but not from its clients answers from
//! its old view for as long as the partition lasts: coordinators are looked up at every bootstrap
//! server at once and the answer most of them give is taken ([`Wire::coordinator_of`]).
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! `protocol.rs`: a minimal Kafka wire client over `kafka-protocol` (FindCoordinator,
//! DescribeTransactions and EndTxn in `protocol/txn.rs`, ListTransactions and Metadata for the live
//! brokers in `protocol/listing.rs`, the record's offsets in `protocol/offsets.rs`). A coordinator
//! that is unreachable or answers NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE /
//! COORDINATOR_LOAD_IN_PROGRESS is found again and the request retried (100 ms doubling to 1 s) for
//! up to 60 s (`FAILOVER`: a dead broker is fenced after `broker.session.timeout.ms`, then the new
//! leader loads the transaction log) — EndTxn only where it cannot have left (no connection): a
//! coordinator-moving answer or a lost one returns to the recovery, which describes the id again
//! before another EndTxn (`send_again`); a listing that a broker fails starts again at the brokers
//! the cluster's metadata lists then (a fenced broker drops out, the one that took over its
//! transactions is listed afresh). Configuration errors (credentials, certificates) return at once.
//! The bootstrap server that answered last is asked first for metadata and versions (a node that
//! stalls with its connections open costs one request timeout, not one per request: with the
//! first bootstrap server SIGSTOPped every pre-commit waited 10 s for it). FindCoordinator goes to
//! every bootstrap server at once and takes the answer more than half give, as soon as they have
//! (else the most given): a node cut off from its peers but not from its clients names itself and
//! answers from its stale view (a transaction "CompleteCommit" at pre-commit, CONCURRENT_TRANSACTIONS
//! while its log append waits for peers) for as long as the partition lasts — with the first
//! answer taken, the job restarted for all of it (`cli/tests/kafka_network_partition.rs`). The pre-commit's
//! DescribeTransactions (`describe_open`: the producer has the transaction open) asks again when
//! the answer says the id is unknown — a node back from a stall answers for a moment from its old
//! view (seen right after SIGCONT: the attempt restarted); elsewhere an unknown id is an answer.
//! `admin.rs`: inspection for tools and tests.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exactly_kafka_client::Cluster;
use kafka_protocol::messages::{
    api_versions_request::ApiVersionsRequest, describe_transactions_request::DescribeTransactionsRequest,
    end_txn_request::EndTxnRequest, find_coordinator_request::FindCoordinatorRequest,
    list_transactions_request::ListTransactionsRequest, metadata_request::MetadataRequest, ApiKey, ProducerId,
    TransactionalId,
};
use kafka_protocol::protocol::{Request, StrBytes};
use tracing::warn;

use crate::error::{Result, SinkError};

/// How long a request keeps trying while its coordinator or a broker is unreachable or moving.
pub(crate) const FAILOVER: Duration = Duration::from_secs(60);
/// The first pause between tries, doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// How long a coordinator lookup waits, after its first answer, for the other bootstrap servers'
/// when no answer has a majority yet ([`Wire::coordinator_of`]).
const VOTE_GRACE: Duration = Duration::from_millis(500);

pub(crate) mod code;
mod listing;
mod offsets;
mod txn;
pub(crate) use offsets::TxnOffset;

/// EndTxn version used for recovery. librdkafka speaks transaction version 1, whose EndTxn
/// versions are 0..=4 (version 5 marks transaction version 2, KIP-890); the broker infers the
/// version family from the request, so the commit must stay in the family that opened it.
pub const END_TXN_VERSION: i16 = 3;

/// The version of every request this client sends. Checked against the broker's ApiVersions when
/// a sink opens ([`Wire::check_versions`]), so a broker that cannot take one fails at start with a
/// clear message rather than at recovery.
pub(crate) const FIND_COORDINATOR_VERSION: i16 = 3;
pub(crate) const DESCRIBE_TRANSACTIONS_VERSION: i16 = 0;
pub(crate) const LIST_TRANSACTIONS_VERSION: i16 = 0;
/// Metadata without topics: the brokers the cluster lists now.
pub(crate) const METADATA_VERSION: i16 = 9;
/// The first EndTxn version of transaction version 2 (KIP-890): a recovery EndTxn must stay below
/// it while the producer speaks transaction version 1.
pub const END_TXN_TV2_VERSION: i16 = 5;
const _: () = assert!(
    END_TXN_VERSION < END_TXN_TV2_VERSION,
    "the recovery EndTxn must speak transaction version 1"
);

/// What a coordinator is looked up for (FindCoordinator's key type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Coordinates {
    /// A consumer group's offsets.
    Group = 0,
    /// A transactional id's transactions.
    Transaction = 1,
}

/// A transaction as its coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnDescription {
    pub(crate) state: String,
    pub(crate) producer_id: i64,
    pub(crate) producer_epoch: i16,
    pub(crate) timeout_ms: i32,
    pub(crate) start_time_ms: i64,
    pub(crate) partitions: usize,
    /// "topic-partition" of every partition the transaction touches.
    pub(crate) topic_partitions: Vec<String>,
}

/// A transaction listed by a broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ListedTxn {
    pub(crate) transactional_id: String,
    pub(crate) producer_id: i64,
    pub(crate) state: String,
}

/// A wire error as the sink's: bad security settings and refused credentials are configuration
/// errors (a restart cannot fix them); the rest is the protocol's (retried).
pub(crate) fn wire_error(e: exactly_kafka_client::wire::WireError) -> SinkError {
    use exactly_kafka_client::wire::WireError;
    match e {
        WireError::Config(_) | WireError::Authentication { .. } | WireError::Certificate { .. } => {
            SinkError::Config(e.to_string())
        }
        _ => SinkError::Protocol(e.to_string()),
    }
}

/// The tries of one request through a failover: pauses from [`FIRST_BACKOFF`], doubling up to
/// [`MAX_BACKOFF`], until [`FAILOVER`] has passed.
struct Failover {
    deadline: Instant,
    backoff: Duration,
    tries: u32,
}

impl Failover {
    fn new() -> Self {
        Failover {
            deadline: Instant::now() + FAILOVER,
            backoff: FIRST_BACKOFF,
            tries: 0,
        }
    }

    /// After a try that failed with `failure`: the error (`gave_up`, then how long and how many
    /// tries) once the next pause would pass the deadline; otherwise `first` on the first failure
    /// (a warning) and the pause.
    async fn pause(
        &mut self,
        failure: String,
        gave_up: impl FnOnce() -> String,
        first: impl FnOnce(&str),
    ) -> Result<()> {
        self.tries += 1;
        if Instant::now() + self.backoff >= self.deadline {
            return Err(SinkError::Protocol(format!(
                "{} within {FAILOVER:?} ({} tries; last: {failure})",
                gave_up(),
                self.tries
            )));
        }
        if self.tries == 1 {
            first(&failure);
        }
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        Ok(())
    }
}

/// How one try of a request at a coordinator went, as far as sending it again is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tried {
    /// It never left: no connection to the coordinator.
    Unsent,
    /// The coordinator answered with this error code.
    Answered(i16),
    /// It left and its answer was lost (timeout, connection closed): the coordinator may have
    /// acted on it.
    AnswerLost,
}

/// Whether [`Wire::at_coordinator`] sends a request again itself after `tried`: while it never
/// left, always; after an answer that the coordinator moved or is loading (NOT_COORDINATOR,
/// COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS), or a lost answer, only a
/// `repeatable` one. EndTxn is not: those answers can follow a transaction-log append that was
/// written (Jepsen's Bufstream analysis reproduced in Kafka that such an EndTxn can still take
/// effect), and sent again blind it can end a zombie's later transaction of the same producer id
/// and epoch (transaction version 1). Its caller describes the transaction first.
///
/// A TxnOffsetCommit is sent again after such an answer (the coordinator did not write it) but
/// not after a lost answer: a first copy still in flight could land after a later checkpoint's
/// offset and replace it ([`Resend::AfterRefusal`]).
fn send_again(resend: Resend, tried: Tried) -> bool {
    match tried {
        Tried::Unsent => true,
        Tried::Answered(c) => resend != Resend::OnlyUnsent && code::coordinator_moving(c),
        Tried::AnswerLost => resend == Resend::Always,
    }
}

/// When [`Wire::at_coordinator_of`] may send a request again (see [`send_again`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resend {
    /// Only while it never left (EndTxn).
    OnlyUnsent,
    /// Also after an answer that the coordinator moved or is loading.
    AfterRefusal,
    /// Also after a lost answer.
    Always,
}

/// How a request failed: before it was sent (no connection), or after (the broker may have acted
/// on it, and its answer was lost).
enum SendFailure {
    Unsent(SinkError),
    MaybeSent(SinkError),
}
use SendFailure::{MaybeSent, Unsent};

/// A minimal client for the requests above.
#[derive(Debug, Clone)]
pub(crate) struct Wire {
    cluster: Cluster,
    bootstrap: Vec<String>,
    /// The bootstrap server that answered last (an index into `bootstrap`), asked first; shared
    /// by the clones (the sink's background pre-commits).
    answered_last: Arc<AtomicUsize>,
    timeout: Duration,
}

impl Wire {
    pub(crate) fn new(cluster: Cluster, timeout: Duration) -> Self {
        Wire {
            bootstrap: cluster.addresses().map(str::to_owned).collect(),
            answered_last: Arc::default(),
            cluster,
            timeout,
        }
    }

    /// The bootstrap servers with their indexes, the one that answered last first, then the
    /// others in their configured order from there.
    fn bootstrap_servers(&self) -> impl Iterator<Item = (usize, &str)> {
        let n = self.bootstrap.len();
        let first = self.answered_last.load(Ordering::Relaxed);
        (0..n).map(move |k| {
            let i = (first + k) % n;
            (i, self.bootstrap[i].as_str())
        })
    }

    /// Bootstrap server `i` answered: asked first from now on.
    fn answered(&self, i: usize) {
        self.answered_last.store(i, Ordering::Relaxed);
    }

    /// The cluster this client reaches (and how).
    pub(crate) fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    async fn send<R: Request>(&self, addr: &str, req: &R, version: i16) -> Result<R::Response> {
        self.send_tracked(addr, req, version).await.map_err(|f| match f {
            Unsent(e) | MaybeSent(e) => e,
        })
    }

    /// [`Wire::send`], telling a failure before the request left (no connection) from one after
    /// (the broker may have acted on it).
    async fn send_tracked<R: Request>(
        &self,
        addr: &str,
        req: &R,
        version: i16,
    ) -> std::result::Result<R::Response, SendFailure> {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let no_answer = || SinkError::Protocol(format!("{addr}: no answer within {:?}", self.timeout));
        // One connection per request (these run at checkpoints and recovery, not per record),
        // secured as the cluster's settings say.
        let connect = exactly_kafka_client::wire::connect(addr, &self.cluster.security, "exactly-kafka-sink");
        let mut conn = tokio::time::timeout_at(deadline, connect)
            .await
            .map_err(|_| Unsent(no_answer()))?
            .map_err(|e| Unsent(wire_error(e)))?;
        tokio::time::timeout_at(deadline, conn.request(req, version))
            .await
            .map_err(|_| MaybeSent(no_answer()))?
            .map_err(|e| MaybeSent(wire_error(e)))
    }

    /// Asks a bootstrap broker which request versions it supports (ApiVersions) and fails, naming
    /// the request and both ranges, if one this client sends is not among them (Kafka before 3.0
    /// has no DescribeTransactions; a future broker might drop a version).
    pub(crate) async fn check_versions(&self) -> Result<()> {
        let req = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("exactly"))
            .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")));
        let mut last = String::from("no bootstrap server");
        for (i, addr) in self.bootstrap_servers() {
            let resp = match self.send(addr, &req, 3).await {
                Ok(r) if r.error_code == code::NONE => {
                    self.answered(i);
                    r
                }
                Ok(r) => {
                    last = format!("{addr}: ApiVersions error code {}", r.error_code);
                    continue;
                }
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let needed = [
                (ApiKey::FindCoordinator, FIND_COORDINATOR_VERSION),
                (ApiKey::DescribeTransactions, DESCRIBE_TRANSACTIONS_VERSION),
                (ApiKey::ListTransactions, LIST_TRANSACTIONS_VERSION),
                (ApiKey::EndTxn, END_TXN_VERSION),
                (ApiKey::AddOffsetsToTxn, offsets::ADD_OFFSETS_TO_TXN_VERSION),
                (ApiKey::TxnOffsetCommit, offsets::TXN_OFFSET_COMMIT_VERSION),
                (ApiKey::Metadata, METADATA_VERSION),
            ];
            for (api, version) in needed {
                let supported = resp.api_keys.iter().find(|k| k.api_key == api as i16);
                let ok = supported.is_some_and(|k| (k.min_version..=k.max_version).contains(&version));
                if !ok {
                    let range =
                        supported.map_or("none".to_owned(), |k| format!("{}..={}", k.min_version, k.max_version));
                    return Err(SinkError::Protocol(format!(
                        "the broker at {addr} does not support {api:?} version {version} (it supports {range}); exactly's transaction recovery needs Kafka 3.0 or later with transaction version 1 requests"
                    )));
                }
            }
            return Ok(());
        }
        Err(SinkError::Protocol(format!(
            "asking for the broker's API versions: {last}"
        )))
    }

    /// `host:port` of the coordinator of `key` (a transactional id or a group), as most bootstrap
    /// servers see it. Each answers FindCoordinator from its own view of the cluster, and a node
    /// cut off from its peers but not from its clients (an asymmetric partition: its replication
    /// link down) answers from the view it had when the partition began — itself, typically,
    /// while the others fenced it and moved its roles. Its answers to the requests that follow
    /// are stale too (a transaction in the state it last knew; CONCURRENT_TRANSACTIONS while its
    /// log append waits for peers it cannot reach), for as long as the partition lasts. So every
    /// (distinct) bootstrap server is asked at once, and the answer is the one more than half of
    /// them give, as soon as they have. Otherwise, [`VOTE_GRACE`] after the first answer (or once
    /// every server answered or failed), the one most of the answers so far give; on a tie, the
    /// earliest — a list of two cannot outvote a stale node, three or more can. A silent server
    /// costs at most that grace, not a request timeout. No answer at all is a protocol error
    /// (retried by the caller), whatever the failures were, as before.
    async fn coordinator_of(&self, key: &str, kind: Coordinates) -> Result<String> {
        let transactional_id = key;
        let req = FindCoordinatorRequest::default()
            .with_key(StrBytes::from_string(key.to_owned()))
            .with_key_type(kind as i8);
        let mut asked = tokio::task::JoinSet::new();
        let mut servers = 0;
        for (i, addr) in self.bootstrap_servers() {
            if self.bootstrap[..i].iter().any(|a| a == addr) {
                continue; // named twice: one vote
            }
            servers += 1;
            let (wire, req, addr) = (self.clone(), req.clone(), addr.to_owned());
            asked.spawn(async move {
                let answer = wire.send(&addr, &req, FIND_COORDINATOR_VERSION).await;
                (i, addr, answer)
            });
        }
        // (address, votes, the server whose answer came first), in the order answers came.
        let mut votes: Vec<(String, usize, usize)> = Vec::new();
        let mut last = String::from("no bootstrap server");
        let mut grace_until: Option<tokio::time::Instant> = None;
        loop {
            let done = match grace_until {
                None => asked.join_next().await,
                Some(until) => tokio::time::timeout_at(until, asked.join_next()).await.unwrap_or(None),
            };
            let Some(done) = done else { break };
            let (i, addr, answer) = match done {
                Ok(done) => done,
                Err(e) => {
                    warn!(error = %e, "A FindCoordinator request's task failed");
                    continue;
                }
            };
            match answer {
                Ok(r) if r.error_code == code::NONE => {
                    let coordinator = format!("{}:{}", r.host.as_str(), r.port);
                    let n = match votes.iter_mut().find(|(c, _, _)| *c == coordinator) {
                        Some(vote) => {
                            vote.1 += 1;
                            vote.1
                        }
                        None => {
                            votes.push((coordinator.clone(), 1, i));
                            1
                        }
                    };
                    if n * 2 > servers {
                        self.answered(i);
                        return Ok(coordinator);
                    }
                    grace_until.get_or_insert_with(|| tokio::time::Instant::now() + VOTE_GRACE);
                }
                Ok(r) => last = format!("{addr}: FindCoordinator error code {}", r.error_code),
                Err(e) => last = e.to_string(),
            }
        }
        // No majority: the answer most gave, the earliest of those on a tie.
        let best = votes.iter().map(|(_, n, _)| *n).max();
        if let Some((coordinator, _, i)) = votes.into_iter().find(|(_, n, _)| Some(*n) == best) {
            self.answered(i);
            return Ok(coordinator);
        }
        Err(SinkError::Protocol(format!(
            "finding the coordinator of {transactional_id}: {last}"
        )))
    }

    /// Sends `req` to the coordinator of `transactional_id`, finding it again and retrying while it
    /// is unreachable or answers that it moved or is loading (`error_code` of the answer), for up
    /// to [`FAILOVER`]. Other answers, and configuration errors (credentials, certificates), are
    /// returned at once. A request that is not `repeatable` (EndTxn: the coordinator may have
    /// ended the transaction and the id may have a new one since) is sent again only when it
    /// cannot have left (no connection); an answer that the coordinator moved or is loading, and
    /// a lost answer, return to the caller, which describes the id first ([`send_again`]).
    async fn at_coordinator<R: Request>(
        &self,
        transactional_id: &str,
        what: &str,
        req: &R,
        version: i16,
        repeatable: bool,
        error_code: impl Fn(&R::Response) -> i16,
    ) -> Result<R::Response> {
        let resend = if repeatable { Resend::Always } else { Resend::OnlyUnsent };
        self.at_coordinator_of(
            Coordinates::Transaction,
            transactional_id,
            what,
            req,
            version,
            resend,
            error_code,
        )
        .await
    }

    /// [`Wire::at_coordinator`] at the coordinator of `key` of the given `kind`.
    #[allow(clippy::too_many_arguments)]
    async fn at_coordinator_of<R: Request>(
        &self,
        kind: Coordinates,
        key: &str,
        what: &str,
        req: &R,
        version: i16,
        resend: Resend,
        error_code: impl Fn(&R::Response) -> i16,
    ) -> Result<R::Response> {
        let transactional_id = key;
        let mut failover = Failover::new();
        loop {
            let failure = match self.coordinator_of(key, kind).await {
                Ok(coordinator) => match self.send_tracked(&coordinator, req, version).await {
                    Ok(resp) if send_again(resend, Tried::Answered(error_code(&resp))) => {
                        format!("{coordinator} answered error code {}", error_code(&resp))
                    }
                    Ok(resp) => return Ok(resp),
                    Err(Unsent(SinkError::Protocol(e))) if send_again(resend, Tried::Unsent) => e,
                    Err(MaybeSent(SinkError::Protocol(e))) if send_again(resend, Tried::AnswerLost) => e,
                    Err(Unsent(e) | MaybeSent(e)) => return Err(e),
                },
                Err(SinkError::Protocol(e)) => e,
                Err(e) => return Err(e),
            };
            failover
                .pause(failure, || format!("{what} of {transactional_id}: no coordinator answered"), |failure| {
                    warn!(transactional_id, request = what, error = %failure, "The coordinator did not answer; finding it again (a broker failing over?) for up to {FAILOVER:?}.")
                })
                .await?;
        }
    }
}

#[cfg(test)]
#[path = "protocol_tests.rs"]
mod tests;
