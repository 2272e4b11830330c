//! Kerberos tickets of a running job. librdkafka's clients and the wire client obtain tickets
//! from a keytab with `kinit`, which writes them into the credential cache of the process's
//! environment (`KRB5CCNAME`, else the OS user's default, e.g. `/tmp/krb5cc_UID`), and the
//! GSS-API library reads them from there. Two jobs of one OS user sharing that cache would
//! replace each other's tickets every minute — another principal's, or a cache half rewritten
//! while the other reads it — and a job would replace the operator's own. Kafka's Java clients
//! keep a keytab's tickets in memory; the nearest here is a cache of the process's own. The
//! short commands (`verify`, `txn`, `datagen`, `bench`) as well: one run with a keytab would
//! replace the operator's tickets, or a job's sharing the default cache.

use exactly_kafka_client::KafkaSecurity;

/// A credential cache of this process's own: a file in a directory only this OS user can read,
/// both removed when this is dropped (a SIGKILLed job leaves them in the temporary directory, as
/// `kinit` leaves the default cache).
#[derive(Debug)]
pub struct OwnCredentialCache {
    dir: tempfile::TempDir,
}

impl OwnCredentialCache {
    /// The cache's name, as `KRB5CCNAME` holds it.
    pub fn name(&self) -> String {
        format!("FILE:{}", self.dir.path().join("krb5cc").display())
    }
}

/// When some of the process's Kafka clients (their `security`: a job's source and Kafka sinks, a
/// command's `--kafka-config`) obtain Kerberos tickets from a keytab and `KRB5CCNAME` is not set
/// (an operator who sets it chooses the cache): makes a credential cache of this process's own
/// and sets `KRB5CCNAME` to it, which librdkafka's `kinit`, the wire client's and the GSS-API
/// library then use. Clients without a keytab use the tickets the operator obtained, in the cache
/// they are in.
///
/// Call it before the process starts another thread: it changes the process's environment.
pub fn own_credential_cache<'a>(
    security: impl IntoIterator<Item = &'a KafkaSecurity>,
) -> std::io::Result<Option<OwnCredentialCache>> {
    let keytab = security.into_iter().any(|s| s.kerberos_keytab().is_some());
    if std::env::var_os("KRB5CCNAME").is_some() || !keytab {
        return Ok(None);
    }
    let cache = OwnCredentialCache {
        dir: tempfile::Builder::new()
            .prefix("exactly-krb5cc-")
            .tempdir_in(std::env::temp_dir())?,
    };
    // kinit makes the cache itself readable by its owner only; the directory as well.
    std::fs::set_permissions(cache.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700))?;
    std::env::set_var("KRB5CCNAME", cache.name());
    Ok(Some(cache))
}
