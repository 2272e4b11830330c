//! From records to rows: JSON fields to columns, or delimited text by position (the classic
//! `1,zs,18` -> `user(id, name, age)`).

use serde::{Deserialize, Serialize};

use crate::error::{MysqlSinkError, Result};

/// How a record's payload is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Format {
    /// A JSON object; columns name fields (dots reach into nested objects).
    Json,
    /// Delimited text; columns take fields by position.
    Delimited {
        /// The field separator.
        #[serde(default = "default_delimiter")]
        delimiter: char,
    },
}

fn default_delimiter() -> char {
    ','
}

/// SQL column types the mapping converts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ColumnType {
    /// 64-bit integer.
    Bigint,
    /// 32-bit integer.
    Int,
    /// Double precision float.
    Double,
    /// Boolean (TINYINT(1)).
    Boolean,
    /// VARCHAR(length).
    Varchar,
    /// TEXT.
    Text,
    /// DATETIME(3), from "YYYY-MM-DD HH:MM:SS[.fff]" text.
    Datetime,
}

/// One column.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// Column type.
    #[serde(rename = "type")]
    pub ty: ColumnType,
    /// JSON field (dotted path); the column name when absent.
    #[serde(default)]
    pub field: Option<String>,
    /// Delimited position (0-based); the column's index when absent.
    #[serde(default)]
    pub position: Option<usize>,
    /// Part of the primary key.
    #[serde(default)]
    pub key: bool,
    /// May be NULL (a missing field is then NULL rather than an error).
    #[serde(default)]
    pub nullable: bool,
    /// VARCHAR length.
    #[serde(default)]
    pub length: Option<u16>,
}

impl Column {
    /// A non-null column named `name` of type `ty`, read from the field of the same name (JSON)
    /// or the column's position (delimited).
    pub fn new(name: impl Into<String>, ty: ColumnType) -> Self {
        Column {
            name: name.into(),
            ty,
            field: None,
            position: None,
            key: false,
            nullable: false,
            length: None,
        }
    }

    /// Makes it part of the primary key.
    pub fn key(mut self) -> Self {
        self.key = true;
        self
    }

    /// Sets the VARCHAR length.
    pub fn length(mut self, length: u16) -> Self {
        self.length = Some(length);
        self
    }
}

/// Records to rows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Mapping {
    /// Payload format.
    pub format: Format,
    /// Columns, in order.
    pub columns: Vec<Column>,
}

/// A value to bind.
#[derive(Debug, Clone, PartialEq)]
pub enum SqlValue {
    /// NULL.
    Null,
    /// Integer.
    Int(i64),
    /// Float.
    Float(f64),
    /// Boolean.
    Bool(bool),
    /// Text (also datetimes, which MySQL parses).
    Text(String),
}

fn ident_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Mapping {
    /// Checks the mapping.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(MysqlSinkError::Config(m));
        if self.columns.is_empty() {
            return bad("mapping.columns must list at least one column".into());
        }
        let mut seen = std::collections::BTreeSet::new();
        for c in &self.columns {
            if !ident_ok(&c.name) {
                return bad(format!(
                    "column name {:?} must be 1-64 letters, digits or underscores",
                    c.name
                ));
            }
            if !seen.insert(&c.name) {
                return bad(format!("column {:?} appears twice", c.name));
            }
            if c.key && c.nullable {
                return bad(format!("key column {:?} cannot be nullable", c.name));
            }
        }
        Ok(())
    }

    /// `CREATE TABLE IF NOT EXISTS` for this mapping.
    pub fn ddl(&self, table: &str) -> String {
        let cols: Vec<String> = self
            .columns
            .iter()
            .map(|c| {
                let ty = match c.ty {
                    ColumnType::Bigint => "BIGINT".to_owned(),
                    ColumnType::Int => "INT".to_owned(),
                    ColumnType::Double => "DOUBLE".to_owned(),
                    ColumnType::Boolean => "BOOLEAN".to_owned(),
                    ColumnType::Varchar => format!("VARCHAR({})", c.length.unwrap_or(255)),
                    ColumnType::Text => "TEXT".to_owned(),
                    ColumnType::Datetime => "DATETIME(3)".to_owned(),
                };
                format!("`{}` {ty}{}", c.name, if c.nullable { " NULL" } else { " NOT NULL" })
            })
            .collect();
        let keys: Vec<String> = self
            .columns
            .iter()
            .filter(|c| c.key)
            .map(|c| format!("`{}`", c.name))
            .collect();
        let pk = if keys.is_empty() {
            String::new()
        } else {
            format!(", PRIMARY KEY ({})", keys.join(", "))
        };
        format!(
            "CREATE TABLE IF NOT EXISTS `{table}` ({}{pk}) ENGINE=InnoDB",
            cols.join(", ")
        )
    }

    /// The column names, quoted, comma separated.
    pub(crate) fn column_list(&self) -> String {
        self.columns
            .iter()
            .map(|c| format!("`{}`", c.name))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The key columns' values from a Kafka key: a JSON object gives each key column from its
    /// field (as in a row); a plain key (text, a JSON string or number) gives the one key column.
    pub fn key_values(&self, key: &[u8]) -> Result<Vec<SqlValue>, String> {
        let keys: Vec<&Column> = self.columns.iter().filter(|c| c.key).collect();
        if keys.is_empty() {
            return Err("the mapping has no key column to delete by".into());
        }
        let parsed: Option<serde_json::Value> = serde_json::from_slice(key).ok();
        if let Some(object @ serde_json::Value::Object(_)) = &parsed {
            return keys
                .iter()
                .map(|c| {
                    let path = c.field.as_deref().unwrap_or(&c.name);
                    let mut cur = Some(object);
                    for part in path.split('.') {
                        cur = cur.and_then(|x| x.get(part));
                    }
                    match cur {
                        None | Some(serde_json::Value::Null) => {
                            Err(format!("the tombstone's key has no field {path:?}"))
                        }
                        Some(x) => json_value(c, x),
                    }
                })
                .collect();
        }
        let [c] = keys.as_slice() else {
            return Err(format!(
                "the mapping has {} key columns: a tombstone's key must be a JSON object with their fields",
                keys.len()
            ));
        };
        match parsed {
            Some(serde_json::Value::String(s)) => text_value(c, &s).map(|v| vec![v]),
            Some(x @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => json_value(c, &x).map(|v| vec![v]),
            _ => {
                let text = std::str::from_utf8(key).map_err(|e| format!("the tombstone's key is not UTF-8: {e}"))?;
                text_value(c, text).map(|v| vec![v])
            }
        }
    }

    /// Converts a payload to a row, or says why it does not fit.
    pub fn row(&self, payload: &[u8]) -> Result<Vec<SqlValue>, String> {
        match &self.format {
            Format::Json => {
                let v: serde_json::Value = serde_json::from_slice(payload).map_err(|e| format!("not JSON: {e}"))?;
                self.columns
                    .iter()
                    .map(|c| {
                        let path = c.field.as_deref().unwrap_or(&c.name);
                        let mut cur = Some(&v);
                        for part in path.split('.') {
                            cur = cur.and_then(|x| x.get(part));
                        }
                        match cur {
                            None | Some(serde_json::Value::Null) if c.nullable => Ok(SqlValue::Null),
                            None | Some(serde_json::Value::Null) => Err(format!("field {path:?} is missing")),
                            Some(x) => json_value(c, x),
                        }
                    })
                    .collect()
            }
            Format::Delimited { delimiter } => {
                let text = std::str::from_utf8(payload).map_err(|e| format!("not UTF-8: {e}"))?;
                let fields: Vec<&str> = text.trim_end_matches(['\n', '\r']).split(*delimiter).collect();
                self.columns
                    .iter()
                    .enumerate()
                    .map(|(i, c)| {
                        let pos = c.position.unwrap_or(i);
                        match fields.get(pos) {
                            None | Some(&"") if c.nullable => Ok(SqlValue::Null),
                            None => Err(format!("field {pos} ({}) is missing", c.name)),
                            Some(s) => text_value(c, s),
                        }
                    })
                    .collect()
            }
        }
    }
}

fn text_value(c: &Column, s: &str) -> Result<SqlValue, String> {
    let s = s.trim();
    let wrong = |what: &str| format!("{:?} is not {what} (column {})", s, c.name);
    Ok(match c.ty {
        ColumnType::Bigint => SqlValue::Int(s.parse().map_err(|_| wrong("an integer"))?),
        ColumnType::Int => {
            let v: i32 = s.parse().map_err(|_| wrong("a 32-bit integer"))?;
            SqlValue::Int(i64::from(v))
        }
        ColumnType::Double => SqlValue::Float(s.parse().map_err(|_| wrong("a number"))?),
        ColumnType::Boolean => SqlValue::Bool(match s {
            "true" | "1" => true,
            "false" | "0" => false,
            _ => return Err(wrong("a boolean")),
        }),
        ColumnType::Varchar | ColumnType::Text => check_len(c, s.to_owned())?,
        ColumnType::Datetime => {
            let ok = s.len() >= 19 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b' ';
            if !ok {
                return Err(wrong("a datetime (YYYY-MM-DD HH:MM:SS)"));
            }
            SqlValue::Text(s.to_owned())
        }
    })
}

fn check_len(c: &Column, s: String) -> Result<SqlValue, String> {
    if c.ty == ColumnType::Varchar {
        let max = usize::from(c.length.unwrap_or(255));
        if s.chars().count() > max {
            return Err(format!(
                "{} characters exceed VARCHAR({max}) of column {}",
                s.chars().count(),
                c.name
            ));
        }
    }
    Ok(SqlValue::Text(s))
}

fn json_value(c: &Column, v: &serde_json::Value) -> Result<SqlValue, String> {
    use serde_json::Value as J;
    let wrong = |what: &str| format!("{v} is not {what} (column {})", c.name);
    Ok(match (c.ty, v) {
        (ColumnType::Bigint, J::Number(n)) => SqlValue::Int(n.as_i64().ok_or_else(|| wrong("an integer"))?),
        (ColumnType::Int, J::Number(n)) => {
            let v = n
                .as_i64()
                .filter(|v| i32::try_from(*v).is_ok())
                .ok_or_else(|| wrong("a 32-bit integer"))?;
            SqlValue::Int(v)
        }
        (ColumnType::Double, J::Number(n)) => SqlValue::Float(n.as_f64().ok_or_else(|| wrong("a number"))?),
        (ColumnType::Boolean, J::Bool(b)) => SqlValue::Bool(*b),
        (ColumnType::Varchar | ColumnType::Text, J::String(s)) => check_len(c, s.clone())?,
        (ColumnType::Varchar | ColumnType::Text, J::Number(n)) => check_len(c, n.to_string())?,
        (ColumnType::Datetime, J::String(s)) => text_value(c, s)?,
        (ColumnType::Bigint | ColumnType::Int | ColumnType::Double | ColumnType::Boolean, J::String(s)) => {
            text_value(c, s)?
        }
        _ => return Err(wrong(&format!("{:?}", c.ty).to_lowercase())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(format: Format) -> Mapping {
        let col = |name: &str, ty, key: bool| {
            let c = Column::new(name, ty).length(16);
            if key {
                c.key()
            } else {
                c
            }
        };
        Mapping {
            format,
            columns: vec![
                col("id", ColumnType::Bigint, true),
                col("name", ColumnType::Varchar, false),
                col("age", ColumnType::Int, false),
            ],
        }
    }

    #[test]
    fn the_classic_delimited_example() {
        let m = user(Format::Delimited { delimiter: ',' });
        assert_eq!(
            m.row(b"1,zs,18").unwrap(),
            vec![SqlValue::Int(1), SqlValue::Text("zs".into()), SqlValue::Int(18)]
        );
        assert!(m.row(b"1,zs").unwrap_err().contains("missing"));
        assert!(m.row(b"x,zs,18").unwrap_err().contains("not an integer"));
        assert!(m
            .row(b"1,this-name-is-too-long,18")
            .unwrap_err()
            .contains("VARCHAR(16)"));
    }

    #[test]
    fn json_fields_and_nested_paths() {
        let mut m = user(Format::Json);
        m.columns[1].field = Some("who.name".into());
        assert_eq!(
            m.row(br#"{"id":7,"who":{"name":"ann"},"age":"40"}"#).unwrap(),
            vec![SqlValue::Int(7), SqlValue::Text("ann".into()), SqlValue::Int(40)]
        );
        assert!(m.row(br#"{"id":7,"age":1}"#).unwrap_err().contains("who.name"));
        assert!(m.row(br#"{"id":"x","who":{"name":"a"},"age":1}"#).is_err());
        assert!(m.row(b"{").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn ddl_from_the_mapping() {
        let m = user(Format::Json);
        assert_eq!(
            m.ddl("users"),
            "CREATE TABLE IF NOT EXISTS `users` (`id` BIGINT NOT NULL, `name` VARCHAR(16) NOT NULL, `age` INT NOT NULL, PRIMARY KEY (`id`)) ENGINE=InnoDB"
        );
    }
}
