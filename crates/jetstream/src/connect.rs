use crate::BusError;
use async_nats::{ConnectOptions, ServerAddr};
use std::time::Duration;
use turnpike_config::Config;

/// The servers of `nats_url`, for messages.
pub fn describe_servers(config: &Config) -> String {
    config.nats_servers().join(",")
}

/// Connect with the configured credentials. Fails fast (with a message that says what to check)
/// if no server answers now; once connected, the client reconnects forever.
pub async fn connect(config: &Config, client_name: &str) -> Result<async_nats::Client, BusError> {
    let servers: Vec<ServerAddr> = config
        .nats_servers()
        .iter()
        .map(|s| {
            s.parse::<ServerAddr>().map_err(|e| {
                BusError::Setting(format!("nats_url entry {s:?} is not a server address: {e}"))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut opts = ConnectOptions::new()
        .name(client_name)
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)));
    if let Some(creds) = &config.nats_creds {
        opts = opts.credentials_file(creds).await.map_err(|e| {
            BusError::Setting(format!(
                "cannot read nats_creds file {}: {e}",
                creds.display()
            ))
        })?;
    }
    let password = match &config.nats_password_file {
        Some(file) => Some(read_secret(file)?),
        None => config.nats_password.clone(),
    };
    if let Some(prefix) = &config.nats_inbox_prefix {
        opts = opts.custom_inbox_prefix(prefix.clone());
    }
    match (&config.nats_user, &password) {
        (Some(u), Some(p)) => opts = opts.user_and_password(u.clone(), p.clone()),
        (Some(_), None) | (None, Some(_)) => {
            return Err(BusError::Setting(
                "set both nats_user and nats_password (or nats_password_file), or neither".into(),
            ))
        }
        (None, None) => {}
    }
    if let Some(token) = &config.nats_token {
        opts = opts.token(token.clone());
    }
    if config.nats_tls {
        opts = opts.require_tls(true);
    }
    if let Some(ca) = &config.nats_tls_ca {
        opts = opts.add_root_certificates(ca.clone());
    }
    match (&config.nats_tls_cert, &config.nats_tls_key) {
        (Some(c), Some(k)) => opts = opts.add_client_certificate(c.clone(), k.clone()),
        (Some(_), None) | (None, Some(_)) => {
            return Err(BusError::Setting(
                "set both nats_tls_cert and nats_tls_key for mutual TLS, or neither".into(),
            ))
        }
        (None, None) => {}
    }
    let client = opts.connect(servers).await.map_err(|e| BusError::Connect {
        servers: describe_servers(config),
        source: Box::new(e),
    })?;
    check_max_payload(client.server_info().max_payload, config)?;
    Ok(client)
}

/// Every budget is computed for `max_payload`: servers that accept less would refuse what
/// Turnpike builds, forever. Refuse to start instead, saying what to change.
fn check_max_payload(server: usize, config: &Config) -> Result<(), BusError> {
    let want = config.max_payload.0;
    if (server as u64) < want {
        return Err(BusError::Setting(format!(
            "the NATS server accepts messages of up to {server} bytes (its max_payload), but \
             max_payload is {want}: set TURNPIKE_MAX_PAYLOAD to {server} or less (and the limits \
             that must fit it), or raise the servers' max_payload"
        )));
    }
    Ok(())
}

/// A secret kept in a file (a mounted Docker secret): its content without trailing white space.
fn read_secret(file: &std::path::Path) -> Result<String, BusError> {
    let text = std::fs::read_to_string(file).map_err(|e| {
        BusError::Setting(format!(
            "cannot read nats_password_file {}: {e}",
            file.display()
        ))
    })?;
    let secret = text.trim_end().to_owned();
    if secret.is_empty() {
        return Err(BusError::Setting(format!(
            "nats_password_file {} is empty",
            file.display()
        )));
    }
    Ok(secret)
}
