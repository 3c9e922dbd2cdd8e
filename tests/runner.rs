//! A runner in its own process (config from the environment), so tests can kill -9 it.
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() {
    let config = turnpike_config::Config::load(None).expect("config from the environment");
    let bus = turnpike_jetstream::Bus::connect(&config, "test-runner")
        .await
        .expect("connect");
    let runner = turnpike_runner::Runner::new(bus, config)
        .await
        .expect("runner");
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        t.cancel();
    });
    runner.run(token).await.expect("runner runs");
}
