//! Kerberos for the wire client's SASL/GSSAPI: tickets obtained from the keytab as librdkafka
//! obtains them (MIT Kerberos' `kinit`, into the process's credential cache), and the SASL GSSAPI
//! exchange of RFC 4752 on the system's GSS-API library (the `libgssapi` crate), which asks the KDC
//! for the broker's service ticket.
//!
//! Not `rsasl`'s GSSAPI client: it asks for every context flag, credential delegation included,
//! so each connection first asked the KDC for a forwardable ticket-granting ticket to hand to the
//! broker (refused by this realm, ≈35 refused requests a second in the KDC's log while a job ran;
//! in a realm whose tickets are forwardable it would have given every broker the job's TGT).
//! Kafka's own clients and librdkafka (Cyrus SASL) delegate nothing; neither does this one.
//!
//! # Design notes
//!
//! Why this part is built as it is, with the measurements and failures that shaped it.
//!
//! GSSAPI: librdkafka's clients get `sasl.kerberos.*` (Cyrus SASL, rdkafka's `gssapi` feature; its
//! kinit command with the keytab, or none — `min.time.before.relogin = 0` — without one); the wire
//! client runs `kinit -k -t` itself (`kerberos::ensure_tickets`, at most once a minute per keytab
//! and principal in the process, one kinit at a time) and then `kerberos::Gssapi`, RFC 4752 on
//! `libgssapi` (the system's MIT Kerberos; the service principal `service@host` of the address it
//! connected to; mutual authentication, no security layer, no credential delegation — rsasl's
//! GSSAPI client asks for delegation, which sent the KDC two refused requests per connection and
//! would hand a forwardable TGT to every broker), its blocking calls inside `block_in_place`. A
//! kinit that fails (its failure stands 10 s) is logged and the cached tickets tried — librdkafka's
//! clients go on the same way, so a KDC outage shorter than the tickets' lifetime stops nothing;
//! only when no context can be established is it an error naming both: a `Transport` error when no
//! KDC answered (retried), an `Authentication` error otherwise (a refused key, no tickets: the job
//! stops). Both kinds of client read and write the process's credential cache (`KRB5CCNAME`, else
//! the OS user's default): every `exactly` command whose Kafka clients have a keytab (a job file's,
//! a `--kafka-config` file's), without `KRB5CCNAME`, sets one of the process's own before any
//! thread starts (`cli/src/credential_cache.rs`, a private temporary directory dropped at exit;
//! `main` reads those files once, then), and the job file check refuses Kafka clients of one job
//! naming different principals (one cache, one principal).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[cfg(feature = "kerberos")]
use libgssapi::context::{ClientCtx, CtxFlags, SecurityContext};
#[cfg(feature = "kerberos")]
use libgssapi::credential::{Cred, CredUsage};
#[cfg(feature = "kerberos")]
use libgssapi::name::Name;
#[cfg(feature = "kerberos")]
use libgssapi::oid::{OidSet, GSS_MECH_KRB5, GSS_NT_HOSTBASED_SERVICE};

use crate::KafkaSecurity;

/// How long tickets obtained from a keytab are taken as fresh: librdkafka's default
/// `sasl.kerberos.min.time.before.relogin`.
const RELOGIN: Duration = Duration::from_secs(60);
/// How long `kinit` may take (it asks the KDC once).
const KINIT_TIMEOUT: Duration = Duration::from_secs(30);

/// After a `kinit` that failed, how long its failure stands before `kinit` runs again (a KDC that
/// does not answer is not asked again by every connection meanwhile).
const RETRY_FAILED: Duration = Duration::from_secs(10);

/// A `kinit` that did not obtain tickets.
#[derive(Debug, Clone)]
pub(crate) struct KinitFailure {
    /// The command and what it said.
    pub(crate) message: String,
    /// No KDC answered (or `kinit` did not finish): worth retrying, unlike a refused key.
    pub(crate) unreachable: bool,
}

/// The last `kinit` for a keytab and principal in this process: when, and how it failed.
type Attempts = HashMap<(PathBuf, String), (Instant, Option<KinitFailure>)>;

/// Held while `kinit` runs: the connections that need tickets at the same moment (every
/// subtask's sink at start) wait for one `kinit` instead of each rewriting the credential cache
/// while the others read it.
static ATTEMPTS: tokio::sync::Mutex<Option<Attempts>> = tokio::sync::Mutex::const_new(None);

/// Whether a GSS-API or kinit message says that no KDC answered (MIT Kerberos' wording).
pub(crate) fn kdc_unreachable(message: &str) -> bool {
    message.contains("Cannot contact any KDC") || message.contains("Cannot resolve network address for KDC")
}

/// With `sasl.kerberos.keytab`, runs `kinit -k -t KEYTAB PRINCIPAL` unless it succeeded in the
/// last minute (or failed in the last 10 s: that failure again); without a keytab, the tickets in
/// the credential cache are used as they are. A failure names the command and repeats what
/// `kinit` said (a key the KDC refuses, an unknown principal, an unreachable KDC); tickets
/// obtained earlier may still be in the cache, so the caller may go on with them.
pub(crate) async fn ensure_tickets(security: &KafkaSecurity) -> Result<(), KinitFailure> {
    let Some((keytab, principal)) = security.kerberos_keytab() else {
        return Ok(());
    };
    let key = (keytab.to_path_buf(), principal.to_owned());
    let mut attempts = ATTEMPTS.lock().await;
    match attempts.as_ref().and_then(|m| m.get(&key)) {
        Some((at, None)) if at.elapsed() < RELOGIN => return Ok(()),
        Some((at, Some(failure))) if at.elapsed() < RETRY_FAILED => return Err(failure.clone()),
        _ => {}
    }
    let result = kinit(keytab, principal).await;
    attempts
        .get_or_insert_with(HashMap::new)
        .insert(key, (Instant::now(), result.clone().err()));
    result
}

/// `kinit -k -t KEYTAB PRINCIPAL`.
async fn kinit(keytab: &std::path::Path, principal: &str) -> Result<(), KinitFailure> {
    let command = format!("kinit -k -t {} {principal}", keytab.display());
    let failed = |message: String, unreachable: bool| Err(KinitFailure { message, unreachable });
    let run = tokio::process::Command::new("kinit")
        .arg("-k")
        .arg("-t")
        .arg(keytab)
        .arg(principal)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = match tokio::time::timeout(KINIT_TIMEOUT, run).await {
        Err(_) => {
            return failed(
                format!("`{command}` did not finish within {KINIT_TIMEOUT:?} (is the KDC reachable?)"),
                true,
            )
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return failed(
                format!("`{command}`: kinit was not found; install MIT Kerberos' client tools (Debian: krb5-user)"),
                false,
            )
        }
        Ok(Err(e)) => return failed(format!("`{command}`: {e}"), false),
        Ok(Ok(out)) => out,
    };
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        let said = said.trim();
        return failed(
            format!("`{command}` failed ({}): {said}", out.status),
            kdc_unreachable(said),
        );
    }
    Ok(())
}

/// What a build without the `kerberos` feature says of `sasl.mechanism = "GSSAPI"`.
pub(crate) const LEFT_OUT: &str = "sasl.mechanism GSSAPI (Kerberos) is left out of this build of exactly: \
build it with the `kerberos` feature (cargo build --release -p exactly-cli --features kerberos; \
it needs libsasl2-dev, libkrb5-dev and libclang)";

/// Without the `kerberos` feature: no context can be made (the settings check refuses GSSAPI
/// before a client is made, [`LEFT_OUT`]).
#[cfg(not(feature = "kerberos"))]
pub(crate) struct Gssapi;

#[cfg(not(feature = "kerberos"))]
impl Gssapi {
    pub(crate) fn new(_service: &str, _host: &str) -> Result<Self, String> {
        Err(LEFT_OUT.into())
    }

    pub(crate) fn step(&mut self, _challenge: Option<&[u8]>) -> Result<(Vec<u8>, bool), String> {
        Err(LEFT_OUT.into())
    }
}

/// The client side of SASL GSSAPI (RFC 4752) for one connection.
#[cfg(feature = "kerberos")]
pub(crate) struct Gssapi {
    ctx: ClientCtx,
    established: bool,
}

#[cfg(feature = "kerberos")]
impl Gssapi {
    /// A context for the service principal `service@host` (`service/host@REALM`, as librdkafka
    /// names it), with the credentials of the cache (`$KRB5CCNAME` or Kerberos' default).
    pub(crate) fn new(service: &str, host: &str) -> Result<Self, String> {
        let gss = |what: &str, e: libgssapi::error::Error| format!("{what}: {e}");
        let target = Name::new(format!("{service}@{host}").as_bytes(), Some(&GSS_NT_HOSTBASED_SERVICE))
            .map_err(|e| gss("the broker's service name", e))?;
        let mut krb5 = OidSet::new().map_err(|e| gss("GSS-API", e))?;
        krb5.add(&GSS_MECH_KRB5).map_err(|e| gss("GSS-API", e))?;
        let cred = Cred::acquire(None, None, CredUsage::Initiate, Some(&krb5))
            .map_err(|e| gss("the Kerberos credentials", e))?;
        // Mutual authentication (the broker proves its identity too); no delegation.
        let flags = CtxFlags::GSS_C_MUTUAL_FLAG
            | CtxFlags::GSS_C_SEQUENCE_FLAG
            | CtxFlags::GSS_C_REPLAY_FLAG
            | CtxFlags::GSS_C_INTEG_FLAG
            | CtxFlags::GSS_C_CONF_FLAG;
        Ok(Gssapi {
            ctx: ClientCtx::new(Some(cred), target, flags, Some(&GSS_MECH_KRB5)),
            established: false,
        })
    }

    /// What to send after `challenge` (the broker's last message; none at first), and whether
    /// that message ends the exchange. While the security context is being established these are
    /// its tokens (an empty message once it is, for the broker's security-layer offer); then the
    /// answer to that offer: no security layer (Kafka protects connections with TLS, not SASL).
    pub(crate) fn step(&mut self, challenge: Option<&[u8]>) -> Result<(Vec<u8>, bool), String> {
        if !self.established {
            let token = self
                .ctx
                .step(challenge.filter(|c| !c.is_empty()), None)
                .map_err(|e| format!("establishing the security context: {e}"))?;
            self.established = self.ctx.is_complete();
            return Ok((token.map(|t| t.to_vec()).unwrap_or_default(), false));
        }
        let offer = self
            .ctx
            .unwrap(challenge.unwrap_or_default())
            .map_err(|e| format!("the broker's security-layer offer: {e}"))?;
        if offer.len() != 4 {
            return Err(format!(
                "the broker's security-layer offer has {} bytes, not 4",
                offer.len()
            ));
        }
        const NO_SECURITY_LAYER: u8 = 1;
        if offer[0] & NO_SECURITY_LAYER == 0 {
            return Err(format!(
                "the broker offers only SASL security layers (0x{:02x}); Kafka uses none",
                offer[0]
            ));
        }
        let answer = self
            .ctx
            .wrap(false, &[NO_SECURITY_LAYER, 0, 0, 0])
            .map_err(|e| format!("answering the security-layer offer: {e}"))?;
        Ok((answer.to_vec(), true))
    }
}
