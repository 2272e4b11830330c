//! The sections of a job file as it is read (before `Job` checks them).

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::StateBackendConfig;
use exactly_kafka_client::KafkaSecurity;
use exactly_kafka_sink::KafkaSinkConfig;
use exactly_kafka_source::KafkaSourceConfig;
use exactly_mysql_sink::MysqlSinkConfig;
use exactly_postgres_sink::PostgresSinkConfig;
use serde::Deserialize;

use super::Transform;

/// A whole job file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobFile {
    /// `[job]`: name, parallelism, admin address.
    pub job: JobSection,
    /// `[checkpoints]`: required for exactly-once sinks.
    #[serde(default)]
    pub checkpoints: Option<CheckpointConfig>,
    /// `[restart]`: the restart strategy (default: exponential delay).
    #[serde(default)]
    pub restart: Option<RestartStrategy>,
    /// `[state_backend]`: memory (default) or rocks_db.
    #[serde(default)]
    pub state_backend: Option<StateBackendConfig>,
    /// `[source]`: the Kafka source.
    pub source: KafkaSourceConfig,
    /// `[[transform]]`: record transforms, applied in order to JSON values.
    #[serde(default, rename = "transform")]
    pub transforms: Vec<Transform>,
    /// `[sink.kafka]` or `[sink.mysql]` (one sink), or `[[sink]]` entries (several sinks fed by
    /// one reading of the source, committed on the same checkpoints).
    #[serde(deserialize_with = "sinks")]
    pub sink: Sinks,
    /// `[kafka]`: TLS and SASL for every Kafka client of the job (Kafka's names as dotted keys:
    /// `security.protocol`, `sasl.mechanism`, `sasl.username`, `sasl.password` /
    /// `sasl.password_file`, `ssl.ca.location`, ...). Plaintext when absent.
    #[serde(default)]
    pub kafka: Option<KafkaSecurity>,
}

fn default_parallelism() -> u32 {
    1
}

/// `[job]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSection {
    /// The job's name (in logs, metrics and checkpoint metadata).
    pub name: String,
    /// Subtasks of every stage.
    #[serde(default = "default_parallelism")]
    pub parallelism: u32,
    /// Number of key groups (fixed for the life of the job's state).
    #[serde(default)]
    pub max_parallelism: Option<u32>,
    /// Address of the admin HTTP endpoint (metrics, status, savepoints), e.g. "127.0.0.1:9249".
    #[serde(default)]
    pub admin: Option<String>,
    /// The admin endpoint's bearer token (write `"${EXACTLY_ADMIN_TOKEN}"`, not the token):
    /// required for every POST, and for every request on a non-loopback address.
    #[serde(default)]
    pub admin_token: Option<exactly_core::secret::Secret>,
    /// A file holding the admin token (e.g. a mounted Kubernetes Secret).
    #[serde(default)]
    pub admin_token_file: Option<PathBuf>,
    /// Host names (beside IP addresses and `localhost`) under which clients reach the admin
    /// endpoint, e.g. a Kubernetes Service's `["orders-job-admin"]`: a request naming another
    /// host is refused, so a web page cannot reach the endpoint through a name it controls (DNS
    /// rebinding).
    #[serde(default)]
    pub admin_allowed_hosts: Vec<String>,
    /// The admin endpoint's certificate chain (PEM, the server's certificate first): with
    /// `admin_tls_key` the endpoint speaks HTTPS only.
    #[serde(default)]
    pub admin_tls_cert: Option<PathBuf>,
    /// The private key of `admin_tls_cert` (PEM: PKCS#8, PKCS#1 or SEC1, not encrypted).
    #[serde(default)]
    pub admin_tls_key: Option<PathBuf>,
    /// CA certificates (PEM) whose certificates clients must present (mutual TLS; needs
    /// `admin_tls_cert`): without one a connection gets only `GET /healthz`.
    #[serde(default)]
    pub admin_tls_client_ca: Option<PathBuf>,
    /// Certificate revocation lists (PEM) of `admin_tls_client_ca`: a revoked client certificate
    /// ends the handshake. Read again when the file changes, as the CA and certificate are.
    #[serde(default)]
    pub admin_tls_client_crl: Option<PathBuf>,
    /// How long a graceful stop waits for tasks.
    #[serde(default, with = "humantime_serde")]
    pub shutdown_timeout: Option<Duration>,
    /// Failed attempts to start (before the first completed checkpoint) after which the job
    /// gives up, whatever `[restart]` allows (default 5; 0: no limit).
    #[serde(default)]
    pub startup_attempts: Option<u32>,
}

/// `[sink.kafka]`, `[sink.mysql]` or `[sink.postgres]` (exactly one).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SinkSection {
    /// A Kafka topic.
    #[serde(default)]
    pub kafka: Option<KafkaSinkConfig>,
    /// A MySQL/MariaDB table.
    #[serde(default)]
    pub mysql: Option<MysqlSinkConfig>,
    /// A PostgreSQL table.
    #[serde(default)]
    pub postgres: Option<PostgresSinkConfig>,
}

/// One `[[sink]]` entry of a job with several sinks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamedSink {
    /// Names the sink in logs, metrics and checkpoints (its operator uid): keep it across
    /// restarts, like a Flink uid.
    pub name: String,
    /// `[[sink.transform]]`: transforms of this sink only, after the job's own `[[transform]]`s.
    #[serde(default, rename = "transform")]
    pub transforms: Vec<Transform>,
    /// A Kafka topic.
    #[serde(default)]
    pub kafka: Option<KafkaSinkConfig>,
    /// A MySQL/MariaDB table.
    #[serde(default)]
    pub mysql: Option<MysqlSinkConfig>,
    /// A PostgreSQL table.
    #[serde(default)]
    pub postgres: Option<PostgresSinkConfig>,
}

/// The `sink` of a job file: one table, or an array of named tables.
#[derive(Debug, Clone)]
pub enum Sinks {
    /// `[sink.kafka]` or `[sink.mysql]`.
    One(Box<SinkSection>),
    /// `[[sink]]` entries.
    Many(Vec<NamedSink>),
}

/// Takes `sink` as a table or as an array of tables; errors keep their place in the file.
fn sinks<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Sinks, D::Error> {
    struct V;
    impl<'de> serde::de::Visitor<'de> for V {
        type Value = Sinks;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a [sink.kafka], [sink.mysql] or [sink.postgres] table, or [[sink]] entries")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Sinks, A::Error> {
            SinkSection::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(|s| Sinks::One(Box::new(s)))
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<Sinks, A::Error> {
            Vec::<NamedSink>::deserialize(serde::de::value::SeqAccessDeserializer::new(seq)).map(Sinks::Many)
        }
    }
    d.deserialize_any(V)
}
