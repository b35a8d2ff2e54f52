//! How the client commands print objects and events: kubectl's formats.

use base64::Engine;
use clap::ValueEnum;
use serde_json::{json, Map, Value};
use watchproxy_client::pb::{EventType, Object, WatchEvent};

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
    Name,
}

/// Prints what one command shows, in one format.
pub struct Printer {
    format: Format,
    resource: String,
    /// With objects of every namespace, a table says which.
    namespace_column: bool,
    /// A json or yaml List is printed whole, at its end.
    items: Vec<Value>,
    shown: usize,
}

impl Printer {
    pub fn new(format: Format, resource: &str, namespace_column: bool) -> Printer {
        Printer {
            format,
            resource: resource.to_owned(),
            namespace_column,
            items: Vec::new(),
            shown: 0,
        }
    }

    /// One object, asked for by name: json and yaml print it alone.
    pub fn one(&mut self, object: &Object) {
        match self.format {
            Format::Json => say(format_args!("{:#}", object_json(object))),
            Format::Yaml => print_yaml(&object_json(object)),
            _ => self.page(std::slice::from_ref(object)),
        }
    }

    /// A page of a list: a table's rows are aligned within it.
    pub fn page(&mut self, objects: &[Object]) {
        match self.format {
            Format::Json | Format::Yaml => self.items.extend(objects.iter().map(object_json)),
            Format::Name => {
                for o in objects {
                    say(format_args!("{}/{}", self.resource, escaped(&o.name)));
                }
            }
            Format::Table | Format::Wide => {
                let mut rows: Vec<Vec<String>> = Vec::with_capacity(objects.len() + 1);
                if self.shown == 0 {
                    rows.push(self.header(None));
                }
                rows.extend(objects.iter().map(|o| self.row(None, o)));
                print_aligned(&rows);
            }
        }
        self.shown += objects.len();
    }

    /// The end of a list at `resource_version`.
    pub fn end_list(&mut self, resource_version: &str) {
        match self.format {
            Format::Json | Format::Yaml => {
                let list = json!({
                    "apiVersion": "v1",
                    "kind": "List",
                    "metadata": {"resourceVersion": resource_version},
                    "items": std::mem::take(&mut self.items),
                });
                if self.format == Format::Json {
                    say(format_args!("{list:#}"));
                } else {
                    print_yaml(&list);
                }
            }
            _ if self.shown == 0 => eprintln!("No {} found.", self.resource),
            _ => {}
        }
    }

    /// One event of a watch; bookmarks only move where it resumes.
    pub fn event(&mut self, event: &WatchEvent) {
        let kind = EventType::try_from(event.r#type).unwrap_or(EventType::Unspecified);
        if kind == EventType::Bookmark {
            return;
        }
        let default = Object::default();
        let object = event.object.as_ref().unwrap_or(&default);
        let name = kind.as_str_name().trim_start_matches("EVENT_TYPE_");
        match self.format {
            Format::Json | Format::Yaml => {
                let mut doc = json!({"type": name, "object": object_json(object)});
                if event.resync {
                    doc["resync"] = Value::Bool(true);
                }
                if self.format == Format::Json {
                    say(format_args!("{doc}"));
                } else {
                    say(format_args!("---"));
                    print_yaml(&doc);
                }
            }
            Format::Name => say(format_args!("{}/{}", self.resource, escaped(&object.name))),
            Format::Table | Format::Wide => {
                // Printed as they come: in columns of fixed widths.
                let mut rows = Vec::with_capacity(2);
                if self.shown == 0 {
                    rows.push(self.header(Some("EVENT")));
                }
                let mut row = self.row(Some(name), object);
                if event.resync {
                    row.push("(resync)".into());
                }
                rows.push(row);
                let widths: &[usize] = if self.namespace_column {
                    &[9, 16, 40, 12]
                } else {
                    &[9, 40, 12]
                };
                for row in &rows {
                    say(format_args!("{}", join_padded(row, widths)));
                }
            }
        }
        self.shown += 1;
    }

    fn header(&self, first: Option<&str>) -> Vec<String> {
        let mut cells: Vec<&str> = first.into_iter().collect();
        if self.namespace_column {
            cells.push("NAMESPACE");
        }
        cells.extend(["NAME", "RESOURCE VERSION"]);
        if self.format == Format::Wide {
            cells.push("LABELS");
        }
        cells.into_iter().map(str::to_owned).collect()
    }

    fn row(&self, first: Option<&str>, o: &Object) -> Vec<String> {
        let mut cells: Vec<String> = first.into_iter().map(str::to_owned).collect();
        if self.namespace_column {
            cells.push(escaped(&o.namespace));
        }
        cells.extend([escaped(&o.name), escaped(&o.resource_version)]);
        if self.format == Format::Wide {
            let labels: Vec<String> = (o.labels.iter())
                .map(|(k, v)| format!("{}={}", escaped(k), escaped(v)))
                .collect();
            cells.push(if labels.is_empty() {
                "<none>".into()
            } else {
                labels.join(",")
            });
        }
        cells
    }
}

/// `text` as a terminal may show it: control characters (escape
/// sequences, carriage returns, C1 controls) written as escapes, so that a
/// name or a label cannot move the cursor, rewrite what was printed or
/// drive the terminal (kubectl's CVE-2021-25743).
pub fn escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c.is_control() {
            true => out.extend(c.escape_default()),
            false => out.push(c),
        }
    }
    out
}

/// The object as the apiserver shows it: its JSON value with the server's
/// `metadata.resourceVersion` (etcd's values do not hold it). A value that
/// is not a JSON object is shown under `value` (UTF-8) or `valueBase64`.
pub fn object_json(o: &Object) -> Value {
    let mut identity = Map::new();
    identity.insert("name".into(), o.name.clone().into());
    if !o.namespace.is_empty() {
        identity.insert("namespace".into(), o.namespace.clone().into());
    }
    match serde_json::from_slice::<Value>(&o.value) {
        Ok(Value::Object(mut fields)) => {
            let metadata = fields
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = metadata {
                for (k, v) in identity {
                    m.entry(k).or_insert(v);
                }
                m.insert("resourceVersion".into(), o.resource_version.clone().into());
            }
            Value::Object(fields)
        }
        _ => {
            identity.insert("resourceVersion".into(), o.resource_version.clone().into());
            if !o.labels.is_empty() {
                identity.insert("labels".into(), json!(o.labels));
            }
            let mut shown = json!({ "metadata": identity });
            match std::str::from_utf8(&o.value) {
                Ok(text) => shown["value"] = text.into(),
                Err(_) => {
                    shown["valueBase64"] = base64::engine::general_purpose::STANDARD
                        .encode(&o.value)
                        .into()
                }
            }
            shown
        }
    }
}

fn print_yaml(value: &Value) {
    match serde_yaml_ng::to_string(value) {
        Ok(text) => say(format_args!("{}", text.trim_end())),
        Err(e) => eprintln!("watchproxy: cannot write YAML: {e}"),
    }
}

/// Rows in columns as wide as their widest cell, three spaces apart.
fn print_aligned(rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = Vec::new();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            match widths.get_mut(i) {
                Some(w) => *w = (*w).max(cell.chars().count()),
                None => widths.push(cell.chars().count()),
            }
        }
    }
    for row in rows {
        say(format_args!("{}", join_padded(row, &widths)));
    }
}

fn join_padded(row: &[String], widths: &[usize]) -> String {
    let mut line = String::new();
    for (i, cell) in row.iter().enumerate() {
        line.push_str(cell);
        if i + 1 < row.len() {
            let width = widths.get(i).copied().unwrap_or(0);
            let pad = width.saturating_sub(cell.chars().count()) + 3;
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }
    line
}

/// Writes a line of output. A reader that went away (`watch | head`) ends
/// the program quietly, with success: it took what it wanted.
pub fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = writeln!(std::io::stdout().lock(), "{line}") {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("watchproxy: cannot write the output: {e}");
        std::process::exit(74);
    }
}
