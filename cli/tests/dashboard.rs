//! The admin page at `/` in a real headless browser (Debian's Chromium driven through its
//! WebDriver, chromedriver): against a running Kafka-to-Kafka job with orders arriving, the page
//! loads, its records-per-second chart moves, the latest checkpoints appear, and its Savepoint
//! button writes a savepoint. Screenshots are saved under the test's target directory
//! (`target/tmp/dashboard/*.png`).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use common::{free_port, spawn_run, wait_exit, wait_status, K2k, OrderFeeder};
use exactly_integration_tests::{create_topic, signal, unique, TestEnv};
use fantoccini::{Client, ClientBuilder, Locator};

/// chromedriver, killed when dropped.
struct Driver(Child);

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_driver() -> Result<(Driver, u16)> {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting chromedriver: the test needs Debian's chromium and chromium-driver (EXACTLY_SETUP_TESTS=1 scripts/setup installs them; scripts/test does)")?;
    let driver = Driver(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            bail!("chromedriver did not listen on port {port} within 20 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((driver, port))
}

async fn browser(driver_port: u16) -> Result<Client> {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1100"],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector)
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{driver_port}"))
        .await
        .context("opening a Chromium session through chromedriver")
}

/// `expr` (JavaScript, of the element `e`) for the element at `css`, "" while there is none; read
/// in one script run: the page redraws every second, so an element found first may be replaced
/// before it is read.
async fn read(c: &Client, css: &str, expr: &str) -> Result<String> {
    let script = format!("const e = document.querySelector(arguments[0]); return e ? {expr} : '';");
    let v = c.execute(&script, vec![serde_json::json!(css)]).await?;
    Ok(v.as_str().unwrap_or_default().to_owned())
}

/// What the page shows at `css`.
async fn text(c: &Client, css: &str) -> Result<String> {
    read(c, css, "e.textContent").await
}

/// The `points` of the chart line at `css`.
async fn points(c: &Client, css: &str) -> Result<String> {
    read(c, css, "e.getAttribute('points')").await
}

/// Polls `f` every 300 ms until it returns `Some`; fails after `timeout` naming `what`.
async fn until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("the page did not show {what} within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_page_shows_the_job_moving_and_its_button_takes_a_savepoint() -> Result<()> {
    let env = TestEnv::get().await?;
    let (driver, driver_port) = start_driver()?;
    let dir = tempfile::tempdir()?;
    let (input, output) = (unique("page-in"), unique("page-out"));
    create_topic(env, &input, 3).await?;
    create_topic(env, &output, 3).await?;
    let port = free_port();
    let prefix = unique("page");
    let file = K2k {
        env,
        name: "page",
        input: &input,
        output: &output,
        prefix: &prefix,
        dir: dir.path(),
        parallelism: 2,
        admin: Some(port),
        transforms: "",
    }
    .write();
    let feeder = OrderFeeder::start(env, &input, 50, Duration::from_millis(50));
    let mut job = spawn_run(&file, &[], "")?;
    wait_status(&mut job, port, "two checkpoints", Duration::from_secs(60), |s| {
        s["checkpoints"]["completed"].as_u64() >= Some(2)
    })?;

    let shots = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    std::fs::create_dir_all(&shots)?;
    let c = browser(driver_port).await?;
    let result = async {
        c.goto(&format!("http://127.0.0.1:{port}/")).await?;
        until("the job's name and state", Duration::from_secs(30), || async {
            Ok((text(&c, "#job").await? == "page" && text(&c, "#state").await? == "running").then_some(()))
        })
        .await?;
        // The records-per-second chart moves: its `in` line grows and changes.
        let line = "#c-rate polyline[data-name=\"in\"]";
        let first = until("a records-per-second line", Duration::from_secs(30), || async {
            let p = points(&c, line).await?;
            Ok((p.split(' ').count() >= 3).then_some(p))
        })
        .await?;
        until("the chart moving", Duration::from_secs(30), || async {
            Ok((points(&c, line).await? != first).then_some(()))
        })
        .await?;
        let legend = text(&c, "#l-rate").await?;
        until("the latest checkpoints", Duration::from_secs(30), || async {
            Ok(text(&c, "#checkpoints").await?.contains("checkpoint ").then_some(()))
        })
        .await?;
        until("the job file", Duration::from_secs(30), || async {
            Ok(text(&c, "#jobfile").await?.contains("[source]").then_some(()))
        })
        .await?;
        std::fs::write(shots.join("running.png"), c.screenshot().await?)?;

        // The Savepoint button: the page says where the savepoint went, and it is there.
        c.find(Locator::Id("savepoint")).await?.click().await?;
        let message = until("the savepoint's path", Duration::from_secs(60), || async {
            let m = text(&c, "#message").await?;
            Ok((m.starts_with("Savepoint: {") || m.contains("refused") || m.contains("failed")).then_some(m))
        })
        .await?;
        std::fs::write(shots.join("savepoint.png"), c.screenshot().await?)?;
        let answer: serde_json::Value = serde_json::from_str(message.trim_start_matches("Savepoint: "))
            .with_context(|| format!("the page said {message:?}"))?;
        let path = answer["path"].as_str().context("a path")?.to_owned();
        Ok::<_, anyhow::Error>((legend, path))
    }
    .await;
    let _ = c.close().await;
    drop(driver);
    let (legend, path) = result?;
    assert!(
        Path::new(&path).join("_metadata").is_file(),
        "savepoint {path} (legend then: {legend})"
    );

    signal(job.pid(), "TERM")?;
    wait_exit(&mut job, Duration::from_secs(60))?;
    feeder.finish()?;
    Ok(())
}
