//! One role in its own process (config from the environment), so tests can kill -9 it:
//! `test-role runner` or `test-role coordinator`.
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let role = std::env::args().nth(1).unwrap_or_default();
    let mut config = turnpike_config::Config::load(None).expect("config from the environment");
    if role == "runner" {
        config = turnpike_runner::nats_identity(config).expect("the runner's identity");
    }
    let bus = turnpike_store::Bus::connect(&config, &format!("test-{role}"))
        .await
        .expect("connect");
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        t.cancel();
    });
    match role.as_str() {
        "runner" => turnpike_runner::Runner::new(bus, config)
            .await
            .expect("runner")
            .run(token)
            .await
            .expect("runner runs"),
        "coordinator" => turnpike_coordinator::Coordinator::new(bus, &config)
            .run(token)
            .await
            .expect("coordinator runs"),
        other => panic!("unknown role {other:?}; expected runner or coordinator"),
    }
}
