//! The statements of the progress tables, built for a dialect that numbers its placeholders and
//! records what runs (the sinks' own tests check their dialects' SQL, and the integration tests
//! run it on the servers).

use super::*;

/// Numbered placeholders (`$1`, JSON cast), `ON CONFLICT`; runs nothing, keeps what it was given.
struct Numbered;

/// What ran, and what `fetch_int` answers.
#[derive(Default)]
struct Recorded {
    ran: Vec<Statement>,
    answer: Option<i64>,
}

impl Dialect for Numbered {
    type Connection = Recorded;
    fn quote(&self, name: &str) -> String {
        format!("\"{name}\"")
    }
    fn placeholder(&self, n: usize, arg: &Arg) -> String {
        match arg {
            Arg::Json(_) => format!("${n}::jsonb"),
            _ => format!("${n}"),
        }
    }
    fn create_progress_tables(&self, progress: &str, through: &str) -> [String; 2] {
        [format!("CREATE {progress}"), format!("CREATE {through}")]
    }
    fn on_conflict(&self, table: &str, key: &[&str], set: &[(&str, Set)]) -> String {
        let set: Vec<String> = set
            .iter()
            .map(|(c, s)| match s {
                Set::New => format!("{c} = EXCLUDED.{c}"),
                Set::Greatest => format!("{c} = GREATEST({table}.{c}, EXCLUDED.{c})"),
                Set::Now => format!("{c} = now()"),
            })
            .collect();
        format!("ON CONFLICT ({}) DO UPDATE SET {}", key.join(", "), set.join(", "))
    }
    fn execute<'a>(&'a self, conn: &'a mut Recorded, statement: &'a Statement) -> BoxFut<'a, Result<(), sqlx::Error>> {
        conn.ran.push(statement.clone());
        Box::pin(async { Ok(()) })
    }
    fn fetch_int<'a>(
        &'a self,
        conn: &'a mut Recorded,
        statement: &'a Statement,
    ) -> BoxFut<'a, Result<Option<i64>, sqlx::Error>> {
        conn.ran.push(statement.clone());
        let answer = conn.answer;
        Box::pin(async move { Ok(answer) })
    }
}

const P: Progress<'static> = Progress {
    table: "exactly_progress",
    job: "orders",
    sink: "db",
};

fn text(s: &str) -> Arg {
    Arg::Text(s.into())
}

/// Every placeholder `$1` … `$n` appears once, in order, for the n arguments.
fn numbered_in_order(s: &Statement) {
    let mut from = 0;
    for n in 1..=s.args.len() {
        let at = s.sql[from..]
            .find(&format!("${n}"))
            .unwrap_or_else(|| panic!("${n} after {from} in {}", s.sql));
        from += at + 1;
    }
    assert!(!s.sql.contains(&format!("${}", s.args.len() + 1)), "{}", s.sql);
}

#[test]
fn a_progress_row_is_written_with_its_offsets_and_replaces_one_of_the_same_checkpoint() {
    let offsets = BTreeMap::from([("in:0".to_string(), 42), ("in:1".to_string(), 7)]);
    let s = P.record_statement(&Numbered, 3, 17, &offsets, 500);
    assert_eq!(
        s.sql,
        "INSERT INTO \"exactly_progress\" (job, sink, subtask, checkpoint_id, offsets, rows_written) \
         VALUES ($1, $2, $3, $4, $5::jsonb, $6) ON CONFLICT (job, sink, subtask, checkpoint_id) DO UPDATE SET \
         offsets = EXCLUDED.offsets, rows_written = EXCLUDED.rows_written, committed_at = now()"
    );
    assert_eq!(
        s.args,
        [
            text("orders"),
            text("db"),
            Arg::Int(3),
            Arg::Int(17),
            Arg::Json(r#"{"in:0":42,"in:1":7}"#.into()),
            Arg::Int(500)
        ]
    );
}

#[test]
fn a_checkpoint_committed_when_its_row_or_a_summary_at_or_after_it_exists() {
    let s = P.committed_statement(&Numbered, 1, 9);
    assert_eq!(
        s.sql,
        "SELECT (SELECT COUNT(*) FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND subtask = $3 AND checkpoint_id = $4) \
         + (SELECT COUNT(*) FROM \"exactly_progress_through\" WHERE job = $5 AND sink = $6 AND subtask = $7 AND committed_through >= $8)"
    );
    let row = [text("orders"), text("db"), Arg::Int(1), Arg::Int(9)];
    assert_eq!(s.args, [row.clone(), row].concat());
}

#[test]
fn subtask_zero_answers_for_the_subtasks_a_rescale_down_left_behind_and_others_for_themselves() {
    let zero = P.committed_through_statement(&Numbered, 0, 4);
    let two = P.committed_through_statement(&Numbered, 2, 4);
    numbered_in_order(&zero);
    assert_eq!(
        zero.sql,
        "SELECT GREATEST(COALESCE((SELECT MAX(checkpoint_id) FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 \
         AND (subtask = $3 OR subtask >= $4)), 0), COALESCE((SELECT MAX(committed_through) FROM \"exactly_progress_through\" \
         WHERE job = $5 AND sink = $6 AND (subtask = $7 OR subtask >= $8)), 0))"
    );
    let of = |subtask, beyond| [text("orders"), text("db"), Arg::Int(subtask), Arg::Int(beyond)];
    assert_eq!(zero.args, [of(0, 4), of(0, 4)].concat());
    assert_eq!(two.args, [of(2, i64::MAX), of(2, i64::MAX)].concat());
    let [rows, summaries] = P.forget_after_statements(&Numbered, 0, 4, 11);
    assert_eq!(
        rows.sql,
        "DELETE FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND (subtask = $3 OR subtask >= $4) AND checkpoint_id > $5"
    );
    assert_eq!(rows.args, [of(0, 4).to_vec(), vec![Arg::Int(11)]].concat());
    assert_eq!(
        summaries.sql,
        "UPDATE \"exactly_progress_through\" SET committed_through = $1 WHERE job = $2 AND sink = $3 \
         AND (subtask = $4 OR subtask >= $5) AND committed_through > $6"
    );
    assert_eq!(
        summaries.args,
        [vec![Arg::Int(11)], of(0, 4).to_vec(), vec![Arg::Int(11)]].concat()
    );
}

#[test]
fn summarising_moves_the_summary_up_only_and_prunes_strictly_before_the_checkpoint() {
    let [summary, prune] = P.summarise_statements(&Numbered, 2, 30);
    assert_eq!(
        summary.sql,
        "INSERT INTO \"exactly_progress_through\" (job, sink, subtask, committed_through) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (job, sink, subtask) DO UPDATE SET committed_through = GREATEST(\"exactly_progress_through\".committed_through, EXCLUDED.committed_through)"
    );
    assert_eq!(
        prune.sql,
        "DELETE FROM \"exactly_progress\" WHERE job = $1 AND sink = $2 AND subtask = $3 AND checkpoint_id < $4"
    );
    for s in [&summary, &prune] {
        assert_eq!(s.args, [text("orders"), text("db"), Arg::Int(2), Arg::Int(30)]);
    }
}

/// The answers: a positive count is a commit, none or zero is not; a newest checkpoint of 0 (no
/// rows: COALESCE) or NULL is none.
#[tokio::test]
async fn the_answers_are_read_as_committed_or_not_and_the_newest_or_none() {
    let mut conn = Recorded::default();
    for (answer, committed, newest) in [
        (None, false, None),
        (Some(0), false, None),
        (Some(1), true, Some(1)),
        (Some(2), true, Some(2)),
    ] {
        conn.answer = answer;
        assert_eq!(P.committed(&Numbered, &mut conn, 0, 1).await.unwrap(), committed);
        assert_eq!(P.committed_through(&Numbered, &mut conn, 0, 1).await.unwrap(), newest);
    }
    conn.ran.clear();
    P.summarise(&Numbered, &mut conn, 0, 5).await.unwrap();
    P.forget_after(&Numbered, &mut conn, 0, 1, 5).await.unwrap();
    P.create(&Numbered, &mut conn).await.unwrap();
    let ran: Vec<&str> = conn.ran.iter().map(|s| s.sql.split(' ').next().unwrap()).collect();
    assert_eq!(ran, ["INSERT", "DELETE", "DELETE", "UPDATE", "CREATE", "CREATE"]);
    assert_eq!(conn.ran[4].sql, "CREATE \"exactly_progress\"");
    assert_eq!(conn.ran[5].sql, "CREATE \"exactly_progress_through\"");
}

/// A checkpoint id the tables' BIGINT cannot hold is refused, never written as another id.
#[tokio::test]
async fn an_id_beyond_bigint_is_refused_before_any_statement_runs() {
    let mut conn = Recorded::default();
    let too_large = i64::MAX as u64 + 1;
    let offsets = BTreeMap::new();
    assert!(P.record(&Numbered, &mut conn, 0, too_large, &offsets, 1).await.is_err());
    assert!(P.committed(&Numbered, &mut conn, 0, too_large).await.is_err());
    assert!(P.summarise(&Numbered, &mut conn, 0, too_large).await.is_err());
    assert!(P.forget_after(&Numbered, &mut conn, 0, 1, too_large).await.is_err());
    assert!(conn.ran.is_empty());
    P.record(&Numbered, &mut conn, 0, i64::MAX as u64, &offsets, 1)
        .await
        .unwrap();
}

#[test]
fn arguments_bind_every_arg_in_order() {
    use sqlx::Arguments as _;
    let statement = Statement {
        sql: "INSERT INTO t VALUES (?, ?, ?)".into(),
        args: vec![Arg::Text("job".into()), Arg::Int(-7), Arg::Json("{}".into())],
    };
    let args = statement.arguments::<sqlx::MySql>().expect("binds");
    assert_eq!(args.len(), 3);
    let none = Statement {
        sql: "SELECT 1".into(),
        args: vec![],
    };
    assert_eq!(none.arguments::<sqlx::MySql>().expect("binds").len(), 0);
}
