//! The progress tables: the proof of which checkpoints a SQL sink committed.
//!
//! A sink writes a checkpoint's progress row in the database transaction that holds the
//! checkpoint's rows ([`Progress::record`]), so the row exists exactly when they committed. After
//! a restart [`Progress::committed`] answers whether one checkpoint committed and
//! [`Progress::committed_through`] which is the newest (what the restore is checked against);
//! [`Progress::forget_after`] forgets the commits of checkpoints a restore goes back behind. Once a
//! checkpoint committed, [`Progress::summarise`] moves the subtask's summary row (the table
//! `<progress>_through`: per subtask, the checkpoint through which everything committed) and
//! deletes the rows before it, so the tables stay at about one row per subtask plus the
//! checkpoints in flight, however old a restored savepoint is.
//!
//! Rows are keyed by job, sink, subtask and checkpoint: the ranges of a job split over processes
//! keep checkpoint ids of their own. Subtask 0 also answers for the subtasks at or above the
//! parallelism (a job rescaled down).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

/// A boxed, `Send` future. Every database call goes through one: sqlx's executor bounds trip the
/// compiler's `Send` inference of futures in trait methods otherwise.
pub type BoxFut<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A value bound to one placeholder of a [`Statement`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    /// A string.
    Text(String),
    /// An integer (`BIGINT`; the database converts it for an `INT` column).
    Int(i64),
    /// A JSON document as text (the dialect may cast its placeholder).
    Json(String),
}

/// SQL and its arguments, one per placeholder, in the order they appear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Statement {
    /// The SQL text with the dialect's placeholders.
    pub sql: String,
    /// The arguments, in placeholder order.
    pub args: Vec<Arg>,
}

impl Statement {
    /// The statement's arguments as the database `DB`'s: each [`Arg::Text`] and [`Arg::Json`]
    /// bound as a string, each [`Arg::Int`] as a 64-bit integer. For a [`Dialect`]'s `execute`
    /// (`sqlx::query_with`) and `fetch_int` (`sqlx::query_scalar_with`).
    pub fn arguments<'q, DB>(&'q self) -> Result<DB::Arguments<'q>, sqlx::error::BoxDynError>
    where
        DB: sqlx::Database,
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        use sqlx::Arguments as _;
        let mut out = DB::Arguments::<'q>::default();
        for arg in &self.args {
            match arg {
                Arg::Text(s) | Arg::Json(s) => out.add(s.as_str())?,
                Arg::Int(i) => out.add(*i)?,
            }
        }
        Ok(out)
    }
}

/// What an upsert sets a column of the row already there to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Set {
    /// The value the statement tried to insert.
    New,
    /// The larger of the row's value and the one tried.
    Greatest,
    /// The current time.
    Now,
}

/// What one database says differently, and how a statement runs on its connection.
pub trait Dialect: Send + Sync {
    /// A connection to the database.
    type Connection: Send;
    /// `name` quoted as an identifier.
    fn quote(&self, name: &str) -> String;
    /// The placeholder of the `n`th argument (from 1), which is `arg`.
    fn placeholder(&self, n: usize, arg: &Arg) -> String;
    /// `CREATE TABLE IF NOT EXISTS` of the progress table `progress` — columns job, sink
    /// (text), subtask (integer), checkpoint_id (bigint), offsets (JSON), rows_written (bigint),
    /// committed_at (a timestamp, now by default), keyed by (job, sink, subtask, checkpoint_id)
    /// — and of the summary table `through` — job, sink, subtask, committed_through (bigint),
    /// keyed by (job, sink, subtask). Both names are quoted.
    fn create_progress_tables(&self, progress: &str, through: &str) -> [String; 2];
    /// What follows `INSERT INTO table (…) VALUES (…)` so that a row whose key (`key`) is
    /// already there gets the columns of `set` instead. `table` is quoted.
    fn on_conflict(&self, table: &str, key: &[&str], set: &[(&str, Set)]) -> String;
    /// Runs `statement`.
    fn execute<'a>(
        &'a self,
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<(), sqlx::Error>>;
    /// Runs `statement`, which returns one row of one integer column (which may be NULL).
    fn fetch_int<'a>(
        &'a self,
        conn: &'a mut Self::Connection,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<Option<i64>, sqlx::Error>>;
}

/// A failed statement and what it was for.
#[derive(Debug)]
pub struct DbError {
    /// What was being done ("writing the progress row").
    pub context: &'static str,
    /// The driver's error.
    pub source: sqlx::Error,
}

fn failed(context: &'static str) -> impl FnOnce(sqlx::Error) -> DbError {
    move |source| DbError { context, source }
}

/// One statement being written: text, and placeholders numbered as the arguments come.
struct Builder<'d, D> {
    dialect: &'d D,
    statement: Statement,
}

impl<'d, D: Dialect> Builder<'d, D> {
    fn new(dialect: &'d D, sql: impl Into<String>) -> Self {
        Builder {
            dialect,
            statement: Statement {
                sql: sql.into(),
                args: Vec::new(),
            },
        }
    }

    fn sql(mut self, text: &str) -> Self {
        self.statement.sql.push_str(text);
        self
    }

    fn arg(mut self, arg: Arg) -> Self {
        let n = self.statement.args.len() + 1;
        let placeholder = self.dialect.placeholder(n, &arg);
        self.statement.sql.push_str(&placeholder);
        self.statement.args.push(arg);
        self
    }

    fn int(self, value: impl Into<i64>) -> Self {
        self.arg(Arg::Int(value.into()))
    }

    fn done(self) -> Statement {
        self.statement
    }
}

/// The progress tables of one sink of one job.
#[derive(Debug, Clone, Copy)]
pub struct Progress<'a> {
    /// The progress table's name (unquoted); the summary table is `<name>_through`.
    pub table: &'a str,
    /// The job's id (the sink's `job_id`).
    pub job: &'a str,
    /// The sink's id within the job.
    pub sink: &'a str,
}

/// A checkpoint id as the tables hold it (`BIGINT`; [`fits`] refuses larger ones before a
/// statement is built).
fn id_arg(id: u64) -> Arg {
    Arg::Int(i64::try_from(id).unwrap_or(i64::MAX))
}

/// Refuses a checkpoint id the tables' `BIGINT` cannot hold (ids count up from 1; one this large
/// would otherwise read as every larger one).
fn fits(id: u64, context: &'static str) -> Result<(), DbError> {
    if i64::try_from(id).is_ok() {
        return Ok(());
    }
    Err(DbError {
        context,
        source: sqlx::Error::Encode(format!("checkpoint id {id} is beyond the progress tables' BIGINT").into()),
    })
}

impl<'a> Progress<'a> {
    fn through(&self) -> String {
        format!("{}_through", self.table)
    }

    /// `… WHERE job = ? AND sink = ? AND subtask = ?`
    fn of<'d, D: Dialect>(&self, b: Builder<'d, D>, subtask: u32) -> Builder<'d, D> {
        b.sql(" WHERE job = ")
            .arg(Arg::Text(self.job.into()))
            .sql(" AND sink = ")
            .arg(Arg::Text(self.sink.into()))
            .sql(" AND subtask = ")
            .int(subtask)
    }

    /// `… WHERE job = ? AND sink = ? AND (subtask = ? OR subtask >= ?)`: subtask 0 answers for
    /// those at or above `parallelism` too (a job rescaled down).
    fn of_or_beyond<'d, D: Dialect>(&self, b: Builder<'d, D>, subtask: u32, parallelism: u32) -> Builder<'d, D> {
        let beyond = if subtask == 0 { i64::from(parallelism) } else { i64::MAX };
        b.sql(" WHERE job = ")
            .arg(Arg::Text(self.job.into()))
            .sql(" AND sink = ")
            .arg(Arg::Text(self.sink.into()))
            .sql(" AND (subtask = ")
            .int(subtask)
            .sql(" OR subtask >= ")
            .int(beyond)
            .sql(")")
    }

    /// The statements that create both tables when they are missing.
    pub fn create_statements<D: Dialect>(&self, d: &D) -> [Statement; 2] {
        d.create_progress_tables(&d.quote(self.table), &d.quote(&self.through()))
            .map(|sql| Builder::new(d, sql).done())
    }

    /// The statement that records checkpoint `id` of `subtask`: the next offset per topic
    /// partition, and the rows it wrote.
    pub fn record_statement<D: Dialect>(
        &self,
        d: &D,
        subtask: u32,
        id: u64,
        offsets: &BTreeMap<String, i64>,
        rows: u64,
    ) -> Statement {
        let table = d.quote(self.table);
        let offsets = serde_json::to_string(offsets).expect("a map of strings to numbers serializes");
        Builder::new(
            d,
            format!("INSERT INTO {table} (job, sink, subtask, checkpoint_id, offsets, rows_written) VALUES ("),
        )
        .arg(Arg::Text(self.job.into()))
        .sql(", ")
        .arg(Arg::Text(self.sink.into()))
        .sql(", ")
        .int(subtask)
        .sql(", ")
        .arg(id_arg(id))
        .sql(", ")
        .arg(Arg::Json(offsets))
        .sql(", ")
        .arg(Arg::Int(i64::try_from(rows).unwrap_or(i64::MAX)))
        .sql(") ")
        .sql(&d.on_conflict(
            &table,
            &["job", "sink", "subtask", "checkpoint_id"],
            &[
                ("offsets", Set::New),
                ("rows_written", Set::New),
                ("committed_at", Set::Now),
            ],
        ))
        .done()
    }

    /// The statement whose integer is positive when checkpoint `id` of `subtask` committed.
    pub fn committed_statement<D: Dialect>(&self, d: &D, subtask: u32, id: u64) -> Statement {
        let b = Builder::new(d, format!("SELECT (SELECT COUNT(*) FROM {}", d.quote(self.table)));
        let b = self.of(b, subtask).sql(" AND checkpoint_id = ").arg(id_arg(id));
        let b = b.sql(&format!(") + (SELECT COUNT(*) FROM {}", d.quote(&self.through())));
        self.of(b, subtask)
            .sql(" AND committed_through >= ")
            .arg(id_arg(id))
            .sql(")")
            .done()
    }

    /// The statements that move the summary of `subtask` to `id` and delete its rows before.
    pub fn summarise_statements<D: Dialect>(&self, d: &D, subtask: u32, id: u64) -> [Statement; 2] {
        let through = d.quote(&self.through());
        let summary = Builder::new(
            d,
            format!("INSERT INTO {through} (job, sink, subtask, committed_through) VALUES ("),
        )
        .arg(Arg::Text(self.job.into()))
        .sql(", ")
        .arg(Arg::Text(self.sink.into()))
        .sql(", ")
        .int(subtask)
        .sql(", ")
        .arg(id_arg(id))
        .sql(") ")
        .sql(&d.on_conflict(
            &through,
            &["job", "sink", "subtask"],
            &[("committed_through", Set::Greatest)],
        ))
        .done();
        // Strictly before `id`: the scan stops at row `id` (committed), never reaching the locked
        // row of a transaction still prepared.
        let b = Builder::new(d, format!("DELETE FROM {}", d.quote(self.table)));
        let prune = self.of(b, subtask).sql(" AND checkpoint_id < ").arg(id_arg(id)).done();
        [summary, prune]
    }

    /// The statement whose integer is the newest checkpoint of `subtask` that committed (0 for
    /// none).
    pub fn committed_through_statement<D: Dialect>(&self, d: &D, subtask: u32, parallelism: u32) -> Statement {
        let b = Builder::new(
            d,
            format!(
                "SELECT GREATEST(COALESCE((SELECT MAX(checkpoint_id) FROM {}",
                d.quote(self.table)
            ),
        );
        let b = self.of_or_beyond(b, subtask, parallelism).sql(&format!(
            "), 0), COALESCE((SELECT MAX(committed_through) FROM {}",
            d.quote(&self.through())
        ));
        self.of_or_beyond(b, subtask, parallelism).sql("), 0))").done()
    }

    /// The statements that forget the commits of `subtask` after `id`.
    pub fn forget_after_statements<D: Dialect>(
        &self,
        d: &D,
        subtask: u32,
        parallelism: u32,
        id: u64,
    ) -> [Statement; 2] {
        let b = Builder::new(d, format!("DELETE FROM {}", d.quote(self.table)));
        let rows = self
            .of_or_beyond(b, subtask, parallelism)
            .sql(" AND checkpoint_id > ")
            .arg(id_arg(id))
            .done();
        let b = Builder::new(
            d,
            format!("UPDATE {} SET committed_through = ", d.quote(&self.through())),
        )
        .arg(id_arg(id));
        let summaries = self
            .of_or_beyond(b, subtask, parallelism)
            .sql(" AND committed_through > ")
            .arg(id_arg(id))
            .done();
        [rows, summaries]
    }

    /// Creates both tables when they are missing.
    pub async fn create<D: Dialect>(&self, d: &D, conn: &mut D::Connection) -> Result<(), DbError> {
        for statement in self.create_statements(d) {
            d.execute(conn, &statement)
                .await
                .map_err(failed("creating the progress tables"))?;
        }
        Ok(())
    }

    /// Records checkpoint `id` of `subtask`, in the caller's transaction (the one that holds the
    /// checkpoint's rows).
    pub async fn record<D: Dialect>(
        &self,
        d: &D,
        conn: &mut D::Connection,
        subtask: u32,
        id: u64,
        offsets: &BTreeMap<String, i64>,
        rows: u64,
    ) -> Result<(), DbError> {
        fits(id, "writing the progress row")?;
        let statement = self.record_statement(d, subtask, id, offsets, rows);
        d.execute(conn, &statement)
            .await
            .map_err(failed("writing the progress row"))
    }

    /// Whether checkpoint `id` of `subtask` committed: its progress row exists, or the subtask's
    /// summary says everything through a later checkpoint committed.
    pub async fn committed<D: Dialect>(
        &self,
        d: &D,
        conn: &mut D::Connection,
        subtask: u32,
        id: u64,
    ) -> Result<bool, DbError> {
        fits(id, "reading the progress table")?;
        let statement = self.committed_statement(d, subtask, id);
        let n = d
            .fetch_int(conn, &statement)
            .await
            .map_err(failed("reading the progress table"))?;
        Ok(n.unwrap_or(0) > 0)
    }

    /// After checkpoint `id` of `subtask` committed: everything of the subtask through `id` has
    /// committed (the driver commits in checkpoint order, and a lost one stops the job), so the
    /// summary row moves to `id` and the per-checkpoint rows before it go.
    pub async fn summarise<D: Dialect>(
        &self,
        d: &D,
        conn: &mut D::Connection,
        subtask: u32,
        id: u64,
    ) -> Result<(), DbError> {
        fits(id, "writing the progress summary")?;
        let [summary, prune] = self.summarise_statements(d, subtask, id);
        d.execute(conn, &summary)
            .await
            .map_err(failed("writing the progress summary"))?;
        d.execute(conn, &prune)
            .await
            .map_err(failed("pruning the progress table"))
    }

    /// The newest checkpoint `subtask` committed (for subtask 0, also subtasks at or above
    /// `parallelism`: a job rescaled down), by its progress rows and summaries; `None` when there
    /// are none.
    pub async fn committed_through<D: Dialect>(
        &self,
        d: &D,
        conn: &mut D::Connection,
        subtask: u32,
        parallelism: u32,
    ) -> Result<Option<u64>, DbError> {
        let statement = self.committed_through_statement(d, subtask, parallelism);
        let newest = d
            .fetch_int(conn, &statement)
            .await
            .map_err(failed("reading the progress table"))?;
        Ok(newest.filter(|n| *n > 0).map(|n| n as u64))
    }

    /// Forgets the commits of checkpoints after `id` of `subtask` (and, for subtask 0, of subtasks
    /// at or above `parallelism`): their progress rows go and the summaries come back to `id`.
    pub async fn forget_after<D: Dialect>(
        &self,
        d: &D,
        conn: &mut D::Connection,
        subtask: u32,
        parallelism: u32,
        id: u64,
    ) -> Result<(), DbError> {
        fits(id, "forgetting progress rows")?;
        let [rows, summaries] = self.forget_after_statements(d, subtask, parallelism, id);
        d.execute(conn, &rows)
            .await
            .map_err(failed("forgetting progress rows"))?;
        d.execute(conn, &summaries)
            .await
            .map_err(failed("forgetting the progress summary"))
    }
}

#[cfg(test)]
#[path = "progress_tests.rs"]
mod tests;
