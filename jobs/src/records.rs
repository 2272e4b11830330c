//! What each sink takes, made from a record as read from Kafka: one mapping per sink, shared by
//! `exactly run` and the benchmarks (which measure the same pipeline a job file builds).

use exactly_kafka_sink::ProducerRecord;
use exactly_kafka_source::KafkaRecord;
use exactly_mysql_sink::{Origin, SinkRecord};
use exactly_postgres_sink::{PgOrigin, PgRecord};

/// For the Kafka sink: key, value, timestamp and headers carried over (the partition is the
/// sink's partitioner's to choose).
pub fn to_kafka(r: KafkaRecord) -> ProducerRecord {
    ProducerRecord {
        key: r.key,
        value: r.value,
        timestamp: r.timestamp,
        headers: r.headers,
    }
}

/// For the MySQL sink: no value is a tombstone; the coordinates name the record in errors and
/// dead letters.
pub fn to_mysql(r: KafkaRecord) -> SinkRecord {
    SinkRecord {
        tombstone: r.value.is_none(),
        payload: r.value.unwrap_or_default(),
        key: r.key,
        origin: Some(Origin {
            topic: r.topic.to_string(),
            partition: r.partition,
            offset: r.offset,
        }),
    }
}

/// For the PostgreSQL sink, as for MySQL's.
pub fn to_postgres(r: KafkaRecord) -> PgRecord {
    PgRecord {
        tombstone: r.value.is_none(),
        payload: r.value.unwrap_or_default(),
        key: r.key,
        origin: Some(PgOrigin {
            topic: r.topic.to_string(),
            partition: r.partition,
            offset: r.offset,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(value: Option<&str>) -> KafkaRecord {
        KafkaRecord {
            topic: "orders".into(),
            partition: 2,
            offset: 41,
            timestamp: Some(1_700_000_000_000),
            key: Some(b"k1".to_vec()),
            value: value.map(|v| v.as_bytes().to_vec()),
            headers: vec![("h".into(), Some(b"v".to_vec()))],
        }
    }

    #[test]
    fn every_sink_gets_the_key_the_value_and_where_the_record_came_from() {
        let k = to_kafka(record(Some("{}")));
        assert_eq!(
            (k.key, k.value, k.timestamp, k.headers),
            (
                Some(b"k1".to_vec()),
                Some(b"{}".to_vec()),
                Some(1_700_000_000_000),
                vec![("h".into(), Some(b"v".to_vec()))]
            )
        );
        let m = to_mysql(record(Some("{}")));
        assert_eq!(
            (m.payload, m.key, m.tombstone),
            (b"{}".to_vec(), Some(b"k1".to_vec()), false)
        );
        assert_eq!(
            m.origin,
            Some(Origin {
                topic: "orders".into(),
                partition: 2,
                offset: 41
            })
        );
        let p = to_postgres(record(Some("{}")));
        assert_eq!(
            (p.payload, p.key, p.tombstone),
            (b"{}".to_vec(), Some(b"k1".to_vec()), false)
        );
        assert_eq!(
            p.origin,
            Some(PgOrigin {
                topic: "orders".into(),
                partition: 2,
                offset: 41
            })
        );
    }

    #[test]
    fn no_value_is_a_tombstone_that_keeps_its_key() {
        let k = to_kafka(record(None));
        assert_eq!((k.key, k.value), (Some(b"k1".to_vec()), None));
        let m = to_mysql(record(None));
        assert_eq!((m.payload, m.key, m.tombstone), (vec![], Some(b"k1".to_vec()), true));
        let p = to_postgres(record(None));
        assert_eq!((p.payload, p.key, p.tombstone), (vec![], Some(b"k1".to_vec()), true));
    }
}
