//! The wire client's errors (below both the connections and the OAUTHBEARER token requests).

/// An error of a wire connection: what failed and where.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// TCP or TLS transport.
    #[error("{addr}: {what}")]
    Transport {
        /// The broker.
        addr: String,
        /// What failed.
        what: String,
    },
    /// The broker refused the credentials, or the mechanism.
    #[error("{addr}: SASL authentication failed: {what}")]
    Authentication {
        /// The broker.
        addr: String,
        /// The broker's message.
        what: String,
    },
    /// The broker's certificate is not trusted (or the broker refused ours).
    #[error("{addr}: TLS: {what}")]
    Certificate {
        /// The broker.
        addr: String,
        /// What rustls said.
        what: String,
    },
    /// The security settings cannot be used (a file that does not parse, an unknown key type).
    #[error("kafka security settings: {0}")]
    Config(String),
    /// A request or response did not encode or decode.
    #[error("{addr}: {what}")]
    Protocol {
        /// The broker.
        addr: String,
        /// What failed.
        what: String,
    },
}

/// Whether the error is about credentials or certificates (a restart cannot fix it).
impl WireError {
    /// Wrong credentials, an untrusted certificate, unusable settings.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            WireError::Authentication { .. } | WireError::Certificate { .. } | WireError::Config(_)
        )
    }
}
