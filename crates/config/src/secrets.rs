//! Which secrets agents get (`agent_secrets`): names of files in `secrets_dir`, each also given
//! as an environment variable where asked. Only names live in the configuration; the values are
//! read by the runner at each attempt.

use std::fmt;

/// The longest secret name.
pub const SECRET_NAME_MAX: usize = 64;

/// One secret an agent gets: the file `/run/secrets/<name>` and, with `env`, that variable too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSecret {
    /// The file's name in `secrets_dir` and in the agent's secrets directory.
    pub name: String,
    /// The environment variable that also holds it.
    pub env: Option<String>,
}

impl fmt::Display for AgentSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.env {
            Some(env) => write!(f, "{}:{env}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// Variables an agent's run sets itself, or that would change how its programs run.
const RESERVED_ENV: [&str; 9] = [
    "PATH",
    "HOME",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "HOSTNAME",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
];

/// `name[:ENV_VAR]`, comma-separated (spaces around items ignored; empty: none). Names are
/// letters, digits, `_`, `-` and `.`, not starting with `.`; variables are `[A-Z_][A-Z0-9_]*`,
/// not `TURNPIKE_*` nor one the run sets; each name and variable at most once.
pub fn parse_agent_secrets(list: &str) -> Result<Vec<AgentSecret>, String> {
    let mut out: Vec<AgentSecret> = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, env) = match item.split_once(':') {
            Some((n, e)) => (n.trim(), Some(e.trim())),
            None => (item, None),
        };
        check_name(name)?;
        if let Some(env) = env {
            check_env(env)?;
        }
        if out.iter().any(|s| s.name == name) {
            return Err(format!("secret {name:?} is named twice"));
        }
        if env.is_some() && out.iter().any(|s| s.env.as_deref() == env) {
            return Err(format!(
                "variable {:?} is named twice",
                env.unwrap_or_default()
            ));
        }
        out.push(AgentSecret {
            name: name.to_owned(),
            env: env.map(str::to_owned),
        });
    }
    Ok(out)
}

fn check_name(name: &str) -> Result<(), String> {
    plain_name("secret", name, SECRET_NAME_MAX)
}

/// Is `name` a plain name of a `kind` of thing: 1 to `max` letters, digits, `_`, `-` or `.`, not
/// starting with `.` (it may become a file name)?
pub(crate) fn plain_name(kind: &str, name: &str, max: usize) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= max
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{kind} name {name:?}: 1 to {max} letters, digits, '_', '-' or '.', not starting with '.'"
        ))
    }
}

pub(crate) fn check_env(env: &str) -> Result<(), String> {
    let mut bytes = env.bytes();
    let ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_uppercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
    if !ok {
        return Err(format!(
            "variable {env:?}: upper-case letters, digits and '_', not starting with a digit"
        ));
    }
    if env.starts_with("TURNPIKE_") || RESERVED_ENV.contains(&env) {
        return Err(format!("variable {env:?} is set by the run itself"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_variables_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_agent_secrets(" ").expect("none"), vec![]);
        assert_eq!(
            parse_agent_secrets("openai_key:OPENAI_API_KEY, gh-token ,").expect("two"),
            vec![
                AgentSecret {
                    name: "openai_key".into(),
                    env: Some("OPENAI_API_KEY".into())
                },
                AgentSecret {
                    name: "gh-token".into(),
                    env: None
                },
            ]
        );
        for bad in [
            "../etc/passwd",
            ".hidden",
            "a/b",
            "a:lower",
            "a:1X",
            "a:PATH",
            "a:TURNPIKE_TURN",
            "a,a",
            "a:X,b:X",
            "a:",
            &"x".repeat(SECRET_NAME_MAX + 1),
        ] {
            assert!(parse_agent_secrets(bad).is_err(), "{bad:?} accepted");
        }
    }
}
