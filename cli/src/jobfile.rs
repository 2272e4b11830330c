//! Job files: a TOML description of a Kafka-to-Kafka or Kafka-to-MySQL job, and the checks that
//! turn mistakes into messages naming the file, the line and the field.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use exactly_core::coordinator::CheckpointConfig;
use exactly_core::restart::RestartStrategy;
use exactly_core::runtime::StateBackendConfig;
use exactly_kafka_client::KafkaSecurity;
use exactly_kafka_sink::{DeliveryGuarantee, KafkaSinkConfig};
use exactly_kafka_source::KafkaSourceConfig;
use exactly_mysql_sink::{Mode, MysqlSinkConfig};
use exactly_postgres_sink::PostgresSinkConfig;
use serde::Deserialize;
use serde_json::Value;

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

/// A record transform (`[[transform]]` with `type = ...`), applied to the record's JSON value.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Transform {
    /// Keeps records whose `field` satisfies exactly one condition: `equals`, `not_equals`,
    /// `one_of` or `exists`.
    Filter {
        /// A field name; nested fields with dots ("customer.country").
        field: String,
        /// Keep when the field equals this value.
        #[serde(default)]
        equals: Option<Value>,
        /// Keep when the field is absent or differs from this value.
        #[serde(default)]
        not_equals: Option<Value>,
        /// Keep when the field equals one of these values.
        #[serde(default)]
        one_of: Option<Vec<Value>>,
        /// Keep when the field is present (true) or absent (false).
        #[serde(default)]
        exists: Option<bool>,
    },
    /// Keeps only these top-level fields (in this order).
    Project {
        /// Field names.
        fields: Vec<String>,
    },
    /// Renames a top-level field.
    Rename {
        /// Current name.
        from: String,
        /// New name.
        to: String,
    },
    /// Sets the record key to the field's value (strings as they are, anything else as JSON).
    Key {
        /// A field name; nested fields with dots.
        field: String,
    },
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

/// One step of a field path: a table key or an index into an array of tables.
#[derive(Debug, Clone, Copy)]
enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// Finds the line of `path` in `src` (the deepest part of the path that exists).
fn line_of(src: &str, path: &[Seg<'_>]) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(src).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut item: Option<&toml_edit::Item> = None;
    let mut span = None;
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if let Some(it) = item {
                    match it.as_table_like() {
                        Some(t) => table = t,
                        None => break,
                    }
                }
                let Some((key, value)) = table.get_key_value(k) else {
                    break;
                };
                span = key.span().or_else(|| value.span()).or(span);
                item = Some(value);
            }
            Seg::Index(i) => {
                let Some(t) = item.and_then(|it| it.as_array_of_tables()).and_then(|a| a.get(*i)) else {
                    break;
                };
                span = t.span().or(span);
                table = t;
                item = None;
            }
        }
    }
    let offset = span?.start;
    Some(src[..offset.min(src.len())].matches('\n').count() + 1)
}

fn segs(path: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        if let Some((name, rest)) = part.split_once('[') {
            out.push(Seg::Key(name));
            if let Ok(i) = rest.trim_end_matches(']').parse() {
                out.push(Seg::Index(i));
            }
        } else {
            out.push(Seg::Key(part));
        }
    }
    out
}

impl Job {
    /// The admin endpoint's token, from `admin_token` or `admin_token_file`.
    pub fn admin_token(&self) -> anyhow::Result<Option<exactly_core::secret::Secret>> {
        let j = &self.file.job;
        match (&j.admin_token, &j.admin_token_file) {
            (Some(t), _) => Ok(Some(t.clone())),
            (None, Some(f)) => exactly_core::secret::Secret::from_file(f)
                .map(Some)
                .map_err(anyhow::Error::msg),
            (None, None) => Ok(None),
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
            if let Err(m) = exactly_core::secret::Secret::from_file(f) {
                return Err(err("job.admin_token_file", m));
            }
        }
        if let Some(c) = &file.checkpoints {
            if let Err(e) = c.validate() {
                return Err(err("checkpoints", e.to_string()));
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
        Ok(Job {
            path: path.to_owned(),
            file,
            sinks,
        })
    }

    /// Whether records are parsed as JSON (some transform needs it).
    pub fn needs_json(&self) -> bool {
        !self.file.transforms.is_empty() || self.sinks.iter().any(|s| !s.transforms.is_empty())
    }
}

/// `src` (a job file) with its secrets masked, for showing it: the value of every key whose name
/// says password, secret or token, and the password of every `scheme://user:password@` URL, become
/// `***` — unless they are `${NAME}` references, which hold no secret.
pub fn masked(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    for line in src.split_inclusive('\n') {
        let mut line = line.to_owned();
        if let Some((key, value)) = line.split_once('=') {
            let k = key.trim().to_ascii_lowercase();
            let secret = ["password", "secret", "token"].iter().any(|w| k.contains(w));
            let v = value.trim();
            // An inline table that names a secret (`sasl = { password = "…" }`) is hidden whole.
            let inline = v.starts_with('{')
                && ["password", "secret", "token"]
                    .iter()
                    .any(|w| v.to_ascii_lowercase().contains(w));
            if inline && !k.starts_with('#') {
                let end = if line.ends_with('\n') { "\n" } else { "" };
                line = format!("{key}= {{ *** }}{end}");
            } else if secret
                && !k.starts_with('#')
                && !k.ends_with("_file")
                && !k.ends_with(".location")
                && !v.starts_with("\"${")
            {
                let end = if line.ends_with('\n') { "\n" } else { "" };
                line = format!("{key}= \"***\"{end}");
            }
        }
        // scheme://user:password@host
        let mut at = 0;
        while let Some(i) = line[at..].find("://") {
            let start = at + i + 3;
            let rest = &line[start..];
            let stop = rest.find(['/', '"', ' ', '\'']).unwrap_or(rest.len());
            let authority = &rest[..stop];
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                if let Some((user, pass)) = userinfo.split_once(':') {
                    if !pass.starts_with("${") {
                        let replaced = format!("{user}:***");
                        line.replace_range(start..start + userinfo.len(), &replaced);
                    }
                }
            }
            at = start;
        }
        out.push_str(&line);
    }
    out
}

fn field<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(value, |v, k| v.get(k))
}

impl Transform {
    fn check(&self) -> Result<(), String> {
        match self {
            Transform::Filter {
                field,
                equals,
                not_equals,
                one_of,
                exists,
            } => {
                if field.is_empty() {
                    return Err("field must not be empty".into());
                }
                let n = [
                    equals.is_some(),
                    not_equals.is_some(),
                    one_of.is_some(),
                    exists.is_some(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if n != 1 {
                    return Err(format!(
                        "a filter takes exactly one of `equals`, `not_equals`, `one_of`, `exists` (found {n})"
                    ));
                }
                Ok(())
            }
            Transform::Project { fields } => {
                if fields.is_empty() {
                    return Err("project needs at least one field in `fields`".into());
                }
                Ok(())
            }
            Transform::Rename { from, to } => {
                if from.is_empty() || to.is_empty() {
                    return Err("rename needs non-empty `from` and `to`".into());
                }
                Ok(())
            }
            Transform::Key { field } => {
                if field.is_empty() {
                    return Err("field must not be empty".into());
                }
                Ok(())
            }
        }
    }

    /// Applies the transform. Returns false when a filter drops the record; `key` receives a
    /// new key from a key transform.
    pub fn apply(&self, value: &mut Value, key: &mut Option<Vec<u8>>) -> bool {
        match self {
            Transform::Filter {
                field: f,
                equals,
                not_equals,
                one_of,
                exists,
            } => {
                let v = field(value, f);
                if let Some(e) = equals {
                    return v == Some(e);
                }
                if let Some(e) = not_equals {
                    return v != Some(e);
                }
                if let Some(list) = one_of {
                    return v.is_some_and(|v| list.contains(v));
                }
                if let Some(e) = exists {
                    return v.is_some() == *e;
                }
                true
            }
            Transform::Project { fields } => {
                if let Value::Object(map) = value {
                    let mut out = serde_json::Map::new();
                    for f in fields {
                        if let Some(v) = map.remove(f) {
                            out.insert(f.clone(), v);
                        }
                    }
                    *map = out;
                }
                true
            }
            Transform::Rename { from, to } => {
                if let Value::Object(map) = value {
                    if let Some(v) = map.remove(from) {
                        map.insert(to.clone(), v);
                    }
                }
                true
            }
            Transform::Key { field: f } => {
                *key = field(value, f).map(|v| match v {
                    Value::String(s) => s.clone().into_bytes(),
                    other => other.to_string().into_bytes(),
                });
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(src: &str) -> Result<Job, JobFileError> {
        Job::parse(Path::new("job.toml"), src)
    }

    const GOOD: &str = r#"
[job]
name = "orders"
parallelism = 2

[checkpoints]
dir = "/tmp/x"
interval = "1s"
timeout = "30s"

[source]
bootstrap_servers = "127.0.0.1:19092"
topics = ["orders"]
group_id = "g"

[[transform]]
type = "filter"
field = "status"
equals = "paid"

[[transform]]
type = "key"
field = "customer.id"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = { type = "exactly_once", transactional_id_prefix = "orders" }
"#;

    #[test]
    fn a_good_file_parses() {
        let job = parse(GOOD).unwrap();
        assert_eq!(job.file.job.parallelism, 2);
        assert_eq!(job.file.transforms.len(), 2);
        assert!(matches!(job.sinks[0].kind, SinkKind::Kafka(_)));
        assert_eq!(
            job.sinks[0].name, "kafka-sink",
            "a job's only sink keeps the uid it always had"
        );
    }

    #[test]
    fn when_caught_up_takes_a_flag_or_a_name_and_defaults_to_after_backlog() {
        use exactly_core::coordinator::WhenCaughtUp;
        let when = |line: &str| {
            parse(&GOOD.replace("timeout = \"30s\"", &format!("timeout = \"30s\"\n{line}")))
                .map(|j| j.file.checkpoints.expect("checkpoints").when_caught_up)
        };
        assert_eq!(when("").unwrap(), WhenCaughtUp::AfterBacklog);
        for (line, expected) in [
            ("when_caught_up = false", WhenCaughtUp::Never),
            ("when_caught_up = true", WhenCaughtUp::Always),
            ("when_caught_up = \"never\"", WhenCaughtUp::Never),
            ("when_caught_up = \"after-backlog\"", WhenCaughtUp::AfterBacklog),
            ("when_caught_up = \"always\"", WhenCaughtUp::Always),
        ] {
            assert_eq!(when(line).unwrap(), expected, "{line}");
        }
        let e = when("when_caught_up = \"backlog\"").unwrap_err();
        assert_eq!(e.line, Some(10), "{e}");
        assert!(e.message.contains(r#"false, "after-backlog" or true"#), "{e}");
    }

    #[test]
    fn an_unknown_field_names_its_line() {
        let src = GOOD.replace("group_id = \"g\"", "group_id = \"g\"\ngroupid = \"h\"");
        let e = parse(&src).unwrap_err();
        assert_eq!(e.line, Some(15), "{e}");
        assert!(e.message.contains("unknown field `groupid`"), "{e}");
    }

    #[test]
    fn a_wrong_type_names_its_line() {
        let e = parse(&GOOD.replace("parallelism = 2", "parallelism = \"two\"")).unwrap_err();
        assert_eq!(e.line, Some(4), "{e}");
        assert!(e.message.contains("expected u32"), "{e}");
    }

    #[test]
    fn semantic_errors_name_field_and_line() {
        let e = parse(&GOOD.replace("parallelism = 2", "parallelism = 0")).unwrap_err();
        assert_eq!((e.line, e.field.as_deref()), (Some(4), Some("job.parallelism")), "{e}");
        let e = parse(&GOOD.replace("equals = \"paid\"", "equals = \"paid\"\nexists = true")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("transform[0]"), "{e}");
        assert_eq!(e.line, Some(16), "{e}");
        assert!(e.message.contains("exactly one of"), "{e}");
        let e = parse(&GOOD.replace(
            "[checkpoints]\ndir = \"/tmp/x\"\ninterval = \"1s\"\ntimeout = \"30s\"\n",
            "",
        ))
        .unwrap_err();
        assert!(e.message.contains("need checkpoints"), "{e}");
        let e = parse(&GOOD.replace("timeout = \"30s\"", "timeout = \"2h\"")).unwrap_err();
        assert_eq!(
            e.field.as_deref(),
            Some("sink.kafka.delivery.transaction_timeout"),
            "{e}"
        );
        let e = parse(&GOOD.replace("[sink.kafka]", "[sink.mysql]\nurl = \"x\"\n[sink.kafka]")).unwrap_err();
        assert_eq!(e.line, Some(25), "{e}");
        assert!(e.message.contains("missing field `table`"), "{e}");
        let head = GOOD.split("[sink.kafka]").next().unwrap();
        let e = parse(&format!("{head}[sink]\n")).unwrap_err();
        assert!(
            e.to_string()
                .contains("no sink: add a [sink.kafka], [sink.mysql] or [sink.postgres]"),
            "{e}"
        );
    }

    #[test]
    fn a_postgres_sink_parses_and_is_checked() {
        let head = GOOD.split("[sink.kafka]").next().unwrap();
        let pg = format!(
            r#"{head}[sink.postgres]
url = "postgres://app:${{PG_TEST_UNSET_OK:-x}}@127.0.0.1:5432/shop"
table = "orders"
mode = "two_phase"
job_id = "orders"
columns = [{{ name = "id", type = "bigint" }}]
"#
        )
        .replace("${PG_TEST_UNSET_OK:-x}", "pw");
        let job = parse(&pg).unwrap();
        assert_eq!(job.sinks[0].name, "postgres-sink");
        assert_eq!(job.sinks[0].describe(), "postgres table orders");
        let e = parse(&pg.replace("mode = \"two_phase\"", "mode = \"upsert\"")).unwrap_err();
        assert!(e.message.contains("needs key columns"), "{e}");
        assert_eq!(e.field.as_deref(), Some("sink.postgres"), "{e}");
        let e = parse(&pg.replace(
            "[checkpoints]\ndir = \"/tmp/x\"\ninterval = \"1s\"\ntimeout = \"30s\"\n",
            "",
        ))
        .unwrap_err();
        assert!(e.message.contains("commits on checkpoints"), "{e}");
        let kafka = GOOD.split("[sink.kafka]").nth(1).unwrap();
        let e = parse(&format!("{pg}[sink.kafka]{kafka}")).unwrap_err();
        assert!(e.message.contains("one kind per sink"), "{e}");
    }

    #[test]
    fn several_sinks_parse_with_their_names_and_transforms_and_are_checked() {
        let head = GOOD.split("[sink.kafka]").next().unwrap();
        let two = format!(
            r#"{head}[[sink]]
name = "paid"

[[sink.transform]]
type = "filter"
field = "status"
equals = "paid"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = {{ type = "exactly_once", transactional_id_prefix = "a" }}

[[sink]]
name = "table"

[sink.mysql]
url = "mysql://u:p@127.0.0.1:13306/d"
table = "t"
mode = "xa"
job_id = "j"
mapping = {{ format = {{ type = "json" }}, columns = [{{ name = "id", type = "bigint", key = true }}] }}
"#
        );
        let job = parse(&two).unwrap();
        let names: Vec<_> = job.sinks.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["paid", "table"]);
        assert_eq!(job.sinks[0].transforms.len(), 1);
        assert!(matches!(job.sinks[1].kind, SinkKind::Mysql(_)));
        assert!(job.needs_json());

        // Two sinks with one name; two Kafka sinks with one transactional id prefix.
        let e = parse(&two.replace("name = \"table\"", "name = \"paid\"")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("sink[1].name"), "{e}");
        assert_eq!(e.line, Some(line(&two, "name = \"table\"")), "{e}");
        let kafka_tail = two.split("[[sink]]").nth(1).unwrap();
        let twice = format!(
            "{head}[[sink]]{kafka_tail}[[sink]]{}",
            kafka_tail.replace("\"paid\"", "\"paid2\"")
        );
        let e = parse(&twice).unwrap_err();
        assert!(e.message.contains("needs its own"), "{e}");
        assert_eq!(
            e.field.as_deref(),
            Some("sink[1].kafka.delivery.transactional_id_prefix"),
            "{e}"
        );
        // A bad name; a sink's own transform; an entry without a kind; errors inside an entry
        // keep their line.
        let e = parse(&two.replace("name = \"table\"", "name = \"a table\"")).unwrap_err();
        assert!(e.message.contains("letters, digits"), "{e}");
        let e = parse(&two.replace("equals = \"paid\"\n\n[sink.kafka]", "\n[sink.kafka]")).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("sink[0].transform[0]"), "{e}");
        let e = parse(&two.replace("[sink.mysql]", "[sink.mysqll]")).unwrap_err();
        assert!(e.message.contains("unknown field `mysqll`"), "{e}");
        assert_eq!(e.line, Some(line(&two, "[sink.mysql]")), "{e}");
        let e = parse(&two.replace("table = \"t\"\n", "")).unwrap_err();
        assert!(e.message.contains("missing field `table`"), "{e}");
        assert!(e.line.is_some(), "{e}");
    }

    /// The 1-based line of the first line of `src` that contains `needle`.
    fn line(src: &str, needle: &str) -> usize {
        src.lines().position(|l| l.contains(needle)).unwrap() + 1
    }

    #[test]
    fn secrets_are_masked_but_references_and_files_shown() {
        let src = "[job]\nadmin_token = \"abc\"\nadmin_token_file = \"/run/t\"\n[kafka]\nsasl.password = \"hunter2\"\n\
                   ssl.key.password = \"${KEY_PASS}\"\n[sink.mysql]\nurl = \"mysql://app:s3cret@db:3306/x\"\n\
                   other = \"mysql://app:${P}@db/x\"\nname = \"orders\"\nsasl = { username = \"u\", password = \"pw9\" }\n";
        let m = masked(src);
        assert!(
            !m.contains("abc") && !m.contains("hunter2") && !m.contains("s3cret") && !m.contains("pw9"),
            "{m}"
        );
        assert!(m.contains("admin_token = \"***\"\n"), "{m}");
        assert!(m.contains("mysql://app:***@db:3306/x"), "{m}");
        assert!(
            m.contains("${KEY_PASS}") && m.contains("app:${P}@db") && m.contains("/run/t"),
            "{m}"
        );
        assert!(m.contains("name = \"orders\""), "{m}");
        assert_eq!(m.lines().count(), src.lines().count());
    }

    #[test]
    fn transforms_filter_project_rename_and_key() {
        let mut v = json!({"id": 7, "status": "paid", "customer": {"id": "c1"}, "note": "x"});
        let mut key = None;
        let t = [
            Transform::Filter {
                field: "status".into(),
                equals: Some(json!("paid")),
                not_equals: None,
                one_of: None,
                exists: None,
            },
            Transform::Key {
                field: "customer.id".into(),
            },
            Transform::Project {
                fields: vec!["id".into(), "customer".into()],
            },
            Transform::Rename {
                from: "customer".into(),
                to: "buyer".into(),
            },
        ];
        assert!(t.iter().all(|t| t.apply(&mut v, &mut key)));
        assert_eq!(v, json!({"id": 7, "buyer": {"id": "c1"}}));
        assert_eq!(key.as_deref(), Some(&b"c1"[..]));
        let mut other = json!({"status": "open"});
        assert!(!t[0].apply(&mut other, &mut key));
        let one_of = Transform::Filter {
            field: "n".into(),
            equals: None,
            not_equals: None,
            one_of: Some(vec![json!(1), json!(2)]),
            exists: None,
        };
        assert!(one_of.apply(&mut json!({"n": 2}), &mut key));
        assert!(!one_of.apply(&mut json!({"n": 3}), &mut key));
        assert!(!one_of.apply(&mut json!({}), &mut key));
    }
}
