//! What `exactly verify` found: the report, as JSON (`--json`) or for people.

use serde::Serialize;

/// One example of a problem.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Example {
    /// The id, as read.
    pub id: String,
    /// Where it was read: `topic-partition@offset` (for the input or a topic), or `table` with
    /// the count of rows.
    pub at: Vec<String>,
}

/// The report.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Report {
    /// The input read ("orders", "orders:100..200").
    pub source: String,
    /// The output read.
    pub output: String,
    /// Input records read in the range.
    pub input_records: u64,
    /// Input records the output should hold (read, minus filtered and unreadable).
    pub expected: u64,
    /// Input records the job's transforms drop.
    pub filtered: u64,
    /// Input records without a value, not JSON, or without the id field (not expected).
    pub input_unreadable: u64,
    /// Ids that occur more than once in the input (each must then occur as often in the
    /// output).
    pub input_repeated_ids: u64,
    /// Output records (or rows) read.
    pub output_records: u64,
    /// Output records without a readable id.
    pub output_unreadable: u64,
    /// Expected records missing from the output.
    pub lost: u64,
    /// Output records beyond the expected count of their id.
    pub duplicated: u64,
    /// Output records whose id is not in the input range (only a failure when the whole topic
    /// was read: with a range, the output also holds what lies outside it).
    pub outside_input: u64,
    /// Output records whose order value is below that of an earlier record of the same key.
    pub out_of_order: Option<u64>,
    /// Sorted runs spilled to disk.
    pub spilled_runs: usize,
    /// Whether the output holds every expected record exactly once (and in order, if asked).
    pub exactly_once: bool,
    /// Examples of lost records.
    pub lost_examples: Vec<Example>,
    /// Examples of duplicated records.
    pub duplicated_examples: Vec<Example>,
    /// Examples of records outside the input.
    pub outside_examples: Vec<Example>,
    /// Examples of out-of-order records (the earlier record's place, then this one's).
    pub out_of_order_examples: Vec<Example>,
}

/// The report for people.
pub fn print(r: &Report) {
    println!("exactly verify: {} -> {}", r.source, r.output);
    println!(
        "  input:  {} records read, {} expected in the output ({} filtered by the job, {} without a readable id)",
        r.input_records, r.expected, r.filtered, r.input_unreadable
    );
    if r.input_repeated_ids > 0 {
        println!(
            "          {} ids occur more than once in the input (each is expected as often in the output)",
            r.input_repeated_ids
        );
    }
    println!(
        "  output: {} records read ({} without a readable id)",
        r.output_records, r.output_unreadable
    );
    println!("  lost:         {}", r.lost);
    println!("  duplicated:   {}", r.duplicated);
    println!("  not in input: {}", r.outside_input);
    if let Some(n) = r.out_of_order {
        println!("  out of order: {n}");
    }
    let show = |title: &str, list: &[Example]| {
        if !list.is_empty() {
            println!("  {title}:");
            for e in list {
                println!("    id {} at {}", e.id, e.at.join(", "));
            }
        }
    };
    show("lost, for example", &r.lost_examples);
    show("duplicated, for example", &r.duplicated_examples);
    show("not in input, for example", &r.outside_examples);
    show(
        "out of order, for example (earlier record, then this one)",
        &r.out_of_order_examples,
    );
    if r.exactly_once {
        println!("EXACTLY ONCE: every expected record is in the output once.");
    } else {
        println!("NOT EXACTLY ONCE.");
    }
}
