//! Logs on stderr: text (default), JSON on request; on a terminal, log lines clear the progress
//! line before they are written, and the progress line is redrawn in place.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

static PROGRESS: AtomicBool = AtomicBool::new(false);

/// Log format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

struct ClearingStderr;

struct ClearingWriter {
    cleared: bool,
}

impl Write for ClearingWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut err = std::io::stderr().lock();
        if !self.cleared && PROGRESS.load(Ordering::Relaxed) {
            err.write_all(b"\r\x1b[2K")?;
            self.cleared = true;
        }
        err.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for ClearingStderr {
    type Writer = ClearingWriter;
    fn make_writer(&'a self) -> ClearingWriter {
        ClearingWriter { cleared: false }
    }
}

/// Whether stderr is a terminal.
pub fn stderr_is_terminal() -> bool {
    std::io::stderr().is_terminal()
}

/// The default filter: `info` for exactly (a target matches by prefix, so `exactly` takes in
/// every `exactly_*` crate), `warn` else — but sqlx's URL parser, which logs an unknown
/// PostgreSQL URL parameter with its value (`?sslpassword=…` would be printed), only at `error`.
pub const DEFAULT_FILTER: &str = "warn,sqlx_postgres::options=error,exactly=info";

/// Installs the subscriber (level from `RUST_LOG`, else [`DEFAULT_FILTER`]).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(ClearingStderr)
        .with_ansi(stderr_is_terminal());
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// Draws `line` as the progress line (terminal only).
pub fn progress_line(line: &str) {
    PROGRESS.store(true, Ordering::Relaxed);
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the log shows while a PostgreSQL URL with an unknown parameter is parsed.
    fn logged_parsing(filter: &str) -> String {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(filter))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            exactly_postgres_sink::tls_warning("postgres://u@db.example.com/d?sslpassword=hunter2-secret");
        });
        let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
        text
    }

    #[test]
    fn an_unknown_url_parameter_is_not_logged_with_its_value() {
        assert!(
            logged_parsing("warn").contains("hunter2-secret"),
            "sqlx logs it at warn (what the default filter must hide)"
        );
        assert!(!logged_parsing(DEFAULT_FILTER).contains("hunter2-secret"));
    }

    /// Every crate of the workspace logs at `info` by default, the others at `warn`.
    #[test]
    fn the_default_filter_shows_every_exactly_crate_at_info_and_others_from_warn() {
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(EnvFilter::new(DEFAULT_FILTER))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::info!(target: "exactly_core::runtime", "core-info");
            tracing::info!(target: "exactly_jobs::warnings", "jobs-info");
            tracing::info!(target: "exactly_verify::read", "verify-info");
            tracing::info!(target: "exactly_bench::soak", "bench-info");
            tracing::info!(target: "exactly_cli::run", "cli-info");
            tracing::info!(target: "exactly", "binary-info");
            tracing::debug!(target: "exactly_core::runtime", "core-debug");
            tracing::info!(target: "rdkafka::client", "other-info");
            tracing::warn!(target: "rdkafka::client", "other-warn");
        });
        let text = String::from_utf8_lossy(&out.0.lock().unwrap()).into_owned();
        for shown in ["core", "jobs", "verify", "bench", "cli", "binary"] {
            assert!(text.contains(&format!("{shown}-info")), "{shown} at info: {text}");
        }
        assert!(text.contains("other-warn"), "{text}");
        for hidden in ["core-debug", "other-info"] {
            assert!(!text.contains(hidden), "{hidden}: {text}");
        }
    }
}
