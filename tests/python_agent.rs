//! Issue 37, the example LLM agent (`turnpike-python-agent:latest`, deploy/images/python-agent)
//! end to end in Docker: against a stand-in OpenAI-compatible endpoint on a network of the test's
//! own (`turnpike-test-llm`, which checks the key), through the attempt's egress proxy, with the
//! key given as a secret. Needs the images: `bash deploy/build-images.sh` (tests/run.sh does it).

use std::io::{Read, Write};
use std::time::Duration;
use turnpike_config::{ByteSize, Config};
use turnpike_core::record::TurnState;
use turnpike_core::wire::{ExitClass, OutboundKind};
use turnpike_store::Bus;
use turnpike_testkit::NatsServer;
use turnpike_tests::*;

const T: Duration = Duration::from_secs(120);
const KEY: &str = "sk-test-python-agent-0123456789";

/// The stack for the example agent: its image, the endpoint on the allowlist, the key as a
/// secret, the endpoint's URL and model as the agent's variables.
struct Stack {
    endpoints: Endpoints,
    _secrets: tempfile::TempDir,
    _server: NatsServer,
    roles: Vec<Role>,
    bus: Bus,
    config: Config,
}

impl Stack {
    async fn start(tag: &str, tweak: impl FnOnce(&mut Config)) -> Stack {
        let endpoints = Endpoints::start(tag, &["llm"], &["--key", KEY]).await;
        let secrets = tempfile::tempdir().expect("dir");
        std::fs::write(secrets.path().join("openai_key"), format!("{KEY}\n")).expect("write");
        let server = NatsServer::start();
        let mut config = docker_config(&server, &format!("dt-py-{tag}"));
        config.agent_image = "turnpike-python-agent:latest".into();
        config.egress_allow = "llm:8080".into();
        config.egress_network = endpoints.network.clone();
        config.secrets_dir = Some(secrets.path().to_path_buf());
        config.agent_secrets = "openai_key:OPENAI_API_KEY".into();
        config.agent_env = [
            ("LLM_URL".to_owned(), "http://llm:8080/v1".to_owned()),
            ("LLM_MODEL".to_owned(), "test-model".to_owned()),
        ]
        .into();
        tweak(&mut config);
        let roles = vec![
            start_dispatcher(&config).await,
            start_coordinator(&config).await,
            start_runner(&config).await,
        ];
        let bus = Bus::connect(&config, "test").await.expect("bus");
        Stack {
            endpoints,
            _secrets: secrets,
            _server: server,
            roles,
            bus,
            config,
        }
    }

    /// Stop the runner and start another (its own id) in its place.
    async fn another_runner(&mut self, id: &str) {
        if let Some(old) = self.roles.pop() {
            old.stop().await;
        }
        let config = Config {
            runner_id: Some(id.into()),
            ..self.config.clone()
        };
        self.roles.push(start_runner(&config).await);
    }

    /// What the endpoint says it was asked (`GET /stats`), from the host (the test's network is
    /// a bridge the host reaches by address).
    async fn stats(&self) -> serde_json::Value {
        let ip = self.endpoints.address("llm").await;
        let mut s = std::net::TcpStream::connect((ip.as_str(), 8080)).expect("reach the endpoint");
        s.write_all(b"GET /stats HTTP/1.1\r\nHost: llm\r\nConnection: close\r\n\r\n")
            .expect("ask");
        let mut r = String::new();
        s.read_to_string(&mut r).expect("read");
        let body = r.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        serde_json::from_str(body).expect("stats JSON")
    }

    async fn stop(self) {
        for r in self.roles {
            r.stop().await;
        }
    }
}

/// A reply lands: the agent called the endpoint through its proxy with the key from its secret
/// (the endpoint answers only that key), streamed status lines, and answered; a second message
/// in the chat carries the first exchange as history.
#[tokio::test]
async fn the_example_agent_answers_through_its_proxy_with_its_key() {
    let stack = Stack::start("reply", |_| {}).await;
    let chat = "dt-py-reply";
    let turn = send(&stack.bus, chat, "py-reply-1", "hello there").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    let items = chat_items(&stack.bus, chat).await;
    assert!(
        items
            .iter()
            .any(|i| i.kind == OutboundKind::Status && i.text.starts_with("thinking")),
        "{items:?}"
    );
    let replies = visible_items(&stack.bus, chat).await;
    assert_eq!(replies[0].text, "llm heard: hello there");

    let turn = send(&stack.bus, chat, "py-reply-2", "and again").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    let stats = stack.stats().await;
    assert_eq!(stats["completions"], 2, "{stats}");
    let asked: Vec<(String, String)> = stats["last"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| {
            (
                m["role"].as_str().unwrap_or_default().to_owned(),
                m["content"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        asked[1..].to_vec(),
        [
            ("user".to_owned(), "hello there".to_owned()),
            ("assistant".to_owned(), "llm heard: hello there".to_owned()),
            ("user".to_owned(), "and again".to_owned()),
        ],
        "{stats}"
    );
    stack.stop().await;
}

/// The concept's case: the first attempt is killed for memory (the endpoint's answer is one
/// 100 MiB line, at a 64 MiB limit) with nothing said; the retry, a brand-new container, sends
/// the prompt behind the retry note (the endpoint then answers briefly) and its reply lands.
#[tokio::test]
async fn an_out_of_memory_first_attempt_is_retried_with_the_note_and_answers() {
    let stack = Stack::start("oom", |c| {
        c.memory_limit = ByteSize(64 << 20);
        c.max_turn_retry = 2;
    })
    .await;
    let chat = "dt-py-oom";
    let turn = send(&stack.bus, chat, "py-oom-1", "llm-bloat please").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(record.attempts.len(), 2, "{record:?}");
    let first = record.attempts[0].exit.clone().expect("exit");
    assert_eq!(first.class, ExitClass::OomKilled, "{first:?}");
    let replies = visible_items(&stack.bus, chat).await;
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].text, "llm heard: llm-bloat please");
    let stats = stack.stats().await;
    let prompt = stats["last"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        prompt.starts_with("<system-note>") && prompt.ends_with("\nllm-bloat please"),
        "{prompt}"
    );
    stack.stop().await;
}

/// An endpoint that goes silent: the agent posts what it has before its deadline, so the turn is
/// replied (one attempt, not retried) instead of dying mid-thought at the time limit.
#[tokio::test]
async fn a_silent_endpoint_gets_a_summary_before_the_deadline() {
    let stack = Stack::start("deadline", |c| {
        c.run_timeout = Duration::from_secs(20);
        c.agent_env
            .insert("SUMMARY_MARGIN".to_owned(), "8".to_owned());
    })
    .await;
    let chat = "dt-py-deadline";
    let turn = send(&stack.bus, chat, "py-deadline-1", "llm-hang forever").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(record.attempts.len(), 1, "{record:?}");
    let replies = visible_items(&stack.bus, chat).await;
    assert_eq!(replies[0].text, "I ran out of time before finishing.");
    stack.stop().await;
}

/// The agent keeps notes in its chat's workspace: what it wrote in turn 1 is shown to the model
/// in turn 2, which another runner runs.
#[tokio::test]
async fn the_example_agent_reads_its_notes_from_an_earlier_turn_on_another_runner() {
    let mut stack = Stack::start("notes", |c| {
        c.workspace_max_bytes = ByteSize(1 << 20);
    })
    .await;
    let chat = "dt-py-notes";
    let turn = send(&stack.bus, chat, "py-notes-1", "remember apples").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    stack.another_runner("dt-py-notes-2").await;
    let turn = send(&stack.bus, chat, "py-notes-2", "what did I say?").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    assert_eq!(
        record.attempts[0].runner.as_ref().map(|r| r.as_str()),
        Some("dt-py-notes-2")
    );
    let stats = stack.stats().await;
    let system = stats["last"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        system.contains("Your notes from earlier turns")
            && system.contains("asked 'remember apples'"),
        "{system}"
    );
    stack.stop().await;
}

/// An endpoint that cuts its stream off mid-answer: the agent counts it as a death (exit 1,
/// nothing said), retried in a fresh container, and the turn gives up when it keeps happening.
#[tokio::test]
async fn a_stream_cut_off_is_a_death_and_is_retried() {
    let stack = Stack::start("drop", |c| c.max_turn_retry = 2).await;
    let chat = "dt-py-drop";
    let turn = send(&stack.bus, chat, "py-drop-1", "llm-drop now").await;
    let record = wait_ended(&stack.bus, &turn, T).await;
    assert_eq!(record.state, TurnState::GaveUp, "{record:?}");
    assert_eq!(record.attempts.len(), 2, "{record:?}");
    for a in &record.attempts {
        let exit = a.exit.clone().expect("exit");
        assert_eq!(exit.class, ExitClass::Crashed, "{exit:?}");
        assert_eq!(exit.exit_code, Some(1), "{exit:?}");
    }
    assert_eq!(stack.stats().await["completions"], 2);
    stack.stop().await;
}
