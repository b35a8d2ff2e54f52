//! The proto's comments and the API page's status table say what the code
//! sends: every ErrorInfo reason, with its status code; the clients know
//! every reason, and the Python stubs are the proto's. The README stays a
//! page a person reads, every link of it and of the docs resolves, the
//! layout page names the source tree, and the fuzzers' targets call what
//! the library has.

use crate::common::code_name;
use watchproxy::api::error::REASONS;
use watchproxy_client::Reason;

fn read(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

/// The words of a comma-separated table cell or comment list.
fn names(text: &str) -> Vec<&str> {
    text.split([',', ' ', ';'])
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .collect()
}

#[test]
fn the_api_pages_status_table_names_every_reason_with_its_code() {
    let page = read("docs/api.md");
    let rows: Vec<Vec<&str>> = page
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains('_'))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    for (reason, code) in REASONS {
        let code = code_name(*code);
        let row = rows.iter().find(|cells| {
            cells.len() > 3
                && names(cells[1]).contains(&code.as_str())
                && names(cells[2]).contains(reason)
        });
        assert!(
            row.is_some(),
            "docs/api.md: no status row with {code} and {reason}"
        );
    }
}

#[test]
fn the_proto_names_every_reason_with_its_code() {
    let proto = read("proto/watchproxy/v1/watchproxy.proto");
    let words = proto.split(|c: char| !(c.is_ascii_uppercase() || c == '_'));
    assert!(
        !words.into_iter().any(|w| w == "ABORTED"),
        "the code never sends ABORTED"
    );
    // The lines "//   CODE: REASON, REASON" (and their continuations).
    let mut listed: Vec<(String, String)> = Vec::new();
    let mut code = String::new();
    for line in proto.lines().map(|l| l.trim_start_matches([' ', '/'])) {
        for part in line.split(';') {
            let part = part.trim();
            let reasons = match part.split_once(": ") {
                Some((c, rest)) if c.chars().all(|ch| ch.is_ascii_uppercase() || ch == '_') => {
                    code = c.to_owned();
                    rest
                }
                _ => part,
            };
            for r in names(reasons) {
                listed.push((code.clone(), r.to_owned()));
            }
        }
    }
    for (reason, c) in REASONS {
        let want = (code_name(*c), reason.to_string());
        assert!(listed.contains(&want), "proto: {} with {}", want.1, want.0);
    }
}

#[test]
fn the_rust_client_knows_every_reason() {
    for (reason, _) in REASONS {
        let parsed = Reason::parse(reason);
        assert!(!matches!(parsed, Reason::Other(_)), "{reason}");
        assert_eq!(parsed.as_str(), *reason);
    }
    assert_eq!(Reason::KNOWN.len(), REASONS.len());
}

#[test]
fn the_python_stubs_are_generated_from_the_proto() {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = crate::common::python3()
        .arg(format!("{dir}/clients/python/tests/stubs_current.py"))
        .arg(format!("{dir}/proto"))
        .output()
        .expect("python3 with grpcio-tools is required: run ./scripts/install-deps.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_readme_is_short_and_leads_to_a_page_for_each_reader() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "the README has {lines} lines");
    for page in [
        "docs/api.md",
        "docs/clients.md",
        "docs/consistency.md",
        "docs/operating.md",
        "docs/tiers.md",
        "docs/checker.md",
        "docs/architecture.md",
        "docs/benchmarks.md",
        "docs/etcd-api.md",
        "docs/runbooks/",
    ] {
        assert!(
            readme.contains(&format!("]({page})")),
            "the README does not link {page}"
        );
    }
    let benchmarks = read("docs/benchmarks.md");
    let first = benchmarks
        .lines()
        .filter(|l| l.starts_with("## "))
        .take(2)
        .collect::<Vec<_>>();
    assert_eq!(first, ["## How to measure", "## Current figures"]);
    assert!(
        !benchmarks.contains("(issue "),
        "the benchmarks page is by topic, not by issue"
    );
}

/// The relative links (`](path)` and `](path#anchor)`) of a Markdown file.
fn links(text: &str) -> Vec<&str> {
    text.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap())
        .filter(|t| !t.is_empty() && !t.contains("://") && !t.starts_with("mailto:"))
        .collect()
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_resolves() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = vec![root.join("README.md")];
    for dir in ["docs", "docs/runbooks"] {
        for entry in std::fs::read_dir(root.join(dir)).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    assert!(files.len() > 12, "{files:?}");
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for link in links(&text) {
            let target = file.parent().unwrap().join(link);
            assert!(target.exists(), "{}: {link} does not exist", file.display());
        }
    }
}

/// The layout in docs/architecture.md names every folder at the top of
/// `src/`, and every `src/` folder it names is there: the page and the tree
/// cannot drift apart.
#[test]
fn the_layout_page_names_every_source_folder() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let page = read("docs/architecture.md");
    let listed: std::collections::BTreeSet<String> = (page.lines())
        .filter_map(|line| line.split_whitespace().next())
        .filter(|word| word.starts_with("src/") && word.ends_with('/'))
        .map(|word| word.trim_end_matches('/').to_owned())
        .collect();
    for folder in &listed {
        assert!(
            root.join(folder).is_dir(),
            "the layout names {folder}/, which is not in the tree"
        );
    }
    for entry in std::fs::read_dir(root.join("src")).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            let folder = format!("src/{}", path.file_name().unwrap().to_string_lossy());
            assert!(
                listed.contains(&folder),
                "docs/architecture.md's layout does not name {folder}/"
            );
        }
    }
    assert!(listed.len() >= 10, "{listed:?}");
}

/// The coverage-guided fuzzers are not built by the test command: each of
/// fuzz/'s targets calls a function the library's fuzz module has, and
/// scripts/fuzz.sh runs every one of them, so they cannot drift apart
/// unseen.
#[test]
fn every_fuzz_target_calls_a_function_of_the_fuzz_module_and_is_run() {
    let module = read("src/server/http2/fuzz.rs");
    let script = read("scripts/fuzz.sh");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut targets = Vec::new();
    for entry in std::fs::read_dir(root.join("fuzz/src/bin")).unwrap() {
        let path = entry.unwrap().path();
        let target = path.file_stem().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        // The last mention: the doc comment names it first.
        let call = (text.rsplit("watchproxy::server::http2_fuzz::").next())
            .filter(|rest| rest.len() < text.len())
            .and_then(|rest| rest.split('(').next())
            .unwrap_or_else(|| panic!("{target} calls no function of http2_fuzz"));
        assert!(
            module.contains(&format!("pub fn {call}(input: &[u8])")),
            "{target} calls http2_fuzz::{call}, which src/server/http2/fuzz.rs does not have"
        );
        assert!(
            script.contains(&format!(" {target}:")),
            "scripts/fuzz.sh does not run {target}"
        );
        targets.push(target);
    }
    assert_eq!(targets.len(), 3, "{targets:?}");
}
