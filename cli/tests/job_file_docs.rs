//! docs/job-files.md against the parser: every key the parser accepts in a section is in that
//! section's table, and every key a table lists is accepted — so the reference cannot drift.
//!
//! The parser is asked, not read: for each documented section, a valid job file (an example)
//! gets an unknown key in that section, and the parser's error names the keys it accepts there
//! ("unknown field `…`, expected one of `a`, `b`, …"). Sections of a tagged type (`type = "…"`)
//! are asked once per variant.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use exactly_cli::jobfile::Job;
use toml::{Table, Value};

const PROBE: &str = "zz_not_a_documented_key";

fn repo(path: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// One table of the reference: the section it documents and the keys in its first column.
#[derive(Debug)]
struct Documented {
    heading: String,
    /// The section's path (`sink.kafka.delivery` → ["sink", "kafka", "delivery"]); empty: the top.
    path: Vec<String>,
    /// `[[…]]`: the last component is an array of tables.
    array: bool,
    /// `with type = "…"` in the heading: the table documents that variant only.
    variant: Option<String>,
    keys: BTreeSet<String>,
    /// The quoted values the `type` row allows, if the table has one.
    types: Vec<String>,
}

fn backticked(s: &str) -> Vec<String> {
    s.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

fn quoted(s: &str) -> Vec<String> {
    s.split('"').skip(1).step_by(2).map(str::to_owned).collect()
}

fn documented() -> Vec<Documented> {
    let doc = repo("docs/job-files.md");
    let mut out: Vec<Documented> = Vec::new();
    let mut heading = String::new();
    let mut in_code = false;
    let mut in_table = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if line.starts_with('#') {
            heading = line.trim_start_matches('#').trim().to_owned();
            in_table = false;
            continue;
        }
        if line.starts_with("| key |") {
            let section = backticked(&heading).into_iter().find(|b| b.starts_with('['));
            let (path, array) = match &section {
                Some(s) if s.starts_with("[[") => (s.trim_matches(|c| c == '[' || c == ']').to_owned(), true),
                Some(s) => (s.trim_matches(|c| c == '[' || c == ']').to_owned(), false),
                None if heading == "Top level" => (String::new(), false),
                None => panic!("a key table under a heading without a section: {heading}"),
            };
            let variant = heading
                .split("type = \"")
                .nth(1)
                .map(|rest| rest.split('"').next().unwrap_or_default().to_owned());
            out.push(Documented {
                heading: heading.clone(),
                path: path.split('.').filter(|p| !p.is_empty()).map(str::to_owned).collect(),
                array,
                variant,
                keys: BTreeSet::new(),
                types: Vec::new(),
            });
            in_table = true;
            continue;
        }
        if in_table {
            if !line.starts_with('|') {
                in_table = false;
                continue;
            }
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let Some(key) = backticked(cells.get(1).copied().unwrap_or("")).into_iter().next() else {
                continue; // the header's rule
            };
            let table = out.last_mut().expect("a table");
            if key == "type" {
                table.types = quoted(cells.get(2).copied().unwrap_or(""));
            }
            table.keys.insert(key);
        }
    }
    assert!(out.len() >= 20, "the reference's tables were not found: {out:#?}");
    out
}

/// The example job file a section is probed in.
fn base(d: &Documented) -> Table {
    let file = match d.path.first().map(String::as_str) {
        Some("sink") if d.array && d.path.len() == 1 => "examples/orders-fan-out.toml",
        Some("sink") if d.path.get(1).map(String::as_str) == Some("mysql") => "examples/orders-k2m.toml",
        _ => "examples/orders-k2k.toml",
    };
    toml::from_str(&repo(file)).expect("the example parses as TOML")
}

/// The table at `path` in `root` (the first entry of an array), created where missing.
fn table_at<'a>(root: &'a mut Table, path: &[String], last_is_array: bool) -> &'a mut Table {
    let mut t = root;
    for (i, name) in path.iter().enumerate() {
        let last = i + 1 == path.len();
        let entry = t.entry(name.clone()).or_insert_with(|| {
            if last && last_is_array {
                Value::Array(vec![Value::Table(Table::new())])
            } else {
                Value::Table(Table::new())
            }
        });
        t = match entry {
            Value::Table(inner) => inner,
            Value::Array(items) => {
                if items.is_empty() {
                    items.push(Value::Table(Table::new()));
                }
                match &mut items[0] {
                    Value::Table(inner) => inner,
                    other => panic!("{name}: an array of {other:?}, not of tables"),
                }
            }
            other => panic!("{name} is {other:?}, not a table"),
        };
    }
    t
}

/// The keys the parser accepts in the table at `path` (as `variant` when given), or `None` when it
/// takes an unknown key there without complaint (a variant without fields).
fn accepted(d: &Documented, path: &[String], variant: Option<&str>) -> Option<BTreeSet<String>> {
    let mut root = base(d);
    let table = table_at(&mut root, path, d.array && path.len() == d.path.len());
    if let Some(v) = variant {
        table.clear();
        table.insert("type".into(), Value::String(v.to_owned()));
    }
    table.insert(PROBE.into(), Value::Integer(1));
    let src = toml::to_string(&root).expect("serializes");
    let message = match Job::parse(Path::new("probe.toml"), &src) {
        Ok(_) => String::new(),
        Err(e) => e.to_string(),
    };
    let Some(at) = message.find(&format!("unknown field `{PROBE}`")) else {
        assert!(
            variant.is_some(),
            "{}: the parser took an unknown key in [{}] without naming it:\n{message}\n{src}",
            d.heading,
            path.join(".")
        );
        return None;
    };
    let rest = &message[at + PROBE.len() + 16..];
    let rest = rest.lines().next().unwrap_or_default();
    if rest.contains("there are no fields") {
        return Some(BTreeSet::new());
    }
    Some(backticked(rest).into_iter().collect())
}

#[test]
fn every_key_the_parser_accepts_is_documented_and_every_documented_key_is_accepted() {
    let tables = documented();
    let mut problems = Vec::new();
    let mut variant_tables: BTreeSet<(Vec<String>, String)> = BTreeSet::new();
    for d in &tables {
        if let Some(v) = &d.variant {
            variant_tables.insert((d.path.clone(), v.clone()));
        }
    }
    for d in &tables {
        let compare = |what: String, doc: BTreeSet<String>, parser: BTreeSet<String>| -> Option<String> {
            let undocumented: Vec<_> = parser.difference(&doc).collect();
            let unknown: Vec<_> = doc.difference(&parser).collect();
            (!undocumented.is_empty() || !unknown.is_empty()).then(|| {
                format!(
                    "{what} (\"{}\"): accepted but not documented {undocumented:?}; documented but not accepted {unknown:?}",
                    d.heading
                )
            })
        };
        if d.keys.iter().any(|k| k.contains('.')) {
            // Dotted keys ([kafka]): each level of the nesting is a table of its own.
            let mut levels: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
            for key in &d.keys {
                let parts: Vec<String> = key.split('.').map(str::to_owned).collect();
                for i in 0..parts.len() {
                    levels.entry(parts[..i].to_vec()).or_default().insert(parts[i].clone());
                }
            }
            for (prefix, doc) in levels {
                let path: Vec<String> = d.path.iter().cloned().chain(prefix.iter().cloned()).collect();
                let parser = accepted(d, &path, None).unwrap_or_default();
                problems.extend(compare(format!("[{}]", path.join(".")), doc, parser));
            }
            continue;
        }
        let mut doc = d.keys.clone();
        let section = format!("[{}]", d.path.join("."));
        // A `type` row is a tag when the parser, asked with that `type`, does not list `type`
        // among the keys (a variant's fields); otherwise it is a key like any other (a column's
        // SQL type).
        let tagged = doc.contains("type")
            && !d.types.is_empty()
            && !accepted(d, &d.path, Some(&d.types[0])).is_some_and(|keys| keys.contains("type"));
        match (&d.variant, tagged) {
            (Some(v), _) => {
                doc.remove("type");
                let parser = accepted(d, &d.path, Some(v)).unwrap_or_default();
                problems.extend(compare(format!("{section} type = \"{v}\""), doc, parser));
            }
            (None, true) => {
                doc.remove("type");
                let mut union = BTreeSet::new();
                for v in &d.types {
                    let fields = accepted(d, &d.path, Some(v)).unwrap_or_default();
                    if doc.is_empty() && !fields.is_empty() && !variant_tables.contains(&(d.path.clone(), v.clone())) {
                        problems.push(format!(
                            "{section} type = \"{v}\" takes {fields:?} but has no table of its own"
                        ));
                    }
                    union.extend(fields);
                }
                if !doc.is_empty() {
                    problems.extend(compare(section, doc, union));
                }
            }
            (None, false) => {
                let parser = accepted(d, &d.path, None).unwrap_or_default();
                problems.extend(compare(section, doc, parser));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "docs/job-files.md and the parser disagree:\n{}",
        problems.join("\n")
    );
}

/// The probe itself: a key the parser does not know is found undocumented, and a documented key
/// the parser does not accept is found too (so the test above can fail).
#[test]
fn the_probe_sees_a_missing_and_an_extra_key() {
    let mut tables = documented();
    let job = tables
        .iter_mut()
        .find(|d| d.path == ["job"] && d.variant.is_none())
        .expect("[job]");
    let parser = accepted(job, &job.path.clone(), None).expect("[job] names its keys");
    assert!(parser.contains("name") && parser.contains("parallelism"), "{parser:?}");
    assert!(!parser.contains("not_a_job_key"));
    let restart = tables
        .iter()
        .find(|d| d.path == ["restart"] && d.variant.as_deref() == Some("fixed_delay"))
        .expect("[restart] fixed_delay");
    let fields = accepted(restart, &restart.path, Some("fixed_delay")).expect("fixed_delay names its keys");
    assert_eq!(fields, BTreeSet::from(["attempts".to_owned(), "delay".to_owned()]));
}
