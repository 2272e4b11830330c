//! Record transforms (`[[transform]]`): what each checks in the job file and does to a record's
//! JSON value.

use serde::Deserialize;
use serde_json::Value;

/// A record transform (`[[transform]]` with `type = ...`), applied to the record's JSON value.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Transform {
    /// Keeps records whose `field` satisfies exactly one condition: `equals`, `not_equals`,
    /// `one_of` or `exists`.
    Filter {
        /// A field name; nested fields with dots ("customer.country").
        field: String,
        /// Keep when the field equals this value.
        #[serde(default)]
        equals: Option<Value>,
        /// Keep when the field is absent or differs from this value.
        #[serde(default)]
        not_equals: Option<Value>,
        /// Keep when the field equals one of these values.
        #[serde(default)]
        one_of: Option<Vec<Value>>,
        /// Keep when the field is present (true) or absent (false).
        #[serde(default)]
        exists: Option<bool>,
    },
    /// Keeps only these top-level fields (in this order).
    Project {
        /// Field names.
        fields: Vec<String>,
    },
    /// Renames a top-level field.
    Rename {
        /// Current name.
        from: String,
        /// New name.
        to: String,
    },
    /// Sets the record key to the field's value (strings as they are, anything else as JSON).
    Key {
        /// A field name; nested fields with dots.
        field: String,
    },
    /// Unwraps a Debezium change event (JSON, with or without the converter's `schema` /
    /// `payload` wrapper): a create, a snapshot read or an update becomes its `after` row; a
    /// delete becomes a deletion of the record's key (a tombstone); the key loses its wrapper
    /// too. Anything else (a truncate, a message, not a change event) is a record this transform
    /// cannot apply: the source's `on_deserialization_error` policy decides. A Kafka tombstone (a
    /// compacted topic may keep it and not the delete before it) is a deletion of its key too.
    /// First in the job's transforms, followed by `project` at most; upsert-mode sinks only.
    Debezium,
}

/// What a transform did with a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Go on with the (changed) value.
    Keep,
    /// A filter dropped the record.
    Drop,
    /// The record is now a deletion of its key (a tombstone): no further transform applies.
    Delete,
}

/// Whether `v` is the Debezium JSON converter's wrapper (`schemas.enable=true`):
/// `{"schema": …, "payload": …}`.
fn wrapped(v: &Value) -> bool {
    matches!(v, Value::Object(m) if m.len() == 2 && m.contains_key("schema") && m.contains_key("payload"))
}

/// `v` without the converter's wrapper.
fn unwrapped(v: Value) -> Value {
    match v {
        Value::Object(mut m) if m.len() == 2 && m.contains_key("schema") => {
            m.remove("payload").unwrap_or(Value::Object(m))
        }
        other => other,
    }
}

fn field<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(value, |v, k| v.get(k))
}

impl Transform {
    pub(super) fn check(&self) -> Result<(), String> {
        match self {
            Transform::Filter {
                field,
                equals,
                not_equals,
                one_of,
                exists,
            } => {
                if field.is_empty() {
                    return Err("field must not be empty".into());
                }
                let n = [
                    equals.is_some(),
                    not_equals.is_some(),
                    one_of.is_some(),
                    exists.is_some(),
                ]
                .iter()
                .filter(|b| **b)
                .count();
                if n != 1 {
                    return Err(format!(
                        "a filter takes exactly one of `equals`, `not_equals`, `one_of`, `exists` (found {n})"
                    ));
                }
                Ok(())
            }
            Transform::Project { fields } => {
                if fields.is_empty() {
                    return Err("project needs at least one field in `fields`".into());
                }
                Ok(())
            }
            Transform::Rename { from, to } => {
                if from.is_empty() || to.is_empty() {
                    return Err("rename needs non-empty `from` and `to`".into());
                }
                Ok(())
            }
            Transform::Key { field } => {
                if field.is_empty() {
                    return Err("field must not be empty".into());
                }
                Ok(())
            }
            Transform::Debezium => Ok(()),
        }
    }

    /// Applies the transform and says whether the record goes on; filters only (no error, no
    /// deletion): for callers that know their transforms are not `debezium`.
    pub fn keeps(&self, value: &mut Value, key: &mut Option<Vec<u8>>) -> bool {
        self.apply(value, key) == Ok(Change::Keep)
    }

    /// Applies the transform: [`Change::Drop`] when a filter drops the record, [`Change::Delete`]
    /// when it became a deletion of its key; `key` receives a new key from a key or debezium
    /// transform. An error: a record the transform cannot apply (`debezium` on something other
    /// than a change event).
    pub fn apply(&self, value: &mut Value, key: &mut Option<Vec<u8>>) -> Result<Change, String> {
        if let Transform::Debezium = self {
            return debezium(value, key);
        }
        Ok(if self.filter(value, key) {
            Change::Keep
        } else {
            Change::Drop
        })
    }

    fn filter(&self, value: &mut Value, key: &mut Option<Vec<u8>>) -> bool {
        match self {
            Transform::Filter {
                field: f,
                equals,
                not_equals,
                one_of,
                exists,
            } => {
                let v = field(value, f);
                if let Some(e) = equals {
                    return v == Some(e);
                }
                if let Some(e) = not_equals {
                    return v != Some(e);
                }
                if let Some(list) = one_of {
                    return v.is_some_and(|v| list.contains(v));
                }
                if let Some(e) = exists {
                    return v.is_some() == *e;
                }
                true
            }
            Transform::Project { fields } => {
                if let Value::Object(map) = value {
                    let mut out = serde_json::Map::new();
                    for f in fields {
                        if let Some(v) = map.remove(f) {
                            out.insert(f.clone(), v);
                        }
                    }
                    *map = out;
                }
                true
            }
            Transform::Rename { from, to } => {
                if let Value::Object(map) = value {
                    if let Some(v) = map.remove(from) {
                        map.insert(to.clone(), v);
                    }
                }
                true
            }
            Transform::Key { field: f } => {
                *key = field(value, f).map(|v| match v {
                    Value::String(s) => s.clone().into_bytes(),
                    other => other.to_string().into_bytes(),
                });
                true
            }
            Transform::Debezium => true,
        }
    }
}

/// Where a `debezium` transform sits that it must not: not first, or followed by anything but
/// `project` (the index of the offending transform).
pub(super) fn debezium_misplaced(transforms: &[Transform]) -> Option<usize> {
    let at = transforms.iter().position(|t| matches!(t, Transform::Debezium))?;
    if at > 0 {
        return Some(at);
    }
    transforms
        .iter()
        .enumerate()
        .skip(1)
        .find(|(_, t)| !matches!(t, Transform::Project { .. }))
        .map(|(i, _)| i)
}

/// A Debezium record's key without the JSON converter's schema wrapper (as it is, when it has
/// none or is not JSON).
pub fn debezium_key(key: Option<Vec<u8>>) -> Option<Vec<u8>> {
    let k = key?;
    match serde_json::from_slice::<Value>(&k) {
        Ok(v) if wrapped(&v) => serde_json::to_vec(&unwrapped(v)).ok().or(Some(k)),
        _ => Some(k),
    }
}

/// The `debezium` transform (see [`Transform::Debezium`]).
fn debezium(value: &mut Value, key: &mut Option<Vec<u8>>) -> Result<Change, String> {
    let event = unwrapped(std::mem::take(value));
    *key = debezium_key(key.take());
    let Value::Object(mut event) = event else {
        return Err("not a Debezium change event: the value is not a JSON object".into());
    };
    let op = event.get("op").and_then(Value::as_str).map(str::to_owned);
    match op.as_deref() {
        Some("c" | "r" | "u") => match event.remove("after") {
            Some(after @ Value::Object(_)) => {
                *value = after;
                Ok(Change::Keep)
            }
            _ => Err(format!(
                "a Debezium {:?} event without an `after` row",
                op.unwrap_or_default()
            )),
        },
        Some("d") => {
            if key.is_none() {
                return Err("a Debezium delete without a key cannot say which row to delete".into());
            }
            Ok(Change::Delete)
        }
        Some(other) => Err(format!(
            "a Debezium {other:?} event (truncate or message) cannot be applied row by row"
        )),
        None => Err("not a Debezium change event: no `op` field".into()),
    }
}
