//! `exactly verify` against the real broker and MariaDB sees each kind of failure it reports:
//! an input topic, and outputs made by hand with a record lost, one duplicated, one that was never
//! in the input and one out of order — in a topic and in a table — and passes an output that is
//! exactly once. Input ranges and the job's filter decide what is expected. A PostgreSQL table
//! is read the same way.

mod common;

use std::process::Command;

use anyhow::Result;
use common::exactly;
use exactly_integration_tests::{
    connect_mysql, connect_postgres, create_topic, execute, pg_execute, postgres_url, produce, unique, TestEnv,
};
use serde_json::{json, Value};

fn rec(id: u64, key: &str, seq: u64) -> (String, String) {
    (
        key.to_owned(),
        json!({"id": id, "key": key, "seq": seq, "status": if id.is_multiple_of(2) { "paid" } else { "open" }})
            .to_string(),
    )
}

/// Runs `exactly verify ARGS --json`; returns the exit code and the report.
fn verify(env: &TestEnv, args: &[&str]) -> Result<(i32, Value)> {
    let out = Command::new(exactly())
        .arg("verify")
        .args(args)
        .args(["--bootstrap-servers", &env.kafka_bootstrap, "--json"])
        .args(["--mysql-url", &env.mysql_url])
        .output()?;
    let code = out.status.code().unwrap_or(-1);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report = serde_json::from_str(&stdout).unwrap_or_else(|_| {
        panic!(
            "exit {code}, no JSON report:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    Ok((code, report))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reports_lost_duplicated_foreign_and_out_of_order_records() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, good, bad) = (unique("verify-in"), unique("verify-good"), unique("verify-bad"));
    for t in [&input, &good, &bad] {
        create_topic(env, t, 2).await?;
    }
    // 100 input records: ids 0..100, keys k0..k4, seq increasing per key.
    let records: Vec<_> = (0..100).map(|i| rec(i, &format!("k{}", i % 5), i / 5)).collect();
    produce(env, &input, &records)?;
    produce(env, &good, &records)?;
    // The bad output: id 7 lost, id 8 twice, id 1000 never in the input, and k3's seq going back.
    // (13 is k3's third record, moved after k3's last.)
    let mut bad_records: Vec<_> = records
        .iter()
        .filter(|(_, v)| !v.contains("\"id\":7,") && !v.contains("\"id\":13,"))
        .cloned()
        .collect();
    bad_records.push(rec(8, "k3", 30));
    bad_records.push(rec(1000, "k4", 99));
    bad_records.push(rec(13, "k3", 2));
    produce(env, &bad, &bad_records)?;

    let (code, r) = verify(
        env,
        &[
            "--source", &input, "--output", &good, "--id", "id", "--key", "key", "--order", "seq",
        ],
    )?;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(
        (
            r["input_records"].as_u64(),
            r["expected"].as_u64(),
            r["output_records"].as_u64()
        ),
        (Some(100), Some(100), Some(100)),
        "{r:#}"
    );
    assert_eq!(
        (r["lost"].as_u64(), r["duplicated"].as_u64(), r["out_of_order"].as_u64()),
        (Some(0), Some(0), Some(0))
    );
    assert_eq!(r["exactly_once"], true);

    let (code, r) = verify(
        env,
        &[
            "--source",
            &input,
            "--output",
            &format!("topic:{bad}"),
            "--id",
            "id",
            "--key",
            "key",
            "--order",
            "seq",
        ],
    )?;
    assert_eq!(code, 1, "{r:#}");
    assert_eq!(r["lost"].as_u64(), Some(1), "{r:#}");
    assert_eq!(r["duplicated"].as_u64(), Some(1), "{r:#}");
    assert_eq!(r["outside_input"].as_u64(), Some(1), "{r:#}");
    assert_eq!(r["out_of_order"].as_u64(), Some(1), "{r:#}");
    assert_eq!(r["lost_examples"][0]["id"], "7", "{r:#}");
    assert_eq!(r["duplicated_examples"][0]["id"], "8", "{r:#}");
    assert_eq!(
        r["duplicated_examples"][0]["at"].as_array().map(Vec::len),
        Some(2),
        "{r:#}"
    );
    assert_eq!(r["outside_examples"][0]["id"], "1000", "{r:#}");
    assert_eq!(r["out_of_order_examples"][0]["id"], "13", "{r:#}");
    assert_eq!(r["exactly_once"], false);

    // A range of the input: offsets 0..10 of each partition.
    let (code, r) = verify(
        env,
        &["--source", &format!("{input}:0..10"), "--output", &good, "--id", "id"],
    )?;
    assert_eq!(code, 0, "outside the range is not a failure: {r:#}");
    assert_eq!(r["input_records"].as_u64(), Some(20), "{r:#}");
    assert_eq!(r["outside_input"].as_u64(), Some(80), "{r:#}");

    // A table: the good rows, then a duplicate row.
    let table = unique("verify").replace('-', "_");
    let mut sql = connect_mysql(env).await?;
    execute(
        &mut sql,
        &format!("CREATE TABLE `{table}` (id BIGINT NOT NULL, status VARCHAR(16))"),
    )
    .await?;
    let values: Vec<String> = (0..100)
        .filter(|i| i % 2 == 0)
        .map(|i| format!("({i}, 'paid')"))
        .collect();
    execute(&mut sql, &format!("INSERT INTO `{table}` VALUES {}", values.join(","))).await?;
    // Without the job's filter, the open orders count as lost.
    let (code, r) = verify(
        env,
        &["--source", &input, "--output", &format!("mysql:{table}"), "--id", "id"],
    )?;
    assert_eq!((code, r["lost"].as_u64()), (1, Some(50)), "{r:#}");
    // With a job whose filter keeps paid orders: exactly once.
    let dir = tempfile::tempdir()?;
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            r#"
[job]
name = "verify"
[checkpoints]
dir = "{dir}"
[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "verify"
[[transform]]
type = "filter"
field = "status"
equals = "paid"
[sink.mysql]
url = "{url}"
table = "{table}"
mode = "xa"
job_id = "verify"
mapping = {{ format = {{ type = "json" }}, columns = [{{ name = "id", type = "bigint", key = true }}] }}
"#,
            dir = dir.path().display(),
            bootstrap = env.kafka_bootstrap,
            url = env.mysql_url,
        ),
    )?;
    let job = job.display().to_string();
    let (code, r) = verify(
        env,
        &[
            "--source",
            &input,
            "--output",
            &format!("mysql:{table}"),
            "--id",
            "id",
            "--job",
            &job,
        ],
    )?;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(
        (r["expected"].as_u64(), r["filtered"].as_u64()),
        (Some(50), Some(50)),
        "{r:#}"
    );
    execute(&mut sql, &format!("INSERT INTO `{table}` VALUES (42, 'paid')")).await?;
    let (code, r) = verify(
        env,
        &[
            "--source",
            &input,
            "--output",
            &format!("mysql:{table}"),
            "--id",
            "id",
            "--job",
            &job,
        ],
    )?;
    assert_eq!((code, r["duplicated"].as_u64()), (1, Some(1)), "{r:#}");
    assert_eq!(r["duplicated_examples"][0]["id"], "42", "{r:#}");

    // Bad arguments: exit status 2 and a message.
    let out = Command::new(exactly())
        .args([
            "verify",
            "--source",
            "no-such-topic-here",
            "--output",
            &good,
            "--id",
            "id",
        ])
        .args(["--bootstrap-servers", &env.kafka_bootstrap])
        .output()?;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no-such-topic-here"),
        "{out:?}"
    );
    Ok(())
}

/// A PostgreSQL table (reached over TLS with certificate checks, as the sink reaches it): the
/// server and the id column's input field come from the job's `[sink.postgres]`; a lost and a
/// duplicated row are reported with their ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_reads_a_postgres_table() -> Result<()> {
    let env = TestEnv::get().await?;
    let url = postgres_url()?;
    let input = unique("verify-pg-in");
    create_topic(env, &input, 2).await?;
    // The sink fills column `id` from field `order_id`; field `id` is something else.
    let records: Vec<_> = (0..20)
        .map(|i| (format!("k{i}"), json!({"id": i, "order_id": 1000 + i}).to_string()))
        .collect();
    produce(env, &input, &records)?;
    let table = unique("verify_pg").replace('-', "_");
    let mut pg = connect_postgres().await?;
    pg_execute(
        &mut pg,
        &format!("CREATE TABLE public.\"{table}\" (id bigint NOT NULL)"),
    )
    .await?;
    let values: Vec<String> = (1000..1020).map(|i| format!("({i})")).collect();
    pg_execute(
        &mut pg,
        &format!("INSERT INTO public.\"{table}\" VALUES {}", values.join(",")),
    )
    .await?;
    let output = format!("postgres:public.{table}");

    // Named by flags: the input's `id` field is compared with the column, which holds other
    // values.
    let (code, r) = verify(
        env,
        &[
            "--source",
            &input,
            "--output",
            &output,
            "--id",
            "id",
            "--postgres-url",
            &url,
        ],
    )?;
    assert_eq!(
        (code, r["lost"].as_u64(), r["outside_input"].as_u64()),
        (1, Some(20), Some(20)),
        "{r:#}"
    );

    // With the job: its URL, and the field its column reads.
    let dir = tempfile::tempdir()?;
    let job = dir.path().join("job.toml");
    std::fs::write(
        &job,
        format!(
            r#"
[job]
name = "verify-pg"
[checkpoints]
dir = "{dir}"
[source]
bootstrap_servers = "{bootstrap}"
topics = ["{input}"]
group_id = "verify-pg"
[sink.postgres]
url = "{url}"
table = "public.{table}"
mode = "two_phase"
job_id = "verify-pg"
columns = [{{ name = "id", type = "bigint", field = "order_id" }}]
"#,
            dir = dir.path().display(),
            bootstrap = env.kafka_bootstrap,
        ),
    )?;
    let job = job.display().to_string();
    let with_job = ["--source", &input, "--output", &output, "--id", "id", "--job", &job];
    let (code, r) = verify(env, &with_job)?;
    assert_eq!(code, 0, "{r:#}");
    assert_eq!(
        (r["expected"].as_u64(), r["output_records"].as_u64()),
        (Some(20), Some(20)),
        "{r:#}"
    );

    // One row lost, one twice (no primary key: a duplicate is a second row).
    pg_execute(&mut pg, &format!("DELETE FROM public.\"{table}\" WHERE id = 1003")).await?;
    pg_execute(&mut pg, &format!("INSERT INTO public.\"{table}\" VALUES (1007)")).await?;
    let (code, r) = verify(env, &with_job)?;
    assert_eq!(
        (code, r["lost"].as_u64(), r["duplicated"].as_u64()),
        (1, Some(1), Some(1)),
        "{r:#}"
    );
    assert_eq!(r["lost_examples"][0]["id"], "1003", "{r:#}");
    assert_eq!(r["duplicated_examples"][0]["id"], "1007", "{r:#}");
    assert_eq!(r["output"], format!("postgres table public.{table}"), "{r:#}");
    Ok(())
}
