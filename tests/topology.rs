//! The `nats/` definitions load into a real nats-server 2.15.1 through the JetStream API (as
//! `nats stream add --config` would send them), and Turnpike creates the same topology itself,
//! idempotently.

use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use std::time::{Duration, SystemTime};
use turnpike_config::Config;
use turnpike_core::subjects;
use turnpike_jetstream::{topology, Publish};
use turnpike_store::Bus;
use turnpike_testkit::NatsServer;

fn config_for(server: &NatsServer) -> Config {
    Config {
        nats_url: server.url(),
        ..Config::default()
    }
}

/// Send each file's JSON, byte for byte, to `$JS.API.STREAM.CREATE.<name>` and
/// `$JS.API.CONSUMER.DURABLE.CREATE.<stream>.<durable>`: what the `nats` CLI does.
async fn load_files_raw(client: &async_nats::Client) {
    for f in topology::STREAM_FILES.iter() {
        let v: serde_json::Value = serde_json::from_str(f.json).expect("valid JSON");
        let name = v["name"].as_str().expect("name");
        let reply = client
            .request(format!("$JS.API.STREAM.CREATE.{name}"), Bytes::from(f.json))
            .await
            .expect("API reply");
        let body: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON reply");
        assert!(body.get("error").is_none(), "{}: {body}", f.file);
    }
    for f in topology::CONSUMER_FILES.iter() {
        let v: serde_json::Value = serde_json::from_str(f.json).expect("valid JSON");
        let durable = v["durable_name"].as_str().expect("durable_name");
        let req = serde_json::json!({"stream_name": f.stream, "config": v});
        let reply = client
            .request(
                format!("$JS.API.CONSUMER.DURABLE.CREATE.{}.{durable}", f.stream),
                Bytes::from(req.to_string()),
            )
            .await
            .expect("API reply");
        let body: serde_json::Value = serde_json::from_slice(&reply.payload).expect("JSON reply");
        assert!(body.get("error").is_none(), "{}: {body}", f.file);
    }
}

async fn stream_configs(js: &jetstream::Context) -> Vec<stream::Config> {
    let mut out = Vec::new();
    for f in topology::STREAM_FILES.iter() {
        let v: serde_json::Value = serde_json::from_str(f.json).expect("valid JSON");
        let mut s = js
            .get_stream(v["name"].as_str().expect("name"))
            .await
            .expect("stream exists");
        out.push(s.info().await.expect("info").config.clone());
    }
    out
}

#[tokio::test]
async fn files_load_through_the_api_and_turnpike_creates_the_same_topology() {
    let by_files = NatsServer::start();
    let by_turnpike = NatsServer::start();
    let files_client = by_files.client().await;
    load_files_raw(&files_client).await;
    let files_js = jetstream::new(files_client.clone());

    // Turnpike's own start-up, twice (idempotent), on a fresh server.
    let config = config_for(&by_turnpike);
    let tp_client = by_turnpike.client().await;
    let tp_js = jetstream::new(tp_client.clone());
    topology::ensure(&tp_js, &config).await.expect("creates");
    topology::ensure(&tp_js, &config).await.expect("idempotent");

    // Same streams, same settings.
    let a = stream_configs(&files_js).await;
    let b = stream_configs(&tp_js).await;
    assert_eq!(a.len(), b.len());
    for (a, b) in a.iter().zip(&b) {
        assert_eq!(a, b, "stream {} differs between nats/ and Turnpike", a.name);
    }

    // Turnpike's start-up over the files' topology changes nothing and succeeds.
    topology::ensure(&files_js, &config_for(&by_files))
        .await
        .expect("ensure over an existing topology");
    assert_eq!(stream_configs(&files_js).await, a);

    // Consumers match too.
    for f in topology::CONSUMER_FILES.iter() {
        let v: serde_json::Value = serde_json::from_str(f.json).expect("valid JSON");
        let durable = v["durable_name"].as_str().expect("durable");
        let get = |js: jetstream::Context| async move {
            let mut c: jetstream::consumer::PullConsumer = js
                .get_stream(f.stream)
                .await
                .expect("stream")
                .get_consumer(durable)
                .await
                .expect("consumer");
            c.info().await.expect("info").config.clone()
        };
        assert_eq!(
            get(files_js.clone()).await,
            get(tp_js.clone()).await,
            "{}",
            f.file
        );
    }

    // The KV streams created from files work as KV buckets and the object store as one.
    let bus = Bus::open(files_client, files_js, &config_for(&by_files))
        .await
        .expect("buckets open");
    turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_TURNS)
        .await
        .create("t-1", Bytes::from_static(b"{\"v\":1}"))
        .await
        .expect("kv create");
    assert!(
        turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_TURNS)
            .await
            .create("t-1", Bytes::from_static(b"{}"))
            .await
            .is_err()
    );
    assert_eq!(
        turnpike_tests::bucket(&bus, turnpike_core::subjects::BUCKET_TURNS)
            .await
            .get("t-1")
            .await
            .expect("get")
            .as_deref(),
        Some(&b"{\"v\":1}"[..])
    );
    let mut data: &[u8] = b"attachment bytes";
    turnpike_store::attachments::put(&bus, "chat/m/file.txt", &mut data)
        .await
        .expect("object put");
}

/// The attachment store reserves its size on the server; a server that cannot hold it refuses
/// the stream, and the error names the setting to lower.
#[tokio::test]
async fn a_store_the_server_cannot_reserve_names_its_setting() {
    let server = NatsServer::start_with_conf("jetstream { max_file_store: 512MB }\n");
    let js = jetstream::new(server.client().await);
    let mut config = config_for(&server);
    config.attachments_store_max_bytes = turnpike_config::ByteSize(1024 * 1024 * 1024);
    let err = topology::ensure(&js, &config)
        .await
        .expect_err("1 GiB does not fit in 512 MB");
    let said = err.to_string();
    assert!(
        said.contains("OBJ_turnpike_attachments") && said.contains("attachments_store_max_bytes"),
        "{said}"
    );
    config.attachments_store_max_bytes = turnpike_config::ByteSize(256 * 1024 * 1024);
    let err = topology::ensure(&js, &config)
        .await
        .expect_err("256 MiB and the workspaces' 1 GiB do not fit");
    assert!(
        err.to_string().contains("workspaces_store_max_bytes"),
        "{err}"
    );
    config.workspaces_store_max_bytes = turnpike_config::ByteSize(128 * 1024 * 1024);
    topology::ensure(&js, &config)
        .await
        .expect("256 + 128 MiB fit");
}

#[tokio::test]
async fn retention_and_replicas_come_from_config() {
    let server = NatsServer::start();
    let mut config = config_for(&server);
    config.retention_events = Duration::from_secs(3600);
    config.retention_chat = Duration::from_secs(7200);
    let js = jetstream::new(server.client().await);
    topology::ensure(&js, &config).await.expect("creates");
    let mut events = js
        .get_stream(subjects::STREAM_EVENTS)
        .await
        .expect("stream");
    assert_eq!(
        events.info().await.expect("info").config.max_age,
        Duration::from_secs(3600)
    );
    // Changing retention later updates the stream in place.
    config.retention_events = Duration::from_secs(1800);
    topology::ensure(&js, &config).await.expect("updates");
    let mut events = js
        .get_stream(subjects::STREAM_EVENTS)
        .await
        .expect("stream");
    assert_eq!(
        events.info().await.expect("info").config.max_age,
        Duration::from_secs(1800)
    );
    let mut chat = js
        .get_stream(subjects::STREAM_CHAT_OUT)
        .await
        .expect("stream");
    assert_eq!(
        chat.info().await.expect("info").config.max_age,
        Duration::from_secs(7200)
    );
}

/// The retry delay is held by message scheduling on the work stream: check that a schedule with a
/// millisecond-precise `@at` fires on the target subject, never before it is due, and only once.
#[tokio::test]
async fn a_schedule_fires_on_the_work_subject_not_before_it_is_due() {
    use futures::StreamExt;
    let server = NatsServer::start();
    let config = config_for(&server);
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let turn = turnpike_core::TurnId::new("t-sched").expect("valid");
    let due = turnpike_jetstream::now().saturating_add(Duration::from_millis(1500));
    Publish::new(
        bus.codec,
        subjects::work_schedule(&turn, 2),
        &serde_json::json!({"v": 1}),
    )
    .expect("encodes")
    .schedule_at(due, &subjects::work_run(&turn))
    .send(&bus.js)
    .await
    .expect("schedule accepted");
    let stream = bus
        .js
        .get_stream(subjects::STREAM_WORK)
        .await
        .expect("stream");
    let consumer = stream
        .get_consumer::<jetstream::consumer::pull::Config>(subjects::CONSUMER_RUNNERS)
        .await
        .expect("runners consumer");
    let mut batch = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(10))
        .messages()
        .await
        .expect("fetch");
    let msg = batch
        .next()
        .await
        .expect("one message within 10 s")
        .expect("message");
    let info = msg.info().expect("jetstream message");
    let fired = turnpike_core::Timestamp::from_system_time(SystemTime::from(info.published));
    assert_eq!(msg.subject.as_str(), subjects::work_run(&turn));
    assert!(fired >= due, "fired at {fired}, before it was due at {due}");
    assert!(
        fired.since(due) < Duration::from_secs(1),
        "fired {:?} late",
        fired.since(due)
    );
    msg.ack().await.expect("ack");
    let mut again = consumer
        .fetch()
        .max_messages(1)
        .expires(Duration::from_secs(2))
        .messages()
        .await
        .expect("fetch");
    assert!(again.next().await.is_none(), "fired more than once");
}

/// A replicated stream refuses a publish whose dedup id another publish is still proposing
/// (10158, "duplicate message id is in process") instead of acknowledging it as a duplicate.
/// Found by fault case f8: an operator's kill and the coordinator finishing the same turn
/// published its final status at once, and the kill was answered "refused". Every publish of
/// one id, however many race, is acknowledged, exactly one of them as the stored message.
#[tokio::test]
async fn racing_publishes_of_one_dedup_id_in_a_cluster_are_all_acknowledged() {
    let nodes = NatsServer::cluster(3);
    let client = nodes[0].client().await;
    let js = jetstream::new(client);
    turnpike_testkit::eventually(Duration::from_secs(30), "a replicated stream", || {
        let js = js.clone();
        async move {
            js.get_or_create_stream(stream::Config {
                name: "DEDUP".into(),
                subjects: vec!["dedup.>".into()],
                num_replicas: 3,
                ..Default::default()
            })
            .await
            .ok()
        }
    })
    .await;
    for round in 0..30 {
        let sends = (0..8).map(|_| {
            Publish::new(
                turnpike_core::codec::Codec::Json,
                format!("dedup.{round}"),
                &serde_json::json!({ "round": round }),
            )
            .expect("encode")
            .msg_id(&format!("id-{round}"))
            .send(&js)
        });
        let acks = futures::future::join_all(sends).await;
        let stored = acks
            .iter()
            .map(|a| match a {
                Ok(ack) => !ack.duplicate,
                Err(e) => panic!("round {round}: a racing duplicate was refused: {e}"),
            })
            .filter(|s| *s)
            .count();
        assert_eq!(stored, 1, "round {round}: stored once");
    }
}
