//! The web console in headless Chromium (Debian's `chromium` and `chromium-driver`), driven
//! over WebDriver: log in, watch a running turn appear live, approve with the button and see
//! the turn finish, and see tool output carrying markup rendered as text. Screenshots of each
//! page go to `target/console-screenshots/`.
//!
//! Browser tier: `cargo test --release --test cli -- --ignored browser` (CI installs
//! the packages with apt and runs it).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

use super::serve::{Server, client, get, post, upload_effects};

/// A chromedriver on a free port, stopped when dropped.
struct Driver {
    child: Child,
    port: u16,
}

impl Driver {
    fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver is not installed: apt-get install chromium chromium-driver");
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "chromedriver did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, port }
    }

    async fn browser(&self) -> Client {
        let mut caps = serde_json::Map::new();
        let binary = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .unwrap_or("/usr/bin/chromium");
        caps.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": binary,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1280,1000"],
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("cannot start headless Chromium")
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn shot(b: &Client, name: &str) {
    let png = b.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// Polls `script` (a JavaScript expression) in the page until it is true.
async fn until(b: &Client, what: &str, script: &str) {
    let start = Instant::now();
    loop {
        let v = b.execute(&format!("return !!({script});"), vec![]).await.unwrap();
        if v == Value::Bool(true) {
            return;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let html = b.source().await.unwrap_or_default();
            panic!("never saw {what} ({script}); the page:\n{html}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn text_of(b: &Client, css: &str) -> String {
    b.find(Locator::Css(css)).await.unwrap().text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "browser tier: needs Debian's chromium and chromium-driver"]
async fn browser_console_login_live_turn_approve_and_escaping() {
    let evil =
        "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\">";
    let model = MockModel::start(vec![
        // Slow enough that the page is open while the turn runs.
        Reply::Delay(
            Duration::from_millis(1500),
            Box::new(Reply::calls(&[("c1", "fs_read_file", r#"{"path":"/work/evil.html"}"#)])),
        ),
        Reply::Delay(
            Duration::from_millis(500),
            Box::new(Reply::calls(&[("c2", "effect_send", r#"{"label":"hello"}"#)])),
        ),
        Reply::text("All done: the note was sent."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let project = roots.path().join("project");
    std::fs::create_dir_all(project.join("docs")).unwrap();
    std::fs::write(project.join("evil.html"), evil).unwrap();
    std::fs::write(project.join("docs/readme.md"), "# notes\n").unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    upload_effects(&c, &s).await;
    let driver = Driver::start();
    let b = driver.browser().await;

    // Log in: a wrong token is refused on the page, the admin token gets in.
    b.goto(&format!("{}/", s.base)).await.unwrap();
    until(&b, "the login page", "location.pathname === '/login'").await;
    shot(&b, "login").await;
    b.find(Locator::Id("token")).await.unwrap().send_keys("keel_wrong").await.unwrap();
    b.find(Locator::Id("login")).await.unwrap().click().await.unwrap();
    until(&b, "the refusal", "document.getElementById('login-error')").await;
    b.find(Locator::Id("token")).await.unwrap().send_keys(&s.admin).await.unwrap();
    b.find(Locator::Id("login")).await.unwrap().click().await.unwrap();
    until(&b, "the sessions page", "location.pathname === '/'").await;
    let cookie = b.get_named_cookie("keel_login").await.unwrap();
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
    let scripts = b.execute("return document.cookie;", vec![]).await.unwrap();
    assert_eq!(scripts, json!(""), "the login cookie is not readable by scripts");

    // Start a turn through the API and watch it on its page, live.
    let grant = json!([{"host": project.display().to_string(), "guest": "/work", "access": "rw"}]);
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "Read evil.html, then send a note", "grants": grant, "id": "live",
               "tools": ["fs_read_file", "effect_send"]}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    b.goto(&format!("{}/sessions/live", s.base)).await.unwrap();
    let state = text_of(&b, "#state").await;
    assert!(
        ["running", "preparing_context", "idle"].contains(&state.as_str()) && state != "idle",
        "{state}"
    );
    // The call appears without a reload, its output (markup) as text.
    until(&b, "the tool call, live", "document.querySelector('#timeline pre.output')").await;
    until(&b, "the approval form, live", "document.querySelector('#timeline form.decide')").await;
    shot(&b, "session-waiting").await;
    let output = text_of(&b, "#timeline pre.output").await;
    assert!(output.contains("<script>document.title='pwned'</script>"), "{output}");
    let injected = b.find_all(Locator::Css("#timeline script, #timeline img")).await.unwrap();
    assert!(injected.is_empty(), "tool output became markup");
    assert_ne!(b.title().await.unwrap(), "pwned");

    // The queue shows exactly what would run; approve it with the button.
    b.goto(&format!("{}/approvals", s.base)).await.unwrap();
    let queue = text_of(&b, "#approval-list").await;
    assert!(queue.contains("effect_send") && queue.contains(r#""label": "hello""#), "{queue}");
    shot(&b, "approvals").await;
    b.find(Locator::Css("#approval-list button.approve")).await.unwrap().click().await.unwrap();
    until(&b, "the empty queue", "document.body.innerText.includes('Nothing is waiting')").await;

    // Back on the session: the turn finishes, live.
    b.goto(&format!("{}/sessions/live", s.base)).await.unwrap();
    until(
        &b,
        "the answer",
        "document.getElementById('timeline').innerText.includes('All done: the note was sent.')",
    )
    .await;
    until(&b, "the idle state", "document.getElementById('state').innerText === 'idle'").await;
    let timeline = text_of(&b, "#timeline").await;
    let by = format!("by api token {}", super::serve_token_name());
    assert!(timeline.contains(&by), "{timeline}");
    assert_eq!(keel_tests::log_lines(&project, "sent.log"), ["hello"]);
    assert_ne!(b.title().await.unwrap(), "pwned");
    shot(&b, "session").await;

    // Sessions, tools, a tool, the files inside the grants.
    b.goto(&format!("{}/", s.base)).await.unwrap();
    until(&b, "the session row", "document.querySelector('a[href=\"/sessions/live\"]')").await;
    shot(&b, "sessions").await;
    b.goto(&format!("{}/tools", s.base)).await.unwrap();
    shot(&b, "tools").await;
    b.goto(&format!("{}/tools/effect_send", s.base)).await.unwrap();
    assert!(
        text_of(&b, "main")
            .await
            .contains(&keel::digest::sha256_hex(&super::serve::effects_wasm()))
    );
    shot(&b, "tool").await;
    b.goto(&format!("{}/sessions/live/files?grant=%2Fwork", s.base)).await.unwrap();
    let tree = text_of(&b, "ul.tree").await;
    assert!(tree.contains("docs/") && tree.contains("evil.html"), "{tree}");
    b.find(Locator::LinkText("docs/")).await.unwrap().click().await.unwrap();
    until(&b, "the sub-directory", "document.body.innerText.includes('readme.md')").await;
    shot(&b, "files").await;

    // The strict policy holds: no inline script runs even if one were in the page.
    let csp = c.get(format!("{}/", s.base)).send().await.unwrap();
    let policy = csp.headers()["content-security-policy"].to_str().unwrap().to_string();
    assert!(policy.contains("script-src 'self'") && !policy.contains("unsafe-inline"), "{policy}");
    b.close().await.unwrap();
}

/// An approval that shows the change: the pending write at the top of its session with its
/// buttons and a diff against the file there now; the decided one reads "approved by … · ran
/// once"; a long output starts collapsed; the model's text appears while it is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "browser tier: needs Debian's chromium and chromium-driver"]
async fn browser_console_approval_diff_at_the_top_verdict_collapsed_output_and_live_text() {
    let long: String = (1..=400).map(|i| format!("line {i}: the quick brown fox\n")).collect();
    let words = ["The report ", "is written ", "now."];
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "fs_read_file", r#"{"path":"/work/long.txt"}"#)]),
        Reply::calls(&[(
            "c2",
            "fs_write_file",
            &json!({"path": "/work/report.md", "content": "# audit\nrow 3: ragged\n"}).to_string(),
        )]),
        Reply::drip_text(&words, Duration::from_millis(1200)),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let project = roots.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("long.txt"), &long).unwrap();
    std::fs::write(project.join("report.md"), "# audit\nold\n").unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let driver = Driver::start();
    let b = driver.browser().await;
    b.goto(&format!("{}/login", s.base)).await.unwrap();
    b.find(Locator::Id("token")).await.unwrap().send_keys(&s.admin).await.unwrap();
    b.find(Locator::Id("login")).await.unwrap().click().await.unwrap();
    until(&b, "the sessions page", "location.pathname === '/'").await;

    let grant = json!([{"host": project.display().to_string(), "guest": "/work", "access": "rw"}]);
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "Write the report", "grants": grant, "id": "diff",
               "tools": ["fs_read_file", "fs_write_file"], "policy": {"ask": ["fs_write_file"]}}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    b.goto(&format!("{}/sessions/diff", s.base)).await.unwrap();
    until(
        &b,
        "the pending approval at the top",
        "document.querySelector('section.approval.top form.decide')",
    )
    .await;
    shot(&b, "approval-diff").await;
    let top = text_of(&b, "section.approval.top").await;
    assert!(top.contains("writes 22B to /work/report.md, replacing 12B"), "{top}");
    let del = text_of(&b, "section.approval.top pre.diff .del").await;
    let add = b.find_all(Locator::Css("section.approval.top pre.diff .add")).await.unwrap();
    assert_eq!(del, "-old");
    let mut added = Vec::new();
    for a in add {
        added.push(a.text().await.unwrap());
    }
    assert_eq!(added, ["+row 3: ragged"]);
    // The long output starts collapsed, its size on its summary.
    let collapsed = b
        .execute(
            "return [...document.querySelectorAll('#timeline li.call details')].filter(d => d.querySelector('pre.output') && !d.open).map(d => d.querySelector('summary').innerText);",
            vec![],
        )
        .await
        .unwrap();
    let summaries = collapsed.as_array().unwrap();
    assert_eq!(summaries.len(), 1, "{collapsed}");
    let summary = summaries[0].as_str().unwrap();
    assert!(summary.starts_with("output (") && summary.ends_with(" bytes)"), "{summary}");

    // Approve from the top; the reply streams in before it is committed.
    b.find(Locator::Css("section.approval.top button.approve"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    until(
        &b,
        "the first words, live",
        "document.getElementById('live-text').innerText.includes('The report')",
    )
    .await;
    let timeline = text_of(&b, "#timeline").await;
    assert!(!timeline.contains("is written now."), "not committed yet: {timeline}");
    shot(&b, "live-text").await;
    until(
        &b,
        "the answer",
        "document.getElementById('timeline').innerText.includes('The report is written now.')",
    )
    .await;
    until(&b, "the idle state", "document.getElementById('state').innerText === 'idle'").await;
    let verdict = text_of(&b, "#timeline .verdict").await;
    assert!(verdict.starts_with("approved by api token keel-serve at "), "{verdict}");
    assert!(verdict.ends_with(" · ran once"), "{verdict}");
    assert!(b.find_all(Locator::Css("section.approval.top")).await.unwrap().is_empty());
    assert_eq!(
        std::fs::read_to_string(project.join("report.md")).unwrap(),
        "# audit\nrow 3: ragged\n"
    );
    b.close().await.unwrap();
}

/// Logs `b` in with `token`.
async fn log_in(b: &Client, base: &str, token: &str) {
    b.goto(&format!("{base}/login")).await.unwrap();
    b.find(Locator::Id("token")).await.unwrap().send_keys(token).await.unwrap();
    b.find(Locator::Id("login")).await.unwrap().click().await.unwrap();
    until(b, "the sessions page", "location.pathname === '/'").await;
}

async fn click(b: &Client, css: &str) {
    b.find(Locator::Css(css)).await.unwrap().click().await.unwrap();
}

async fn type_into(b: &Client, css: &str, text: &str) {
    b.find(Locator::Css(css)).await.unwrap().send_keys(text).await.unwrap();
}

/// An admin's day in the console: start a session with a grant and a policy of their choosing,
/// answer its approval with "always allow", tighten the policy again and move the session to
/// another context window from its page (each change listed with who made it), find sessions
/// by text and state, delete one, make a user's token and revoke it — and the user's open
/// pages say at once that their access ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "browser tier: needs Debian's chromium and chromium-driver"]
async fn browser_console_admin_starts_with_grants_changes_settings_finds_deletes_and_revokes() {
    let write = |name: &str, text: &str| {
        json!({"path": format!("/work/out/{name}"), "content": text}).to_string()
    };
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "fs_write_file", &write("one.txt", "one\n"))]),
        Reply::calls(&[("c2", "fs_write_file", &write("two.txt", "two\n"))]),
        Reply::text("Both notes are written."),
        Reply::text("The ferry leaves at nine."),
        Reply::text("Hello, Dana."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let project = roots.path().join("project");
    std::fs::create_dir_all(project.join("out")).unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let driver = Driver::start();
    let b = driver.browser().await;
    log_in(&b, &s.base, &s.admin).await;

    // Start a session with a read-write grant and a policy that asks before writes.
    type_into(&b, "#new-input", "Write two notes into out/").await;
    click(&b, "#new-options summary").await;
    type_into(&b, "#new-grants", &format!("{}=/work:rw", project.display())).await;
    type_into(&b, "#new-ask", "fs_write_file").await;
    shot(&b, "new-session-options").await;
    click(&b, "#new-session").await;
    until(&b, "the session page", "location.pathname.startsWith('/sessions/s-')").await;
    let id = b.current_url().await.unwrap().path().trim_start_matches("/sessions/").to_string();
    let policy = text_of(&b, "#settings-policy").await;
    assert!(policy.contains("ask fs_write_file"), "{policy}");
    // Its first write waits; "always allow" approves it and allows the tool under /work/out.
    until(&b, "the approval", "document.querySelector('section.approval.top button.always')").await;
    let always = text_of(&b, "section.approval.top button.always").await;
    assert_eq!(always, "Always allow fs_write_file under /work/out");
    click(&b, "section.approval.top button.always").await;
    until(
        &b,
        "the answer",
        "document.getElementById('timeline').innerText.includes('Both notes are written.')",
    )
    .await;
    // The second write ran without asking: one approval in all.
    assert_eq!(std::fs::read_to_string(project.join("out/two.txt")).unwrap(), "two\n");
    let (_, v) = get(&c, &s.api("/approvals?all=true"), &s.admin).await;
    assert_eq!(v["approvals"].as_array().map(Vec::len), Some(1), "{v}");
    b.refresh().await.unwrap();
    let by = format!("policy changed by api token {}", super::serve_token_name());
    let changes = text_of(&b, "#settings-changes").await;
    assert!(
        changes.contains(&by) && changes.contains("allow fs_write_file under /work/out"),
        "{changes}"
    );

    // Tighten it again, move it to a smaller window, give it a title: each from its form.
    click(&b, "#settings-edit summary").await;
    click(&b, "#policy-rule option[value=ask]").await;
    click(&b, "#policy-tool option[value=fs_write_file]").await;
    click(&b, "#policy-change").await;
    until(
        &b,
        "the policy after",
        "document.getElementById('settings-changes').innerText.split('\\n').length === 2",
    )
    .await;
    let policy = text_of(&b, "#settings-policy").await;
    assert!(policy.contains("ask fs_write_file") && !policy.contains("allow"), "{policy}");
    click(&b, "#settings-edit summary").await;
    type_into(&b, "#model-window", "4096").await;
    click(&b, "#model-change").await;
    until(
        &b,
        "the model change",
        "document.getElementById('settings-changes').innerText.includes('(window 4096)')",
    )
    .await;
    click(&b, "#settings-edit summary").await;
    type_into(&b, "#title-text", "Two notes").await;
    click(&b, "#title-save").await;
    until(&b, "the title", "document.getElementById('session-title')").await;
    shot(&b, "session-settings").await;
    let (_, v) = get(&c, &s.api(&format!("/sessions/{id}")), &s.admin).await;
    assert_eq!(v["session"]["model"]["context_window"], 4096, "{v}");
    // A bad value is a clear page, and changes nothing.
    click(&b, "#settings-edit summary").await;
    type_into(&b, "#model-window", "lots").await;
    click(&b, "#model-change").await;
    until(
        &b,
        "the error page",
        "document.body.innerText.includes('the context window is a number of tokens')",
    )
    .await;

    // Another session through the API; find each by text, and by state.
    let (status, v) =
        post(&c, &s.api("/sessions"), &s.admin, json!({"input": "find a ferry to the island"}))
            .await;
    assert_eq!(status, 202, "{v}");
    let ferry = v["session_id"].as_str().unwrap().to_string();
    super::serve::wait_for(&c, &s, &ferry, "idle", |v| v["state"] == "idle").await;
    b.goto(&format!("{}/", s.base)).await.unwrap();
    type_into(&b, "#search", "ferry").await;
    click(&b, "#filter-go").await;
    until(&b, "the filtered list", "location.search.includes('search=ferry')").await;
    let rows = b.find_all(Locator::Css("#session-rows tr[data-session]")).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].attr("data-session").await.unwrap().as_deref(), Some(ferry.as_str()));
    b.goto(&format!("{}/?search=two+notes", s.base)).await.unwrap();
    let title = text_of(&b, "#session-rows td.title").await;
    assert_eq!(title, "Two notes");
    b.goto(&format!("{}/?state=failed", s.base)).await.unwrap();
    assert_eq!(text_of(&b, "#session-rows").await, "No session matches.");
    shot(&b, "sessions-filtered").await;

    // Delete the ferry session from its row (after the confirmation).
    b.goto(&format!("{}/", s.base)).await.unwrap();
    click(&b, &format!("tr[data-session='{ferry}'] button.delete")).await;
    b.accept_alert().await.unwrap();
    until(&b, "the row gone", &format!("!document.querySelector(\"tr[data-session='{ferry}']\")"))
        .await;
    let (status, _) = get(&c, &s.api(&format!("/sessions/{ferry}")), &s.admin).await;
    assert_eq!(status, 404);

    // Make a user's token: its secret is shown once.
    b.goto(&format!("{}/tokens", s.base)).await.unwrap();
    type_into(&b, "#token-name", "dana").await;
    click(&b, "#token-add").await;
    until(&b, "the new secret", "document.getElementById('token-secret')").await;
    let dana = text_of(&b, "#token-secret").await;
    assert!(dana.starts_with("keel_"), "{dana}");
    b.goto(&format!("{}/tokens", s.base)).await.unwrap();
    assert!(!text_of(&b, "main").await.contains(&dana), "the secret is shown once");

    // Dana works in another browser, her session's page open.
    let (status, v) = post(&c, &s.api("/sessions"), &dana, json!({"input": "say hello"})).await;
    assert_eq!(status, 202, "{v}");
    let hers = v["session_id"].as_str().unwrap().to_string();
    let d = driver.browser().await;
    log_in(&d, &s.base, &dana).await;
    assert!(text_of(&d, "header nav").await.find("Tokens").is_none(), "no tokens page for users");
    d.goto(&format!("{}/sessions/{hers}", s.base)).await.unwrap();
    until(
        &d,
        "her answer",
        "document.getElementById('timeline').innerText.includes('Hello, Dana.')",
    )
    .await;
    assert!(d.find_all(Locator::Css("#delete, #policy-form")).await.unwrap().is_empty());

    // The admin revokes her token; her open page says so at once.
    click(&b, "tr[data-token='dana'] button.revoke").await;
    b.accept_alert().await.unwrap();
    until(&b, "the token gone", "!document.querySelector(\"tr[data-token='dana']\")").await;
    until(&d, "the banner", "!document.getElementById('access-ended').hidden").await;
    shot(&d, "access-ended").await;
    let (status, _) = get(&c, &s.api("/sessions"), &dana).await;
    assert_eq!(status, 401);
    d.close().await.unwrap();
    b.close().await.unwrap();
}

/// Undo from the console: a call's "Fork from after step N" makes a fork to another model,
/// whose page says where it came from; "Rewind files to before step N" shows what would
/// change (the diff), and the button puts the file back, with the conversation when asked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "browser tier: needs Debian's chromium and chromium-driver"]
async fn browser_console_rewinds_a_sessions_files_from_a_step() {
    let model = MockModel::start(vec![
        Reply::calls(&[(
            "c1",
            "fs_write_file",
            &json!({"path": "/work/plan.md", "content": "# plan\nship it\n"}).to_string(),
        )]),
        Reply::text("The plan is written."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let roots = tempfile::tempdir().unwrap();
    let project = roots.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("plan.md"), "# plan\nwait\n").unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let grant = json!([{"host": project.display().to_string(), "guest": "/work", "access": "rw"}]);
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "Write the plan", "grants": grant, "id": "undo"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    super::serve::wait_for(&c, &s, "undo", "idle", |v| v["state"] == "idle").await;
    let driver = Driver::start();
    let b = driver.browser().await;
    log_in(&b, &s.base, &s.admin).await;
    b.goto(&format!("{}/sessions/undo", s.base)).await.unwrap();
    until(&b, "the rewind link", "document.querySelector('a.rewind-link')").await;
    assert_eq!(text_of(&b, "a.rewind-link").await, "Rewind files to before step 1…");
    click(&b, "a.rewind-link").await;
    until(&b, "the preview", "document.getElementById('rewind-form')").await;
    let row = text_of(&b, "tr[data-path='/work/plan.md']").await;
    assert!(row.contains("restore") && row.contains("would"), "{row}");
    assert_eq!(text_of(&b, "tr[data-path='/work/plan.md'] pre.diff .del").await, "-ship it");
    assert_eq!(text_of(&b, "tr[data-path='/work/plan.md'] pre.diff .add").await, "+wait");
    shot(&b, "rewind-preview").await;
    assert_eq!(std::fs::read_to_string(project.join("plan.md")).unwrap(), "# plan\nship it\n");
    // Before rewinding: fork the session after its one step, to another model.
    b.goto(&format!("{}/sessions/undo", s.base)).await.unwrap();
    until(&b, "the fork link", "document.querySelector('a.fork-link')").await;
    assert_eq!(text_of(&b, "a.fork-link").await, "Fork from after step 1…");
    click(&b, "a.fork-link").await;
    until(&b, "the fork form", "document.getElementById('fork-form')").await;
    type_into(&b, "#fork-model", "m2").await;
    click(&b, "#fork-go").await;
    until(&b, "the fork's page", "document.getElementById('forked-from')").await;
    let origin = text_of(&b, "#forked-from").await;
    assert!(origin.starts_with("Forked from undo at step 1"), "{origin}");
    assert!(text_of(&b, "#settings-model").await.contains("m2"));
    shot(&b, "forked").await;
    // Rewind the files and the conversation.
    b.goto(&format!("{}/sessions/undo/rewind?to=0", s.base)).await.unwrap();
    until(&b, "the preview", "document.getElementById('rewind-form')").await;
    click(&b, "#rewind-conversation").await;
    click(&b, "#rewind-go").await;
    b.accept_alert().await.unwrap();
    until(&b, "the result", "document.getElementById('rewind-done')").await;
    let row = text_of(&b, "tr[data-path='/work/plan.md']").await;
    assert!(row.contains("done"), "{row}");
    assert_eq!(std::fs::read_to_string(project.join("plan.md")).unwrap(), "# plan\nwait\n");
    let said = text_of(&b, "#rewind-conversation-outcome").await;
    assert!(said.starts_with("Conversation: went back to step 0"), "{said}");
    shot(&b, "rewind-done").await;
    b.goto(&format!("{}/sessions/undo", s.base)).await.unwrap();
    until(&b, "the session", "document.querySelector('.conversation-rewound')").await;
    b.close().await.unwrap();
}

/// What a tool wrote to its stderr in a session is under its call on the session's page, in a
/// closed "tool logs" box, redacted as outputs are.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "browser tier: needs Debian's chromium and chromium-driver"]
async fn browser_console_shows_a_calls_tool_logs_under_it() {
    let model =
        MockModel::start(vec![Reply::calls(&[("c1", "boom", "{}")]), Reply::text("It failed.")])
            .await;
    let home = tempfile::tempdir().unwrap();
    let hostile = keel_tests::guests::HOSTILE_COMPONENT;
    let out = super::keel(home.path(), &["tool", "install", hostile, "--name", "hostile"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let roots = tempfile::tempdir().unwrap();
    let s = Server::start(home.path(), &model.url(), &[roots.path()]);
    let c = client();
    let (status, v) = post(
        &c,
        &s.api("/sessions"),
        &s.admin,
        json!({"input": "Try it", "tools": ["boom"], "id": "logs"}),
    )
    .await;
    assert_eq!(status, 202, "{v}");
    super::serve::wait_for(&c, &s, "logs", "idle", |v| v["state"] == "idle").await;
    let driver = Driver::start();
    let b = driver.browser().await;
    log_in(&b, &s.base, &s.admin).await;
    b.goto(&format!("{}/sessions/logs", s.base)).await.unwrap();
    until(&b, "the tool logs", "document.querySelector('details.tool-logs')").await;
    let open =
        b.execute("return document.querySelector('details.tool-logs').open", vec![]).await.unwrap();
    assert_eq!(open, json!(false), "closed until asked for");
    click(&b, "details.tool-logs summary").await;
    let logs = text_of(&b, "details.tool-logs pre.logs").await;
    assert!(logs.contains("to fail"), "{logs}");
    shot(&b, "tool-logs").await;
    b.close().await.unwrap();
}
