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

impl KafkaRecord {
    /// The bytes this record occupies, heap included (the topic name is shared, so not counted):
    /// what the alignment buffer's byte limit weighs it at.
    pub fn size(&self) -> usize {
        let bytes = |b: &Option<Vec<u8>>| b.as_ref().map_or(0, Vec::len);
        std::mem::size_of::<Self>()
            + bytes(&self.key)
            + bytes(&self.value)
            + self
                .headers
                .iter()
                .map(|(name, value)| std::mem::size_of::<(String, Option<Vec<u8>>)>() + name.len() + bytes(value))
                .sum::<usize>()
    }
}

/// Turns a [`KafkaRecord`] into `T`; an error sends the record to the poison policy.
pub trait Deserializer<T>: Send + Sync + 'static {
    /// Converts one record.
    fn deserialize(&self, record: KafkaRecord) -> Result<T, BoxError>;
    /// The bytes a converted record occupies, heap included, for the alignment buffer's byte
    /// limit (`max_alignment_buffer_bytes`). The default counts `size_of::<T>()` only; a `T`
    /// that owns heap data should say what it weighs.
    fn record_size(record: &T) -> usize
    where
        Self: Sized,
    {
        std::mem::size_of_val(record)
    }
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

    fn record_size(record: &KafkaRecord) -> usize {
        record.size()
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

    fn record_size(record: &String) -> usize {
        std::mem::size_of::<String>() + record.len()
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

    fn record_size(record: &serde_json::Value) -> usize {
        json_size(record)
    }
}

/// A JSON value's bytes, heap included (an estimate: the strings, and one `Value` per node).
fn json_size(value: &serde_json::Value) -> usize {
    use serde_json::Value;
    std::mem::size_of::<Value>()
        + match value {
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(json_size).sum(),
            Value::Object(fields) => fields.iter().map(|(k, v)| k.len() + json_size(v)).sum(),
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
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

    #[test]
    fn a_records_alignment_weight_counts_its_bytes() {
        let mut big = rec(&[1; 100_000]);
        big.key = Some(vec![2; 1_000]);
        big.headers = vec![("trace".into(), Some(vec![3; 500]))];
        let weight =
            <crate::KafkaSource<KafkaRecord, RawBytes> as exactly_core::runtime::Source<KafkaRecord>>::record_size(
                &big,
            );
        assert!(weight >= 101_505, "{weight}");
        assert!(weight < 102_000, "{weight}");
        let text = "x".repeat(50_000);
        let weight = <crate::KafkaSource<String, Utf8> as exactly_core::runtime::Source<String>>::record_size(&text);
        assert!(weight >= 50_000, "{weight}");
        let doc = serde_json::json!({ "payload": "y".repeat(30_000), "list": ["z".repeat(10_000)] });
        let weight =
            <crate::KafkaSource<serde_json::Value, Json> as exactly_core::runtime::Source<_>>::record_size(&doc);
        assert!(weight >= 40_000, "{weight}");
    }
}
