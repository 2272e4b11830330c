//! Job files: a TOML description of a job from Kafka to Kafka, MySQL/MariaDB or PostgreSQL (one
//! sink or several), and the checks that turn mistakes into messages naming the file, the line and
//! the field.

use std::fmt;
use std::path::{Path, PathBuf};

#[cfg(not(feature = "rocksdb"))]
use exactly_core::runtime::StateBackendConfig;
use exactly_kafka_client::KafkaSecurity;
use exactly_kafka_sink::{DeliveryGuarantee, KafkaSinkConfig};
use exactly_mysql_sink::{Mode, MysqlSinkConfig};
use exactly_postgres_sink::PostgresSinkConfig;

pub mod admin_tls;
pub mod records;
mod sections;
mod text;
mod transform;
mod warnings;

pub use sections::{JobFile, JobSection, NamedSink, SinkSection, Sinks};
pub use text::masked;
use text::{line_of, segs};
pub use transform::{debezium_key, Change, Transform};

/// One sink of a checked job.
#[derive(Debug, Clone)]
pub struct JobSink {
    /// Its operator uid: the entry's `name`, or `kafka-sink` / `mysql-sink` for a job's only sink.
    pub name: String,
    /// Where it is in the file ("sink" or "sink[1]").
    pub field: String,
    /// Its own transforms (after the job's).
    pub transforms: Vec<Transform>,
    /// What it writes to.
    pub kind: SinkKind,
}

impl JobSink {
    /// "kafka topic T" or "mysql table T".
    pub fn describe(&self) -> String {
        match &self.kind {
            SinkKind::Kafka(k) => format!("kafka topic {}", k.topic),
            SinkKind::Mysql(m) => format!("mysql table {}", m.table),
            SinkKind::Postgres(p) => format!("postgres table {}", p.table),
        }
    }
}

/// The sink a job writes to.
#[derive(Debug, Clone)]
pub enum SinkKind {
    /// Kafka.
    Kafka(Box<KafkaSinkConfig>),
    /// MySQL/MariaDB.
    Mysql(Box<MysqlSinkConfig>),
    /// PostgreSQL.
    Postgres(Box<PostgresSinkConfig>),
}

/// A problem in a job file: where it is and what is expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFileError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// The field ("sink.kafka.topic").
    pub field: Option<String>,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for JobFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        write!(f, ": ")?;
        if let Some(field) = &self.field {
            write!(f, "{field}: ")?;
        }
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for JobFileError {}

/// A checked job file.
#[derive(Debug, Clone)]
pub struct Job {
    /// Where it came from.
    pub path: PathBuf,
    /// Its content.
    pub file: JobFile,
    /// The sinks (one, or several fed by one reading of the source).
    pub sinks: Vec<JobSink>,
}

/// The principal a GSSAPI client of `security` authenticates as, when it names one.
fn kerberos_principal(security: &KafkaSecurity) -> Option<&str> {
    if security.sasl.mechanism != Some(exactly_kafka_client::SaslMechanism::Gssapi) {
        return None;
    }
    security.sasl.kerberos.as_ref()?.principal.as_deref()
}

impl JobSection {
    /// The admin endpoint's client-certificate settings (`admin_tls_client_ca`, `_crl`).
    fn client_auth(&self) -> Option<crate::admin_tls::ClientAuth<'_>> {
        self.admin_tls_client_ca
            .as_deref()
            .map(|ca| crate::admin_tls::ClientAuth {
                ca,
                crl: self.admin_tls_client_crl.as_deref(),
            })
    }
}

impl Job {
    /// The admin endpoint's token, from `admin_token` or `admin_token_file`.
    pub fn admin_token(&self) -> anyhow::Result<Option<exactly_core::secret::Secret>> {
        let j = &self.file.job;
        let token = match (&j.admin_token, &j.admin_token_file) {
            (Some(t), _) => t.clone(),
            (None, Some(f)) => exactly_core::secret::Secret::from_file(f).map_err(anyhow::Error::msg)?,
            (None, None) => return Ok(None),
        };
        // Checked again here: a file's content may have changed since the job file was checked.
        check_token(&token).map_err(|m| anyhow::anyhow!("job.admin_token: {m}"))?;
        Ok(Some(token))
    }

    /// The admin endpoint's TLS settings, read from `admin_tls_cert` and `admin_tls_key`.
    pub fn admin_tls(&self) -> anyhow::Result<Option<std::sync::Arc<rustls::ServerConfig>>> {
        let j = &self.file.job;
        match (&j.admin_tls_cert, &j.admin_tls_key) {
            (Some(cert), Some(key)) => crate::admin_tls::server_tls(cert, key, j.client_auth()).map(Some),
            _ => Ok(None),
        }
    }

    /// Reads and checks `path`.
    pub fn load(path: &Path) -> Result<Job, JobFileError> {
        let src = std::fs::read_to_string(path).map_err(|e| JobFileError {
            file: path.to_owned(),
            line: None,
            field: None,
            message: format!("cannot read the job file: {e}"),
        })?;
        Job::parse(path, &src)
    }

    /// Parses and checks `src` (read from `path`).
    pub fn parse(path: &Path, src: &str) -> Result<Job, JobFileError> {
        let mut file: JobFile = toml::from_str(src).map_err(|e| {
            let line = e
                .span()
                .map(|s| src[..s.start.min(src.len())].matches('\n').count() + 1);
            JobFileError {
                file: path.to_owned(),
                line,
                field: None,
                message: e.message().trim().to_owned(),
            }
        })?;
        let err = |field: &str, message: String| JobFileError {
            file: path.to_owned(),
            line: line_of(src, &segs(field)),
            field: Some(field.to_owned()),
            message,
        };
        if let Some(c) = &file.checkpoints {
            if let Err(m) = exactly_core::storage::check_scheme(&c.dir.to_string_lossy()) {
                return Err(err("checkpoints.dir", m));
            }
        }
        // One place for the security settings: [kafka] reaches the source and the Kafka sink.
        if let Some(security) = &file.kafka {
            if let Err(m) = security.validate() {
                return Err(err("kafka", m));
            }
            if file.source.security != KafkaSecurity::default() {
                return Err(err(
                    "source.security",
                    "the job has a [kafka] section: keep the security settings there only".into(),
                ));
            }
            file.source.security = security.clone();
        }
        // (where in the file, the entry); a job's only sink is an entry without a name.
        let entries: Vec<(String, NamedSink)> = match &file.sink {
            Sinks::One(one) => vec![(
                "sink".into(),
                NamedSink {
                    name: String::new(),
                    transforms: Vec::new(),
                    kafka: one.kafka.clone(),
                    mysql: one.mysql.clone(),
                    postgres: one.postgres.clone(),
                },
            )],
            Sinks::Many(list) => list
                .iter()
                .enumerate()
                .map(|(i, n)| (format!("sink[{i}]"), n.clone()))
                .collect(),
        };
        if entries.is_empty() {
            return Err(err(
                "sink",
                "no sink: add a [sink.kafka], [sink.mysql] or [sink.postgres] table, or [[sink]] entries".into(),
            ));
        }
        let mut sinks = Vec::new();
        for (
            at,
            NamedSink {
                name,
                transforms,
                kafka,
                mysql,
                postgres,
            },
        ) in entries
        {
            let kind = match (kafka, mysql, postgres) {
                (Some(mut k), None, None) => {
                    // One place for the security settings: [kafka] reaches every Kafka sink.
                    if let Some(security) = &file.kafka {
                        if k.security != KafkaSecurity::default() {
                            return Err(err(
                                &format!("{at}.kafka.security"),
                                "the job has a [kafka] section: keep the security settings there only".into(),
                            ));
                        }
                        k.security = security.clone();
                    }
                    SinkKind::Kafka(Box::new(k))
                }
                (None, Some(m), None) => SinkKind::Mysql(Box::new(m)),
                (None, None, Some(p)) => SinkKind::Postgres(Box::new(p)),
                (None, None, None) => return Err(err(
                    &at,
                    match &file.sink {
                        Sinks::One(_) => "no sink: add a [sink.kafka], [sink.mysql] or [sink.postgres] table".into(),
                        Sinks::Many(_) => {
                            "no sink: give this [[sink]] entry a [sink.kafka], [sink.mysql] or [sink.postgres] table"
                                .into()
                        }
                    },
                )),
                _ => return Err(err(
                    &at,
                    "one kind per sink: keep one of kafka, mysql and postgres (several sinks: one [[sink]] entry each)"
                        .into(),
                )),
            };
            let name = match (&file.sink, &kind) {
                (Sinks::Many(_), _) => name,
                (Sinks::One(_), SinkKind::Kafka(_)) => "kafka-sink".into(),
                (Sinks::One(_), SinkKind::Mysql(_)) => "mysql-sink".into(),
                (Sinks::One(_), SinkKind::Postgres(_)) => "postgres-sink".into(),
            };
            sinks.push(JobSink {
                name,
                field: at,
                transforms,
                kind,
            });
        }
        let j = &file.job;
        if j.name.trim().is_empty() {
            return Err(err("job.name", "must not be empty".into()));
        }
        if j.parallelism == 0 {
            return Err(err("job.parallelism", "must be at least 1".into()));
        }
        if let Some(a) = &j.admin {
            if a.parse::<std::net::SocketAddr>().is_err() {
                return Err(err(
                    "job.admin",
                    format!("{a:?} is not an address: expected \"host-ip:port\", e.g. \"127.0.0.1:9249\""),
                ));
            }
        }
        if j.admin_token.is_some() && j.admin_token_file.is_some() {
            return Err(err(
                "job.admin_token",
                "give admin_token or admin_token_file, not both".into(),
            ));
        }
        if let Some(f) = &j.admin_token_file {
            match exactly_core::secret::Secret::from_file(f) {
                Err(m) => return Err(err("job.admin_token_file", m)),
                Ok(t) => {
                    if let Err(m) = check_token(&t) {
                        return Err(err("job.admin_token_file", m));
                    }
                }
            }
        }
        if let Some(t) = &j.admin_token {
            if let Err(m) = check_token(t) {
                return Err(err("job.admin_token", m));
            }
        }
        for h in &j.admin_allowed_hosts {
            if h.is_empty() || h.contains([':', '/', ' ', '*']) {
                return Err(err(
                    "job.admin_allowed_hosts",
                    format!("{h:?} is not a host name (give names without port or scheme, e.g. \"orders-job-admin\")"),
                ));
            }
        }
        match (&j.admin_tls_cert, &j.admin_tls_key) {
            (Some(cert), Some(key)) => {
                if j.admin_tls_client_crl.is_some() && j.admin_tls_client_ca.is_none() {
                    return Err(err(
                        "job.admin_tls_client_crl",
                        "needs admin_tls_client_ca (the CA whose certificates it revokes)".into(),
                    ));
                }
                if let Err(e) = crate::admin_tls::server_tls(cert, key, j.client_auth()) {
                    let said = format!("{e:#}");
                    let field = ["admin_tls_client_ca", "admin_tls_client_crl"]
                        .into_iter()
                        .find(|f| said.starts_with(f))
                        .unwrap_or("admin_tls_cert");
                    return Err(err(&format!("job.{field}"), said));
                }
            }
            (Some(_), None) => {
                return Err(err(
                    "job.admin_tls_cert",
                    "needs admin_tls_key (the certificate's private key) too".into(),
                ))
            }
            (None, Some(_)) => {
                return Err(err(
                    "job.admin_tls_key",
                    "needs admin_tls_cert (the certificate chain) too".into(),
                ))
            }
            (None, None) => {
                let client_setting = if j.admin_tls_client_ca.is_some() {
                    Some("job.admin_tls_client_ca")
                } else if j.admin_tls_client_crl.is_some() {
                    Some("job.admin_tls_client_crl")
                } else {
                    None
                };
                if let Some(field) = client_setting {
                    return Err(err(
                        field,
                        "needs admin_tls_cert and admin_tls_key: client certificates are asked for over TLS".into(),
                    ));
                }
            }
        }
        if let Some(c) = &file.checkpoints {
            if let Err(e) = c.validate() {
                return Err(err("checkpoints", e.to_string()));
            }
        }
        if let Some(b) = &file.state_backend {
            if let Err(e) = b.validate() {
                return Err(err("state_backend.memory_mb", e.to_string()));
            }
        }
        #[cfg(not(feature = "rocksdb"))]
        if matches!(file.state_backend, Some(StateBackendConfig::RocksDb { .. })) {
            return Err(err(
                "state_backend.type",
                "this exactly was built without the RocksDB state backend (cargo build -p exactly-cli with its default features has it); use type = \"memory\" or another build".into(),
            ));
        }
        if let Some(r) = &file.restart {
            if let Err(e) = r.validate() {
                return Err(err("restart", e.to_string()));
            }
        }
        if let Err(e) = file.source.validate() {
            return Err(err("source", e.to_string()));
        }
        for (i, t) in file.transforms.iter().enumerate() {
            if let Err(m) = t.check() {
                return Err(err(&format!("transform[{i}]"), m));
            }
        }
        let debezium = file.transforms.iter().any(|t| matches!(t, Transform::Debezium));
        if let Some(i) = transform::debezium_misplaced(&file.transforms) {
            return Err(err(
                &format!("transform[{i}]"),
                "`debezium` must be the first transform, followed by `project` at most: a delete carries only its key, so a `key`, `rename` or `filter` after it would apply to rows but not to deletes (a key changed on one and not the other, a row filtered out that stays)".into(),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        let mut prefixes = std::collections::BTreeMap::new();
        let mut xa_ids = std::collections::BTreeMap::new();
        let mut pg_ids = std::collections::BTreeMap::new();
        for s in &sinks {
            let at = &s.field;
            if matches!(file.sink, Sinks::Many(_)) {
                let ok = !s.name.is_empty()
                    && s.name.len() <= 64
                    && s.name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
                if !ok {
                    return Err(err(
                        &format!("{at}.name"),
                        format!("{:?}: a sink name is 1 to 64 letters, digits, '-' or '_' (it names the sink's state in checkpoints)", s.name),
                    ));
                }
                if s.name == "kafka-source" || !names.insert(s.name.clone()) {
                    return Err(err(
                        &format!("{at}.name"),
                        format!(
                            "{:?} names another operator of the job: give every sink its own name",
                            s.name
                        ),
                    ));
                }
            }
            for (i, t) in s.transforms.iter().enumerate() {
                if let Err(m) = t.check() {
                    return Err(err(&format!("{at}.transform[{i}]"), m));
                }
                if matches!(t, Transform::Debezium) {
                    return Err(err(
                        &format!("{at}.transform[{i}]"),
                        "`debezium` unwraps change events as the source reads them: put it in the job's [[transform]] list, first".into(),
                    ));
                }
                if debezium && !matches!(t, Transform::Project { .. }) {
                    return Err(err(
                        &format!("{at}.transform[{i}]"),
                        "a sink of a `debezium` change stream takes `project` at most: a deletion carries only its key, so a `key`, `rename` or `filter` here would apply to rows and not to deletes".into(),
                    ));
                }
            }
            match &s.kind {
                SinkKind::Kafka(k) => {
                    if let Err(e) = k.validate() {
                        return Err(err(&format!("{at}.kafka"), e.to_string()));
                    }
                    if let DeliveryGuarantee::ExactlyOnce {
                        transactional_id_prefix,
                        ..
                    } = &k.delivery
                    {
                        if let Some(other) = prefixes.insert(transactional_id_prefix.clone(), at.clone()) {
                            return Err(err(
                                &format!("{at}.kafka.delivery.transactional_id_prefix"),
                                format!("{transactional_id_prefix:?} is also the prefix of {other}: each exactly-once Kafka sink needs its own (their transactions would fence each other)"),
                            ));
                        }
                    }
                    if let DeliveryGuarantee::ExactlyOnce { .. } | DeliveryGuarantee::AtLeastOnce = k.delivery {
                        let Some(c) = &file.checkpoints else {
                            return Err(err(
                                &format!("{at}.kafka.delivery"),
                                "exactly_once and at_least_once need checkpoints: add a [checkpoints] table with `dir` (and `interval`)".into(),
                            ));
                        };
                        let restart = file.restart.clone().unwrap_or_default();
                        if let Err(e) = k.validate_against_checkpoints(c.interval, c.timeout, restart.longest_delay()) {
                            return Err(err(&format!("{at}.kafka.delivery.transaction_timeout"), e.to_string()));
                        }
                    }
                }
                SinkKind::Mysql(m) => {
                    if let Err(e) = m.validate() {
                        return Err(err(&format!("{at}.mysql"), e.to_string()));
                    }
                    if debezium && !m.upserts() {
                        return Err(err(
                            &format!("{at}.mysql.insert_mode"),
                            "a `debezium` change stream updates and deletes rows: with mode \"xa\" set insert_mode = \"upsert\" (or use mode \"upsert\")".into(),
                        ));
                    }
                    if m.mode == Mode::Xa && file.checkpoints.is_none() {
                        return Err(err(
                            &format!("{at}.mysql.mode"),
                            "mode \"xa\" commits on checkpoints: add a [checkpoints] table with `dir` (and `interval`)"
                                .into(),
                        ));
                    }
                    if let Some(other) = xa_ids.insert((m.job_id.clone(), m.sink_id.clone()), at.clone()) {
                        return Err(err(
                            &format!("{at}.mysql.sink_id"),
                            format!("job_id {:?} and sink_id {:?} are also those of {other}: give each MySQL sink its own sink_id (they name its transactions and progress rows)", m.job_id, m.sink_id),
                        ));
                    }
                }
                SinkKind::Postgres(p) => {
                    if let Err(e) = p.validate() {
                        return Err(err(&format!("{at}.postgres"), e.to_string()));
                    }
                    if debezium && !p.upserts() {
                        return Err(err(
                            &format!("{at}.postgres.insert_mode"),
                            "a `debezium` change stream updates and deletes rows: with mode \"two_phase\" set insert_mode = \"upsert\" (or use mode \"upsert\")".into(),
                        ));
                    }
                    if p.mode == exactly_postgres_sink::Mode::TwoPhase && file.checkpoints.is_none() {
                        return Err(err(
                            &format!("{at}.postgres.mode"),
                            "mode \"two_phase\" commits on checkpoints: add a [checkpoints] table with `dir` (and `interval`)"
                                .into(),
                        ));
                    }
                    if let Some(other) = pg_ids.insert((p.job_id.clone(), p.sink_id.clone()), at.clone()) {
                        return Err(err(
                            &format!("{at}.postgres.sink_id"),
                            format!("job_id {:?} and sink_id {:?} are also those of {other}: give each PostgreSQL sink its own sink_id (they name its transactions and progress rows)", p.job_id, p.sink_id),
                        ));
                    }
                }
            }
        }
        let job = Job {
            path: path.to_owned(),
            file,
            sinks,
        };
        // A process has one Kerberos credential cache, whose principal librdkafka's clients
        // authenticate as (the command's `credential_cache`): every Kafka client names the same one.
        {
            let mut principals = job
                .kafka_securities()
                .filter_map(|(at, security)| Some((at, kerberos_principal(security)?)));
            if let Some((first_at, first)) = principals.next() {
                if let Some((at, sink)) = principals.find(|(_, p)| *p != first) {
                    let who = match first_at {
                        "source" => "the source".to_owned(),
                        other => format!("{other}.kafka"),
                    };
                    return Err(err(
                        &format!("{at}.kafka.security"),
                        format!("{who} authenticates as {first:?} with Kerberos and this sink as {sink:?}: a job's Kafka clients share one credential cache, so they must use one principal (a [kafka] section gives them the same)"),
                    ));
                }
            }
        }
        Ok(job)
    }

    /// The security settings of the job's Kafka clients, with where they are in the file:
    /// `source`'s, then each Kafka sink's (`sink`, `sink[1]`, …).
    pub fn kafka_securities(&self) -> impl Iterator<Item = (&str, &KafkaSecurity)> {
        let sinks = self.sinks.iter().filter_map(|s| match &s.kind {
            SinkKind::Kafka(k) => Some((s.field.as_str(), &k.security)),
            _ => None,
        });
        std::iter::once(("source", &self.file.source.security)).chain(sinks)
    }

    /// Whether records are parsed as JSON (some transform needs it).
    pub fn needs_json(&self) -> bool {
        !self.file.transforms.is_empty() || self.sinks.iter().any(|s| !s.transforms.is_empty())
    }
}

/// The shortest admin token accepted (bytes).
pub const MIN_TOKEN_BYTES: usize = 16;

/// Refuses a token too short to protect anything: an empty one (a variable set but empty, an
/// empty Secret file) would otherwise compare equal to an empty `Authorization` and serve
/// everyone.
pub fn check_token(token: &exactly_core::secret::Secret) -> std::result::Result<(), String> {
    let t = token.expose();
    if t.trim().len() < MIN_TOKEN_BYTES {
        return Err(format!(
            "the admin token is {} (from {token:?}): it must be at least {MIN_TOKEN_BYTES} bytes, e.g. `openssl rand -hex 16`",
            if t.trim().is_empty() {
                "empty".to_owned()
            } else {
                format!("{} bytes", t.trim().len())
            }
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
