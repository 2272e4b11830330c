//! Settings the SQL sinks read the same way.

use std::collections::BTreeMap;

use serde::Deserialize;

/// Rows per statement unless the job says otherwise.
pub fn default_batch_size() -> usize {
    500
}

/// The progress table's name unless the job says otherwise (the summary table is
/// `<name>_through`).
pub fn default_progress_table() -> String {
    "exactly_progress".into()
}

/// A database URL whose `${NAME}` parts are read from the environment (see
/// `exactly_core::secret`): `mysql://app:${MYSQL_PASSWORD}@db/shop`.
pub fn expand_url<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<String, D::Error> {
    let text = String::deserialize(d)?;
    exactly_core::secret::expand_env(&text).map_err(serde::de::Error::custom)
}

/// Notes that the record at `offset` of `topic`'s `partition` was written: the progress row
/// keeps, per `topic:partition`, the offset after the newest record written.
pub fn note_offset(offsets: &mut BTreeMap<String, i64>, topic: &str, partition: i32, offset: i64) {
    let next = offsets.entry(format!("{topic}:{partition}")).or_insert(offset + 1);
    *next = (*next).max(offset + 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offset_after_the_newest_record_per_partition_is_kept() {
        let mut offsets = BTreeMap::new();
        for (partition, offset) in [(0, 5), (1, 2), (0, 7), (0, 6)] {
            note_offset(&mut offsets, "in", partition, offset);
        }
        assert_eq!(
            offsets,
            BTreeMap::from([("in:0".to_string(), 8), ("in:1".to_string(), 3)])
        );
    }

    #[derive(Deserialize)]
    struct Url {
        #[serde(deserialize_with = "expand_url")]
        url: String,
    }

    #[test]
    fn a_url_takes_its_secret_from_the_environment_and_an_unset_one_is_refused() {
        std::env::set_var("EXACTLY_SQL_SINK_TEST_PASSWORD", "s3cret");
        let u: Url =
            serde_json::from_str(r#"{"url": "mysql://app:${EXACTLY_SQL_SINK_TEST_PASSWORD}@db/shop"}"#).unwrap();
        assert_eq!(u.url, "mysql://app:s3cret@db/shop");
        let unset = serde_json::from_str::<Url>(r#"{"url": "mysql://app:${EXACTLY_SQL_SINK_TEST_UNSET}@db/shop"}"#);
        assert!(unset.is_err());
    }
}
