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

use super::serve::{Server, client, post, upload_effects};

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
