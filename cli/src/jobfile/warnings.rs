//! What a valid job file leaves weaker than the defaults, one sentence each: said by
//! `exactly check` and logged when the job starts.

use exactly_kafka_sink::DeliveryGuarantee;

use super::{Job, SinkKind};

impl Job {
    /// The warnings of this job file (none for one that keeps every default check).
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for (at, security) in self.kafka_securities() {
            for w in security.warnings() {
                // [kafka] reaches every client: said once.
                if !out.iter().any(|o| o.ends_with(&w)) {
                    out.push(format!("{at}: {w}"));
                }
            }
        }
        out.extend(nested_prefixes(self));
        for s in &self.sinks {
            let weak = match &s.kind {
                SinkKind::Mysql(m) => exactly_mysql_sink::tls_warning(&m.url),
                SinkKind::Postgres(p) => exactly_postgres_sink::tls_warning(&p.url),
                SinkKind::Kafka(_) => None,
            };
            out.extend(weak.map(|w| format!("{}: {w}", s.field)));
        }
        out
    }
}

/// Transactional-id prefixes of the job's Kafka sinks of which one begins with another and a
/// dash (`orders` and `orders-eu`): the ACL on `orders-` (prefixed) that the first needs also
/// grants the second's ids, so a job given the first's ACLs may fence and abort the second's
/// transactions.
fn nested_prefixes(job: &Job) -> Vec<String> {
    let prefixes: Vec<(&str, &str)> = job
        .sinks
        .iter()
        .filter_map(|s| match &s.kind {
            SinkKind::Kafka(k) => match &k.delivery {
                DeliveryGuarantee::ExactlyOnce {
                    transactional_id_prefix,
                    ..
                } => Some((s.field.as_str(), transactional_id_prefix.as_str())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for (at, outer) in &prefixes {
        for (other, inner) in &prefixes {
            if inner.starts_with(&format!("{outer}-")) {
                out.push(format!(
                    "{at}: transactional_id_prefix {outer:?} begins {other}'s {inner:?}: the ACL on {:?} (prefixed) that {at} needs also grants {other}'s transactional ids; choose prefixes of which none begins with another followed by '-'",
                    format!("{outer}-")
                ));
            }
        }
    }
    out
}
