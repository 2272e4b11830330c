//! Checkpoint files in an object store — S3 and S3-compatible servers, Google Cloud Storage, Azure
//! Blob Storage — through the `object_store` crate, chosen by the location's URL (`s3://bucket/prefix`,
//! `gs://…`, `az://…`, `abfs://…`). Credentials and endpoints come from the environment the
//! way each store's own tools read them (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
//! `AWS_REGION`, `AWS_ENDPOINT`, `AWS_ALLOW_HTTP`, `GOOGLE_APPLICATION_CREDENTIALS`,
//! `AZURE_STORAGE_ACCOUNT_NAME`, …), never from the job file. An S3 endpoint whose certificate a
//! private CA signed is trusted through `AWS_CA_BUNDLE` (a PEM file, as the AWS CLI reads it);
//! otherwise the system's trust store decides.
//!
//! Metadata is created with a conditional put (`If-None-Match: *` on S3, which AWS S3 and
//! SeaweedFS honour; generation and ETag preconditions on GCS and Azure), so a second writer of
//! the same checkpoint id fails instead of replacing it. A store that does not implement
//! conditional puts (an S3-compatible server configured with `AWS_CONDITIONAL_PUT=disabled`)
//! gets a check for the key before the write, with a warning: two jobs misconfigured onto the
//! same prefix could then both write one checkpoint's metadata in the window between the two, and
//! a metadata write whose answer was lost, landing late, could replace the void marker a restart
//! put in its place (`unfinished.rs`).
//!
//! Calls block the calling thread (storage calls run on blocking threads), driven by a small
//! runtime of their own so they work from any thread.

use std::future::Future;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path as Key;
use object_store::{BackoffConfig, ObjectStore, PutMode, PutOptions, PutPayload, RetryConfig};
use tracing::warn;

use super::blobs::{Blobs, Put, Sum, Summing};
use crate::error::{CoreError, Result};

/// URL schemes that name an object store.
const SCHEMES: [&str; 5] = ["s3", "s3a", "gs", "az", "abfs"];

/// The error for a location whose store this build leaves out (an optional feature): such a
/// location is still recognised as an object store, never taken for a local path.
#[cfg(any(not(feature = "gcs"), not(feature = "azure")))]
fn left_out(scheme: &str, store: &str, feature: &str) -> String {
    format!(
        "{scheme}:// is {store}, which this build of exactly leaves out: build it with the \
         `{feature}` feature (cargo build --release -p exactly-cli --features {feature})"
    )
}

/// Refuses an object store location whose store this build leaves out, naming the feature (a
/// job file's check calls it: the job would fail at its start).
pub fn check_scheme(location: &str) -> std::result::Result<(), String> {
    let scheme = location.split_once("://").map_or("", |(s, _)| s);
    match scheme {
        #[cfg(not(feature = "gcs"))]
        "gs" => Err(left_out("gs", "Google Cloud Storage", "gcs")),
        #[cfg(not(feature = "azure"))]
        "az" | "abfs" => Err(left_out(scheme, "Azure Blob Storage", "azure")),
        _ => Ok(()),
    }
}

/// Whether `location` is an object store URL rather than a local path.
pub(crate) fn is_url(location: &Path) -> bool {
    location
        .to_str()
        .and_then(|s| s.split_once("://"))
        .is_some_and(|(scheme, _)| SCHEMES.contains(&scheme))
}

/// Whether `key` names one of the location's small control records (the owner's claim, the notes
/// of explicit restores), read with the quick client. Checkpoint metadata is not one: it holds
/// operator state inline, of any size.
fn control_record(key: &str) -> bool {
    matches!(key.rsplit('/').next(), Some(name) if matches!(name, "_owner" | "_restore" | "_restored_from") || name.starts_with("_owner-beat-"))
}

/// How long a request for a small object (a control record, a listing, a deletion) may take
/// before it is given up (and retried): a store that stops answering mid-request — restarting,
/// or cut off — must not hold a checkpoint for the client's default of 30 s, which the job would
/// then spend behind the store's return.
const QUICK_TIMEOUT: &str = "3s";
/// How long connecting may take, for every request.
const CONNECT_TIMEOUT: &str = "2s";
/// Writes up to this size go through the quick client.
const QUICK_PUT_BYTES: usize = 1 << 20;
/// A file larger than this is uploaded in parts of this size (S3's smallest part is 5 MiB).
const PART: usize = 8 << 20;

/// A prefix of a bucket (or container).
pub(crate) struct Bucket {
    /// For data files (their size unknown, up to a RocksDB file's).
    store: Arc<dyn ObjectStore>,
    /// For small objects: control records ([`control_record`]), listings, deletions, small writes.
    quick: Arc<dyn ObjectStore>,
    /// The URL of the prefix, without a trailing slash.
    url: String,
    prefix: String,
    /// Cleared once the store answers a conditional put with "not implemented".
    conditional: AtomicBool,
}

impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket").field("url", &self.url).finish()
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("exactly-object-store")
            .enable_all()
            .build()
            .expect("starting the object store runtime")
    })
}

/// Runs `f` on the object store runtime and waits for it, from any thread.
fn block<F>(f: F) -> F::Output
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    runtime().spawn(async move {
        let _ = tx.send(f.await);
    });
    rx.recv().expect("the object store runtime runs every task it is given")
}

/// `AmazonS3Builder::from_env`, trusting the CA certificates of `AWS_CA_BUNDLE` as well.
fn s3_builder_from_env() -> std::result::Result<object_store::aws::AmazonS3Builder, String> {
    let mut b = object_store::aws::AmazonS3Builder::new();
    if let Some(bundle) = std::env::var_os("AWS_CA_BUNDLE").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(bundle);
        let pem = std::fs::read(&path).map_err(|e| format!("AWS_CA_BUNDLE {}: {e}", path.display()))?;
        let certs = object_store::Certificate::from_pem_bundle(&pem)
            .map_err(|e| format!("AWS_CA_BUNDLE {}: {e}", path.display()))?;
        if certs.is_empty() {
            return Err(format!(
                "AWS_CA_BUNDLE {}: no certificate in it (expected PEM)",
                path.display()
            ));
        }
        let options = certs
            .into_iter()
            .fold(object_store::ClientOptions::new(), |o, c| o.with_root_certificate(c));
        b = b.with_client_options(options);
    }
    // As `from_env` does; the client's settings among them (`AWS_ALLOW_HTTP`, …) are added to the
    // options above instead of replacing them.
    for (key, value) in std::env::vars_os() {
        if let (Some(key), Some(value)) = (key.to_str(), value.to_str()) {
            if let Some(refused) = insecure_setting(key, value) {
                return Err(refused);
            }
            if key.starts_with("AWS_") {
                if let Ok(k) = key.to_ascii_lowercase().parse() {
                    b = b.with_config(k, value);
                }
            }
        }
    }
    Ok(b)
}

/// Why an environment setting of the object store client is refused: one that turns off the
/// check of the store's certificate (checkpoints read from a store that anyone on the path can
/// pose as would restore their state). A private CA goes in `AWS_CA_BUNDLE`.
fn insecure_setting(key: &str, value: &str) -> Option<String> {
    let on = !matches!(value.trim().to_ascii_lowercase().as_str(), "" | "false" | "0" | "no");
    let switch = [
        "AWS_ALLOW_INVALID_CERTIFICATES",
        "GOOGLE_ALLOW_INVALID_CERTIFICATES",
        "AZURE_ALLOW_INVALID_CERTIFICATES",
    ]
    .contains(&key);
    (switch && on).then(|| {
        format!(
            "{key}={value} would turn off the check of the object store's certificate: refused; trust a private CA instead (AWS_CA_BUNDLE for S3)"
        )
    })
}

/// Retries of one request: a few, within 20 s, so that an outage fails the checkpoint (and the
/// job goes on) rather than hold it for the crate's default of 3 minutes.
fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 3,
        retry_timeout: Duration::from_secs(20),
    }
}

/// The kind of an object store error that carries its cause only as text (object_store's
/// `Generic`): `TimedOut` or `ConnectionRefused` for a store that cannot be reached (a refused or
/// reset connection, a timeout, a server error: an outage, waited for), `Other` for anything else
/// — a name that does not resolve, a certificate not trusted, a bucket or region that does not
/// exist, a request refused (a configuration to fix, never waited for).
fn unreachable_kind(e: &object_store::Error) -> std::io::ErrorKind {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    // The request's URL names the bucket and key, which may contain any word: left out.
    let text: String = text
        .split_whitespace()
        .filter(|w| !w.contains("://"))
        .collect::<Vec<_>>()
        .join(" ")
        .to_ascii_lowercase();
    // The status first: a response body may name the bucket or key, with any word in it.
    if [
        "status code: 408",
        "status code: 429",
        "status: 408",
        "status: 429",
        "status code: 5",
        "status: 5",
    ]
    .iter()
    .any(|m| text.contains(m))
    {
        return std::io::ErrorKind::TimedOut; // throttled, slow or failing: an outage
    }
    let misconfigured = [
        "dns error",
        "failed to lookup",
        "certificate",
        "invalid peer",
        "handshake",
        "nosuchbucket",
        "permanentredirect",
        "authorizationheadermalformed",
        "invalidaccesskeyid",
        "signaturedoesnotmatch",
        "credential",
        "status code: 4",
        "status: 4",
    ];
    if misconfigured.iter().any(|m| text.contains(m)) {
        return std::io::ErrorKind::Other;
    }
    let outage = [
        "connection refused",
        "connection reset",
        "connection closed",
        "broken pipe",
        "timed out",
        "error sending request",
        "service unavailable",
        "slowdown",
        "slow down",
        "internalerror",
    ];
    if text.contains("connection refused") {
        std::io::ErrorKind::ConnectionRefused
    } else if outage.iter().any(|m| text.contains(m)) {
        std::io::ErrorKind::TimedOut
    } else {
        std::io::ErrorKind::Other
    }
}

/// Retries of one small request: within 8 s (a request that does not answer is cut off after
/// [`QUICK_TIMEOUT`]); what still fails is tried again by the next checkpoint or start.
fn quick_retry() -> RetryConfig {
    RetryConfig {
        retry_timeout: Duration::from_secs(8),
        ..retry()
    }
}

impl Bucket {
    /// The store and prefix of `url`, configured from the environment.
    pub(crate) fn open(url: &str) -> Result<Bucket> {
        let url = url.trim_end_matches('/').to_owned();
        let config = |reason: String| CoreError::Config(format!("checkpoint location {url}: {reason}"));
        let (scheme, rest) = url.split_once("://").ok_or_else(|| config("not a URL".into()))?;
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(config("no bucket in the URL".into()));
        }
        use object_store::ClientConfigKey::{ConnectTimeout, Timeout};
        let built = |e: object_store::Error| config(e.to_string());
        // Whichever store: none of the providers' switches that turn off certificate checks.
        for (key, value) in std::env::vars() {
            if let Some(refused) = insecure_setting(&key, &value) {
                return Err(config(refused));
            }
        }
        // A store this build leaves out is refused naming its feature.
        check_scheme(&url).map_err(config)?;
        let (store, quick): (Arc<dyn ObjectStore>, Arc<dyn ObjectStore>) = match scheme {
            "s3" | "s3a" => {
                use object_store::aws::AmazonS3ConfigKey::Client;
                let mut b = s3_builder_from_env()
                    .map_err(config)?
                    .with_url(url.as_str())
                    .with_retry(retry())
                    .with_config(Client(ConnectTimeout), CONNECT_TIMEOUT);
                if std::env::var_os("AWS_CONDITIONAL_PUT").is_none() {
                    b = b.with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch);
                }
                let quick = b
                    .clone()
                    .with_retry(quick_retry())
                    .with_config(Client(Timeout), QUICK_TIMEOUT);
                (
                    Arc::new(b.build().map_err(built)?),
                    Arc::new(quick.build().map_err(built)?),
                )
            }
            #[cfg(feature = "gcs")]
            "gs" => {
                use object_store::gcp::GoogleConfigKey::Client;
                let b = object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_url(url.as_str())
                    .with_retry(retry())
                    .with_config(Client(ConnectTimeout), CONNECT_TIMEOUT);
                let quick = b
                    .clone()
                    .with_retry(quick_retry())
                    .with_config(Client(Timeout), QUICK_TIMEOUT);
                (
                    Arc::new(b.build().map_err(built)?),
                    Arc::new(quick.build().map_err(built)?),
                )
            }
            #[cfg(feature = "azure")]
            "az" | "abfs" => {
                use object_store::azure::AzureConfigKey::Client;
                let b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_url(url.as_str())
                    .with_retry(retry())
                    .with_config(Client(ConnectTimeout), CONNECT_TIMEOUT);
                let quick = b
                    .clone()
                    .with_retry(quick_retry())
                    .with_config(Client(Timeout), QUICK_TIMEOUT);
                (
                    Arc::new(b.build().map_err(built)?),
                    Arc::new(quick.build().map_err(built)?),
                )
            }
            other => {
                return Err(config(format!(
                    "unknown scheme {other}:// (expected one of {SCHEMES:?})"
                )))
            }
        };
        Ok(Bucket {
            store,
            quick,
            prefix: prefix.trim_matches('/').to_owned(),
            url,
            conditional: AtomicBool::new(true),
        })
    }

    fn key(&self, key: &str) -> Key {
        match (self.prefix.is_empty(), key.is_empty()) {
            (true, _) => Key::from(key),
            (false, true) => Key::from(self.prefix.as_str()),
            (false, false) => Key::from(format!("{}/{key}", self.prefix)),
        }
    }

    fn error(&self, action: &'static str, key: &str, e: object_store::Error) -> CoreError {
        let kind = match e {
            object_store::Error::NotFound { .. } => std::io::ErrorKind::NotFound,
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                std::io::ErrorKind::PermissionDenied
            }
            ref other => unreachable_kind(other),
        };
        CoreError::io(action, self.locate(key), std::io::Error::new(kind, e))
    }
}

impl Blobs for Bucket {
    fn locate(&self, key: &str) -> PathBuf {
        if key.is_empty() {
            PathBuf::from(&self.url)
        } else {
            PathBuf::from(format!("{}/{key}", self.url))
        }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let store = if control_record(key) { &self.quick } else { &self.store };
        let (store, k) = (store.clone(), self.key(key));
        block(async move { store.get(&k).await?.bytes().await })
            .map(|b| b.to_vec())
            .map_err(|e| self.error("reading", key, e))
    }

    fn size(&self, key: &str) -> Result<Option<u64>> {
        let (store, k) = (self.quick.clone(), self.key(key));
        match block(async move { store.head(&k).await }) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("reading", key, e)),
        }
    }

    fn put(&self, key: &str, bytes: &[u8], how: Put) -> Result<bool> {
        let payload = PutPayload::from(bytes.to_vec());
        let conditional = how == Put::Create && self.conditional.load(Ordering::Relaxed);
        if how == Put::Create && !conditional && self.size(key)?.is_some() {
            return Ok(false);
        }
        let mode = if conditional {
            PutMode::Create
        } else {
            PutMode::Overwrite
        };
        let store = if bytes.len() <= QUICK_PUT_BYTES {
            &self.quick
        } else {
            &self.store
        };
        let (store, k) = (store.clone(), self.key(key));
        let p = payload.clone();
        match block(async move { store.put_opts(&k, p, PutOptions::from(mode)).await }) {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. } | object_store::Error::Precondition { .. })
                if conditional =>
            {
                Ok(false)
            }
            Err(object_store::Error::NotImplemented) if conditional => {
                warn!(
                    location = %self.url,
                    "This object store does not implement conditional puts: checkpoint metadata is checked for, then written (two jobs on the same prefix could both write one checkpoint, and a metadata write whose answer was lost could land after a restart gave its checkpoint up)."
                );
                self.conditional.store(false, Ordering::Relaxed);
                self.put(key, bytes, how)
            }
            Err(e) => Err(self.error("writing", key, e)),
        }
    }

    fn put_file(&self, key: &str, src: &Path) -> Result<Sum> {
        let size = std::fs::metadata(src)
            .map_err(|e| CoreError::io("reading", src, e))?
            .len();
        if size <= PART as u64 {
            let bytes = std::fs::read(src).map_err(|e| CoreError::io("reading", src, e))?;
            self.put(key, &bytes, Put::Replace)?;
            return Ok(Sum::of(&bytes));
        }
        // A multipart upload, one part in flight: memory holds one part, whatever the file's
        // size. The object appears when the upload completes; a failed one is aborted.
        let mut file = std::fs::File::open(src).map_err(|e| CoreError::io("reading", src, e))?;
        let (store, k) = (self.store.clone(), self.key(key));
        let mut upload =
            block(async move { store.put_multipart(&k).await }).map_err(|e| self.error("writing", key, e))?;
        let mut sent = Summing::default();
        let parts = loop {
            let mut part = Vec::with_capacity(PART);
            match (&mut file).take(PART as u64).read_to_end(&mut part) {
                Ok(0) => break Ok(()),
                Ok(_) => sent.update(&part),
                Err(e) => break Err(CoreError::io("reading", src, e)),
            }
            if let Err(e) = block(upload.put_part(PutPayload::from(part))) {
                break Err(self.error("writing", key, e));
            }
        };
        let done = match parts {
            // A failed completion is aborted too (its parts would stay in the bucket otherwise);
            // one whose answer was lost finds the upload gone, and the object there.
            Ok(()) => block(async move {
                let completed = upload.complete().await.map(|_| ());
                if completed.is_err() {
                    let _ = upload.abort().await;
                }
                completed
            })
            .map_err(|e| self.error("writing", key, e)),
            Err(e) => {
                let _ = block(async move { upload.abort().await });
                Err(e)
            }
        };
        done.map(|()| sent.sum())
    }

    fn get_file(&self, key: &str, dest: &Path) -> Result<Sum> {
        use std::io::Write as _;
        // Streamed: what the store sends is written as it arrives.
        let (store, k) = (self.store.clone(), self.key(key));
        let mut stream = block(async move { store.get(&k).await.map(|got| got.into_stream()) })
            .map_err(|e| self.error("reading", key, e))?;
        let mut to = crate::private_fs::create_file(dest).map_err(|e| CoreError::io("creating", dest, e))?;
        let mut got = Summing::default();
        loop {
            let (rest, next) = block(async move {
                let next = stream.try_next().await;
                (stream, next)
            });
            stream = rest;
            match next.map_err(|e| self.error("reading", key, e))? {
                None => break,
                Some(chunk) => {
                    got.update(&chunk);
                    to.write_all(&chunk).map_err(|e| CoreError::io("writing", dest, e))?;
                }
            }
        }
        Ok(got.sum())
    }

    fn dirs(&self) -> Result<Vec<String>> {
        let (store, k) = (self.quick.clone(), self.key(""));
        let prefix = (!self.prefix.is_empty()).then_some(k);
        let listed = block(async move { store.list_with_delimiter(prefix.as_ref()).await })
            .map_err(|e| self.error("listing", "", e))?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_owned))
            .collect())
    }

    fn delete(&self, key: &str) -> Result<()> {
        let (store, k) = (self.quick.clone(), self.key(key));
        match block(async move { store.delete(&k).await }) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("removing", key, e)),
        }
    }

    fn delete_dir(&self, dir: &str) -> Result<()> {
        self.delete_under(dir, None)
    }

    fn delete_named(&self, dir: &str, prefix: &str) -> Result<()> {
        self.delete_under(dir, Some(prefix.to_owned()))
    }
}

impl Bucket {
    /// Deletes every key under `dir`, or (`named`) only the files directly under it whose names
    /// begin with that prefix; a key gone meanwhile is fine.
    fn delete_under(&self, dir: &str, named: Option<String>) -> Result<()> {
        let (store, k) = (self.quick.clone(), self.key(dir));
        block(async move {
            let keys: Vec<Key> = store
                .list(Some(&k))
                .try_filter(|m| {
                    let wanted = named.as_ref().is_none_or(|prefix| {
                        m.location.filename().is_some_and(|n| n.starts_with(prefix.as_str()))
                            && m.location
                                .prefix_match(&k)
                                .is_some_and(|mut rest| rest.nth(1).is_none())
                    });
                    futures::future::ready(wanted)
                })
                .map_ok(|m| m.location)
                .try_collect()
                .await?;
            for key in keys {
                match store.delete(&key).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        })
        .map_err(|e| self.error("removing", dir, e))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_setting_that_turns_off_the_certificate_check_is_refused() {
        for on in ["true", "TRUE", "1", "yes"] {
            let why = insecure_setting("AWS_ALLOW_INVALID_CERTIFICATES", on).unwrap();
            assert!(why.contains("AWS_CA_BUNDLE"), "{why}");
        }
        for off in ["false", "0", ""] {
            assert_eq!(insecure_setting("AWS_ALLOW_INVALID_CERTIFICATES", off), None);
        }
        assert!(insecure_setting("GOOGLE_ALLOW_INVALID_CERTIFICATES", "true").is_some());
        assert!(insecure_setting("AZURE_ALLOW_INVALID_CERTIFICATES", "1").is_some());
        assert_eq!(insecure_setting("AWS_ALLOW_HTTP", "true"), None);
    }

    use super::*;
    use std::io::ErrorKind;

    /// A store the build leaves out is still an object store location (never a local directory
    /// named `gs:`), refused naming the feature that brings it.
    #[test]
    fn a_store_left_out_of_the_build_is_refused_naming_its_feature() {
        for (url, feature, built) in [
            ("gs://bucket/prefix", "gcs", cfg!(feature = "gcs")),
            ("az://container/prefix", "azure", cfg!(feature = "azure")),
            ("abfs://container/prefix", "azure", cfg!(feature = "azure")),
        ] {
            assert!(is_url(Path::new(url)), "{url}");
            assert_eq!(check_scheme(url).is_err(), !built, "{url}");
            let said = Bucket::open(url).err().map(|e| e.to_string()).unwrap_or_default();
            assert_eq!(said.contains(&format!("`{feature}` feature")), !built, "{url}: {said}");
        }
    }

    fn generic(text: &str) -> object_store::Error {
        object_store::Error::Generic {
            store: "S3",
            source: text.to_owned().into(),
        }
    }

    /// What the store's client says, as seen against SeaweedFS and in object_store's messages:
    /// an outage is waited for, anything else is a configuration to fix.
    #[test]
    fn an_unreachable_store_is_told_from_a_misconfigured_one() {
        let retries = "Error performing PUT http://127.0.0.1:18333/b/k in 12.6s, after 3 retries, max_retries: 3, retry_timeout: 20s";
        for (text, kind) in [
            (format!("{retries} - HTTP error: error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)"), ErrorKind::ConnectionRefused),
            (format!("{retries} - HTTP error: error sending request"), ErrorKind::TimedOut),
            (format!("{retries} - HTTP error: operation timed out"), ErrorKind::TimedOut),
            (format!("{retries} - Server returned non-2xx status code: 503 Service Unavailable"), ErrorKind::TimedOut),
            (format!("{retries} - HTTP error: error sending request: client error (Connect): dns error: failed to lookup address information"), ErrorKind::Other),
            (format!("{retries} - HTTP error: error sending request: invalid peer certificate: UnknownIssuer"), ErrorKind::Other),
            (format!("{retries} - Server returned non-2xx status code: 404 Not Found: <Code>NoSuchBucket</Code>"), ErrorKind::Other),
            (format!("{retries} - Server returned non-2xx status code: 403 Forbidden"), ErrorKind::Other),
            (format!("{retries} - Server returned non-2xx status code: 429 Too Many Requests"), ErrorKind::TimedOut),
            (format!("{retries} - Server returned non-2xx status code: 503 Service Unavailable: <Key>certificate-store/x</Key>"), ErrorKind::TimedOut),
            ("Error performing GET http://s3/certificate-store/credentials/_owner in 3s - HTTP error: error sending request: Connection refused".to_owned(), ErrorKind::ConnectionRefused),
            ("Error getting credentials from the instance metadata service: operation timed out".to_owned(), ErrorKind::Other),
            ("something nobody foresaw".to_owned(), ErrorKind::Other),
        ] {
            assert_eq!(unreachable_kind(&generic(&text)), kind, "{text}");
        }
        assert!(control_record("prefix/_owner") && control_record("_restore"));
        assert!(!control_record("chk-3/_metadata") && !control_record("chk-3/_sessions-0.keyed"));
    }
}
