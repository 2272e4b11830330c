//! How a database error is classified for the runtime.

use exactly_core::ErrorClass;

/// A connection the server refused or lost, or none within the pool's timeout: what a server
/// that is down or restarting answers.
pub fn unreachable(e: &sqlx::Error) -> bool {
    match e {
        // Refused, reset, timed out: not a name that does not resolve (a configuration).
        // (A server that closes the connection mid-handshake: restarting.)
        sqlx::Error::Io(io) => {
            exactly_core::error::unreachable_kind(io.kind()) || io.kind() == std::io::ErrorKind::UnexpectedEof
        }
        sqlx::Error::PoolTimedOut => true,
        _ => false,
    }
}

/// The class of a sink's database error: fatal when a restart cannot cure it (`permanent`, the
/// sink's judgement of its server's codes), retriable when the server cannot be reached now (an
/// outage, for a job that ran before), else a restart.
pub fn class(e: &sqlx::Error, permanent: impl Fn(&sqlx::Error) -> bool) -> ErrorClass {
    if permanent(e) {
        ErrorClass::Fatal
    } else if unreachable(e) {
        ErrorClass::Retriable
    } else {
        ErrorClass::Restart
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Error, ErrorKind};

    /// A server that refuses, resets or does not answer is down (waited for by a job that ran
    /// before); a name that does not resolve is a configuration to fix.
    #[test]
    fn a_server_down_is_told_from_a_wrong_address() {
        for kind in [
            ErrorKind::ConnectionRefused,
            ErrorKind::ConnectionReset,
            ErrorKind::TimedOut,
            ErrorKind::UnexpectedEof,
        ] {
            assert!(unreachable(&sqlx::Error::Io(Error::from(kind))), "{kind:?}");
        }
        assert!(unreachable(&sqlx::Error::PoolTimedOut));
        assert!(!unreachable(&sqlx::Error::Io(Error::other(
            "failed to lookup address information"
        ))));
        assert!(!unreachable(&sqlx::Error::RowNotFound));
    }

    /// A permanent error stops the job even when it came with a lost connection; an outage is
    /// waited for; anything else restarts.
    #[test]
    fn permanent_beats_unreachable_which_beats_restart() {
        let refused = sqlx::Error::Io(Error::from(ErrorKind::ConnectionRefused));
        assert_eq!(class(&refused, |_| true), ErrorClass::Fatal);
        assert_eq!(class(&refused, |_| false), ErrorClass::Retriable);
        assert_eq!(class(&sqlx::Error::RowNotFound, |_| false), ErrorClass::Restart);
    }
}
