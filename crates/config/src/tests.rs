// figment::Jail closures return figment::Error, which is large; that is its API, not ours.
#![allow(clippy::result_large_err)]

use super::*;
use figment::Jail;

#[test]
fn defaults_are_the_documented_ones() {
    let c = Config::default().validate().expect("defaults are valid");
    assert_eq!(c.max_turn_retry, 3);
    assert_eq!(c.retry_delay, Duration::from_secs(10));
    assert_eq!(c.run_timeout, Duration::from_secs(1800));
    assert_eq!(c.history_limit, 50);
    assert_eq!(c.runner_backend, Backend::Docker);
    assert_eq!(c.replicas, 1);
}

#[test]
fn file_then_env_then_max_turn_retry() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "turnpike.toml",
            r#"
                max_turn_retry = 5
                retry_delay = "2s"
                runner_slots = 4
                memory_limit = "64MiB"
                nats_url = "nats://a:4222, nats://b:4222"
            "#,
        )?;
        let c = Config::load(None).expect("loads");
        assert_eq!(c.max_turn_retry, 5);
        assert_eq!(c.retry_delay, Duration::from_secs(2));
        assert_eq!(c.runner_slots, 4);
        assert_eq!(c.memory_limit, ByteSize(64 << 20));
        assert_eq!(c.nats_servers(), vec!["nats://a:4222", "nats://b:4222"]);

        jail.set_env("TURNPIKE_RUNNER_SLOTS", "8");
        jail.set_env("TURNPIKE_RETRY_DELAY", "250ms");
        jail.set_env("TURNPIKE_RUN_TIMEOUT", "90s");
        jail.set_env("TURNPIKE_MEMORY_LIMIT", "512m");
        jail.set_env("TURNPIKE_RUNNER_BACKEND", "process");
        jail.set_env("TURNPIKE_AGENT_IMAGE", "agent:1");
        jail.set_env("TURNPIKE_AGENT_COMMAND", "/bin/agent --flag");
        jail.set_env("TURNPIKE_NATS_URL", "nats://c:4222");
        jail.set_env("TURNPIKE_MAX_TURN_RETRY", "2");
        let c = Config::load(None).expect("loads");
        assert_eq!(c.runner_slots, 8);
        assert_eq!(c.retry_delay, Duration::from_millis(250));
        assert_eq!(c.run_timeout, Duration::from_secs(90));
        assert_eq!(c.memory_limit, ByteSize(512 << 20));
        assert_eq!(c.runner_backend, Backend::Process);
        assert_eq!(c.agent_image, "agent:1");
        assert_eq!(c.agent_command.as_deref(), Some("/bin/agent --flag"));
        assert_eq!(c.nats_url, "nats://c:4222");
        assert_eq!(c.max_turn_retry, 2);

        // The exact name from the concept text wins.
        jail.set_env("MAX_TURN_RETRY", "0");
        let c = Config::load(None).expect("loads");
        assert_eq!(c.max_turn_retry, 0);
        assert_eq!(c.attempt_limit(), 1);
        Ok(())
    });
}

#[test]
fn bad_values_name_the_key_and_the_value() {
    Jail::expect_with(|jail| {
        jail.set_env("MAX_TURN_RETRY", "lots");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(
            err.contains("MAX_TURN_RETRY") && err.contains("lots"),
            "{err}"
        );
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_RETRY_DELAY", "soon");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(err.contains("RETRY_DELAY") && err.contains("soon"), "{err}");
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_MEMORY_LIMIT", "12 parsecs");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(
            err.contains("MEMORY_LIMIT") && err.contains("parsecs"),
            "{err}"
        );
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_RUNNER_BACKEND", "kubernetes");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(
            err.contains("RUNNER_BACKEND") && err.contains("kubernetes"),
            "{err}"
        );
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_RUNNER_SLOTS", "0");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(
            err.contains("runner_slots") && err.contains("\"0\""),
            "{err}"
        );
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_HEARTBEAT", "20s");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(err.contains("heartbeat") && err.contains("20s"), "{err}");
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_EVENT_BATCH_WAIT", "1m");
        let err = Config::load(None).expect_err("refused").to_string();
        assert!(
            err.contains("event_batch_wait") && err.contains("1m"),
            "{err}"
        );
        jail.set_env("TURNPIKE_EVENT_BATCH_WAIT", "100ms");
        let c = Config::load(None).expect("a short wait");
        assert_eq!(c.event_batch_wait, Duration::from_millis(100));
        Ok(())
    });
}

#[test]
fn a_named_file_must_exist() {
    let err = Config::load(Some(Path::new("/nonexistent/turnpike.toml"))).expect_err("missing");
    assert!(err.to_string().contains("/nonexistent/turnpike.toml"));
}

#[test]
fn sizes_parse() {
    assert_eq!(parse_bytes("512MiB"), Ok(ByteSize(512 << 20)));
    assert_eq!(parse_bytes("64m"), Ok(ByteSize(64 << 20)));
    assert_eq!(parse_bytes("1GB"), Ok(ByteSize(1_000_000_000)));
    assert_eq!(parse_bytes("1.5k"), Ok(ByteSize(1536)));
    assert_eq!(parse_bytes("1048576"), Ok(ByteSize(1 << 20)));
    assert_eq!(
        parse_bytes("-1m"),
        Err(ByteSizeError::NotANumber("-1m".into()))
    );
    assert_eq!(parse_bytes("m"), Err(ByteSizeError::NotANumber("m".into())));
    assert_eq!(
        parse_bytes("5 parsecs"),
        Err(ByteSizeError::UnknownUnit {
            input: "5 parsecs".into(),
            unit: "parsecs".into()
        })
    );
    assert_eq!(
        parse_bytes("99999999999999999999g"),
        Err(ByteSizeError::OutOfRange("99999999999999999999g".into()))
    );
    assert_eq!(ByteSize(512 << 20).to_string(), "512MiB");
    assert_eq!(ByteSize(1000).to_string(), "1000B");
}

#[test]
fn credentials_from_a_file_and_inbox_prefix_from_env() {
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_NATS_USER", "runner");
        jail.set_env("TURNPIKE_NATS_PASSWORD_FILE", "/run/secrets/nats_password");
        jail.set_env("TURNPIKE_NATS_INBOX_PREFIX", "_INBOX_runner");
        jail.set_env("TURNPIKE_MANAGE_TOPOLOGY", "false");
        let c = Config::load(None).expect("loads");
        assert_eq!(
            c.nats_password_file.as_deref(),
            Some(Path::new("/run/secrets/nats_password"))
        );
        assert_eq!(c.nats_inbox_prefix.as_deref(), Some("_INBOX_runner"));
        assert!(!c.manage_topology);

        // A password in two places is ambiguous.
        jail.set_env("TURNPIKE_NATS_PASSWORD", "inline");
        let err = Config::load(None).expect_err("both refused").to_string();
        assert!(err.contains("nats_password_file"), "{err}");
        Ok(())
    });
}

#[test]
fn an_inbox_prefix_is_one_subject_token() {
    for bad in ["", "_INBOX.runner", "_INBOX_*", "a b", ">"] {
        let c = Config {
            nats_inbox_prefix: Some(bad.into()),
            ..Config::default()
        };
        let err = c.validate().expect_err(bad).to_string();
        assert!(err.contains("nats_inbox_prefix"), "{bad:?}: {err}");
    }
}

#[test]
fn unsafe_container_settings_and_unfitting_limits_are_refused() {
    let refused = |c: Config, key: &str| {
        let err = c.validate().expect_err(key).to_string();
        assert!(err.contains(key), "{err}");
    };
    // Issue 33: as the engine reads a user, "00" and "+0" are uid 0 too, and a name may be
    // anything in the image.
    for user in [
        "0", "0:0", "root", "", " ", "00", "+0", "-0", "1000:0", "nobody",
    ] {
        refused(
            Config {
                agent_user: user.into(),
                ..Config::default()
            },
            "agent_user",
        );
    }
    for mode in ["host", "container:turnpike-dashboard", "container:0123abcd"] {
        refused(
            Config {
                network_mode: mode.into(),
                ..Config::default()
            },
            "network_mode",
        );
    }
    for pids in [0, -1] {
        refused(
            Config {
                pids_limit: pids,
                ..Config::default()
            },
            "pids_limit",
        );
    }
    refused(
        Config {
            history_max_bytes: ByteSize(1 << 20),
            ..Config::default()
        },
        "history_max_bytes",
    );
    refused(
        Config {
            message_max_bytes: ByteSize(0),
            ..Config::default()
        },
        "message_max_bytes",
    );
    // Issue 32: every payload fits max_payload by construction, so the limits that make them
    // grow are bounded by it, and by the promises that need them.
    refused(
        Config {
            max_turn_retry: 101,
            ..Config::default()
        },
        "max_turn_retry",
    );
    refused(
        Config {
            max_turn_retry: 100,
            history_max_bytes: ByteSize(512 << 10),
            ..Config::default()
        },
        "max_turn_retry",
    );
    refused(
        Config {
            chat_queue_max: 100_000,
            ..Config::default()
        },
        "chat_queue_max",
    );
    refused(
        Config {
            max_payload: ByteSize(256 << 10),
            ..Config::default()
        },
        "history_max_bytes",
    );
    refused(
        Config {
            dedup_window: Duration::from_secs(10),
            ..Config::default()
        },
        "dedup_window",
    );
    refused(
        Config {
            attempt_bytes_max: ByteSize(1000),
            ..Config::default()
        },
        "attempt_bytes_max",
    );
    // A running attempt's claim must outlive its run.
    refused(
        Config {
            retention_turns: Duration::from_secs(1800),
            ..Config::default()
        },
        "retention_turns",
    );
    for (key, c) in [
        (
            "attempt_messages_max",
            Config {
                attempt_messages_max: 0,
                ..Config::default()
            },
        ),
        (
            "chat_queue_max",
            Config {
                chat_queue_max: 0,
                ..Config::default()
            },
        ),
    ] {
        refused(c, key);
    }
    // A larger max_payload makes room: a hundred attempts with the default limits fit 1 MiB,
    // and more history fits 8 MiB.
    assert!(Config {
        max_turn_retry: 100,
        ..Config::default()
    }
    .validate()
    .is_ok());
    assert!(Config {
        max_payload: ByteSize(8 << 20),
        history_max_bytes: ByteSize(4 << 20),
        ..Config::default()
    }
    .validate()
    .is_ok());
    assert!(Config {
        agent_user: "1000:1000".into(),
        network_mode: "bridge".into(),
        ..Config::default()
    }
    .validate()
    .is_ok());
}

/// Config applies core's rules, not copies of them: a runner id the wire would refuse (too long,
/// or a bad character) is refused at start, naming the key; the codec names are core's; the
/// attempt limit is core's (0 and 1 both mean one attempt).
#[test]
fn runner_id_codec_and_attempt_limit_follow_core() {
    for bad in ["has space", "dots.in.it", &"r".repeat(200)] {
        let c = Config {
            runner_id: Some(bad.to_owned()),
            ..Config::default()
        };
        let err = c.validate().expect_err("refused").to_string();
        assert!(err.contains("runner_id"), "{err}");
    }
    let ok = Config {
        runner_id: Some("runner-1".into()),
        ..Config::default()
    };
    assert!(ok.validate().is_ok());
    for (n, limit) in [(0, 1), (1, 1), (3, 3)] {
        let c = Config {
            max_turn_retry: n,
            ..Config::default()
        };
        assert_eq!(c.attempt_limit(), limit);
        assert_eq!(turnpike_core::lifecycle::attempt_limit(n), limit);
    }
    Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_CODEC", "msgpack");
        let c = Config::figment(Path::new("turnpike.toml"))
            .extract_config()
            .expect("valid");
        assert_eq!(c.codec, turnpike_core::codec::Codec::Msgpack);
        Ok(())
    });
}

#[test]
fn profiles_come_from_the_file_and_the_environment() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "turnpike.toml",
            r#"
                default_profile = "small"
                [profiles.small]
                memory_limit = "256MiB"
                [profiles.big]
                memory_limit = "2GiB"
                run_timeout = "15m"
                cpus = 2.0
            "#,
        )?;
        let c = Config::load(None).expect("loads");
        assert_eq!(c.profile(None).map(|p| p.name), Some("small".into()));
        let big = c.profile(Some("big")).expect("big");
        assert_eq!(
            (big.memory_limit, big.run_timeout, big.cpus),
            (ByteSize(2 << 30), Duration::from_secs(900), 2.0)
        );
        jail.set_env("TURNPIKE_PROFILES", r#"{huge={memory_limit="8GiB"}}"#);
        jail.set_env("TURNPIKE_DEFAULT_PROFILE", "huge");
        let c = Config::load(None).expect("loads");
        assert_eq!(
            c.profile(None).map(|p| p.memory_limit),
            Some(ByteSize(8 << 30))
        );
        jail.set_env("TURNPIKE_PROFILES", r#"{huge={memory="8GiB"}}"#);
        let e = Config::load(None).expect_err("an unknown key").to_string();
        assert!(e.contains("memory"), "{e}");
        Ok(())
    });
}

#[test]
fn egress_lists_are_checked_and_need_no_network_of_their_own() {
    figment::Jail::expect_with(|jail| {
        jail.set_env("TURNPIKE_EGRESS_ALLOW", "api.example.com:443, llm:8080");
        let c = Config::load(None).expect("loads");
        let p = c.profile(None).expect("default");
        assert_eq!(p.egress_allow.to_string(), "api.example.com:443,llm:8080");
        jail.set_env("TURNPIKE_NETWORK_MODE", "bridge");
        let e = Config::load(None)
            .expect_err("a list beside a network")
            .to_string();
        assert!(
            e.contains("egress_allow") && e.contains("network_mode must be none"),
            "{e}"
        );
        jail.set_env("TURNPIKE_NETWORK_MODE", "none");
        jail.set_env("TURNPIKE_EGRESS_ALLOW", "api.example.com");
        let e = Config::load(None).expect_err("no port").to_string();
        assert!(e.contains("egress_allow") && e.contains("host:port"), "{e}");
        jail.set_env("TURNPIKE_EGRESS_ALLOW", "");
        // Per profile: a list of its own, or none where the top level has one.
        jail.set_env(
            "TURNPIKE_PROFILES",
            r#"{llm={egress_allow="api.openai.com:443"},open={network_mode="bridge"},bad={egress_allow="x:1",network_mode="bridge"}}"#,
        );
        let e = Config::load(None).expect_err("bad profile").to_string();
        assert!(e.contains("bad.egress_allow"), "{e}");
        jail.set_env(
            "TURNPIKE_PROFILES",
            r#"{llm={egress_allow="api.openai.com:443"},open={network_mode="bridge"}}"#,
        );
        let c = Config::load(None).expect("loads");
        let llm = c.profile(Some("llm")).expect("llm");
        assert!(llm.egress_allow.allows("api.openai.com", 443));
        assert!(c
            .profile(Some("open"))
            .expect("open")
            .egress_allow
            .is_empty());
        assert!(c.profile(None).expect("default").egress_allow.is_empty());
        Ok(())
    });
}

#[test]
fn agent_variables_are_checked_and_replaced_per_profile() {
    figment::Jail::expect_with(|jail| {
        jail.set_env(
            "TURNPIKE_AGENT_ENV",
            r#"{LLM_URL="http://llm:8080/v1",LLM_MODEL="m"}"#,
        );
        jail.set_env(
            "TURNPIKE_PROFILES",
            r#"{other={agent_env={LLM_MODEL="big"}}}"#,
        );
        let c = Config::load(None).expect("loads");
        let env = |p: Option<&str>| c.profile(p).expect("profile").agent_env;
        assert_eq!(
            env(None).get("LLM_URL").map(String::as_str),
            Some("http://llm:8080/v1")
        );
        assert_eq!(
            env(Some("other")).into_iter().collect::<Vec<_>>(),
            [("LLM_MODEL".to_owned(), "big".to_owned())]
        );
        jail.set_env("TURNPIKE_PROFILES", "{}");
        for (bad, why) in [
            (r#"{TURNPIKE_TURN="x"}"#, "set by the run itself"),
            (r#"{HTTPS_PROXY="x"}"#, "set by the run itself"),
            (r#"{lower="x"}"#, "upper-case"),
        ] {
            jail.set_env("TURNPIKE_AGENT_ENV", bad);
            let e = Config::load(None).expect_err(bad).to_string();
            assert!(e.contains("agent_env") && e.contains(why), "{e}");
        }
        jail.set_env("TURNPIKE_AGENT_ENV", r#"{OPENAI_API_KEY="x"}"#);
        jail.set_env("TURNPIKE_SECRETS_DIR", "/run/secrets");
        jail.set_env("TURNPIKE_AGENT_SECRETS", "openai_key:OPENAI_API_KEY");
        let e = Config::load(None)
            .expect_err("a secret's variable")
            .to_string();
        assert!(e.contains("also a secret's variable"), "{e}");
        Ok(())
    });
}
