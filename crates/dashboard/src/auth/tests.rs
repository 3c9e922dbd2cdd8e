use super::*;

fn key() -> SessionKey {
    SessionKey::new([7; 32])
}

#[test]
fn a_hashed_password_verifies_and_a_wrong_one_does_not() {
    let users = Users::default().with("ops", hash_password("s3cret").expect("hash"));
    assert!(users.verify("ops", "s3cret"));
    assert!(!users.verify("ops", "s3cret "));
    assert!(!users.verify("nobody", "s3cret"));
    // Unknown names are checked against a real hash, so they cost the same time.
    assert!(PasswordHash::new(DUMMY_HASH).is_ok());
}

#[test]
fn the_users_file_is_checked_line_by_line() {
    let h = hash_password("x").expect("hash");
    let users = Users::parse(&format!("# operators\n\nalice:{h}\nbob@ex.org:{h}\n")).expect("ok");
    assert_eq!(users.len(), 2);
    assert_eq!(
        Users::parse("alice").expect_err("no colon"),
        UsersLineError::NoColon { line: 1 }
    );
    assert_eq!(
        Users::parse("# ops\nal ice:$argon2id$x").expect_err("name"),
        UsersLineError::BadName {
            line: 2,
            name: "al ice".into()
        }
    );
    let e = Users::parse("alice:plaintext").expect_err("hash");
    assert!(e.to_string().contains("PHC"), "{e}");
}

#[test]
fn a_session_verifies_until_it_expires_and_not_after_tampering() {
    let k = key();
    let c = k
        .issue("alice", "f1", 1_000, Duration::from_secs(10))
        .expect("issue");
    let s = k.verify(&c, 5_000).expect("valid");
    assert_eq!(s.user, "alice");
    assert!(k.verify(&c, 11_000).is_none(), "expired");
    assert!(key_other().verify(&c, 5_000).is_none(), "other key");
    let forged = c.replacen("alice", "admin", 1);
    assert!(k.verify(&forged, 5_000).is_none(), "renamed");
    let longer = c.replacen(":11000:", ":99999999:", 1);
    assert!(k.verify(&longer, 5_000).is_none(), "extended");
    assert!(k.verify("garbage", 5_000).is_none());
    assert!(k.verify("a:b:c:zz", 5_000).is_none());
}

fn key_other() -> SessionKey {
    SessionKey::new([8; 32])
}

#[test]
fn a_csrf_token_belongs_to_its_session() {
    let k = key();
    let a = k
        .verify(
            &k.issue("alice", "f1", 0, Duration::from_secs(60))
                .expect("issue"),
            1,
        )
        .expect("a");
    let b = k
        .verify(
            &k.issue("alice", "f1", 0, Duration::from_secs(60))
                .expect("issue"),
            1,
        )
        .expect("b");
    assert!(k.csrf_ok(&a, &k.csrf(&a)));
    assert!(!k.csrf_ok(&b, &k.csrf(&a)), "another session's token");
    assert!(!k.csrf_ok(&a, ""));
    assert!(!k.csrf_ok(&a, "not hex"));
}

#[test]
fn logins_are_counted_before_their_check_per_address_and_per_name() {
    let l = LoginLimiter::default();
    let ip: IpAddr = [127, 0, 0, 1].into();
    let other: IpAddr = [127, 0, 0, 2].into();
    // Attempts held at once (being checked) count already; only two checks at a time.
    let a = l.begin(ip, "ops", 0).expect("first");
    let b = l.begin(ip, "ops", 0).expect("second");
    assert_eq!(l.begin(ip, "ops", 0).err(), Some(LoginRefused::Busy));
    drop((a, b));
    for _ in 2..LOGIN_FAILURES_PER_WINDOW {
        drop(l.begin(ip, "ops", 0).expect("within the window"));
    }
    assert_eq!(l.begin(ip, "ops", 1).err(), Some(LoginRefused::TooMany));
    assert!(l.begin(other, "ops", 1).is_ok(), "another address");
    assert!(
        l.begin(ip, "ops", LOGIN_WINDOW.as_millis() as u64).is_ok(),
        "a new window"
    );
    // A success forgets the address's failures.
    l.begin(other, "ops", 2).expect("ok").succeeded();
    // One name from many addresses: limited too.
    let n = LoginLimiter::default();
    for i in 0..LOGIN_NAME_FAILURES_PER_WINDOW {
        drop(
            n.begin([10, 0, 0, i as u8].into(), "ops", 0)
                .expect("within"),
        );
    }
    assert_eq!(
        n.begin([10, 0, 1, 1].into(), "ops", 0).err(),
        Some(LoginRefused::TooMany)
    );
    assert!(
        n.begin([10, 0, 1, 1].into(), "alice", 0).is_ok(),
        "another name"
    );
}

#[test]
fn a_forwarded_address_is_believed_only_from_a_trusted_proxy() {
    let t = TrustedProxies::parse("10.0.0.0/8, 192.168.1.5, fd00::/8").expect("parse");
    let proxy: IpAddr = [10, 1, 2, 3].into();
    let stranger: IpAddr = [203, 0, 113, 9].into();
    assert_eq!(
        t.client(proxy, Some("198.51.100.7, 10.9.9.9")),
        "198.51.100.7".parse::<IpAddr>().expect("ip")
    );
    assert_eq!(
        t.client(stranger, Some("198.51.100.7")),
        stranger,
        "spoofed"
    );
    assert_eq!(t.client(proxy, None), proxy);
    assert_eq!(t.client(proxy, Some("garbage")), proxy);
    assert!(t.contains("192.168.1.5".parse().expect("ip")));
    assert!(!t.contains("192.168.1.6".parse().expect("ip")));
    assert!(t.contains("fd12::1".parse().expect("ip")));
    assert!(TrustedProxies::parse("10.0.0.0/33").is_err());
    assert!(TrustedProxies::parse("proxy.example").is_err());
    assert_eq!(
        TrustedProxies::parse("").expect("none"),
        TrustedProxies::default()
    );
}
