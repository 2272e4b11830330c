//! Transactional ids: `{prefix}-{subtask}-{slot}`, a small pool reused for the life of the job,
//! so the broker does not accumulate ids (each costs memory for `transactional.id.expiration.ms`).

/// The id of `slot` of `subtask`.
pub fn transactional_id(prefix: &str, subtask: u32, slot: usize) -> String {
    format!("{prefix}-{subtask}-{slot}")
}

/// `(subtask, slot)` of an id this prefix owns, or `None` for any other id.
pub fn parse(prefix: &str, id: &str) -> Option<(u32, usize)> {
    let rest = id.strip_prefix(prefix)?.strip_prefix('-')?;
    let (subtask, slot) = rest.split_once('-')?;
    Some((subtask.parse().ok()?, slot.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_foreign_ids() {
        assert_eq!(parse("job", &transactional_id("job", 3, 1)), Some((3, 1)));
        assert_eq!(parse("job", "job-x-1"), None);
        assert_eq!(parse("job", "jobs-1-1"), None);
        assert_eq!(parse("job-1", "job-1-2-0"), Some((2, 0)));
    }
}
