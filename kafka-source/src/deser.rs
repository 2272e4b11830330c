//! Turning Kafka records into the job's records.

use exactly_core::BoxError;

/// A record as read from Kafka.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    /// Topic (shared by the records of a partition).
    pub topic: std::sync::Arc<str>,
    /// Partition.
    pub partition: i32,
    /// Offset.
    pub offset: i64,
    /// Timestamp (ms since the Unix epoch), if the record has one.
    pub timestamp: Option<i64>,
    /// Key bytes.
    pub key: Option<Vec<u8>>,
    /// Value bytes.
    pub value: Option<Vec<u8>>,
    /// Headers, in order.
    pub headers: Vec<(String, Option<Vec<u8>>)>,
}

/// Turns a [`KafkaRecord`] into `T`; an error sends the record to the poison policy.
pub trait Deserializer<T>: Send + Sync + 'static {
    /// Converts one record.
    fn deserialize(&self, record: KafkaRecord) -> Result<T, BoxError>;
}

impl<T, F> Deserializer<T> for F
where
    F: Fn(KafkaRecord) -> Result<T, BoxError> + Send + Sync + 'static,
{
    fn deserialize(&self, record: KafkaRecord) -> Result<T, BoxError> {
        self(record)
    }
}

/// The record as it is (key, value, headers and coordinates).
#[derive(Debug, Clone, Copy, Default)]
pub struct RawBytes;

impl Deserializer<KafkaRecord> for RawBytes {
    fn deserialize(&self, record: KafkaRecord) -> Result<KafkaRecord, BoxError> {
        Ok(record)
    }
}

/// The value as UTF-8 text (an absent value is an error).
#[derive(Debug, Clone, Copy, Default)]
pub struct Utf8;

impl Deserializer<String> for Utf8 {
    fn deserialize(&self, record: KafkaRecord) -> Result<String, BoxError> {
        let value = record.value.ok_or("record has no value")?;
        Ok(String::from_utf8(value)?)
    }
}

/// The value as JSON.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Deserializer<serde_json::Value> for Json {
    fn deserialize(&self, record: KafkaRecord) -> Result<serde_json::Value, BoxError> {
        let value = record.value.ok_or("record has no value")?;
        Ok(serde_json::from_slice(&value)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(value: &[u8]) -> KafkaRecord {
        KafkaRecord {
            topic: "t".into(),
            partition: 0,
            offset: 1,
            timestamp: None,
            key: None,
            value: Some(value.to_vec()),
            headers: vec![],
        }
    }

    #[test]
    fn built_in_deserializers() {
        assert_eq!(Utf8.deserialize(rec(b"hi")).unwrap(), "hi");
        assert!(Utf8.deserialize(rec(&[0xff])).is_err());
        assert_eq!(Json.deserialize(rec(br#"{"a":1}"#)).unwrap()["a"], 1);
        assert!(Json.deserialize(rec(b"{")).is_err());
        let custom = |r: KafkaRecord| -> Result<usize, BoxError> { Ok(r.value.map_or(0, |v| v.len())) };
        assert_eq!(custom.deserialize(rec(b"abc")).unwrap(), 3);
    }
}
