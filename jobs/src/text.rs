//! The job file's text: the line a field is on (for messages) and the file with its secrets
//! masked (for showing it).

/// One step of a field path: a table key or an index into an array of tables.
#[derive(Debug, Clone, Copy)]
pub(super) enum Seg<'a> {
    Key(&'a str),
    Index(usize),
}

/// Finds the line of `path` in `src` (the deepest part of the path that exists).
pub(super) fn line_of(src: &str, path: &[Seg<'_>]) -> Option<usize> {
    let doc = toml_edit::ImDocument::parse(src).ok()?;
    let mut table: &dyn toml_edit::TableLike = doc.as_table();
    let mut item: Option<&toml_edit::Item> = None;
    let mut span = None;
    for seg in path {
        match seg {
            Seg::Key(k) => {
                if let Some(it) = item {
                    match it.as_table_like() {
                        Some(t) => table = t,
                        None => break,
                    }
                }
                let Some((key, value)) = table.get_key_value(k) else {
                    break;
                };
                span = key.span().or_else(|| value.span()).or(span);
                item = Some(value);
            }
            Seg::Index(i) => {
                let Some(t) = item.and_then(|it| it.as_array_of_tables()).and_then(|a| a.get(*i)) else {
                    break;
                };
                span = t.span().or(span);
                table = t;
                item = None;
            }
        }
    }
    let offset = span?.start;
    Some(src[..offset.min(src.len())].matches('\n').count() + 1)
}

pub(super) fn segs(path: &str) -> Vec<Seg<'_>> {
    let mut out = Vec::new();
    for part in path.split('.') {
        if let Some((name, rest)) = part.split_once('[') {
            out.push(Seg::Key(name));
            if let Ok(i) = rest.trim_end_matches(']').parse() {
                out.push(Seg::Index(i));
            }
        } else {
            out.push(Seg::Key(part));
        }
    }
    out
}

/// `src` (a job file) with its secrets masked, for showing it: the value of every key whose name
/// says password, secret or token, and the password of every `scheme://user:password@` URL, become
/// `***` — unless they are `${NAME}` references, which hold no secret.
pub fn masked(src: &str) -> String {
    let mut out = String::with_capacity(src.len());
    // The closing delimiter of a masked multi-line string whose lines are being left out.
    let mut skipping: Option<&str> = None;
    for line in src.split_inclusive('\n') {
        if let Some(close) = skipping {
            if line.contains(close) {
                skipping = None;
            }
            continue;
        }
        let mut line = line.to_owned();
        if let Some((key, value)) = line.split_once('=') {
            let k = key.trim().to_ascii_lowercase();
            let secret = ["password", "secret", "token"].iter().any(|w| k.contains(w));
            let v = value.trim();
            // An inline table that names a secret (`sasl = { password = "…" }`) is hidden whole.
            let inline = v.starts_with('{')
                && ["password", "secret", "token"]
                    .iter()
                    .any(|w| v.to_ascii_lowercase().contains(w));
            if inline && !k.starts_with('#') {
                let end = if line.ends_with('\n') { "\n" } else { "" };
                line = format!("{key}= {{ *** }}{end}");
            } else if secret
                && !k.starts_with('#')
                && !k.ends_with("_file")
                && !k.ends_with(".location")
                // An address (`sasl.oauthbearer.token.endpoint.url`): its userinfo is masked below.
                && !k.ends_with(".url")
                && !v.starts_with("\"${")
            {
                // A multi-line string: its other lines are left out too, up to its end.
                for delim in ["\"\"\"", "'''"] {
                    if let Some(body) = v.strip_prefix(delim) {
                        if !body.contains(delim) {
                            skipping = Some(delim);
                        }
                    }
                }
                let end = if line.ends_with('\n') { "\n" } else { "" };
                line = format!("{key}= \"***\"{end}");
            }
        }
        // scheme://user:password@host
        let mut at = 0;
        while let Some(i) = line[at..].find("://") {
            let start = at + i + 3;
            let rest = &line[start..];
            let stop = rest.find(['/', '"', ' ', '\'']).unwrap_or(rest.len());
            let authority = &rest[..stop];
            if let Some((userinfo, _)) = authority.rsplit_once('@') {
                if let Some((user, pass)) = userinfo.split_once(':') {
                    if !pass.starts_with("${") {
                        let replaced = format!("{user}:***");
                        line.replace_range(start..start + userinfo.len(), &replaced);
                    }
                }
            }
            at = start;
        }
        // ?password=… in a URL (PostgreSQL's URLs take one).
        let line = exactly_core::secret::redact_query(&line);
        out.push_str(&line);
    }
    out
}
