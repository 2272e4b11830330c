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
        }
    }

    /// Applies the transform. Returns false when a filter drops the record; `key` receives a
    /// new key from a key transform.
    pub fn apply(&self, value: &mut Value, key: &mut Option<Vec<u8>>) -> bool {
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
        }
    }
}
