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

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use libgssapi::context::{ClientCtx, CtxFlags, SecurityContext};
use libgssapi::credential::{Cred, CredUsage};
use libgssapi::name::Name;
use libgssapi::oid::{OidSet, GSS_MECH_KRB5, GSS_NT_HOSTBASED_SERVICE};

use crate::KafkaSecurity;

/// How long tickets obtained from a keytab are taken as fresh: librdkafka's default
/// `sasl.kerberos.min.time.before.relogin`.
const RELOGIN: Duration = Duration::from_secs(60);
/// How long `kinit` may take (it asks the KDC once).
const KINIT_TIMEOUT: Duration = Duration::from_secs(30);

/// When `kinit` last succeeded for a keytab and principal in this process. Held while `kinit`
/// runs: the connections that need tickets at the same moment (every subtask's sink at start)
/// wait for one `kinit` instead of each rewriting the credential cache while the others read it.
static OBTAINED: tokio::sync::Mutex<Option<HashMap<(PathBuf, String), Instant>>> = tokio::sync::Mutex::const_new(None);

/// With `sasl.kerberos.keytab`, runs `kinit -k -t KEYTAB PRINCIPAL` unless it succeeded in the
/// last minute; without a keytab, the tickets in the credential cache are used as they are. The
/// error names the command and repeats what `kinit` said (a key the KDC refuses, an unknown
/// principal, an unreachable KDC).
pub(crate) async fn ensure_tickets(security: &KafkaSecurity) -> Result<(), String> {
    let Some((keytab, principal)) = security.kerberos_keytab() else {
        return Ok(());
    };
    let key = (keytab.to_path_buf(), principal.to_owned());
    let mut obtained = OBTAINED.lock().await;
    if obtained
        .as_ref()
        .and_then(|m| m.get(&key))
        .is_some_and(|at| at.elapsed() < RELOGIN)
    {
        return Ok(());
    }
    let command = format!("kinit -k -t {} {principal}", keytab.display());
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
            return Err(format!(
                "`{command}` did not finish within {KINIT_TIMEOUT:?} (is the KDC reachable?)"
            ))
        }
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "`{command}`: kinit was not found; install MIT Kerberos' client tools (Debian: krb5-user)"
            ))
        }
        Ok(Err(e)) => return Err(format!("`{command}`: {e}")),
        Ok(Ok(out)) => out,
    };
    if !out.status.success() {
        let said = String::from_utf8_lossy(&out.stderr);
        return Err(format!("`{command}` failed ({}): {}", out.status, said.trim()));
    }
    obtained.get_or_insert_with(HashMap::new).insert(key, Instant::now());
    Ok(())
}

/// The client side of SASL GSSAPI (RFC 4752) for one connection.
pub(crate) struct Gssapi {
    ctx: ClientCtx,
    established: bool,
}

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
