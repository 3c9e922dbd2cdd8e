//! What Turnpike stores is readable by other NATS clients: nats-py (from PyPI) reads a turn record,
//! the chat's outbound items, the chat record and the work queue's consumer.

use std::time::Duration;
use turnpike_tests::*;

const AGENT: &str = env!("CARGO_BIN_EXE_test-agent");

#[tokio::test]
async fn nats_py_reads_turns_chats_and_the_work_queue() {
    let p = Pipeline::start(AGENT, |_| {}).await;
    let turn = send(&p.bus, "py", "py-1", "reply:read me from Python").await;
    wait_ended(&p.bus, &turn, Duration::from_secs(30)).await;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/py/read_with_nats_py.py");
    let out = tokio::process::Command::new("python3")
        .args([script, &p.config.nats_url, turn.as_str(), "py"])
        .output()
        .await
        .expect("run python3 (tests/run.sh installs nats-py)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "nats-py could not read it:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("state=done"), "{stdout}");
    p.stop().await;
}
