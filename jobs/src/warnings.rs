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
        out.extend(cleartext_brokers(self));
        out.extend(cleartext_admin(self));
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

/// Kafka clients that reach brokers beyond this machine without TLS: records, and any SASL
/// exchange, travel unencrypted (Kafka's default `PLAINTEXT` included).
fn cleartext_brokers(job: &Job) -> Vec<String> {
    let source = std::iter::once((
        "source",
        job.file.source.bootstrap_servers.as_str(),
        &job.file.source.security,
    ));
    let sinks = job.sinks.iter().filter_map(|s| match &s.kind {
        SinkKind::Kafka(k) => Some((s.field.as_str(), k.bootstrap_servers.as_str(), &k.security)),
        _ => None,
    });
    let mut out: Vec<String> = Vec::new();
    for (at, bootstrap, security) in source.chain(sinks) {
        let protocol = security.protocol();
        if protocol.tls() {
            continue;
        }
        if let Some(remote) = bootstrap
            .split(',')
            .map(str::trim)
            .find(|a| !a.is_empty() && !exactly_core::net::address_is_loopback(a))
        {
            let w = format!(
                "security.protocol = {:?}: records travel unencrypted to brokers beyond this machine ({remote}); set SSL or SASL_SSL in [kafka]",
                protocol.name()
            );
            if !out.iter().any(|o| o.ends_with(&w)) {
                out.push(format!("{at}: {w}"));
            }
        }
    }
    out
}

/// An admin endpoint beyond this machine with a token and without TLS: the token travels in
/// cleartext.
fn cleartext_admin(job: &Job) -> Option<String> {
    let j = &job.file.job;
    let address = j.admin.as_deref()?;
    let token = j.admin_token.is_some() || j.admin_token_file.is_some();
    (token && j.admin_tls_cert.is_none() && !exactly_core::net::address_is_loopback(address)).then(|| {
        format!(
            "job.admin = {address:?} without admin_tls_cert: the admin token travels in cleartext beyond this machine; set admin_tls_cert and admin_tls_key"
        )
    })
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
