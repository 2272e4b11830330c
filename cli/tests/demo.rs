//! The demo as users run it: `scripts/demo` itself (the README's first command), with this build's
//! `exactly` binary and the test suite's services. The script runs `exactly datagen` and two example
//! job files with `exactly run` as processes, SIGKILLs and restarts each, stops them with SIGTERM and
//! checks every output with `exactly verify`; this test reads its summary table and requires every
//! row to hold every expected record once, besides the script's own exit status.

mod common;

use std::path::Path;
use std::process::Command;

use anyhow::{ensure, Context, Result};
use exactly_integration_tests::TestEnv;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_script_runs_the_binary_kills_restarts_and_verifies() -> Result<()> {
    // Fails with instructions when Kafka or MySQL cannot be reached.
    let env = TestEnv::get().await?;
    let dir = tempfile::tempdir()?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/demo");
    let out = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || {
            Command::new(script)
                .env("EXACTLY_BIN", common::exactly())
                .env("EXACTLY_DEMO_SERVICES", "given")
                .env("EXACTLY_KAFKA_BOOTSTRAP", &env.kafka_bootstrap)
                .env("EXACTLY_MYSQL_URL", &env.mysql_url)
                .env("EXACTLY_DEMO_DIR", &dir)
                .output()
        }
    })
    .await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    ensure!(
        out.status.success(),
        "scripts/demo failed ({}):\n{stderr}\njob logs in {}:\n{}",
        out.status,
        dir.path().display(),
        logs(dir.path())
    );

    // The summary table: job, in, expected, out, duplicates, missing, checkpoints, killed, restarts.
    let table: Vec<Vec<&str>> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("job "))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split("  ").filter(|c| !c.is_empty()).map(str::trim).collect())
        .collect();
    ensure!(table.len() == 3, "three summary rows expected:\n{stdout}");
    for row in &table {
        let n = |i: usize| -> Result<u64> { row[i].parse().with_context(|| format!("column {i} of {row:?}")) };
        ensure!(row.len() == 9, "nine columns expected: {row:?}");
        ensure!(n(1)? == 20_000, "all sample orders read back as input: {row:?}");
        ensure!(n(2)? > 0 && n(3)? == n(2)?, "output = expected: {row:?}");
        ensure!(n(4)? == 0 && n(5)? == 0, "no duplicates, nothing missing: {row:?}");
        ensure!(n(6)? >= 4, "checkpoints before and after the kill: {row:?}");
        ensure!(n(7)? == 1, "killed once: {row:?}");
    }
    // Two thirds of the orders are paid (the generator's rule); the table has them all.
    ensure!(
        table[0][2] == "13333" && table[1][2] == "13333" && table[2][2] == "20000",
        "{table:?}"
    );
    ensure!(stdout.contains("demo passed"), "{stdout}");

    // The commands it suggests next: the audit, run as printed, passes.
    let next: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Next,"))
        .skip(1)
        .take(3)
        .map(|l| l.split("    #").next().unwrap_or("").trim())
        .collect();
    ensure!(next.len() == 3, "three next commands expected:\n{stdout}");
    ensure!(
        next[0].contains(" run ") && next[1].starts_with("http://127.0.0.1:"),
        "{next:?}"
    );
    let words: Vec<&str> = next[2].split_whitespace().collect();
    ensure!(words.get(1) == Some(&"verify"), "{next:?}");
    let verify = Command::new(words[0]).args(&words[1..]).output()?;
    ensure!(
        verify.status.success(),
        "the suggested `{}` failed ({}):\n{}{}",
        next[2],
        verify.status,
        String::from_utf8_lossy(&verify.stdout),
        String::from_utf8_lossy(&verify.stderr)
    );
    Ok(())
}

fn logs(dir: &Path) -> String {
    let mut text = String::new();
    for name in ["orders-k2k.log", "orders-fan-out.log", "datagen.log"] {
        if let Ok(t) = std::fs::read_to_string(dir.join(name)) {
            let tail: Vec<&str> = t.lines().rev().take(30).collect();
            text += &format!("--- {name}\n");
            for l in tail.into_iter().rev() {
                text += l;
                text.push('\n');
            }
        }
    }
    text
}
