//! Job files: parsing, checks and their messages.

use super::*;
use serde_json::json;

fn parse(src: &str) -> Result<Job, JobFileError> {
    Job::parse(Path::new("job.toml"), src)
}

const GOOD: &str = r#"
[job]
name = "orders"
parallelism = 2

[checkpoints]
dir = "/tmp/x"
interval = "1s"
timeout = "30s"

[source]
bootstrap_servers = "127.0.0.1:19092"
topics = ["orders"]
group_id = "g"

[[transform]]
type = "filter"
field = "status"
equals = "paid"

[[transform]]
type = "key"
field = "customer.id"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = { type = "exactly_once", transactional_id_prefix = "orders" }
"#;

#[test]
fn a_good_file_parses() {
    let job = parse(GOOD).unwrap();
    assert_eq!(job.file.job.parallelism, 2);
    assert_eq!(job.file.transforms.len(), 2);
    assert!(matches!(job.sinks[0].kind, SinkKind::Kafka(_)));
    assert_eq!(
        job.sinks[0].name, "kafka-sink",
        "a job's only sink keeps the uid it always had"
    );
}

#[test]
fn when_caught_up_takes_a_flag_or_a_name_and_defaults_to_after_backlog() {
    use exactly_core::coordinator::WhenCaughtUp;
    let when = |line: &str| {
        parse(&GOOD.replace("timeout = \"30s\"", &format!("timeout = \"30s\"\n{line}")))
            .map(|j| j.file.checkpoints.expect("checkpoints").when_caught_up)
    };
    assert_eq!(when("").unwrap(), WhenCaughtUp::AfterBacklog);
    for (line, expected) in [
        ("when_caught_up = false", WhenCaughtUp::Never),
        ("when_caught_up = true", WhenCaughtUp::Always),
        ("when_caught_up = \"never\"", WhenCaughtUp::Never),
        ("when_caught_up = \"after-backlog\"", WhenCaughtUp::AfterBacklog),
        ("when_caught_up = \"always\"", WhenCaughtUp::Always),
    ] {
        assert_eq!(when(line).unwrap(), expected, "{line}");
    }
    let e = when("when_caught_up = \"backlog\"").unwrap_err();
    assert_eq!(e.line, Some(10), "{e}");
    assert!(e.message.contains(r#"false, "after-backlog" or true"#), "{e}");
}

#[test]
fn an_unknown_field_names_its_line() {
    let src = GOOD.replace("group_id = \"g\"", "group_id = \"g\"\ngroupid = \"h\"");
    let e = parse(&src).unwrap_err();
    assert_eq!(e.line, Some(15), "{e}");
    assert!(e.message.contains("unknown field `groupid`"), "{e}");
}

#[test]
fn a_wrong_type_names_its_line() {
    let e = parse(&GOOD.replace("parallelism = 2", "parallelism = \"two\"")).unwrap_err();
    assert_eq!(e.line, Some(4), "{e}");
    assert!(e.message.contains("expected u32"), "{e}");
}

#[test]
fn semantic_errors_name_field_and_line() {
    let e = parse(&GOOD.replace("parallelism = 2", "parallelism = 0")).unwrap_err();
    assert_eq!((e.line, e.field.as_deref()), (Some(4), Some("job.parallelism")), "{e}");
    let e = parse(&GOOD.replace("equals = \"paid\"", "equals = \"paid\"\nexists = true")).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("transform[0]"), "{e}");
    assert_eq!(e.line, Some(16), "{e}");
    assert!(e.message.contains("exactly one of"), "{e}");
    let e = parse(&GOOD.replace(
        "[checkpoints]\ndir = \"/tmp/x\"\ninterval = \"1s\"\ntimeout = \"30s\"\n",
        "",
    ))
    .unwrap_err();
    assert!(e.message.contains("need checkpoints"), "{e}");
    let e = parse(&GOOD.replace("timeout = \"30s\"", "timeout = \"2h\"")).unwrap_err();
    assert_eq!(
        e.field.as_deref(),
        Some("sink.kafka.delivery.transaction_timeout"),
        "{e}"
    );
    let e = parse(&GOOD.replace("[sink.kafka]", "[sink.mysql]\nurl = \"x\"\n[sink.kafka]")).unwrap_err();
    assert_eq!(e.line, Some(25), "{e}");
    assert!(e.message.contains("missing field `table`"), "{e}");
    let head = GOOD.split("[sink.kafka]").next().unwrap();
    let e = parse(&format!("{head}[sink]\n")).unwrap_err();
    assert!(
        e.to_string()
            .contains("no sink: add a [sink.kafka], [sink.mysql] or [sink.postgres]"),
        "{e}"
    );
}

#[test]
fn a_postgres_sink_parses_and_is_checked() {
    let head = GOOD.split("[sink.kafka]").next().unwrap();
    let pg = format!(
        r#"{head}[sink.postgres]
url = "postgres://app:${{PG_TEST_UNSET_OK:-x}}@127.0.0.1:5432/shop"
table = "orders"
mode = "two_phase"
job_id = "orders"
columns = [{{ name = "id", type = "bigint" }}]
"#
    )
    .replace("${PG_TEST_UNSET_OK:-x}", "pw");
    let job = parse(&pg).unwrap();
    assert_eq!(job.sinks[0].name, "postgres-sink");
    assert_eq!(job.sinks[0].describe(), "postgres table orders");
    let e = parse(&pg.replace("mode = \"two_phase\"", "mode = \"upsert\"")).unwrap_err();
    assert!(e.message.contains("needs key columns"), "{e}");
    assert_eq!(e.field.as_deref(), Some("sink.postgres"), "{e}");
    let e = parse(&pg.replace(
        "[checkpoints]\ndir = \"/tmp/x\"\ninterval = \"1s\"\ntimeout = \"30s\"\n",
        "",
    ))
    .unwrap_err();
    assert!(e.message.contains("commits on checkpoints"), "{e}");
    let kafka = GOOD.split("[sink.kafka]").nth(1).unwrap();
    let e = parse(&format!("{pg}[sink.kafka]{kafka}")).unwrap_err();
    assert!(e.message.contains("one kind per sink"), "{e}");
}

#[test]
fn several_sinks_parse_with_their_names_and_transforms_and_are_checked() {
    let head = GOOD.split("[sink.kafka]").next().unwrap();
    let two = format!(
        r#"{head}[[sink]]
name = "paid"

[[sink.transform]]
type = "filter"
field = "status"
equals = "paid"

[sink.kafka]
bootstrap_servers = "127.0.0.1:19092"
topic = "out"
delivery = {{ type = "exactly_once", transactional_id_prefix = "a" }}

[[sink]]
name = "table"

[sink.mysql]
url = "mysql://u:p@127.0.0.1:13306/d"
table = "t"
mode = "xa"
job_id = "j"
mapping = {{ format = {{ type = "json" }}, columns = [{{ name = "id", type = "bigint", key = true }}] }}
"#
    );
    let job = parse(&two).unwrap();
    let names: Vec<_> = job.sinks.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["paid", "table"]);
    assert_eq!(job.sinks[0].transforms.len(), 1);
    assert!(matches!(job.sinks[1].kind, SinkKind::Mysql(_)));
    assert!(job.needs_json());

    // Two sinks with one name; two Kafka sinks with one transactional id prefix.
    let e = parse(&two.replace("name = \"table\"", "name = \"paid\"")).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("sink[1].name"), "{e}");
    assert_eq!(e.line, Some(line(&two, "name = \"table\"")), "{e}");
    let kafka_tail = two.split("[[sink]]").nth(1).unwrap();
    let twice = format!(
        "{head}[[sink]]{kafka_tail}[[sink]]{}",
        kafka_tail.replace("\"paid\"", "\"paid2\"")
    );
    let e = parse(&twice).unwrap_err();
    assert!(e.message.contains("needs its own"), "{e}");
    assert_eq!(
        e.field.as_deref(),
        Some("sink[1].kafka.delivery.transactional_id_prefix"),
        "{e}"
    );
    // A bad name; a sink's own transform; an entry without a kind; errors inside an entry
    // keep their line.
    let e = parse(&two.replace("name = \"table\"", "name = \"a table\"")).unwrap_err();
    assert!(e.message.contains("letters, digits"), "{e}");
    let e = parse(&two.replace("equals = \"paid\"\n\n[sink.kafka]", "\n[sink.kafka]")).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("sink[0].transform[0]"), "{e}");
    let e = parse(&two.replace("[sink.mysql]", "[sink.mysqll]")).unwrap_err();
    assert!(e.message.contains("unknown field `mysqll`"), "{e}");
    assert_eq!(e.line, Some(line(&two, "[sink.mysql]")), "{e}");
    let e = parse(&two.replace("table = \"t\"\n", "")).unwrap_err();
    assert!(e.message.contains("missing field `table`"), "{e}");
    assert!(e.line.is_some(), "{e}");
}

#[test]
fn kafka_clients_of_one_job_must_use_one_kerberos_principal() {
    let gssapi = |principal: &str| {
        format!(
            "security.protocol = \"SASL_PLAINTEXT\"\nsasl.mechanism = \"GSSAPI\"\nsasl.kerberos.principal = \"{principal}\"\n"
        )
    };
    let with = |source: &str, sink: &str| {
        GOOD.replace(
            "group_id = \"g\"\n",
            &format!("group_id = \"g\"\n\n[source.security]\n{}", gssapi(source)),
        )
        .replace(
            "transactional_id_prefix = \"orders\" }\n",
            &format!(
                "transactional_id_prefix = \"orders\" }}\n\n[sink.kafka.security]\n{}",
                gssapi(sink)
            ),
        )
    };
    parse(&with("job@R", "job@R")).unwrap();
    let e = parse(&with("job@R", "other@R")).unwrap_err();
    assert_eq!(e.field.as_deref(), Some("sink.kafka.security"), "{e}");
    assert!(
        e.message.contains("\"job@R\"")
            && e.message.contains("\"other@R\"")
            && e.message.contains("one credential cache"),
        "{e}"
    );
}

/// The 1-based line of the first line of `src` that contains `needle`.
fn line(src: &str, needle: &str) -> usize {
    src.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn secrets_are_masked_but_references_and_files_shown() {
    let src = "[job]\nadmin_token = \"abc\"\nadmin_token_file = \"/run/t\"\n[kafka]\nsasl.password = \"hunter2\"\n\
               ssl.key.password = \"${KEY_PASS}\"\n[sink.mysql]\nurl = \"mysql://app:s3cret@db:3306/x\"\n\
               other = \"mysql://app:${P}@db/x\"\nname = \"orders\"\nsasl = { username = \"u\", password = \"pw9\" }\n\
               sasl.oauthbearer.client.secret = \"cl13nt\"\n\
               sasl.oauthbearer.token.endpoint.url = \"https://u:tok3n@idp.example/realms/k/token\"\n";
    let m = masked(src);
    assert!(
        !m.contains("abc")
            && !m.contains("hunter2")
            && !m.contains("s3cret")
            && !m.contains("pw9")
            && !m.contains("cl13nt")
            && !m.contains("tok3n"),
        "{m}"
    );
    assert!(m.contains("admin_token = \"***\"\n"), "{m}");
    assert!(m.contains("mysql://app:***@db:3306/x"), "{m}");
    assert!(
        m.contains("${KEY_PASS}") && m.contains("app:${P}@db") && m.contains("/run/t"),
        "{m}"
    );
    assert!(m.contains("name = \"orders\""), "{m}");
    // The token endpoint's address stays readable (only its userinfo is hidden).
    assert!(m.contains("https://u:***@idp.example/realms/k/token"), "{m}");
    assert_eq!(m.lines().count(), src.lines().count());
}

#[test]
fn multi_line_secrets_and_url_parameters_are_masked() {
    let src = "[sink.mysql]\npassword = \"\"\"\nhunter2\nand-more\n\"\"\"\nname = \"orders\"\n\
               sasl.password = '''\nl1ter4l\n'''\n\
               url = \"postgres://app@db/shop?sslmode=verify-full&password=s3cret&x=1\"\n\
               other = \"postgres://db/shop?password=${PG_PASSWORD}\"\n";
    let m = masked(src);
    for leaked in ["hunter2", "and-more", "l1ter4l", "s3cret"] {
        assert!(!m.contains(leaked), "{leaked} in:\n{m}");
    }
    assert!(m.contains("password = \"***\"\nname = \"orders\""), "{m}");
    assert!(m.contains("sslmode=verify-full&password=***&x=1"), "{m}");
    assert!(m.contains("password=${PG_PASSWORD}"), "{m}");
}

#[test]
fn transforms_filter_project_rename_and_key() {
    let mut v = json!({"id": 7, "status": "paid", "customer": {"id": "c1"}, "note": "x"});
    let mut key = None;
    let t = [
        Transform::Filter {
            field: "status".into(),
            equals: Some(json!("paid")),
            not_equals: None,
            one_of: None,
            exists: None,
        },
        Transform::Key {
            field: "customer.id".into(),
        },
        Transform::Project {
            fields: vec!["id".into(), "customer".into()],
        },
        Transform::Rename {
            from: "customer".into(),
            to: "buyer".into(),
        },
    ];
    assert!(t.iter().all(|t| t.keeps(&mut v, &mut key)));
    assert_eq!(v, json!({"id": 7, "buyer": {"id": "c1"}}));
    assert_eq!(key.as_deref(), Some(&b"c1"[..]));
    let mut other = json!({"status": "open"});
    assert!(!t[0].keeps(&mut other, &mut key));
    let one_of = Transform::Filter {
        field: "n".into(),
        equals: None,
        not_equals: None,
        one_of: Some(vec![json!(1), json!(2)]),
        exists: None,
    };
    assert!(one_of.keeps(&mut json!({"n": 2}), &mut key));
    assert!(!one_of.keeps(&mut json!({"n": 3}), &mut key));
    assert!(!one_of.keeps(&mut json!({}), &mut key));
}

/// Debezium change events (JSON converter, with and without its schema wrapper) become rows,
/// deletions of their key, or errors for what cannot be applied row by row.
#[test]
fn a_debezium_change_event_becomes_its_row_or_a_deletion_of_its_key() {
    use crate::Change;
    let t = Transform::Debezium;
    let row = json!({"id": 1, "name": "a"});
    for op in ["c", "r", "u"] {
        let mut v = json!({"before": null, "after": row, "op": op, "source": {"lsn": 5}});
        let mut key = Some(br#"{"id":1}"#.to_vec());
        assert_eq!(t.apply(&mut v, &mut key), Ok(Change::Keep), "{op}");
        assert_eq!(v, row);
        assert_eq!(key.as_deref(), Some(&br#"{"id":1}"#[..]));
    }
    // The converter's wrapper around the value and the key.
    let mut v = json!({"schema": {"type": "struct"}, "payload": {"after": row, "op": "u"}});
    let mut key = Some(serde_json::to_vec(&json!({"schema": {}, "payload": {"id": 1}})).unwrap());
    assert_eq!(t.apply(&mut v, &mut key), Ok(Change::Keep));
    assert_eq!(v, row);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(key.as_deref().unwrap()).unwrap(),
        json!({"id": 1})
    );
    // A delete: a deletion of the key.
    let mut v = json!({"before": row, "after": null, "op": "d"});
    let mut key = Some(br#"{"id":1}"#.to_vec());
    assert_eq!(t.apply(&mut v, &mut key), Ok(Change::Delete));
    assert!(
        t.apply(&mut json!({"before": row, "op": "d"}), &mut None).is_err(),
        "a delete without a key"
    );
    // What cannot be applied row by row, or is no change event at all.
    for bad in [
        json!({"op": "t"}),
        json!({"op": "m"}),
        json!({"id": 1}),
        json!({"op": "c"}),
        json!([1]),
    ] {
        assert!(t.apply(&mut bad.clone(), &mut None).is_err(), "{bad}");
    }
}

/// `debezium` first, followed by `project` at most, in the job's transforms only, and database
/// sinks that upsert only (mode upsert, or a two-phase mode with insert_mode upsert): anything
/// else would apply to rows but not to deletes.
#[test]
fn a_debezium_transform_is_first_in_the_job_and_feeds_upsert_sinks_only() {
    let cdc = |transforms: &str, sink: &str| {
        format!(
            r#"
[job]
name = "cdc"
[checkpoints]
dir = "/tmp/x"
[source]
bootstrap_servers = "127.0.0.1:19092"
topics = ["shop.public.orders"]
group_id = "g"
{transforms}
{sink}
"#
        )
    };
    let upsert = r#"[sink.mysql]
url = "mysql://u:p@127.0.0.1:13306/db"
table = "orders"
mode = "upsert"
job_id = "cdc"
[sink.mysql.mapping]
format = { type = "json" }
columns = [{ name = "id", type = "bigint", key = true }]"#;
    let first = "[[transform]]\ntype = \"debezium\"\n";
    let project = "[[transform]]\ntype = \"project\"\nfields = [\"id\"]\n";
    let key = "[[transform]]\ntype = \"key\"\nfield = \"id\"\n";
    parse(&cdc(first, upsert)).expect("debezium into an upsert sink");
    parse(&cdc(&format!("{first}{project}"), upsert)).expect("project after debezium");
    for (transforms, at) in [
        (format!("{first}{key}"), "transform[1]"),
        (format!("{key}{first}"), "transform[1]"),
    ] {
        let e = parse(&cdc(&transforms, upsert)).expect_err(&transforms).to_string();
        assert!(e.contains(at) && e.contains("must be the first transform"), "{e}");
    }
    // Sink transforms of such a job: `project` at most.
    let fan_out = |sink_transform: &str| {
        format!(
            "{first}[[sink]]\nname = \"copy\"\n{sink_transform}[sink.mysql]\nurl = \"mysql://u:p@127.0.0.1:13306/db\"\ntable = \"orders\"\nmode = \"upsert\"\njob_id = \"cdc\"\n[sink.mysql.mapping]\nformat = {{ type = \"json\" }}\ncolumns = [{{ name = \"id\", type = \"bigint\", key = true }}]\n"
        )
    };
    parse(&cdc(
        &fan_out("[[sink.transform]]\ntype = \"project\"\nfields = [\"id\"]\n"),
        "",
    ))
    .expect("a sink's project");
    let e = parse(&cdc(
        &fan_out("[[sink.transform]]\ntype = \"filter\"\nfield = \"status\"\nequals = \"paid\"\n"),
        "",
    ))
    .expect_err("a sink's filter")
    .to_string();
    assert!(e.contains("`project` at most"), "{e}");
    let xa = upsert.replace("mode = \"upsert\"", "mode = \"xa\"");
    let e = parse(&cdc(first, &xa)).expect_err("xa").to_string();
    assert!(e.contains("insert_mode = \"upsert\""), "{e}");
    let xa_upserts = xa.replace("mode = \"xa\"", "mode = \"xa\"\ninsert_mode = \"upsert\"");
    parse(&cdc(first, &xa_upserts)).expect("xa with insert_mode upsert");
    let pg = r#"[sink.postgres]
url = "postgres://u:p@127.0.0.1:15432/db"
table = "orders"
mode = "two_phase"
job_id = "cdc"
columns = [{ name = "id", type = "bigint", key = true }]"#;
    let e = parse(&cdc(first, pg)).expect_err("two_phase").to_string();
    assert!(e.contains("insert_mode = \"upsert\""), "{e}");
    let pg_upserts = pg.replace("mode = \"two_phase\"", "mode = \"two_phase\"\ninsert_mode = \"upsert\"");
    parse(&cdc(first, &pg_upserts)).expect("two_phase with insert_mode upsert");
}

/// A checkpoint location in a store this build leaves out is refused by the check, naming the
/// feature (the job would fail at its start); S3 is always in.
#[test]
fn a_checkpoint_store_left_out_of_the_build_is_refused_at_the_check() {
    for (url, feature, built) in [
        ("gs://bucket/prefix", "gcs", cfg!(feature = "gcs")),
        ("az://container/prefix", "azure", cfg!(feature = "azure")),
    ] {
        let r = parse(&GOOD.replace("dir = \"/tmp/x\"", &format!("dir = \"{url}\"")));
        match r {
            Err(e) if !built => {
                assert_eq!(e.field.as_deref(), Some("checkpoints.dir"), "{e}");
                assert!(e.message.contains(&format!("`{feature}` feature")), "{e}");
            }
            Ok(_) if built => {}
            other => panic!("{url}: {:?}", other.map(|_| "accepted")),
        }
    }
    parse(&GOOD.replace("dir = \"/tmp/x\"", "dir = \"s3://bucket/prefix\"")).unwrap();
}

/// RocksDB's memory out of its bounds is refused by the check, naming the setting and its line
/// (the job would be refused at its start); within them the file parses.
#[test]
fn a_rocksdb_memory_out_of_bounds_is_refused_at_the_check() {
    let with = |mb: u64| {
        GOOD.replace(
            "[source]",
            &format!("[state_backend]\ntype = \"rocks_db\"\nmemory_mb = {mb}\n\n[source]"),
        )
    };
    for mb in [0, 8, 2 << 20] {
        let e = parse(&with(mb)).unwrap_err();
        assert_eq!(e.field.as_deref(), Some("state_backend.memory_mb"), "{e}");
        assert!(e.message.contains(&format!("memory_mb = {mb}")), "{e}");
        assert!(e.line.is_some(), "{e}");
    }
    #[cfg(feature = "rocksdb")]
    parse(&with(64)).unwrap();
}
