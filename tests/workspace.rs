//! Issue 37, the per-chat workspace: a directory an agent keeps between its chat's turns, on any
//! runner, saved only by an attempt that ends its turn cleanly while it holds the fence. The
//! process backend here (the agent works in the runner's copy); Docker in tests/docker.rs and
//! tests/python_agent.rs.

use std::time::Duration;
use turnpike_config::{ByteSize, Config};
use turnpike_core::record::TurnState;
use turnpike_core::ChatId;
use turnpike_store::Bus;
use turnpike_testkit::NatsServer;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");
const T: Duration = Duration::from_secs(30);

/// One turn's reply (the turn must end done).
async fn reply(bus: &Bus, chat: &str, id: &str, text: &str) -> String {
    let turn = send(bus, chat, id, text).await;
    let record = wait_ended(bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    let items = visible_items(bus, chat).await;
    let mine: Vec<_> = items.iter().filter(|i| i.turn == turn).collect();
    mine.last().expect("a reply").text.clone()
}

#[tokio::test]
async fn a_chats_workspace_persists_across_turns_and_runners_and_a_retry_starts_from_the_first_attempts(
) {
    let server = NatsServer::start();
    let config = Config {
        workspace_max_bytes: ByteSize(1 << 20),
        max_turn_retry: 2,
        runner_id: Some("ws-runner-1".into()),
        ..test_config(&server, AGENT)
    };
    let mut roles = vec![
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let first_runner = start_runner(&config).await;
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = "ws-chat";
    let ok = "Ok(())";
    assert_eq!(
        reply(&bus, chat, "ws-1", "workspace-note:one").await,
        format!("notes: (none) {ok}")
    );
    assert_eq!(
        reply(&bus, chat, "ws-2", "workspace-note:two").await,
        format!("notes: one {ok}")
    );

    // Another runner from here on: the workspace is the chat's, not a runner's.
    first_runner.stop().await;
    let second = Config {
        runner_id: Some("ws-runner-2".into()),
        ..config.clone()
    };
    roles.push(start_runner(&second).await);

    // Attempt 1 writes, then dies: its write is discarded, and the retry starts from exactly
    // what attempt 1 started from.
    assert_eq!(
        reply(&bus, chat, "ws-3", "workspace-note-die-once:three").await,
        format!("notes: one|two {ok}")
    );
    assert_eq!(
        reply(&bus, chat, "ws-4", "workspace-note:four").await,
        format!("notes: one|two|three {ok}")
    );
    // Over its limit at the end of a run: not saved; the chat keeps the version it had.
    reply(&bus, chat, "ws-5", "workspace-fill:2000000").await;
    assert_eq!(
        reply(&bus, chat, "ws-6", "workspace-note:six").await,
        format!("notes: one|two|three|four {ok}")
    );
    // The chat's record names its current version and the one before, the attempts that saved
    // them; older versions are deleted.
    let chat_id = ChatId::new(chat).expect("id");
    let ws = turnpike_store::workspaces::of_chat(&bus, &chat_id)
        .await
        .expect("read")
        .expect("a workspace");
    let previous = ws.previous.clone().expect("a previous version");
    let max = 1 << 20;
    let got = |object: String| {
        let bus = bus.clone();
        async move {
            turnpike_store::workspaces::get(&bus, &object, max)
                .await
                .expect("read")
        }
    };
    assert!(got(ws.current.clone()).await.is_some());
    assert!(got(previous.clone()).await.is_some());
    let record = |id: &str| turnpike_core::TurnId::for_message(&chat_id, id);
    assert_eq!(ws.current, format!("{chat}/{}/1", record("ws-6")));
    assert_eq!(previous, format!("{chat}/{}/1", record("ws-4")));
    for (id, attempt) in [("ws-1", 1), ("ws-2", 1), ("ws-3", 2), ("ws-5", 1)] {
        let gone = format!("{chat}/{}/{attempt}", record(id));
        assert_eq!(got(gone.clone()).await, None, "{gone} is kept");
    }

    // An operator's reset: the next turn starts empty, and the versions are gone.
    let removed = turnpike_store::workspaces::reset(&bus, &chat_id)
        .await
        .expect("reset");
    assert_eq!(removed, vec![ws.current.clone(), previous.clone()]);
    assert_eq!(
        reply(&bus, chat, "ws-7", "workspace-note:seven").await,
        format!("notes: (none) {ok}")
    );
    assert_eq!(got(ws.current).await, None);
    for r in roles {
        r.stop().await;
    }
}

/// The save step itself: the object an attempt stored becomes the chat's only while that
/// attempt holds the turn's fence; once it was declared lost, the save discards the object and
/// leaves the chat's workspace as it was.
#[tokio::test]
async fn a_save_by_an_attempt_that_lost_the_fence_is_discarded() {
    use turnpike_core::fence::FenceWriter;
    let server = NatsServer::start();
    let config = test_config(&server, AGENT);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = ChatId::new("ws-fence").expect("id");
    let (record, _) = turnpike_core::lifecycle::create(
        turnpike_core::lifecycle::NewTurn {
            turn: turnpike_core::TurnId::for_message(&chat, "m-1"),
            message: turnpike_core::wire::InboundMessage {
                v: 1,
                id: "m-1".into(),
                chat: chat.clone(),
                text: "x".into(),
                sender: None,
                attachments: vec![],
            },
            history: vec![],
            max_turn_retry: 1,
            retry_delay: Duration::from_secs(1),
            rerun_of: None,
            created_by: None,
            admit_now: true,
        },
        turnpike_jetstream::now(),
    );
    let runner = turnpike_core::RunnerId::new("ws-r").expect("id");
    let store = |name: String| {
        let bus = bus.clone();
        async move {
            turnpike_store::workspaces::put(&bus, &name, &mut &b"a tar"[..])
                .await
                .expect("put");
            name
        }
    };
    // Held: saved.
    turnpike_store::fence::take(&bus, &record.turn, 1, &runner)
        .await
        .expect("take");
    let one = store(format!("{chat}/{}/1", record.turn)).await;
    turnpike_store::workspaces::save(&bus, &record, 1, &one)
        .await
        .expect("save");
    let ws = turnpike_store::workspaces::of_chat(&bus, &chat)
        .await
        .expect("read")
        .expect("saved");
    assert_eq!((ws.current.as_str(), ws.previous), (one.as_str(), None));
    // Declared lost: the next save of that attempt is discarded.
    turnpike_store::fence::lose(&bus, &record.turn, 1, &FenceWriter::Service)
        .await
        .expect("lose");
    let late = store(format!("{chat}/{}/1-late", record.turn)).await;
    turnpike_store::workspaces::save(&bus, &record, 1, &late)
        .await
        .expect("save");
    let after = turnpike_store::workspaces::of_chat(&bus, &chat)
        .await
        .expect("read")
        .expect("kept");
    assert_eq!(after.current, one, "the chat's workspace is unchanged");
    assert_eq!(
        turnpike_store::workspaces::get(&bus, &late, 1 << 20)
            .await
            .expect("read"),
        None,
        "the superseded attempt's object is deleted"
    );
}

/// In Docker: the agent finds the workspace at `/turnpike/workspace` (its own, owned by its
/// user), a note written in turn 1 is read in turn 2 on another runner, and a dying attempt's
/// write is discarded.
#[tokio::test]
async fn in_docker_the_workspace_follows_the_chat_to_another_runner() {
    let server = NatsServer::start();
    let mut config = docker_config(&server, "dt-ws-1");
    config.workspace_max_bytes = ByteSize(1 << 20);
    config.max_turn_retry = 2;
    let mut roles = vec![
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
    ];
    let first = start_runner(&config).await;
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let chat = "dt-ws-chat";
    let ok = "Ok(())";
    assert_eq!(
        reply(&bus, chat, "dt-ws-1", "workspace-note:one").await,
        format!("notes: (none) {ok}")
    );
    first.stop().await;
    let second = Config {
        runner_id: Some("dt-ws-2".into()),
        ..config.clone()
    };
    roles.push(start_runner(&second).await);
    assert_eq!(
        reply(&bus, chat, "dt-ws-2", "workspace-note-die-once:two").await,
        format!("notes: one {ok}")
    );
    assert_eq!(
        reply(&bus, chat, "dt-ws-3", "workspace-note:three").await,
        format!("notes: one|two {ok}")
    );
    for r in roles {
        r.stop().await;
    }
    let docker = docker_client().await;
    for runner in ["dt-ws-1", "dt-ws-2"] {
        assert!(runner_containers(&docker, runner).await.is_empty());
    }
}
