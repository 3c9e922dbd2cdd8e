//! The deployment's NATS users (`deploy/nats/accounts.conf`), with one user per runner.
//!
//! A runner may publish only on subjects and keys that name it (its events, its leases, its
//! presence), so one compromised runner cannot speak for another. NATS's plain configuration
//! has no per-user templates, so `accounts.conf` holds the runner user once, as a commented
//! template (lines starting with `#|`, `RUNNER_ID` and `RUNNER_PASSWORD` in place of the
//! runner's own), and [`render`] writes it out once per runner right after the template. As
//! checked in, the file lets no runner in. `turnpike nats-accounts` (used by
//! `deploy/secrets.sh`) and the tests render it the same way.

use turnpike_core::RunnerId;

/// `deploy/nats/accounts.conf`, as this build was made with.
pub const TEMPLATE: &str = include_str!("../../../deploy/nats/accounts.conf");

/// What starts a template line.
const MARK: &str = "#|";
const ID: &str = "RUNNER_ID";
const PASSWORD: &str = "RUNNER_PASSWORD";
/// Below this, a password is too easily guessed for a user that speaks for a runner.
pub const PASSWORD_MIN: usize = 16;

/// Why the accounts file or the runners' list cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccountsError {
    /// The accounts file has no template for runner users.
    #[error("the accounts file has no runner template (a block of lines starting with `#|`)")]
    NoTemplate,
    /// More than one template: which one applies would be a guess.
    #[error("the accounts file has more than one runner template; keep one block of `#|` lines")]
    TwoTemplates,
    /// A template without the names it is filled in at.
    #[error("the runner template does not name RUNNER_ID and RUNNER_PASSWORD")]
    TemplateWithoutNames,
    /// A runner listed twice.
    #[error("runner {0} is listed twice")]
    Duplicate(RunnerId),
    /// A password too short or with characters the server's config cannot hold.
    /// A password too short or with characters the server's config cannot hold.
    #[error(
        "the password of runner {runner} is not usable: it must be at least {PASSWORD_MIN} \
         characters of A-Z, a-z, 0-9, '-' and '_' (deploy/secrets.sh makes such ones)"
    )]
    BadPassword {
        /// Whose.
        runner: RunnerId,
    },
    /// A line of the runners' list that is not `<runner id> <password>`.
    #[error("line {line}: expected `<runner id> <password>`: {why}")]
    BadLine {
        /// Its number, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
}

/// One runner's NATS user.
#[derive(Clone, PartialEq, Eq)]
pub struct RunnerUser {
    /// The runner it speaks for (its user name).
    pub id: RunnerId,
    /// Its password.
    pub password: String,
}

impl std::fmt::Debug for RunnerUser {
    // Never a password in a log or a panic message.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunnerUser").field("id", &self.id).finish()
    }
}

/// The NATS user of runner `id`.
pub fn runner_user(id: &RunnerId) -> String {
    format!("runner-{id}")
}

/// The reply prefix of runner `id`: its own, so no runner reads another's replies.
pub fn runner_inbox(id: &RunnerId) -> String {
    format!("_INBOX_runner.{id}")
}

/// `template` with the runner template written out once per runner in `runners`, in order.
pub fn render(template: &str, runners: &[RunnerUser]) -> Result<String, AccountsError> {
    let mut seen = std::collections::HashSet::new();
    for r in runners {
        if !seen.insert(&r.id) {
            return Err(AccountsError::Duplicate(r.id.clone()));
        }
        let usable = r.password.len() >= PASSWORD_MIN
            && r.password
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !usable {
            return Err(AccountsError::BadPassword {
                runner: r.id.clone(),
            });
        }
    }
    let lines: Vec<&str> = template.lines().collect();
    let is_template = |l: &&str| l.trim_start().starts_with(MARK);
    let start = lines
        .iter()
        .position(is_template)
        .ok_or(AccountsError::NoTemplate)?;
    let len = lines[start..].iter().take_while(|l| is_template(l)).count();
    let end = start + len;
    if lines[end..].iter().any(is_template) {
        return Err(AccountsError::TwoTemplates);
    }
    // The template's lines without their mark, indented as the mark was.
    let block: Vec<String> = lines[start..end]
        .iter()
        .map(|l| {
            let indent = &l[..l.len() - l.trim_start().len()];
            let body = l.trim_start()[MARK.len()..]
                .strip_prefix(' ')
                .unwrap_or(&l.trim_start()[MARK.len()..]);
            format!("{indent}{body}")
        })
        .collect();
    let joined = block.join("\n");
    if !joined.contains(ID) || !joined.contains(PASSWORD) {
        return Err(AccountsError::TemplateWithoutNames);
    }
    let mut out: Vec<String> = lines[..end].iter().map(|l| (*l).to_owned()).collect();
    for r in runners {
        out.push(fill(&joined, r));
    }
    out.extend(lines[end..].iter().map(|l| (*l).to_owned()));
    let mut text = out.join("\n");
    if template.ends_with('\n') {
        text.push('\n');
    }
    Ok(text)
}

/// The template with `r`'s names, in one pass: neither name is ever read inside the other.
fn fill(block: &str, r: &RunnerUser) -> String {
    let mut out = String::with_capacity(block.len() + 64);
    let mut rest = block;
    loop {
        let next = [(ID, r.id.as_str()), (PASSWORD, r.password.as_str())]
            .into_iter()
            .filter_map(|(name, value)| rest.find(name).map(|at| (at, name, value)))
            .min_by_key(|(at, _, _)| *at);
        let Some((at, name, value)) = next else {
            out.push_str(rest);
            return out;
        };
        out.push_str(&rest[..at]);
        out.push_str(value);
        rest = &rest[at + name.len()..];
    }
}

/// Runners as `turnpike nats-accounts` reads them: one `<runner id> <password>` per line;
/// blank lines and `#` comments are skipped.
pub fn parse_runners(input: &str) -> Result<Vec<RunnerUser>, AccountsError> {
    let mut runners = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: String| AccountsError::BadLine { line: i + 1, why };
        let mut words = line.split_whitespace();
        let (Some(id), Some(password), None) = (words.next(), words.next(), words.next()) else {
            return Err(bad("not two words".to_owned()));
        };
        let id = RunnerId::new(id).map_err(|e| bad(e.to_string()))?;
        runners.push(RunnerUser {
            id,
            password: password.to_owned(),
        });
    }
    Ok(runners)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(id: &str) -> RunnerUser {
        RunnerUser {
            id: RunnerId::new(id).expect("id"),
            password: format!("password-of-{id}-0123456789"),
        }
    }

    const SMALL: &str = "users: [\n  { user: admin }\n  # one per runner\n  #| { user: \"runner-RUNNER_ID\", password: \"RUNNER_PASSWORD\"\n  #|   allow: \"turnpike.events.*.RUNNER_ID\" }\n]\n";

    #[test]
    fn each_runner_gets_the_template_with_its_own_names() {
        let out = render(SMALL, &[user("a"), user("b-2")]).expect("renders");
        assert_eq!(
            out,
            "users: [\n  { user: admin }\n  # one per runner\n  #| { user: \"runner-RUNNER_ID\", password: \"RUNNER_PASSWORD\"\n  #|   allow: \"turnpike.events.*.RUNNER_ID\" }\n  { user: \"runner-a\", password: \"password-of-a-0123456789\"\n    allow: \"turnpike.events.*.a\" }\n  { user: \"runner-b-2\", password: \"password-of-b-2-0123456789\"\n    allow: \"turnpike.events.*.b-2\" }\n]\n"
        );
        // Names are filled in once: a name inside the other's value stays as it is.
        let odd = RunnerUser {
            id: RunnerId::new("RUNNER_PASSWORD").expect("a valid id"),
            password: "xRUNNER_IDx-0123456789".into(),
        };
        let out = render(SMALL, &[odd]).expect("renders");
        assert!(
            out.contains(
                "{ user: \"runner-RUNNER_PASSWORD\", password: \"xRUNNER_IDx-0123456789\""
            ),
            "{out}"
        );
        // No runner: the file as it is.
        assert_eq!(render(SMALL, &[]).expect("renders"), SMALL);
    }

    #[test]
    fn the_deployments_file_renders() {
        let out = render(TEMPLATE, &[user("r1")]).expect("renders");
        assert!(out.contains("user: \"runner-r1\""), "{out}");
        assert!(out.contains("\"turnpike.events.*.r1\""), "{out}");
        assert!(!render(TEMPLATE, &[])
            .expect("renders")
            .contains("runner-r1"));
    }

    #[test]
    fn what_cannot_be_rendered_is_refused() {
        assert_eq!(
            render("users: []\n", &[user("a")]),
            Err(AccountsError::NoTemplate)
        );
        assert_eq!(
            render("#| RUNNER_ID RUNNER_PASSWORD\nx\n#| again\n", &[]),
            Err(AccountsError::TwoTemplates)
        );
        assert_eq!(
            render("#| { user: fixed }\n", &[]),
            Err(AccountsError::TemplateWithoutNames)
        );
        assert_eq!(
            render(SMALL, &[user("a"), user("a")]),
            Err(AccountsError::Duplicate(RunnerId::new("a").expect("id")))
        );
        for password in [
            "short",
            "has\"quote-0123456789",
            "has space 0123456789",
            "new\nline-0123456789",
            "dollar$VAR-0123456789",
        ] {
            let r = RunnerUser {
                id: RunnerId::new("a").expect("id"),
                password: password.to_owned(),
            };
            assert!(
                matches!(render(SMALL, &[r]), Err(AccountsError::BadPassword { .. })),
                "{password:?}"
            );
        }
    }

    #[test]
    fn runner_lines_are_read_strictly() {
        let got =
            parse_runners("# runners\n\nr1 pw-one-0123456789abc\n  r-2   pw-two-0123456789abc  \n")
                .expect("parses");
        assert_eq!(
            got,
            vec![
                RunnerUser {
                    id: RunnerId::new("r1").expect("id"),
                    password: "pw-one-0123456789abc".into()
                },
                RunnerUser {
                    id: RunnerId::new("r-2").expect("id"),
                    password: "pw-two-0123456789abc".into()
                },
            ]
        );
        for bad in ["r1", "r1 a b", "r.1 password-0123456789", "RUNNER_ID/x pw"] {
            assert!(
                matches!(
                    parse_runners(bad),
                    Err(AccountsError::BadLine { line: 1, .. })
                ),
                "{bad}"
            );
        }
        // A password is never printed.
        assert!(!format!("{:?}", got[0]).contains("pw-one"));
    }
}
