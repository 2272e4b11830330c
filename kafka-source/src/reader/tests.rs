use super::start::answer;
use super::*;

#[test]
fn a_records_partition_is_found_whether_the_hint_is_right_or_not() {
    let now = Instant::now();
    let positions: Vec<Position> = ["a", "b"]
        .iter()
        .flat_map(|t| (0..3).map(move |p| (t, p)))
        .map(|(t, p)| Position {
            tp: TopicPartition {
                topic: (*t).to_owned(),
                partition: p,
            },
            topic: Arc::from(*t),
            next: 0,
            clock: PartitionClock::new(now),
        })
        .collect();
    let mut hint = 0;
    // A run of one partition, then another, then back: each found where it is.
    for (topic, partition, at) in [
        ("a", 0, 0),
        ("a", 0, 0),
        ("b", 2, 5),
        ("b", 2, 5),
        ("a", 1, 1),
        ("b", 0, 3),
    ] {
        assert_eq!(
            find_position(&positions, topic.as_bytes(), partition, &mut hint),
            Some(at),
            "{topic}/{partition}"
        );
        assert_eq!(hint, at);
    }
    // The same partition number of another topic is not the hinted one.
    assert_eq!(find_position(&positions, b"a", 0, &mut hint), Some(0));
    // Not owned: none, and the hint stays.
    assert_eq!(find_position(&positions, b"c", 0, &mut hint), None);
    assert_eq!(find_position(&positions, b"a", 7, &mut hint), None);
    assert_eq!(hint, 0);
    // A hint beyond the end (partitions given up) is only a miss.
    let mut beyond = 99;
    assert_eq!(find_position(&positions, b"b", 1, &mut beyond), Some(4));
}

#[test]
fn the_jobs_client_properties_win_over_the_defaults_and_the_owned_keys_over_both() {
    let mut config = KafkaSourceConfig::new("127.0.0.1:1", vec!["t".into()], "g");
    let c = consumer_config(&config).unwrap();
    for (k, v) in CLIENT_DEFAULTS {
        assert_eq!(c.get(k), Some(*v), "{k}");
    }
    config.client.insert("queued.min.messages".into(), "100000".into());
    config.client.insert("fetch.queue.backoff.ms".into(), "1000".into());
    // Validation refuses owned keys in `client`; were one to get through, it would lose.
    config.client.insert("group.id".into(), "other".into());
    config
        .client
        .insert("isolation.level".into(), "read_uncommitted".into());
    let c = consumer_config(&config).unwrap();
    assert_eq!(c.get("queued.min.messages"), Some("100000"));
    assert_eq!(c.get("fetch.queue.backoff.ms"), Some("1000"));
    assert_eq!(c.get("statistics.interval.ms"), Some("5000"));
    assert_eq!(c.get("group.id"), Some("g"));
    assert_eq!(c.get("isolation.level"), Some("read_committed"));
}

#[test]
#[allow(unsafe_code)]
fn a_failed_lookup_is_an_error_not_a_missing_offset() {
    let tp = TopicPartition {
        topic: "t".into(),
        partition: 0,
    };
    // No answer for the partition.
    let empty = TopicPartitionList::new();
    assert!(matches!(answer(&empty, &tp, "x"), Err(SourceError::Kafka { .. })));
    // An offset, and "none" (the broker found no record at or after a timestamp).
    let mut list = TopicPartitionList::new();
    list.add_partition_offset("t", 0, Offset::Offset(5)).unwrap();
    assert_eq!(answer(&list, &tp, "x").unwrap(), Offset::Offset(5));
    list.set_partition_offset("t", 0, Offset::End).unwrap();
    assert_eq!(answer(&list, &tp, "x").unwrap(), Offset::End);
    // The partition's own error: retried by a restart, or fatal without authorization.
    let set_err = |list: &mut TopicPartitionList, err: rdkafka::bindings::rd_kafka_resp_err_t| {
        // SAFETY: the list owns one element, which this test changes in place.
        unsafe { (*(*list.ptr()).elems).err = err };
    };
    set_err(
        &mut list,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
    );
    let e = answer(&list, &tp, "the offset for the start timestamp").unwrap_err();
    assert!(matches!(e, SourceError::Kafka { .. }), "{e}");
    assert!(
        e.to_string().contains("the offset for the start timestamp of t/0"),
        "{e}"
    );
    set_err(
        &mut list,
        rdkafka::bindings::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED,
    );
    assert!(matches!(answer(&list, &tp, "x"), Err(SourceError::Fetch { .. })));
}
