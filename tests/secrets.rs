//! Issue 37: secrets for agents. An agent gets each configured secret as a file (and as a
//! variable where asked), read at its attempt; no value ever reaches a turn record, a stream, a
//! log line, the dashboard, `turnpike runner container-spec` or an error, even when the agent
//! prints it: in a reply, a status line, its verdict, on stderr, as a stray line, in a run that
//! fails, in one that dies and is retried. Each search has a positive control (what replaced the
//! value is found where the value would have been), so an empty search cannot pass by accident.
//! A test binary of its own: it captures every role's log lines, at debug, in one buffer.

use std::sync::{Arc, Mutex};
use std::time::Duration;
use turnpike_core::record::TurnState;
use turnpike_core::wire::ExitClass;
use turnpike_test_agent::fnv1a;
use turnpike_testkit::{dashboard_login, http, serve_dashboard};
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(60);
const REDACTED: &str = "[secret api_key]";

/// Every log line of this process, as written.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(
            &self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
        .into_owned()
    }
}

/// Every file under `dir` whose bytes hold `needle`.
fn files_holding(dir: &std::path::Path, needle: &[u8]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                todo.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                if bytes.windows(needle.len()).any(|w| w == needle) {
                    found.push(path);
                }
            }
        }
    }
    found
}

#[tokio::test]
async fn no_secret_value_leaves_the_agent() {
    let logs = Captured::default();
    let writer = logs.clone();
    tracing_subscriber::fmt()
        .with_env_filter("info,turnpike_runner=debug")
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .init();
    // A value no test could write by chance.
    let value = format!("tp-secret-{:032x}", rand::random::<u128>());
    let secrets = tempfile::tempdir().expect("dir");
    std::fs::write(secrets.path().join("api_key"), format!("{value}\n")).expect("write");
    let p = Pipeline::start(AGENT, |c| {
        c.secrets_dir = Some(secrets.path().to_path_buf());
        c.agent_secrets = "api_key:AGENT_API_KEY".into();
        c.max_turn_retry = 3;
    })
    .await;

    // The agent has it, as a file and as its variable (without the file's newline).
    let given = send(&p.bus, "sec-1", "m-1", "secret:api_key:AGENT_API_KEY").await;
    // It prints it everywhere, dies (an error naming it), and is retried: then replies with it.
    let retried = send(&p.bus, "sec-2", "m-2", "leak:api_key").await;
    // It fails (its verdict naming it): not retried.
    let failed = send(&p.bus, "sec-3", "m-3", "leak-fail:api_key").await;
    let given_rec = wait_ended(&p.bus, &given, T).await;
    let retried_rec = wait_ended(&p.bus, &retried, T).await;
    let failed_rec = wait_ended(&p.bus, &failed, T).await;
    assert_eq!(given_rec.state, TurnState::Done, "{given_rec:?}");
    let reply = &visible_items(&p.bus, "sec-1").await[0].text;
    assert_eq!(
        *reply,
        format!(
            "secret api_key file {} env {}",
            fnv1a(format!("{value}\n").as_bytes()),
            fnv1a(value.as_bytes())
        )
    );
    assert_eq!(retried_rec.state, TurnState::Done, "{retried_rec:?}");
    assert_eq!(retried_rec.attempts.len(), 2, "{retried_rec:?}");
    let first = retried_rec.attempts[0].exit.as_ref().expect("exit");
    assert_eq!(first.class, ExitClass::Crashed, "{first:?}");
    assert_eq!(
        first.error.as_deref(),
        Some(format!("401 for key {REDACTED}").as_str())
    );
    let replies: Vec<String> = visible_items(&p.bus, "sec-2")
        .await
        .into_iter()
        .map(|i| i.text)
        .collect();
    assert!(
        replies.contains(&format!("my key is {REDACTED}")),
        "{replies:?}"
    );
    let statuses = chat_items(&p.bus, "sec-2").await;
    assert!(
        statuses
            .iter()
            .any(|i| i.text == format!("calling the model with key {REDACTED}")),
        "{statuses:?}"
    );
    assert_eq!(failed_rec.state, TurnState::Failed, "{failed_rec:?}");
    assert_eq!(failed_rec.attempts.len(), 1);
    let error = failed_rec.attempts[0]
        .exit
        .as_ref()
        .and_then(|e| e.error.clone());
    assert_eq!(error, Some(format!("refused with key {REDACTED}")));

    // The dashboard: every page these turns and chats have.
    let (base, stop) = serve_dashboard(&p.bus, &p.config, "op", "op-password").await;
    let cookie = dashboard_login(&base, "op", "op-password").await;
    let mut pages = vec![
        "/".to_owned(),
        "/live".into(),
        "/errored".into(),
        "/runners".into(),
    ];
    for (chat, turn) in [("sec-1", &given), ("sec-2", &retried), ("sec-3", &failed)] {
        pages.push(format!("/chats/{chat}"));
        pages.push(format!("/turns/{turn}"));
    }
    let mut shown = String::new();
    for path in &pages {
        let (status, _, body) = http(&base, "GET", path, &[("Cookie", &cookie)], "").await;
        assert_eq!(status, 200, "{path}");
        assert!(!body.contains(&value), "{path} shows the secret");
        shown.push_str(&body);
    }
    assert!(
        shown.contains(REDACTED),
        "the turn pages show what the agent said"
    );
    stop.cancel();

    // What `turnpike runner container-spec` prints: names, never values.
    let chat = turnpike_core::ChatId::new("sec-9").expect("chat");
    let message = turnpike_core::wire::InboundMessage::new(chat.clone(), "m-1", "hi", None);
    let work = turnpike_core::wire::WorkItem {
        workspace: None,
        v: turnpike_core::FORMAT_VERSION,
        turn: message.turn(),
        chat,
        attempt: 1,
        max_attempts: 3,
        message,
        history: Vec::new(),
        profile: None,
    };
    let spec = turnpike_runner::backend::ContainerSettings::new(
        &p.config,
        turnpike_core::RunnerId::new("r").expect("id"),
    )
    .body(
        &work,
        &p.config.profile(None).expect("the default profile"),
        turnpike_jetstream::now(),
        None,
    );
    let spec = serde_json::to_string(&spec).expect("json");
    assert!(
        spec.contains("TURNPIKE_SECRET_ENV=AGENT_API_KEY=api_key"),
        "{spec}"
    );
    assert!(spec.contains("/run/secrets"), "{spec}");
    assert!(!spec.contains(&value), "{spec}");

    // The store, once the server has written it out; every log line.
    let Pipeline {
        mut server, roles, ..
    } = p;
    for r in roles {
        r.stop().await;
    }
    server.shut_down();
    let store = server.store_dir().to_path_buf();
    assert!(
        !files_holding(&store, REDACTED.as_bytes()).is_empty(),
        "the store holds what the agent said"
    );
    let leaked = files_holding(&store, value.as_bytes());
    assert!(leaked.is_empty(), "the store holds the secret: {leaked:?}");
    assert!(!server.log().contains(&value));
    let logged = logs.text();
    assert!(
        logged.contains(&format!("Authorization: Bearer {REDACTED}")),
        "the agent's stderr is logged, the secret taken out"
    );
    assert!(!logged.contains(&value), "a log line holds the secret");
}
