//! Who may drive a running job through its admin endpoint: with a token configured (referenced
//! from the environment in the job file), a POST without it or with a wrong one is refused, a
//! savepoint path outside the job's savepoint root is refused, a request from a page of another
//! origin is refused, and neither `/status` nor the log shows the token; a non-loopback admin
//! address without a token is refused at start.

mod common;

use std::time::Duration;

use anyhow::Result;
use assert_cmd::Command;
use common::{free_port, spawn_run, wait_exit, wait_status, K2k};
use exactly_integration_tests::{create_topic, unique, TestEnv};

const TOKEN: &str = "t0ken-8f2c1e-only-for-this-test";

fn cmd() -> Command {
    let mut c = Command::cargo_bin("exactly").expect("binary built");
    c.env_remove("EXACTLY_ADMIN_TOKEN");
    c
}

/// POSTs `path` with `headers`; returns the status code and body.
fn post(port: u16, path: &str, headers: &[(&str, &str)]) -> Result<(u16, String)> {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let mut req = agent.post(&format!("http://127.0.0.1:{port}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let mut resp = req.send_empty()?;
    Ok((resp.status().as_u16(), resp.body_mut().read_to_string()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_serves_only_its_owner() -> Result<()> {
    let env = TestEnv::get().await?;
    let (input, output) = (unique("adm-in"), unique("adm-out"));
    create_topic(env, &input, 1).await?;
    create_topic(env, &output, 1).await?;
    let dir = tempfile::tempdir()?;
    let port = free_port();
    let file = K2k {
        env,
        name: "adm",
        input: &input,
        output: &output,
        prefix: &unique("adm"),
        dir: dir.path(),
        parallelism: 1,
        admin: Some(port),
        transforms: "",
    }
    .write();
    // The job file references the token; only the job process has it in its environment.
    let text = std::fs::read_to_string(&file)?.replace(
        &format!("admin = \"127.0.0.1:{port}\""),
        &format!("admin = \"127.0.0.1:{port}\"\nadmin_token = \"${{EXACTLY_TEST_ADMIN_TOKEN}}\""),
    );
    std::fs::write(&file, &text)?;
    assert!(!text.contains(TOKEN));
    // Read only by the child processes started below.
    std::env::set_var("EXACTLY_TEST_ADMIN_TOKEN", TOKEN);
    let mut job = spawn_run(&file, &[], "")?;
    let status = wait_status(&mut job, port, "a checkpoint", Duration::from_secs(60), |s| {
        s["checkpoints"]["completed"].as_u64() >= Some(1)
    })?;
    assert!(!status.to_string().contains(TOKEN), "/status shows no token");
    let admin = format!("127.0.0.1:{port}");

    // No token, a wrong token: refused.
    let (code, _) = post(port, "/savepoint", &[])?;
    assert_eq!(code, 401);
    let (code, _) = post(port, "/savepoint", &[("Authorization", "Bearer wrong")])?;
    assert_eq!(code, 401);
    let refused = cmd().args(["savepoint", "--admin", &admin]).output()?;
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("bearer token is required"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // From a page of another origin, even with the token: refused.
    let bearer = format!("Bearer {TOKEN}");
    let (code, body) = post(
        port,
        "/savepoint",
        &[("Authorization", &bearer), ("Origin", "http://evil.example")],
    )?;
    assert_eq!(code, 403, "{body}");
    // Outside the savepoint root: refused.
    let (code, body) = post(port, "/savepoint?dir=../../escape", &[("Authorization", &bearer)])?;
    assert_eq!(code, 400, "{body}");
    let (code, body) = post(port, "/savepoint?dir=/tmp/escape", &[("Authorization", &bearer)])?;
    assert!(code == 400 && body.contains("only under"), "{code} {body}");
    // The owner, through the command with $EXACTLY_ADMIN_TOKEN.
    let out = cmd()
        .env("EXACTLY_ADMIN_TOKEN", TOKEN)
        .args(["savepoint", "--admin", &admin, "--dir", "mine"])
        .output()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        path.starts_with(&dir.path().join("checkpoints/savepoints/mine").display().to_string()),
        "{path}"
    );
    let out = cmd()
        .env("EXACTLY_ADMIN_TOKEN", TOKEN)
        .args(["stop", "--admin", &admin])
        .output()?;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_exit(&mut job, Duration::from_secs(60))?;
    assert!(!job.tail(100_000).contains(TOKEN), "the log shows no token");

    // Listening beyond loopback without a token: refused before the job starts.
    let open = std::fs::read_to_string(&file)?
        .replace(&format!("127.0.0.1:{port}"), &format!("0.0.0.0:{}", free_port()))
        .replace("admin_token = \"${EXACTLY_TEST_ADMIN_TOKEN}\"", "");
    std::fs::write(&file, open)?;
    let out = cmd().args(["run"]).arg(&file).output()?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && said.contains("refusing to serve the admin endpoint on 0.0.0.0"),
        "{said}"
    );
    Ok(())
}
