use uuid::Uuid;

/// A name no other test uses: `{prefix}-{random}`, valid as a topic, group, transactional id,
/// MySQL table name or XA gtrid (letters, digits, `-` are mapped to `_` by callers that need it).
pub fn unique(prefix: &str) -> String {
    let id = Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &id[..12])
}
