use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::sync::OnceCell;

/// What a failing scenario prints when a service is missing.
pub const HOW_TO_START: &str = "Start the local services (no Docker needed) and export their settings:\n\
     \n    scripts/services up && eval \"$(scripts/services env)\"\n\
     \nor run the whole suite with `scripts/test`, which does both. With a Docker engine and no \
     EXACTLY_* variables set, the harness starts Kafka and MySQL containers itself.";

/// Where the services of this test run are.
#[derive(Debug, Clone)]
pub struct TestEnv {
    /// Kafka bootstrap servers, `host:port`.
    pub kafka_bootstrap: String,
    /// `mysql://user:password@host:port/database`.
    pub mysql_url: String,
    /// The broker's log file, when the broker was started by `scripts/services`.
    pub kafka_log: Option<String>,
    /// The `scripts/services` entry point, when the services were started by it (crash tests use
    /// it to kill and restart MariaDB).
    pub services_script: Option<String>,
    /// The broker's `PROXIED` listener and the address it advertises, where a test runs a
    /// [`crate::Proxy`] (`EXACTLY_KAFKA_PROXIED`, `EXACTLY_KAFKA_PROXY`).
    pub kafka_proxied: Option<(String, String)>,
    /// The S3-compatible object store, when `scripts/services` started one (`EXACTLY_S3_*`).
    pub s3: Option<S3>,
}

/// An S3-compatible object store for checkpoints (`scripts/services`: SeaweedFS).
#[derive(Debug, Clone)]
pub struct S3 {
    /// `http://host:port`.
    pub endpoint: String,
    /// A bucket that exists.
    pub bucket: String,
    /// Credentials.
    pub access_key: String,
    /// Credentials.
    pub secret_key: String,
}

impl S3 {
    /// `s3://<bucket>/<prefix>`.
    pub fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.bucket)
    }

    /// Exports the `AWS_*` variables through which `exactly` (and the object_store crate) find this
    /// store and its credentials, into this process's environment — so that storage opened here
    /// and every job process started from here (children inherit it) use it. Idempotent.
    pub fn export_aws_env(&self) {
        static DONE: std::sync::Once = std::sync::Once::new();
        DONE.call_once(|| {
            for (k, v) in [
                ("AWS_ENDPOINT", self.endpoint.as_str()),
                ("AWS_ALLOW_HTTP", "true"),
                ("AWS_ACCESS_KEY_ID", self.access_key.as_str()),
                ("AWS_SECRET_ACCESS_KEY", self.secret_key.as_str()),
                ("AWS_REGION", "us-east-1"),
            ] {
                std::env::set_var(k, v);
            }
        });
    }
}

static ENV: OnceCell<TestEnv> = OnceCell::const_new();

impl TestEnv {
    /// The services for this test process, found once. Fails (never skips) when they are absent.
    pub async fn get() -> Result<&'static TestEnv> {
        ENV.get_or_try_init(find).await
    }

    /// The three-node Kafka cluster of `scripts/services up cluster` (`EXACTLY_KAFKA_CLUSTER`), as
    /// an environment whose Kafka it is (the same database, object store and services script):
    /// the helpers that take a `TestEnv` then create topics (three replicas), feed and read there.
    /// Fails, saying how to start it, when it is not set or does not answer.
    pub fn cluster(&self) -> Result<TestEnv> {
        let how = "the three-node Kafka cluster is needed by this test: start it and export its address with\n\n    \
             scripts/services up cluster && eval \"$(scripts/services env)\"\n\n(`scripts/test` does both)";
        let bootstrap =
            std::env::var("EXACTLY_KAFKA_CLUSTER").map_err(|_| anyhow!("EXACTLY_KAFKA_CLUSTER is not set: {how}"))?;
        check_reachable("the Kafka cluster", &bootstrap).with_context(|| how.to_owned())?;
        Ok(TestEnv {
            kafka_bootstrap: bootstrap,
            kafka_log: None,
            kafka_proxied: None,
            ..self.clone()
        })
    }

    /// Runs `scripts/services COMMAND` (kill, pause, restart a service); fails when the services
    /// were not started by the scripts (containers cannot be signalled so).
    pub fn services(&self, command: &str) -> Result<()> {
        let Some(script) = &self.services_script else {
            bail!("this test needs the local services (scripts/services) to run `{command}`, not containers.\n{HOW_TO_START}");
        };
        let status = std::process::Command::new(script).arg(command).status()?;
        if !status.success() {
            bail!("scripts/services {command} failed ({status})");
        }
        Ok(())
    }

    /// The object store, its `AWS_*` variables exported into this process (see
    /// [`S3::export_aws_env`]). Fails (never skips) when it is not there.
    pub fn s3(&self) -> Result<&S3> {
        let Some(s3) = &self.s3 else {
            bail!(
                "EXACTLY_S3_ENDPOINT / EXACTLY_S3_BUCKET are not set: this test needs the S3 object store \
                 that `scripts/services up` starts.\n{HOW_TO_START}"
            );
        };
        let host_port = s3.endpoint.trim_start_matches("http://").trim_start_matches("https://");
        check_reachable("The S3 object store", host_port)?;
        s3.export_aws_env();
        Ok(s3)
    }

    /// Starts a [`crate::Proxy`] in front of the broker's `PROXIED` listener and returns it with
    /// the bootstrap address that reaches the broker only through it.
    pub async fn kafka_proxy(&self) -> Result<(crate::Proxy, String)> {
        let Some((listener, advertised)) = &self.kafka_proxied else {
            bail!(
                "EXACTLY_KAFKA_PROXIED / EXACTLY_KAFKA_PROXY are not set: this test needs the broker's \
                 proxied listener that `scripts/services up` configures.\n{HOW_TO_START}"
            );
        };
        let proxy = crate::Proxy::start_kafka(advertised, listener).await?;
        Ok((proxy, advertised.clone()))
    }

    /// The last lines of the broker's log, for failure messages.
    pub fn kafka_log_tail(&self, lines: usize) -> String {
        let Some(path) = &self.kafka_log else {
            return String::from("(broker log not available)");
        };
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let all: Vec<&str> = text.lines().collect();
                all[all.len().saturating_sub(lines)..].join("\n")
            }
            Err(err) => format!("(cannot read {path}: {err})"),
        }
    }
}

async fn find() -> Result<TestEnv> {
    let kafka = std::env::var("EXACTLY_KAFKA_BOOTSTRAP").ok();
    let mysql = std::env::var("EXACTLY_MYSQL_URL").ok();
    match (kafka, mysql) {
        (Some(kafka_bootstrap), Some(mysql_url)) => {
            check_reachable("Kafka", &kafka_bootstrap)?;
            check_reachable("MySQL", mysql_host_port(&mysql_url)?)?;
            Ok(TestEnv {
                kafka_bootstrap,
                mysql_url,
                kafka_log: std::env::var("EXACTLY_KAFKA_LOG").ok(),
                services_script: std::env::var("EXACTLY_SERVICES").ok(),
                kafka_proxied: std::env::var("EXACTLY_KAFKA_PROXIED")
                    .ok()
                    .zip(std::env::var("EXACTLY_KAFKA_PROXY").ok()),
                s3: s3_from_env(),
            })
        }
        (None, None) if docker_answers() => containers::start().await,
        (None, None) => bail!(
            "Kafka and MySQL are needed by this test and neither EXACTLY_KAFKA_BOOTSTRAP nor \
             EXACTLY_MYSQL_URL is set, and no Docker engine answers.\n{HOW_TO_START}"
        ),
        (kafka, _) => bail!(
            "only one of EXACTLY_KAFKA_BOOTSTRAP and EXACTLY_MYSQL_URL is set ({} is missing).\n{HOW_TO_START}",
            if kafka.is_some() {
                "EXACTLY_MYSQL_URL"
            } else {
                "EXACTLY_KAFKA_BOOTSTRAP"
            }
        ),
    }
}

fn s3_from_env() -> Option<S3> {
    let var = |k: &str| std::env::var(k).ok();
    Some(S3 {
        endpoint: var("EXACTLY_S3_ENDPOINT")?,
        bucket: var("EXACTLY_S3_BUCKET")?,
        access_key: var("EXACTLY_S3_ACCESS_KEY")?,
        secret_key: var("EXACTLY_S3_SECRET_KEY")?,
    })
}

fn mysql_host_port(url: &str) -> Result<&str> {
    let rest = url
        .strip_prefix("mysql://")
        .ok_or_else(|| anyhow!("EXACTLY_MYSQL_URL must start with mysql:// (got {url})"))?;
    let after_auth = rest.rsplit_once('@').map_or(rest, |(_, hp)| hp);
    Ok(after_auth.split('/').next().unwrap_or(after_auth))
}

fn check_reachable(what: &str, host_port: &str) -> Result<()> {
    let first = host_port.split(',').next().unwrap_or(host_port);
    let addrs: Vec<_> = first
        .to_socket_addrs()
        .with_context(|| format!("{what} address {first:?} does not resolve"))?
        .collect();
    for addr in &addrs {
        if TcpStream::connect_timeout(addr, Duration::from_secs(3)).is_ok() {
            return Ok(());
        }
    }
    bail!("{what} is not reachable at {first}.\n{HOW_TO_START}")
}

fn docker_answers() -> bool {
    if std::env::var_os("DOCKER_HOST").is_some() {
        return true;
    }
    std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok()
}

/// The Docker path (EXACTLY_KAFKA_BOOTSTRAP and EXACTLY_MYSQL_URL unset, an engine answering):
/// a Kafka and a MariaDB container for this test process, started by testcontainers from the
/// images `scripts/images build` makes on the machine (named by EXACTLY_IMAGE_KAFKA and
/// EXACTLY_IMAGE_MARIADB: `eval "$(scripts/images env)"`); without those, from the upstream
/// images (apache/kafka of the scripts' Kafka version, mysql 8.4), which need a registry.
mod containers {
    use anyhow::{anyhow, Context, Result};
    use testcontainers::core::{IntoContainerPort, WaitFor};
    use testcontainers::runners::AsyncRunner;
    use testcontainers::{ContainerAsync, GenericImage, ImageExt};
    use testcontainers_modules::kafka::apache::{Kafka, KAFKA_PORT};
    use testcontainers_modules::mysql::Mysql;
    use tokio::sync::OnceCell;

    use super::TestEnv;

    enum Running {
        Local {
            _kafka: ContainerAsync<GenericImage>,
            _mariadb: ContainerAsync<GenericImage>,
        },
        Upstream {
            _kafka: ContainerAsync<Kafka>,
            _mysql: ContainerAsync<Mysql>,
        },
    }

    // Held for the life of the test process. A static is never dropped, so the containers
    // outlive it: they carry the label `dev.exactly.test-run` with scripts/test's TEST_RUN_LABEL,
    // by which it removes its run's containers after the lane and at its exit.
    static RUNNING: OnceCell<Running> = OnceCell::const_new();

    pub(super) async fn start() -> Result<TestEnv> {
        let image = |var: &str| std::env::var(var).ok().filter(|v| !v.is_empty());
        match (image("EXACTLY_IMAGE_KAFKA"), image("EXACTLY_IMAGE_MARIADB")) {
            (Some(kafka), Some(mariadb)) => local(&kafka, &mariadb).await,
            (None, None) => upstream().await,
            _ => Err(anyhow!(
                "set both EXACTLY_IMAGE_KAFKA and EXACTLY_IMAGE_MARIADB (eval \"$(scripts/images env)\"), or neither"
            )),
        }
    }

    /// The environment of containers: Kafka on `kafka_port` of this host, MySQL at `mysql_url`.
    fn at(kafka_port: u16, mysql_url: &str) -> TestEnv {
        TestEnv {
            kafka_bootstrap: format!("127.0.0.1:{kafka_port}"),
            mysql_url: mysql_url.to_owned(),
            kafka_log: None,
            services_script: None,
            kafka_proxied: None,
            s3: None,
        }
    }

    fn name_and_tag(image: &str) -> Result<(&str, &str)> {
        image
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("image {image:?} has no tag (name:tag, as scripts/images env prints)"))
    }

    /// A port no one listens on now, from the system's ephemeral range (the services of the
    /// other lanes use fixed ports below it). Kafka's container listens on it too, so the
    /// address the broker advertises is the one clients reach it by.
    fn free_port() -> Result<u16> {
        let socket = std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
        Ok(socket.local_addr()?.port())
    }

    /// `scripts/test` labels its run's containers (TEST_RUN_LABEL) to remove them at the end.
    fn run_label() -> String {
        std::env::var("TEST_RUN_LABEL").unwrap_or_else(|_| "none".into())
    }

    async fn local(kafka_image: &str, mariadb_image: &str) -> Result<TestEnv> {
        let port = free_port()?;
        let (name, tag) = name_and_tag(kafka_image)?;
        let kafka = GenericImage::new(name, tag)
            .with_exposed_port(port.tcp())
            .with_wait_for(WaitFor::message_on_stdout("Kafka Server started"))
            .with_label("dev.exactly.test-run", run_label())
            .with_env_var("KAFKA_PORT", port.to_string())
            .with_mapped_port(port, port.tcp())
            .start()
            .await
            .with_context(|| format!("starting a container of {kafka_image} (built by `scripts/images build`?)"))?;
        let (name, tag) = name_and_tag(mariadb_image)?;
        let mariadb = GenericImage::new(name, tag)
            .with_exposed_port(3306.tcp())
            .with_wait_for(WaitFor::message_on_stderr("ready for connections"))
            .with_label("dev.exactly.test-run", run_label())
            .start()
            .await
            .with_context(|| format!("starting a container of {mariadb_image} (built by `scripts/images build`?)"))?;
        let mariadb_port = mariadb.get_host_port_ipv4(3306).await?;
        let env = at(
            port,
            &format!("mysql://exactly:exactly@127.0.0.1:{mariadb_port}/exactly"),
        );
        let _ = RUNNING.set(Running::Local {
            _kafka: kafka,
            _mariadb: mariadb,
        });
        Ok(env)
    }

    async fn upstream() -> Result<TestEnv> {
        let kafka = Kafka::default()
            .with_jvm_image()
            .with_tag("4.1.1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR", "1")
            .with_env_var("KAFKA_TRANSACTION_STATE_LOG_MIN_ISR", "1")
            .with_env_var("KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
            .with_env_var("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
            .with_label("dev.exactly.test-run", run_label())
            .start()
            .await
            .context("starting the Kafka container (apache/kafka:4.1.1 from a registry; without one, build local images with `scripts/images build` and `eval \"$(scripts/images env)\"`)")?;
        let mysql = Mysql::default()
            .with_tag("8.4")
            .with_label("dev.exactly.test-run", run_label())
            .start()
            .await
            .context("starting the MySQL container (mysql:8.4 from a registry)")?;
        let kafka_port = kafka.get_host_port_ipv4(KAFKA_PORT).await?;
        let mysql_port = mysql.get_host_port_ipv4(3306).await?;
        let env = at(kafka_port, &format!("mysql://root@127.0.0.1:{mysql_port}/test"));
        let _ = RUNNING.set(Running::Upstream {
            _kafka: kafka,
            _mysql: mysql,
        });
        Ok(env)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_service_fails_with_instructions() {
        // Port 1 on loopback: nothing listens there.
        let err = check_reachable("Kafka", "127.0.0.1:1").unwrap_err().to_string();
        assert!(err.contains("not reachable at 127.0.0.1:1"), "{err}");
        assert!(err.contains("scripts/services up"), "{err}");
    }

    #[test]
    fn mysql_url_host_is_parsed() {
        assert_eq!(
            mysql_host_port("mysql://u:p@127.0.0.1:13306/db").unwrap(),
            "127.0.0.1:13306"
        );
        assert!(mysql_host_port("postgres://x").is_err());
    }
}
