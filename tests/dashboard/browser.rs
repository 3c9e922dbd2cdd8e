//! The dashboard in a real headless Chromium (Debian's chromium and chromium-driver): an
//! operator's whole session against a live pipeline.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_works_the_dashboard_in_a_real_browser() {
    init_logs();
    // Two attempts per turn, the default 10 s retry delay: a pending retry lasts long enough
    // to be seen, and a give-up comes after one retry.
    let p = Pipeline::start(AGENT, |c| {
        c.max_turn_retry = 2;
        c.retry_delay = Duration::from_secs(10);
    })
    .await;
    let (base, stop) = start_dashboard(&p).await;
    let driver = Driver::start().await;
    let c = driver.browser(1280, 900).await;

    // No page without a login.
    c.goto(&format!("{base}/errored")).await.expect("goto");
    assert_eq!(
        path(&c).await,
        "/login",
        "a page without login must go to the login"
    );
    login(&c, &base, "wrong").await;
    assert!(
        text(&c, "p.error").await.contains("Wrong"),
        "a wrong password is refused"
    );
    login(&c, &base, PASSWORD).await;
    wait_for(&c, "header .who").await;
    assert_eq!(text(&c, "header .who").await, OPERATOR);

    // A running turn's page shows its reply as it lands, without a reload: the record says
    // nothing until the attempt ends, so the page reads the turn's output itself.
    let told = ToldTurn::start(&p.bus, "talking", "m-talk").await;
    let talking = told.turn.clone();
    c.goto(&format!("{base}/turns/{talking}"))
        .await
        .expect("goto");
    wait_for(&c, "h1 .state-running").await;
    assert!(
        text(&c, "#replies").await.contains("No reply yet"),
        "nothing landed yet"
    );
    mark_document(&c).await;
    // Once the page's event stream said hello it gets every change; count those from here.
    let seen = eventually(WAIT, "the page's event stream", || live_events(&c, 1)).await;
    // Another chat's output is not this page's business: published (and flushed) before the
    // reply is told to land, it reaches the page's event stream first, and must not count.
    p.bus
        .client
        .publish(
            turnpike_core::subjects::chat_out(
                &turnpike_core::ChatId::new("elsewhere").expect("chat id"),
            ),
            "not ours".into(),
        )
        .await
        .expect("publish");
    p.bus.client.flush().await.expect("flush");
    told.tell();
    assert!(
        text(&c, "#replies li[data-attempt='1']")
            .await
            .contains("an answer, once told"),
        "the reply as landed"
    );
    assert!(
        still_same_document(&c).await,
        "the reply must appear without a reload"
    );
    screenshot(&c, "turn-replies").await;
    // Drawn because the page was told a message landed (nothing else changed meanwhile), not
    // by the five-second safety net.
    eventually(WAIT, "an event for the landed reply", || {
        live_events(&c, seen + 1)
    })
    .await;
    let heard = eventually(WAIT, "the reply's output event", || {
        live_events_of(&c, "out", 1)
    })
    .await;
    assert_eq!(heard, 1, "only this chat's output is heard");
    assert!(
        text(&c, "ol.timeline")
            .await
            .contains("1 message(s) landed so far"),
        "the running attempt counts what it landed"
    );
    assert_eq!(
        turnpike_store::turns::load(&p.bus, &talking)
            .await
            .expect("load")
            .expect("record")
            .record
            .state,
        TurnState::Running,
        "shown while the attempt still runs"
    );
    kill_turn(&p.bus, &talking).await;

    // A turn that gives up appears on the errored list without a reload.
    c.goto(&format!("{base}/errored")).await.expect("goto");
    wait_for(&c, "main p.empty").await;
    mark_document(&c).await;
    let doomed = send(&p.bus, "doomed", "m-doomed", "oom").await;
    let row = "tr[data-chat=doomed]";
    wait_for(&c, row).await;
    assert!(
        still_same_document(&c).await,
        "the errored row must appear without a reload"
    );
    assert_eq!(
        wait_state(&p.bus, &doomed, TurnState::GaveUp).await.state,
        TurnState::GaveUp
    );
    screenshot(&c, "errored").await;

    // Clear it, through its confirm dialog; recorded with the operator's name.
    let q = click_and_answer(&c, &format!("{row} button"), true).await;
    assert!(q.contains("Clear the errored flag of chat doomed"), "{q}");
    wait_gone(&c, row).await;
    let chat = turnpike_jetstream::decode_kv::<turnpike_core::wire::ChatRecord>(
        &turnpike_tests::bucket(&p.bus, turnpike_core::subjects::BUCKET_CHATS)
            .await
            .get("doomed")
            .await
            .expect("get")
            .expect("chat record"),
    )
    .expect("decode");
    assert!(chat.errored.is_none());
    assert_eq!(chat.cleared.last().map(|a| a.by.as_str()), Some(OPERATOR));

    // Kill a hanging turn from the live list: dismissing the dialog does nothing, accepting kills.
    c.goto(&format!("{base}/live")).await.expect("goto");
    mark_document(&c).await;
    let hanging = send(&p.bus, "hanging", "m-hang", "hang").await;
    let row = format!("tr[data-turn='{hanging}'][data-state=running]");
    wait_for(&c, &row).await;
    assert!(
        still_same_document(&c).await,
        "the live row must appear without a reload"
    );
    screenshot(&c, "live").await;
    let q = click_and_answer(&c, &format!("{row} .btn-kill"), false).await;
    assert!(q.contains(&format!("Kill turn {hanging}")), "{q}");
    let r = turnpike_store::turns::load(&p.bus, &hanging)
        .await
        .expect("load")
        .expect("record")
        .record;
    assert!(r.kill.is_none(), "a dismissed dialog must not kill");
    click_and_answer(&c, &format!("{row} .btn-kill"), true).await;
    let killed = wait_ended(&p.bus, &hanging, WAIT).await;
    assert_eq!(killed.state, TurnState::Killed);
    assert_eq!(killed.kill.as_ref().map(|k| k.by.as_str()), Some(OPERATOR));
    wait_gone(&c, &format!("tr[data-turn='{hanging}']")).await;

    // The turn page shows it killed, with who; re-run it.
    c.goto(&format!("{base}/turns/{hanging}"))
        .await
        .expect("goto");
    wait_for(&c, "h1 .state-killed").await;
    assert!(text(&c, "dl.facts").await.contains(OPERATOR));
    let q = click_and_answer(&c, ".btn-re-run", true).await;
    assert!(q.contains("again"), "{q}");
    let rerun = TurnId::for_rerun(&hanging, 1);
    wait_for(&c, ".flash.ok").await;
    let again = wait_state(&p.bus, &rerun, TurnState::Running).await;
    assert_eq!(again.rerun_of.as_ref(), Some(&hanging));
    assert_eq!(
        again.created_by.as_ref().map(|a| a.by.as_str()),
        Some(OPERATOR)
    );
    kill_turn(&p.bus, &rerun).await;

    // A pending retry shows a countdown to its due time.
    c.goto(&format!("{base}/live")).await.expect("goto");
    let retried = send(&p.bus, "retried", "m-retry", "die-until:2").await;
    let t = text(
        &c,
        &format!("tr[data-turn='{retried}'][data-state=pending_retry] .countdown"),
    )
    .await;
    assert!(t.starts_with("in ") || t == "due", "countdown reads {t:?}");
    assert_eq!(
        wait_ended(&p.bus, &retried, WAIT).await.state,
        TurnState::Done
    );

    // An HTML-injection message renders as text.
    let inject = send(
        &p.bus,
        "inject",
        "m-inject",
        "reply:<script>alert(1)</script>",
    )
    .await;
    wait_ended(&p.bus, &inject, WAIT).await;
    c.goto(&format!("{base}/turns/{inject}"))
        .await
        .expect("goto");
    assert_eq!(
        text(&c, "#message").await,
        "reply:<script>alert(1)</script>"
    );
    assert!(c.get_alert_text().await.is_err(), "no script ran");
    c.goto(&format!("{base}/chats/inject")).await.expect("goto");
    assert!(text(&c, "ol.history")
        .await
        .contains("<script>alert(1)</script>"));
    assert!(c.get_alert_text().await.is_err(), "no script ran");

    // A POST without the CSRF token is refused (from the dashboard's own page, logged in).
    let status = c
        .execute(
            "return fetch('/turns/' + arguments[0] + '/rerun', {method: 'POST', body: new URLSearchParams({csrf: ''})}).then(r => r.status);",
            vec![json!(inject.as_str())],
        )
        .await
        .expect("fetch");
    assert_eq!(status, json!(403));
    assert!(
        turnpike_store::turns::load(&p.bus, &TurnId::for_rerun(&inject, 1))
            .await
            .expect("load")
            .is_none()
    );

    // Narrow screens: the overview at 390 px.
    c.goto(&format!("{base}/")).await.expect("goto");
    wait_for(&c, "#done").await;
    // The give-up above, counted in the last hour (the turn gave up well before this read).
    assert_eq!(text(&c, "#gave-up").await, "1");
    screenshot(&c, "overview-1280").await;
    c.set_window_size(390, 844).await.expect("resize");
    screenshot(&c, "overview-390").await;
    let overflow = c
        .execute(
            "return document.documentElement.scrollWidth <= window.innerWidth + 1;",
            vec![],
        )
        .await
        .expect("width");
    assert_eq!(
        overflow,
        json!(true),
        "the overview must fit 390 px without sideways scrolling"
    );

    // Logged out: pages are refused again.
    c.delete_all_cookies().await.expect("cookies");
    c.goto(&format!("{base}/live")).await.expect("goto");
    assert_eq!(path(&c).await, "/login");

    c.close().await.expect("close");
    stop.cancel();
    p.stop().await;
}
