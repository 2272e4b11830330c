use super::*;

fn record(key: &str, value: Option<&str>) -> KafkaRecord {
    KafkaRecord {
        topic: Arc::from("orders"),
        partition: 0,
        offset: 7,
        timestamp: None,
        key: Some(key.as_bytes().to_vec()),
        value: value.map(|v| v.as_bytes().to_vec()),
        headers: Vec::new(),
    }
}

/// In a Debezium topic a tombstone is a deletion of its key (compaction may have removed the
/// delete before it), its key unwrapped as a delete's is; a delete event becomes one too.
#[test]
fn a_debezium_tombstone_or_delete_is_a_deletion_of_the_unwrapped_key() {
    let prepare = Prepare {
        transforms: Arc::new(vec![Transform::Debezium]),
        json: true,
        registry: Registry::new("t", 1, "all".into()),
    };
    let wrapped = r#"{"schema":{"type":"struct"},"payload":{"id":7}}"#;
    for value in [None, Some(r#"{"before":{"id":7},"after":null,"op":"d"}"#)] {
        let t = prepare
            .deserialize(record(wrapped, value))
            .unwrap()
            .expect("kept: a deletion");
        assert_eq!(
            (t.key.as_deref(), t.value.as_deref()),
            (Some(&br#"{"id":7}"#[..]), None),
            "{value:?}"
        );
    }
    let row = prepare
        .deserialize(record(wrapped, Some(r#"{"after":{"id":7,"n":1},"op":"u"}"#)))
        .unwrap()
        .expect("a row");
    assert_eq!(row.value.as_deref(), Some(&br#"{"id":7,"n":1}"#[..]));
    // A truncate cannot be applied row by row: the poison policy decides.
    assert!(prepare.deserialize(record(wrapped, Some(r#"{"op":"t"}"#))).is_err());
}

#[test]
fn a_tombstone_passes_the_transforms_as_a_tombstone_with_its_key() {
    let prepare = Prepare {
        transforms: Arc::new(vec![
            Transform::Filter {
                field: "status".into(),
                equals: Some(serde_json::json!("paid")),
                not_equals: None,
                one_of: None,
                exists: None,
            },
            Transform::Key {
                field: "customer".into(),
            },
        ]),
        json: true,
        registry: Registry::new("t", 1, "all".into()),
    };
    let t = prepare
        .deserialize(record("42", None))
        .unwrap()
        .expect("not filtered out");
    assert_eq!((t.key.as_deref(), t.value.as_deref()), (Some(&b"42"[..]), None));
    // A record with a value still meets the transforms.
    let paid = prepare
        .deserialize(record("1", Some(r#"{"status":"paid","customer":"c9"}"#)))
        .unwrap()
        .expect("paid");
    assert_eq!(paid.key.as_deref(), Some(&b"c9"[..]));
    assert!(prepare
        .deserialize(record("2", Some(r#"{"status":"open"}"#)))
        .unwrap()
        .is_none());
}
