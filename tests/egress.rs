//! Issue 37, the egress allowlist, against the real Docker Engine: an agent whose profile lists
//! destinations reaches those through its proxy and nothing else. Everything runs on a network
//! of the test's own (`tp-egress-<pid>`), where two stand-in endpoints (`llm` and `other`, the
//! test agent image's `/llm`) listen; nothing leaves the machine.
//! Needs the images: `bash deploy/build-images.sh` (tests/run.sh does it).

use std::time::Duration;
use turnpike_config::ProfileSettings;
use turnpike_core::record::TurnState;
use turnpike_store::Bus;
use turnpike_testkit::NatsServer;
use turnpike_tests::*;

const T: Duration = Duration::from_secs(90);

/// An agent on an allowlist of `llm:8080`: the listed endpoint answers through the proxy (by
/// a CONNECT tunnel and by a plain proxied request); the other host, and the listed host at
/// another port, are refused by the proxy; a connection straight to the endpoint's address
/// fails, while the same probe from a container on the endpoints' network connects (the
/// probe works; the list is what stops it). Nothing of the attempt's egress is left after.
#[tokio::test]
async fn an_agent_reaches_its_list_through_the_proxy_and_nothing_else() {
    let endpoints = Endpoints::start("list", &["llm", "other"], &[]).await;
    let llm_ip = endpoints.address("llm").await;
    let server = NatsServer::start();
    let runner = "dt-egress";
    let mut config = docker_config(&server, runner);
    config.egress_allow = "llm:8080".into();
    config.egress_network = endpoints.network.clone();
    config.profiles.insert(
        "open".into(),
        ProfileSettings {
            egress_allow: Some(String::new()),
            network_mode: Some(endpoints.network.clone()),
            ..Default::default()
        },
    );
    let roles = [
        start_dispatcher(&config).await,
        start_coordinator(&config).await,
        start_runner(&config).await,
    ];
    let bus = Bus::connect(&config, "test").await.expect("bus");
    let probes = format!(
        "fetch:http://llm:8080/,http://other:8080/,http://llm:9090/,plain=http://llm:8080/x,plain=http://other:8080/,direct={llm_ip}:8080,direct=llm:8080"
    );
    let turn = send(&bus, "dt-egress-listed", "m-1", &probes).await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    let items = visible_items(&bus, "dt-egress-listed").await;
    let refused = |dest: &str| {
        format!("turnpike egress proxy: {dest} is not on this agent's egress allowlist")
    };
    let lines: Vec<&str> = items[0].text.lines().collect();
    assert_eq!(lines[0], "http://llm:8080/ -> 200 hello from llm");
    assert_eq!(
        lines[1],
        format!("http://other:8080/ -> proxy 403 {}", refused("other:8080"))
    );
    assert_eq!(
        lines[2],
        format!("http://llm:9090/ -> proxy 403 {}", refused("llm:9090"))
    );
    assert_eq!(lines[3], "plain=http://llm:8080/x -> 200 hello from llm");
    assert_eq!(
        lines[4],
        format!("plain=http://other:8080/ -> 403 {}", refused("other:8080"))
    );
    assert!(
        lines[5].starts_with(&format!("direct={llm_ip}:8080 -> failed")),
        "{}",
        lines[5]
    );
    // The endpoint's name means nothing on the attempt's network.
    assert_eq!(lines[6], "direct=llm:8080 -> failed: no address");

    // The control: the same direct probe from the endpoints' own network connects.
    turnpike_store::profiles::set(
        &bus,
        &turnpike_core::ChatId::new("dt-egress-open").expect("id"),
        Some("open"),
    )
    .await
    .expect("move the chat");
    let turn = send(
        &bus,
        "dt-egress-open",
        "m-2",
        &format!("fetch:direct={llm_ip}:8080"),
    )
    .await;
    let record = wait_ended(&bus, &turn, T).await;
    assert_eq!(record.state, TurnState::Done, "{record:?}");
    let items = visible_items(&bus, "dt-egress-open").await;
    assert_eq!(items[0].text, format!("direct={llm_ip}:8080 -> connected"));

    for r in roles {
        r.stop().await;
    }
    assert_eq!(egress_left(runner).await, Vec::<String>::new());
    assert_eq!(
        runner_containers(&docker_client().await, runner)
            .await
            .len(),
        0,
        "agent containers left"
    );
}
