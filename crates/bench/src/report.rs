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
    std::fs::write(&history, past).with_context(|| format!("write {}", history.display()))?;
    std::fs::write(path, doc).with_context(|| format!("write {}", path.display()))
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
    fn a_page_without_markers_is_refused_not_appended_to() {
        let err = replace_latest("# Benchmarks\n", "run").expect_err("no markers");
        assert!(err.to_string().contains("markers"), "{err}");
    }
}
