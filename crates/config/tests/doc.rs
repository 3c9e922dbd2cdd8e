//! `docs/configuration.md` is generated from the `Config` struct's doc comments and defaults, so
//! the documentation cannot drift from the code: this test fails when it is not current.
//! `TURNPIKE_BLESS=1 cargo test -p turnpike-config --test doc` rewrites it.

use turnpike_config::Config;

const SOURCE: &str = include_str!("../src/lib.rs");
const DOC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");

/// One key of `Config`, as its source declares it.
#[derive(Debug)]
struct Key {
    name: String,
    doc: String,
}

/// A `// --- Title ---` group of keys.
#[derive(Debug)]
struct Section {
    title: String,
    keys: Vec<Key>,
}

/// The crate's `//!` text, then `Config`'s fields by section, with their `///` text. Plain line
/// reading is enough for a struct this file controls, and keeps the section comments that a Rust
/// parser would drop.
fn parse(source: &str) -> (String, Vec<Section>) {
    let intro: Vec<&str> = source
        .lines()
        .take_while(|l| l.starts_with("//!"))
        .map(|l| l.trim_start_matches("//!").trim())
        .collect();
    let body = source
        .split_once("pub struct Config {")
        .expect("Config in lib.rs")
        .1;
    let body = body.split_once("\n}").expect("end of Config").0;
    let mut sections: Vec<Section> = Vec::new();
    let mut doc: Vec<&str> = Vec::new();
    for line in body.lines().map(str::trim) {
        if let Some(title) = line.strip_prefix("// ---") {
            sections.push(Section {
                title: title
                    .trim_matches(|c: char| c == '-' || c.is_whitespace())
                    .to_owned(),
                keys: Vec::new(),
            });
        } else if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim());
        } else if let Some(field) = line.strip_prefix("pub ") {
            let name = field
                .split(':')
                .next()
                .expect("field name")
                .trim()
                .to_owned();
            let section = sections.last_mut().expect("every key is in a section");
            section.keys.push(Key {
                name,
                doc: doc.join(" "),
            });
            doc.clear();
        }
    }
    (paragraphs(&intro), sections)
}

/// `//!` lines joined into Markdown paragraphs (a blank line ends one).
fn paragraphs(lines: &[&str]) -> String {
    lines
        .split(|l| l.is_empty())
        .map(|p| p.join(" "))
        // The note about this page itself is for the code's readers.
        .filter(|p| !p.is_empty() && !p.contains("docs/configuration.md"))
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn default_of(defaults: &serde_json::Value, key: &str) -> String {
    match &defaults[key] {
        serde_json::Value::Null => "—".to_owned(),
        serde_json::Value::String(s) => format!("`{s}`"),
        v => format!("`{v}`"),
    }
}

fn environment(key: &str) -> String {
    let env = format!("`TURNPIKE_{}`", key.to_ascii_uppercase());
    if key == "max_turn_retry" {
        format!("`MAX_TURN_RETRY`, {env}")
    } else {
        env
    }
}

fn render(source: &str) -> String {
    let (intro, sections) = parse(source);
    let defaults = serde_json::to_value(Config::default()).expect("defaults as JSON");
    let mut out = String::from(
        "<!-- Generated from crates/config/src/lib.rs by crates/config/tests/doc.rs: edit the doc \
         comments there, then run `TURNPIKE_BLESS=1 cargo test -p turnpike-config --test doc`. -->\n\n\
         # Configuration\n\n",
    );
    out.push_str(&intro);
    out.push('\n');
    for section in &sections {
        out.push_str(&format!("\n## {}\n\n", section.title));
        out.push_str("| key | environment | default | meaning |\n|---|---|---|---|\n");
        for key in &section.keys {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} |\n",
                key.name,
                environment(&key.name),
                default_of(&defaults, &key.name),
                key.doc.replace('|', "\\|")
            ));
        }
    }
    out
}

#[test]
fn every_key_is_documented_in_a_section() {
    let (_, sections) = parse(SOURCE);
    let keys: Vec<&Key> = sections.iter().flat_map(|s| &s.keys).collect();
    let defaults = serde_json::to_value(Config::default()).expect("defaults as JSON");
    let fields = defaults.as_object().expect("an object");
    assert_eq!(keys.len(), fields.len(), "the parser found every field");
    for key in keys {
        assert!(fields.contains_key(&key.name), "{} is a key", key.name);
        assert!(!key.doc.is_empty(), "{} has no doc comment", key.name);
    }
}

#[test]
fn the_configuration_page_is_current() {
    let page = render(SOURCE);
    if std::env::var_os("TURNPIKE_BLESS").is_some() {
        std::fs::write(DOC, &page).expect("write docs/configuration.md");
        return;
    }
    let committed = std::fs::read_to_string(DOC).unwrap_or_default();
    assert!(
        committed == page,
        "docs/configuration.md is not current: run `TURNPIKE_BLESS=1 cargo test -p turnpike-config --test doc` and commit it"
    );
}
