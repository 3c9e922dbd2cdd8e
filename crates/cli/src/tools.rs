//! One-shot commands that print something an operator installs: the agent container's
//! settings, the NATS runner accounts, a dashboard password hash.

use anyhow::{Context, Result};
use std::process::ExitCode;
use turnpike_config::Config;

/// `turnpike runner container-spec`: the container every attempt of this runner gets.
pub fn container_spec(config: &Config, profile: Option<&str>) -> Result<ExitCode> {
    let runner = turnpike_runner::runner_id(config);
    let Some(profile) = config.profile(profile) else {
        anyhow::bail!(
            "no profile {:?} in this configuration (defined: {})",
            profile.unwrap_or_default(),
            config.profile_names().join(", ")
        );
    };
    let chat = turnpike_core::ChatId::new("example-chat")?;
    let message = turnpike_core::wire::InboundMessage::new(chat.clone(), "example", "", None);
    let work = turnpike_core::wire::WorkItem {
        workspace: None,
        v: turnpike_core::FORMAT_VERSION,
        turn: message.turn(),
        chat,
        attempt: 1,
        max_attempts: config.attempt_limit(),
        message,
        history: Vec::new(),
        profile: Some(profile.name.clone()),
    };
    // The image's own entrypoint and command follow the watchdog; read at each attempt.
    let command = turnpike_runner::backend::watchdog_command(
        config.lease,
        ["<the image's entrypoint and command>".to_owned()],
    );
    let body = turnpike_runner::backend::ContainerSettings::new(config, runner).body(
        &work,
        &profile,
        // An attempt started now.
        turnpike_jetstream::now().saturating_add(profile.run_timeout),
        Some(command),
    );
    println!("{}", serde_json::to_string_pretty(&body)?);
    Ok(ExitCode::SUCCESS)
}

/// `turnpike nats-accounts`: the runner users for the runner lines on stdin.
pub fn nats_accounts(template: Option<std::path::PathBuf>) -> Result<ExitCode> {
    use std::io::Read;
    use turnpike_jetstream::accounts;
    let template = match template {
        Some(path) => {
            std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?
        }
        None => accounts::TEMPLATE.to_owned(),
    };
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("read runner lines on stdin")?;
    let runners = accounts::parse_runners(&input)?;
    print!("{}", accounts::render(&template, &runners)?);
    Ok(ExitCode::SUCCESS)
}

/// `turnpike dashboard hash-password`: the hash of the password on stdin.
pub fn hash_password() -> Result<ExitCode> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("read the password on stdin")?;
    let password = line.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        anyhow::bail!("empty password");
    }
    println!("{}", turnpike_dashboard::hash_password(password)?);
    Ok(ExitCode::SUCCESS)
}

/// Serve as an agent's egress proxy until killed (its runner removes the container).
pub async fn egress_proxy(listen: std::net::SocketAddr, allow: &str) -> Result<ExitCode> {
    let allow = turnpike_egress::Allowlist::parse(allow)
        .map_err(|why| anyhow::anyhow!("--allow {allow:?}: {why}"))?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    // Line by line, each whole: the runner reads them from the container's log.
    println!("ready {}", listener.local_addr()?);
    turnpike_egress::serve(listener, allow, |d| println!("{d}")).await;
    Ok(ExitCode::SUCCESS)
}
