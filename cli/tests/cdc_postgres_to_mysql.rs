//! Change data capture end to end against the real thing: Debezium's PostgreSQL connector (on
//! Kafka Connect, `scripts/services up kafka postgres cdc`) captures a PostgreSQL table into
//! Kafka; `exactly run` reads the change events (`[[transform]] type = "debezium"`) into a MariaDB
//! table in mode xa (the changes of a checkpoint in its XA branch), or into another PostgreSQL
//! table in mode upsert and in mode two_phase (in its prepared transaction). Inserts before the
//! connector (its snapshot), inserts, updates and
//! deletes while the job runs, a column added midway, the job SIGKILLed while it applies changes
//! and started again (it must restore its checkpoint): at the end the MariaDB table equals the
//! PostgreSQL table row for row.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use exactly_integration_tests::{connect_mysql, create_topic, postgres_url, unique, ChildJob, TestEnv};
use exactly_integration_tests::{connect_postgres, pg_execute};
use sqlx::Row;

const HOW_TO_START_CDC: &str = "this test needs Kafka Connect with Debezium (EXACTLY_CONNECT_URL): start it with\n\n    \
     scripts/services up kafka mysql postgres cdc && eval \"$(scripts/services env)\"\n\nor run the whole suite with `scripts/test`.";

fn connect_url() -> Result<String> {
    match std::env::var("EXACTLY_CONNECT_URL") {
        Ok(url) if !url.is_empty() => Ok(url),
        _ => bail!("EXACTLY_CONNECT_URL is not set: {HOW_TO_START_CDC}"),
    }
}

/// `curl` against Kafka Connect's REST API: the answer's body (an HTTP error fails).
fn rest(method: &str, url: &str, body: Option<&serde_json::Value>) -> Result<String> {
    let mut c = Command::new("curl");
    c.args([
        "-sS",
        "--fail-with-body",
        "-X",
        method,
        "-H",
        "Content-Type: application/json",
        url,
    ]);
    if let Some(b) = body {
        c.args(["-d", &b.to_string()]);
    }
    let out = c.output().context("running curl")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{method} {url}: {text}{}\n{HOW_TO_START_CDC}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(text)
}

/// Where the job applies the change stream.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    /// MariaDB, mode xa with insert_mode upsert.
    Mariadb,
    /// PostgreSQL, in this mode (`upsert`, or `two_phase` with insert_mode upsert).
    Postgres(&'static str),
}

fn sink(env: &TestEnv, target: Target, table: &str) -> Result<String> {
    Ok(match target {
        Target::Mariadb => format!(
            r#"[sink.mysql]
url = "{url}"
table = "{table}"
mode = "xa"
insert_mode = "upsert"
job_id = "{job}"
create_table = true

[sink.mysql.mapping]
format = {{ type = "json" }}
columns = [
  {{ name = "id", type = "bigint", key = true }},
  {{ name = "customer", type = "varchar", length = 64 }},
  {{ name = "amount", type = "double" }},
  {{ name = "status", type = "varchar", length = 16 }},
]
"#,
            url = env.mysql_url,
            job = unique("cdc"),
        ),
        Target::Postgres(mode) => format!(
            r#"[sink.postgres]
url = "{url}"
table = "{table}"
mode = "{mode}"
insert_mode = "upsert"
job_id = "{job}"
create_table = true
columns = [
  {{ name = "id", type = "bigint", key = true }},
  {{ name = "customer", type = "varchar(64)" }},
  {{ name = "amount", type = "double precision" }},
  {{ name = "status", type = "varchar(16)" }},
]
"#,
            url = postgres_url()?,
            job = unique("cdc"),
        ),
    })
}

fn job_file(env: &TestEnv, dir: &std::path::Path, topic: &str, sink: &str) -> Vec<String> {
    let text = format!(
        r#"
[job]
name = "cdc"
parallelism = 1

[checkpoints]
dir = "{checkpoints}"
interval = "300ms"

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"

[[transform]]
type = "debezium"

{sink}
"#,
        checkpoints = dir.join("checkpoints").display(),
        bootstrap = env.kafka_bootstrap,
        group = unique("cdc-group"),
    );
    let path = dir.join("cdc.toml");
    std::fs::write(&path, text).expect("write job file");
    vec!["run".to_owned(), path.display().to_string()]
}

/// The table's rows as `id|customer|amount|status`, in id order.
async fn pg_rows(pg: &mut sqlx::PgConnection, table: &str) -> Result<Vec<String>> {
    let sql = format!("SELECT concat_ws('|', id, customer, amount, status) FROM {table} ORDER BY id");
    let rows = sqlx::query(&sql).fetch_all(&mut *pg).await.context(sql)?;
    rows.iter().map(|r| Ok(r.try_get::<String, _>(0)?)).collect()
}

async fn mysql_rows(my: &mut sqlx::MySqlConnection, table: &str) -> Result<Vec<String>> {
    let sql = format!("SELECT CAST(CONCAT_WS('|', id, customer, amount, status) AS CHAR) FROM `{table}` ORDER BY id");
    match sqlx::query(&sql).fetch_all(&mut *my).await {
        Ok(rows) => rows.iter().map(|r| Ok(r.try_get::<String, _>(0)?)).collect(),
        // Not created yet: the job has not started its sink.
        Err(_) => Ok(Vec::new()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_changes_of_a_postgres_table_reach_mariadb_in_xa_branches_exactly_across_a_sigkill() -> Result<()> {
    captured_into(Target::Mariadb).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_changes_of_a_postgres_table_reach_another_postgres_table_by_upserts_exactly_across_a_sigkill(
) -> Result<()> {
    captured_into(Target::Postgres("upsert")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_changes_of_a_postgres_table_reach_another_postgres_table_in_prepared_transactions_exactly_across_a_sigkill(
) -> Result<()> {
    captured_into(Target::Postgres("two_phase")).await
}

/// One scenario at a time: a logical slot's creation waits for the transactions open on the
/// server (the other scenario's sink commits), and the clean-up of stale slots must not take a
/// slot the other is still snapshotting with.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn captured_into(target: Target) -> Result<()> {
    let _alone = ONE_AT_A_TIME.lock().await;
    let env = TestEnv::get().await?;
    let connect = connect_url()?;
    let mut pg = connect_postgres().await?;
    let mut my = connect_mysql(env).await?;
    let tag = unique("cdc").replace('-', "_").to_lowercase();
    // Slots an earlier run of this test left behind (killed before its cleanup) keep WAL.
    let _ = pg_execute(
        &mut pg,
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name LIKE 'cdc\\_%' AND NOT active",
    )
    .await;
    pg_execute(
        &mut pg,
        &format!("CREATE TABLE {tag} (id bigint PRIMARY KEY, customer varchar(64), amount double precision, status varchar(16))"),
    )
    .await?;
    // Rows before the connector: its snapshot reads them (op "r").
    pg_execute(
        &mut pg,
        &format!("INSERT INTO {tag} SELECT n, 'c' || (n % 7), n * 0.25, 'new' FROM generate_series(1, 50) n"),
    )
    .await?;
    let config = serde_json::json!({
        "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "database.hostname": "127.0.0.1",
        "database.port": std::env::var("EXACTLY_POSTGRES_PORT").unwrap_or_else(|_| "15432".into()),
        "database.user": "exactly",
        "database.password": "exactly",
        "database.dbname": "exactly",
        "database.sslmode": "require",
        "topic.prefix": tag,
        "table.include.list": format!("public.{tag}"),
        "plugin.name": "pgoutput",
        "slot.name": tag,
        "publication.name": tag,
        "publication.autocreate.mode": "filtered",
        // The JSON converter with its schema wrapper, as many deployments run it.
        "key.converter": "org.apache.kafka.connect.json.JsonConverter",
        "key.converter.schemas.enable": "true",
        "value.converter": "org.apache.kafka.connect.json.JsonConverter",
        "value.converter.schemas.enable": "true",
    });
    // The change topic, made before the connector (Connect would make it at the snapshot's first
    // record; the job's source refuses a topic that does not exist).
    create_topic(env, &format!("{tag}.public.{tag}"), 1).await?;
    rest("PUT", &format!("{connect}/connectors/{tag}/config"), Some(&config))?;
    let result = scenario(env, target, &mut pg, &mut my, &tag).await;
    let _ = rest("DELETE", &format!("{connect}/connectors/{tag}"), None);
    // The slot holds WAL until dropped; it is released once the connector's task stops.
    for _ in 0..150 {
        if pg_execute(&mut pg, &format!("SELECT pg_drop_replication_slot('{tag}')"))
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _ = pg_execute(&mut pg, &format!("DROP PUBLICATION IF EXISTS {tag}")).await;
    let _ = pg_execute(&mut pg, &format!("DROP TABLE {tag}")).await;
    let _ = pg_execute(&mut pg, &format!("DROP TABLE IF EXISTS {tag}_copy")).await;
    result
}

async fn scenario(
    env: &TestEnv,
    target: Target,
    pg: &mut sqlx::PgConnection,
    my: &mut sqlx::MySqlConnection,
    tag: &str,
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let copy = format!("{tag}_copy");
    let args = job_file(
        env,
        dir.path(),
        &format!("{tag}.public.{tag}"),
        &sink(env, target, &copy)?,
    );
    // The other side: a second connection, so the source's stays free for changes.
    let mut target_pg = exactly_integration_tests::connect_postgres().await?;
    let mut copied = async |my: &mut sqlx::MySqlConnection| -> Result<Vec<String>> {
        match target {
            Target::Mariadb => mysql_rows(my, &copy).await,
            Target::Postgres(_) => Ok(pg_rows(&mut target_pg, &copy).await.unwrap_or_default()),
        }
    };
    let exactly = env!("CARGO_BIN_EXE_exactly");
    let mut job = ChildJob::spawn(exactly, &args, "")?;
    // The snapshot's rows reach MariaDB first: the kill below lands on a job that is applying
    // changes, not on one still starting.
    let deadline = Instant::now() + Duration::from_secs(60);
    while copied(my).await?.is_empty() {
        if Instant::now() > deadline || !job.running() {
            // A logical slot is created only once every transaction older than it has ended,
            // prepared ones included: one a failed test left behind stops the snapshot for good.
            let prepared: Vec<(String, String)> =
                sqlx::query_as("SELECT gid, prepared::text FROM pg_prepared_xacts ORDER BY prepared LIMIT 10")
                    .fetch_all(&mut *pg)
                    .await
                    .unwrap_or_default();
            bail!(
                "no row reached the copy within 60 s (prepared transactions on the source server, which hold back a replication slot's creation: {prepared:?}):\n{}",
                job.log(40)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Changes while the job runs, in rounds; the job is SIGKILLed after the second and started
    // again (it restores its checkpoint and goes on from there).
    for round in 0..4 {
        let base = 100 + round * 50;
        if round == 2 {
            // A schema change mid-stream: the events carry the new column, the mapping ignores it.
            pg_execute(pg, &format!("ALTER TABLE {tag} ADD COLUMN note text DEFAULT 'x'")).await?;
        }
        pg_execute(
            pg,
            &format!(
                "INSERT INTO {tag} SELECT n, 'c' || (n % 7), n * 0.25, 'new' FROM generate_series({base}, {}) n",
                base + 49
            ),
        )
        .await?;
        pg_execute(
            pg,
            &format!("UPDATE {tag} SET status = 'paid', amount = amount + 1 WHERE id % 3 = {round} % 3"),
        )
        .await?;
        pg_execute(pg, &format!("DELETE FROM {tag} WHERE id % 11 = {round}")).await?;
        tokio::time::sleep(Duration::from_millis(700)).await;
        if round == 1 {
            job.kill();
            eprintln!("SIGKILLed the job after round {round}");
            job = ChildJob::spawn(exactly, &args, "")?;
            // It goes on from its checkpoint (not from the topic's start, which upserts would
            // hide).
            let deadline = Instant::now() + Duration::from_secs(60);
            while !job.tail(10_000).contains("Restoring.") {
                if Instant::now() > deadline || !job.running() {
                    bail!("the restarted job did not restore a checkpoint:\n{}", job.log(40));
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if !job.running() {
            bail!("the job ended:\n{}", job.log(40));
        }
    }
    let want = pg_rows(pg, tag).await?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let got = copied(my).await?;
        if got == want {
            eprintln!("the copy equals the table: {} rows", want.len());
            break;
        }
        if !job.running() {
            bail!("the job ended:\n{}", job.log(40));
        }
        if Instant::now() > deadline {
            let missing: Vec<_> = want.iter().filter(|r| !got.contains(r)).take(5).collect();
            let extra: Vec<_> = got.iter().filter(|r| !want.contains(r)).take(5).collect();
            bail!(
                "after 120 s the copy has {} rows, the table {}; missing or different {missing:?}, extra {extra:?}\n{}",
                got.len(),
                want.len(),
                job.log(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    job.kill();
    Ok(())
}
