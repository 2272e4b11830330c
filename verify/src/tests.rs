use std::time::Duration;

use super::*;

#[test]
fn a_database_url_given_on_the_command_line_takes_its_password_from_the_environment_or_a_file() {
    std::env::set_var("EXACTLY_VERIFY_TEST_DB_PASSWORD", "from-env");
    let args = VerifyArgs {
        source: SourceRange {
            topic: "in".into(),
            from: read::Bound::Start,
            to: read::Bound::End,
        },
        output: Output::Table(Database::Mysql, "orders".into()),
        id: "id".into(),
        key: None,
        order: None,
        job: None,
        sink: None,
        bootstrap: None,
        kafka_config: None,
        mysql_url: Some("mysql://app:${EXACTLY_VERIFY_TEST_DB_PASSWORD}@db/shop".into()),
        postgres_url: Some("postgres://app@db/shop".into()),
        db_password_file: Some("/run/secrets/db".into()),
        examples: 5,
        spill_dir: None,
        stall_timeout: Duration::from_secs(1),
    };
    let job = FromJob {
        transforms: Vec::new(),
        columns: None,
        bootstrap: None,
        group: None,
        database: None,
        input_field: None,
    };
    let (url, file) = db_server(&args, &job, Database::Mysql).unwrap();
    assert_eq!(url, "mysql://app:from-env@db/shop");
    assert_eq!(file.as_deref(), Some(std::path::Path::new("/run/secrets/db")));
    let unset = VerifyArgs {
        mysql_url: Some("mysql://app:${EXACTLY_VERIFY_TEST_UNSET}@db/shop".into()),
        ..args
    };
    let err = db_server(&unset, &job, Database::Mysql).unwrap_err().to_string();
    assert!(
        err.contains("--mysql-url") && err.contains("EXACTLY_VERIFY_TEST_UNSET"),
        "{err}"
    );
}

#[test]
fn outputs_and_ids_parse() {
    assert_eq!(parse_output("paid").unwrap(), Output::Topic("paid".into()));
    assert_eq!(parse_output("topic:paid").unwrap(), Output::Topic("paid".into()));
    assert_eq!(
        parse_output("mysql:orders").unwrap(),
        Output::Table(Database::Mysql, "orders".into())
    );
    assert_eq!(
        parse_output("postgres:shop.orders").unwrap(),
        Output::Table(Database::Postgres, "shop.orders".into())
    );
    assert!(parse_output("sqlite:x").is_err());
    assert!(parse_output("postgres:").is_err());
    assert!(parse_output("mysql:").is_err());
    assert_eq!(id_text(&serde_json::json!(42)), "42");
    assert_eq!(id_text(&serde_json::json!("a-1")), "a-1");
    assert!(OrderValue::Number(2.0) < OrderValue::Number(10.0));
    assert!(OrderValue::Text("2026-01-02".into()) > OrderValue::Text("2026-01-01".into()));
}
