//! Test harness for scenarios that run against a real Apache Kafka broker and a real MariaDB/MySQL.
//!
//! [`TestEnv::get`] finds the services: the endpoints in `EXACTLY_KAFKA_BOOTSTRAP` and
//! `EXACTLY_MYSQL_URL` (printed by `scripts/services env`), else containers started with
//! testcontainers when a Docker engine answers, else it fails with a message that says how to start
//! them. There is no third way: a scenario never passes without the service it tests.
//!
//! Every scenario names its topics, groups and transactional ids with [`unique`], so tests can run
//! in parallel against one broker, and checks what it wrote with an independent `read_committed`
//! consumer ([`read_committed`]) or SQL, polling with deadlines rather than sleeping.

pub mod acls;
mod child;
mod env;
mod ids;
mod jobs;
mod kafka;
mod mysql;
mod owner;
mod postgres;
mod proxy;

pub use child::{fails_at_start, fails_at_start_env, refused_fresh_start, signal, verify_job, ChildJob};
pub use env::{TestEnv, HOW_TO_START, S3};
pub use ids::unique;
pub use jobs::{damage_newest_checkpoint, eventually, subtask_info, within, Committed, CommittingCollector};
pub use kafka::{
    create_topic, create_topic_with, delete_records_before, high_watermark, produce, read_committed, read_uncommitted,
    recreate_topic, transactional_producer, wait_for_committed, wait_for_uncommitted, CommittedRecord, Feed,
};
pub use mysql::{connect_mysql, execute, query_i64, query_pairs};
pub use owner::OwnerLostAfter;
pub use postgres::{connect_postgres, pg_execute, pg_i64, postgres_url, HOW_TO_START_POSTGRES};
pub use proxy::Proxy;
