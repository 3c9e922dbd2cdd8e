//! Turnpike's roles running in this process against a test nats-server: one way to start a
//! pipeline, for the end-to-end tests and the benchmarks alike.

use crate::NatsServer;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use turnpike_config::Config;
use turnpike_store::Bus;

/// A config for tests: the given server, the process backend running the test agent, short
/// delays (tests that check the real values set their own).
pub fn test_config(server: &NatsServer, agent: &str) -> Config {
    Config {
        nats_url: server.url(),
        runner_backend: turnpike_config::Backend::Process,
        agent_command: Some(agent.to_owned()),
        retry_delay: Duration::from_millis(500),
        stop_grace: Duration::from_secs(2),
        lease: Duration::from_secs(4),
        heartbeat: Duration::from_secs(1),
        ..Config::default()
    }
}

/// One role running in this process.
pub struct Role {
    token: CancellationToken,
    task: JoinHandle<()>,
}

impl Role {
    /// Run `role` (a role's `run(token)` future) as a task that can be stopped or aborted.
    fn spawn<F, E>(name: &'static str, role: impl FnOnce(CancellationToken) -> F) -> Role
    where
        F: std::future::Future<Output = Result<(), E>> + Send + 'static,
        E: std::fmt::Display,
    {
        let token = CancellationToken::new();
        let run = role(token.clone());
        Role {
            token,
            task: tokio::spawn(async move {
                if let Err(e) = run.await {
                    panic!("{name} failed: {e}");
                }
            }),
        }
    }

    /// Stop as a role stops on SIGTERM: drain, then return.
    pub async fn stop(self) {
        self.token.cancel();
        let _ = self.task.await;
    }

    /// Stop at once, like kill -9 (the task is aborted where it stands).
    pub fn abort(self) {
        self.task.abort();
    }
}

pub async fn start_dispatcher(config: &Config) -> Role {
    let bus = Bus::connect(config, "test-dispatcher").await.expect("bus");
    let d = turnpike_dispatcher::Dispatcher::new(bus, config.clone());
    Role::spawn("dispatcher", |t| d.run(t))
}

pub async fn start_coordinator(config: &Config) -> Role {
    let bus = Bus::connect(config, "test-coordinator").await.expect("bus");
    let c = turnpike_coordinator::Coordinator::new(bus, config);
    Role::spawn("coordinator", |t| c.run(t))
}

pub async fn start_runner(config: &Config) -> Role {
    let config = turnpike_runner::nats_identity(config.clone()).expect("the runner's identity");
    let bus = Bus::connect(&config, "test-runner").await.expect("bus");
    let r = turnpike_runner::Runner::new(bus, config.clone())
        .await
        .expect("runner config");
    Role::spawn("runner", |t| r.run(t))
}

/// A whole pipeline on its own nats-server: a dispatcher, a coordinator (unless left to the
/// caller) and `runners` runners in this process, and an admin connection.
pub struct Pipeline {
    pub server: NatsServer,
    pub bus: Bus,
    pub config: Config,
    pub roles: Vec<Role>,
}

impl Pipeline {
    /// The tests' pipeline: [`test_config`] for `agent`, adjusted by `tweak`, one runner.
    pub async fn start(agent: &str, tweak: impl FnOnce(&mut Config)) -> Pipeline {
        let server = NatsServer::start();
        let mut config = test_config(&server, agent);
        tweak(&mut config);
        Pipeline::start_on(server, config, 1, true).await
    }

    /// Start the roles on `server` with `config` (whose `nats_url` is set to the server's).
    /// Runners are named `<runner_id or "runner">-<k>` when there is more than one.
    pub async fn start_on(
        server: NatsServer,
        mut config: Config,
        runners: usize,
        coordinator: bool,
    ) -> Pipeline {
        config.nats_url = server.url();
        let mut roles = vec![start_dispatcher(&config).await];
        if coordinator {
            roles.push(start_coordinator(&config).await);
        }
        for k in 0..runners {
            let mut c = config.clone();
            if runners > 1 {
                let base = config.runner_id.as_deref().unwrap_or("runner");
                c.runner_id = Some(format!("{base}-{k}"));
            }
            roles.push(start_runner(&c).await);
        }
        let bus = Bus::connect(&config, "test").await.expect("bus");
        Pipeline {
            server,
            bus,
            config,
            roles,
        }
    }

    /// Stop every role (drained), leaving the server running until this is dropped.
    pub async fn stop(self) {
        for r in self.roles {
            r.stop().await;
        }
    }
}
