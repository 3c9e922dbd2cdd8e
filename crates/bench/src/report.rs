//! `BENCHMARKS.md` keeps one run, the latest, between two markers: `all --write` replaces it and
//! appends the run it replaces to `docs/benchmarks/history.md`, so the page stays short and no
//! result is lost.

use anyhow::{bail, Context, Result};
use std::path::Path;

const BEGIN: &str = "<!-- turnpike-bench: latest run begins -->";
const END: &str = "<!-- turnpike-bench: latest run ends -->";
/// How a run's heading starts while it is the latest.
pub const LATEST: &str = "## Latest run: ";
/// Where the plots go, and the history, relative to the benchmarks page.
pub const PLOTS: &str = "docs/img";
const HISTORY: &str = "docs/benchmarks/history.md";
const INDEX_BEGIN: &str = "<!-- index begins -->";
const INDEX_END: &str = "<!-- index ends -->";

/// `doc` with `run` as its latest run, and the run it replaced, rewritten for the history page
/// (a dated heading, image links relative to `docs/benchmarks/`).
pub fn replace_latest(doc: &str, run: &str) -> Result<(String, String)> {
    let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END)) else {
        bail!("no `{BEGIN}` … `{END}` markers: the page's latest run cannot be found");
    };
    if end < begin {
        bail!("the latest-run markers are out of order");
    }
    let old = &doc[begin + BEGIN.len()..end];
    let replaced = old
        .trim()
        .replacen(LATEST, "## ", 1)
        .replace(&format!("]({PLOTS}/"), "](../img/");
    let new = format!("{}{BEGIN}\n{}\n{}", &doc[..begin], run.trim(), &doc[end..]);
    Ok((new, replaced))
}

/// Write `run` into the page at `path` and move the run it replaces to the history.
pub fn write(path: &Path, run: &str) -> Result<()> {
    let doc = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let (doc, replaced) = replace_latest(&doc, run)?;
    let history = dir_of(path).join(HISTORY);
    let mut past =
        std::fs::read_to_string(&history).with_context(|| format!("read {}", history.display()))?;
    if !replaced.is_empty() {
        past = format!("{}\n\n{replaced}\n", past.trim_end());
    }
    let past = with_index(&past);
    std::fs::write(&history, past).with_context(|| format!("write {}", history.display()))?;
    std::fs::write(path, doc).with_context(|| format!("write {}", path.display()))
}

/// The history page with its index (one row per run: its heading, linked, and the measurements
/// it holds) rebuilt between the index markers, which go after the page's introduction if
/// missing. A history of many runs is read from its index, not scrolled.
pub fn with_index(history: &str) -> String {
    let (head, body) = match (history.find(INDEX_BEGIN), history.find(INDEX_END)) {
        (Some(b), Some(e)) if b < e => (
            history[..b].trim_end().to_owned(),
            history[e + INDEX_END.len()..].trim_start(),
        ),
        _ => match history.find("\n## ") {
            Some(at) => (history[..at].trim_end().to_owned(), &history[at + 1..]),
            None => (history.trim_end().to_owned(), ""),
        },
    };
    let mut rows = vec!["| run | measurements |".to_owned(), "|---|---|".to_owned()];
    let mut seen = std::collections::HashMap::<String, usize>::new();
    let mut current: Option<(String, Vec<String>)> = None;
    let flush = |rows: &mut Vec<String>, run: Option<(String, Vec<String>)>| {
        if let Some((link, parts)) = run {
            rows.push(format!("| {link} | {} |", parts.join(", ")));
        }
    };
    for line in body.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            flush(&mut rows, current.take());
            let slug = slug(title);
            let n = seen.entry(slug.clone()).or_insert(0);
            let anchor = if *n == 0 { slug } else { format!("{slug}-{n}") };
            *n += 1;
            // A run's heading ends with the machine ("— 2 cores, ..."): the index shows its date.
            let short = match title.split_once(" — ") {
                Some((date, machine)) if machine.contains(" cores") => date,
                _ => title,
            };
            current = Some((format!("[{short}](#{anchor})"), Vec::new()));
        } else if let (Some(title), Some((_, parts))) = (line.strip_prefix("### "), &mut current) {
            // "### 3b. Retry ..." → "3b"; unnumbered sections by their first words.
            let part = match title.split_once(". ") {
                Some((n, _)) if n.chars().next().is_some_and(|c| c.is_ascii_digit()) => {
                    n.to_owned()
                }
                _ => title.split(" (").next().unwrap_or(title).to_owned(),
            };
            parts.push(part);
        }
    }
    flush(&mut rows, current);
    format!(
        "{head}\n\n{INDEX_BEGIN}\n{}\n{INDEX_END}\n\n{}",
        rows.join("\n"),
        body.trim_end()
    )
    .trim_end()
    .to_owned()
        + "\n"
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`.
fn slug(title: &str) -> String {
    title
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The folder of the benchmarks page (the current one for a bare file name).
pub fn dir_of(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(run: &str) -> String {
        format!("# Benchmarks\n\nmethod\n\n{BEGIN}\n{run}\n{END}\n\n## Analyses\n")
    }

    #[test]
    fn the_latest_run_is_replaced_and_the_old_one_returned_for_the_history() {
        let old = "## Latest run: 2026-01-01 — 2 cores\n\n### 1. x\n\n![p](docs/img/p.png)";
        let new = "## Latest run: 2026-02-02 — 2 cores\n\n### 1. y";
        let (doc, replaced) = replace_latest(&page(old), new).expect("markers");
        assert_eq!(doc, page(new));
        assert_eq!(
            replaced,
            "## 2026-01-01 — 2 cores\n\n### 1. x\n\n![p](../img/p.png)"
        );
        // Idempotent shape: the new page can be written again.
        let (again, previous) = replace_latest(&doc, old).expect("markers");
        assert_eq!(again, page(old));
        assert!(previous.starts_with("## 2026-02-02"));
    }

    #[test]
    fn the_history_index_lists_every_run_with_its_anchor_and_measurements() {
        let history = "# Benchmark history\n\nintro\n\n\
            ## 2026-12-02T16:15:53.147Z — 2 cores, $X or PATH\n\n### 1. Pipeline (a)\n\n\
            ### 3b. Kill\n\n## Cluster: runners (case 6)\n\n### Latency vs load (1 runner)\n\n\
            ## Cluster: runners (case 6)\n";
        let indexed = with_index(history);
        assert_eq!(
            indexed,
            "# Benchmark history\n\nintro\n\n<!-- index begins -->\n| run | measurements |\n|---|---|\n\
             | [2026-12-02T16:15:53.147Z](#2026-12-02t161553147z--2-cores-x-or-path) | 1, 3b |\n\
             | [Cluster: runners (case 6)](#cluster-runners-case-6) | Latency vs load |\n\
             | [Cluster: runners (case 6)](#cluster-runners-case-6-1) |  |\n<!-- index ends -->\n\n\
             ## 2026-12-02T16:15:53.147Z — 2 cores, $X or PATH\n\n### 1. Pipeline (a)\n\n\
             ### 3b. Kill\n\n## Cluster: runners (case 6)\n\n### Latency vs load (1 runner)\n\n\
             ## Cluster: runners (case 6)\n"
        );
        // Rebuilt, not stacked: indexing an indexed page changes nothing.
        assert_eq!(with_index(&indexed), indexed);
    }

    #[test]
    fn a_page_without_markers_is_refused_not_appended_to() {
        let err = replace_latest("# Benchmarks\n", "run").expect_err("no markers");
        assert!(err.to_string().contains("markers"), "{err}");
    }
}
