//! Kerberos for the wire client's SASL/GSSAPI: tickets obtained from the keytab as librdkafka
//! obtains them (MIT Kerberos' `kinit`, into the process's credential cache), and the broker's
//! service principal handed to the `rsasl` crate's GSSAPI mechanism (which asks the system's
//! GSS-API library, and so the KDC, for the service ticket).

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use rsasl::callback::{Context, Request, SessionCallback, SessionData};
use rsasl::mechanisms::gssapi::properties::GssService;
use rsasl::prelude::SessionError;
use rsasl::property::Hostname;

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

/// The properties rsasl's GSSAPI client asks for: the brokers' service name and the host this
/// connection reached (the service principal is `service/host@REALM`, as librdkafka builds it).
pub(crate) struct Target {
    pub(crate) service: String,
    pub(crate) host: String,
}

impl SessionCallback for Target {
    fn callback(&self, _: &SessionData, _: &Context, request: &mut Request<'_>) -> Result<(), SessionError> {
        request
            .satisfy::<GssService>(&self.service)?
            .satisfy::<Hostname>(&self.host)?;
        Ok(())
    }
}
