//! The terminal tier: `keel chat` and coloured progress in a real terminal (tmux: keys sent,
//! the pane captured), against the scripted model server on loopback.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use keel_tests::mock_model::{MockModel, Reply};
use serde_json::{Value, json};

/// How long a step may take before the test gives up and shows the pane: a hang, not a
/// timing requirement.
const PATIENCE: Duration = Duration::from_secs(60);

/// A tmux server of its own (its socket in a temporary directory) with one pane.
struct Pane {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

impl Pane {
    /// Runs `env` and `args` (the keel binary's) in a 200×60 pane that stays after it ends.
    fn start(env: &[(&str, &str)], args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tmux.sock");
        let pane = Pane { socket, _dir: dir };
        pane.tmux(&["new-session", "-d", "-s", "k", "-x", "200", "-y", "60"]);
        pane.tmux(&["set-option", "-t", "k", "remain-on-exit", "on"]);
        let mut line = String::from("env -u NO_COLOR");
        for (k, v) in env {
            line.push_str(&format!(" {k}={}", quote(v)));
        }
        line.push(' ');
        line.push_str(&quote(env!("CARGO_BIN_EXE_keel")));
        for a in args {
            line.push(' ');
            line.push_str(&quote(a));
        }
        pane.tmux(&["respawn-pane", "-k", "-t", "k", &line]);
        pane
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux").arg("-S").arg(&self.socket).args(args).output().unwrap();
        assert!(out.status.success(), "tmux {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (tmux key names: `Enter`, `C-c`, `Up` …).
    fn send(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "k"];
        args.extend(keys);
        self.tmux(&args);
    }

    /// Types `text` literally, then Enter.
    fn line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "k", "-l", text]);
        self.send(&["Enter"]);
    }

    /// The pane's text, its history included, wrapped lines joined.
    fn text(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-S", "-2000", "-t", "k"])
    }

    /// The pane's text with its colours as escape sequences.
    fn coloured(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-e", "-J", "-S", "-2000", "-t", "k"])
    }

    /// Waits until `ready` holds of the pane's text; returns it.
    fn until(&self, what: &str, ready: impl Fn(&str) -> bool) -> String {
        let start = Instant::now();
        loop {
            let text = self.text();
            if ready(&text) {
                return text;
            }
            assert!(start.elapsed() < PATIENCE, "waiting for {what}; the pane:\n{text}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the pane shows `needle` `n` times.
    fn shows(&self, needle: &str, n: usize) -> String {
        self.until(needle, |t| t.matches(needle).count() >= n)
    }

    fn dead(&self) -> bool {
        self.tmux(&["display-message", "-p", "-t", "k", "#{pane_dead}"]).trim() == "1"
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = Command::new("tmux").arg("-S").arg(&self.socket).arg("kill-server").output();
    }
}

fn keel_json(home: &Path, args: &[&str]) -> Value {
    super::json_of(&super::keel(home, args))
}

/// A conversation kept open: a streamed answer, a write approved in place after its diff was
/// shown, one rejected with a reason, slash commands, Ctrl-C interrupting a turn, history, and
/// Ctrl-D leaving with the session kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "terminal tier: needs tmux"]
async fn terminal_chat_streams_asks_in_place_interrupts_and_leaves() {
    let report = "# audit\nrow 3: ragged\n";
    let model = MockModel::start(vec![
        Reply::calls(&[(
            "c1",
            "fs_write_file",
            &json!({"path": "/w/report.md", "content": report}).to_string(),
        )]),
        Reply::drip_text(&["Report ", "written."], Duration::from_millis(300)),
        Reply::calls(&[(
            "c2",
            "fs_write_file",
            &json!({"path": "/w/report.md", "content": "bad\n"}).to_string(),
        )]),
        Reply::text("Left it as it was."),
        Reply::calls(&[(
            "c3",
            "fs_write_file",
            &json!({"path": "/w/later.md", "content": "later\n"}).to_string(),
        )]),
        Reply::text("Written later."),
        Reply::Delay(Duration::from_secs(120), Box::new(Reply::text("too late"))),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("report.md"), "# audit\nold\n").unwrap();
    let grant = format!("{}=/w:rw", work.path().display());
    let url = model.url();
    let home_arg = home.path().display().to_string();
    let pane = Pane::start(
        &[],
        &[
            "--home",
            &home_arg,
            "chat",
            "--new-session",
            "talk",
            "--no-preprocess",
            "--model-url",
            &url,
            "--model",
            "m",
            "--grant",
            &grant,
            "--tools",
            "fs_write_file,fs_read_file",
            "--ask",
            "fs_write_file",
        ],
    );
    pane.shows("/help lists commands", 1);
    pane.shows("› ", 1);

    // A write is asked about in place, with its diff against the file there now.
    pane.line("Write the audit report");
    let asked = pane.shows("approve once [y]", 1);
    assert!(asked.contains("⏸ fs_write_file /w/report.md (22 bytes) needs approval"), "{asked}");
    assert!(asked.contains("change    writes 22B to /w/report.md, replacing 12B"), "{asked}");
    assert!(asked.contains("│ -old") && asked.contains("│ +row 3: ragged"), "{asked}");
    assert!(!asked.contains(r#"\n"#), "no escaped JSON: {asked}");
    let coloured = pane.coloured();
    assert!(coloured.contains("│ \u{1b}[31m-old"), "removed lines red: {coloured:?}");
    assert!(coloured.contains("\u{1b}[32m+row 3: ragged"), "added lines green: {coloured:?}");
    pane.line("y");
    let done = pane.shows("keel: idle", 1);
    assert!(done.contains("approved by "), "{done}");
    assert!(done.contains("✓ fs_write_file /w/report.md (22 bytes)"), "{done}");
    assert_eq!(done.matches("Report written.").count(), 1, "streamed once, not repeated: {done}");
    assert_eq!(std::fs::read_to_string(work.path().join("report.md")).unwrap(), report);

    // Rejected with a reason: the model is told, the file stays.
    pane.line("Try again");
    pane.shows("approve once [y]", 2);
    pane.line("n");
    pane.shows("reason (the model is told", 1);
    pane.line("not now");
    let done = pane.shows("keel: idle", 2);
    assert!(done.contains("Left it as it was."), "{done}");
    assert_eq!(std::fs::read_to_string(work.path().join("report.md")).unwrap(), report);
    let units = keel_json(home.path(), &["approvals", "--session", "talk", "--all", "--json"]);
    let statuses: Vec<(&str, Option<&str>)> = units
        .as_array()
        .unwrap()
        .iter()
        .map(|u| (u["status"].as_str().unwrap(), u["decision_reason"].as_str()))
        .collect();
    assert_eq!(statuses, [("consumed", None), ("rejected", Some("not now"))]);
    let rejected = &model.requests()[3];
    assert!(String::from_utf8_lossy(rejected).contains("not now"), "the model was told why");

    // Left undecided, then decided from /approvals: the turn resumes from there.
    pane.line("Write it later");
    pane.shows("approve once [y]", 3);
    pane.line("s");
    pane.shows("the turn waits; decide with /approvals", 1);
    pane.line("/approvals");
    pane.shows("approve once [y]", 4);
    pane.line("y");
    let done = pane.shows("keel: idle", 3);
    assert!(done.contains("Written later."), "{done}");
    assert_eq!(std::fs::read_to_string(work.path().join("later.md")).unwrap(), "later\n");

    // Slash commands.
    pane.line("/tools");
    pane.shows("  fs_read_file", 1);
    pane.line("/tool");
    pane.shows("did you mean `/tools`?", 1);
    pane.line("/session");
    pane.shows("policy ", 1);
    pane.line("/context");
    let room = pane.shows("next request ≈", 1);
    assert!(room.contains("(no context window known): keel "), "{room}");
    pane.line("/room");
    pane.shows("next request ≈", 2);
    // /rewind lists the steps; with one, it shows what going back would do and asks first.
    pane.line("/rewind");
    let steps = pane.shows("/rewind STEP goes back", 1);
    assert!(steps.contains("step 5    turn 3    fs_write_file"), "{steps}");
    assert!(steps.contains("step 6    turn 3    answer"), "{steps}");
    pane.line("/rewind 4");
    let plan = pane.shows("go back to step 4? [y/N]", 1);
    assert!(plan.contains("would remove       /w/later.md"), "{plan}");
    assert!(plan.contains("would leave the model's context"), "{plan}");
    pane.line("y");
    let done = pane.shows("are sent again", 1);
    assert!(done.contains("removed            /w/later.md"), "{done}");
    assert!(!work.path().join("later.md").exists());

    // Ctrl-C interrupts the turn and keeps the session.
    pane.line("Wait for it");
    let start = Instant::now();
    while model.requests().len() < 7 {
        assert!(start.elapsed() < PATIENCE, "the seventh request never came: {}", pane.text());
        std::thread::sleep(Duration::from_millis(50));
    }
    pane.send(&["C-c"]);
    pane.shows("interrupted; the session stays", 1);
    pane.until("the prompt again", |t| {
        t.lines().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| l.trim_end() == "›")
    });

    // History: Up brings back the last line; Ctrl-U clears it; Ctrl-D leaves.
    pane.send(&["Up"]);
    pane.until("the last line again", |t| {
        t.lines().rev().find(|l| !l.trim().is_empty()).is_some_and(|l| l.ends_with("› Wait for it"))
    });
    pane.send(&["C-u"]);
    pane.send(&["C-d"]);
    let left = pane.shows("left session talk", 1);
    assert!(left.contains("keel chat --session talk"), "{left}");
    pane.until("the pane to end", |_| pane.dead());
    let show = keel_json(home.path(), &["session", "show", "talk", "--json"]);
    assert_eq!(show["id"], "talk");
    assert_ne!(show["state"], "running");
    // The history has the inputs and commands, not the answers to approvals.
    let history = std::fs::read_to_string(home.path().join("chat-history")).unwrap();
    let lines: Vec<&str> = history.lines().collect();
    assert!(lines.contains(&"Write the audit report") && lines.contains(&"/tools"), "{history}");
    for answer in ["y", "n", "s", "not now"] {
        assert!(!lines.contains(&answer), "`{answer}` is in the history: {history}");
    }
}

/// A chat that continues a session replays its last exchanges; `--resume` offers this user's
/// recent sessions and continues the one picked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "terminal tier: needs tmux"]
async fn terminal_chat_continues_with_a_replay_and_resumes_from_a_picker() {
    let model = MockModel::start(vec![
        Reply::calls(&[("c1", "csv_inspect", r#"{"path":"/data/orders.csv"}"#)]),
        Reply::text("Two rows are ragged."),
        Reply::text("Nothing else to check."),
        Reply::text("Another session's answer."),
        Reply::text("Picked up again."),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let url = model.url();
    let grant = format!("{}=/data:ro", super::data_dir());
    let run = |args: &[&str]| {
        let mut all = vec!["run"];
        all.extend(args);
        all.extend([
            "--model-url",
            url.as_str(),
            "--model",
            "m",
            "--no-preprocess",
            "--user",
            "dee",
        ]);
        let out = super::keel(home.path(), &all);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    run(&[
        "Check orders.csv",
        "--new-session",
        "audit",
        "--grant",
        &grant,
        "--tools",
        "csv_inspect",
    ]);
    run(&["Anything else?", "--session", "audit"]);
    run(&["Something unrelated", "--new-session", "later-one"]);
    let home_arg = home.path().display().to_string();

    let pane = Pane::start(
        &[("KEEL_USER", "dee")],
        &["--home", &home_arg, "chat", "--continue", "--replay", "1"],
    );
    let shown = pane.shows("(end of the replay)", 1);
    assert!(shown.contains("keel: the last exchange of session later-one (1 in all):"), "{shown}");
    assert!(shown.contains("› Something unrelated"), "{shown}");
    assert!(shown.contains("Another session's answer."), "{shown}");
    pane.shows("chat in session later-one", 1);
    pane.send(&["C-d"]);
    pane.until("the pane to end", |_| pane.dead());

    let pane = Pane::start(&[("KEEL_USER", "dee")], &["--home", &home_arg, "chat", "--resume"]);
    let offered = pane.shows("resume which? [1-2", 1);
    let later = offered.lines().position(|l| l.contains("later-one")).expect(&offered);
    let audit = offered.lines().position(|l| l.contains("  audit  ")).expect(&offered);
    assert!(later < audit, "the most recent first: {offered}");
    assert!(offered.contains("2 turns  Check orders.csv"), "{offered}");
    assert!(offered.contains("idle"), "{offered}");
    pane.line("9");
    pane.shows("answer a number from 1 to 2", 1);
    pane.line("2");
    // The default replay: the last three exchanges, here both of the session's.
    let shown = pane.shows("(end of the replay)", 1);
    assert!(shown.contains("the last 2 exchanges of session audit (2 in all):"), "{shown}");
    assert!(shown.contains("› Check orders.csv") && shown.contains("  · csv_inspect"), "{shown}");
    assert!(shown.contains("Two rows are ragged.") && shown.contains("Nothing else to check."));
    pane.shows("chat in session audit", 1);
    pane.line("Go on");
    pane.shows("Picked up again.", 1);
    // /model shows the session's model, and moves it to another.
    pane.line("/model");
    pane.shows(&format!("  model    m at {}", url.trim_end_matches('/')), 1);
    pane.line("/model bigger");
    pane.shows(&format!("keel: model m at {0} → bigger at {0}", url.trim_end_matches('/')), 1);
    pane.send(&["C-d"]);
    pane.until("the pane to end", |_| pane.dead());
    let history = std::fs::read_to_string(home.path().join("chat-history")).unwrap();
    assert!(history.lines().any(|l| l == "Go on"), "{history}");
    assert!(!history.lines().any(|l| l == "2" || l == "9"), "the picker's answers: {history}");

    // A mistyped id in a chat: the same error as run's, and no chat starts.
    let pane = Pane::start(&[], &["--home", &home_arg, "chat", "--session", "audti"]);
    pane.shows("did you mean `audit`?", 1);
    pane.until("the pane to end", |_| pane.dead());
}

/// Progress marks are coloured on a terminal, and not with `NO_COLOR`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "terminal tier: needs tmux"]
async fn terminal_progress_is_coloured_unless_no_color() {
    for no_color in [false, true] {
        let model = MockModel::start(vec![
            Reply::calls(&[("c1", "csv_inspect", r#"{"path":"/data/orders.csv"}"#)]),
            Reply::text("Two rows are ragged."),
        ])
        .await;
        let home = tempfile::tempdir().unwrap();
        let home_arg = home.path().display().to_string();
        let grant = format!("{}=/data:ro", super::data_dir());
        let url = model.url();
        let env: &[(&str, &str)] = if no_color { &[("NO_COLOR", "1")] } else { &[] };
        let pane = Pane::start(
            env,
            &[
                "--home",
                &home_arg,
                "run",
                "Check orders.csv",
                "--no-preprocess",
                "--model-url",
                &url,
                "--model",
                "m",
                "--grant",
                &grant,
                "--tools",
                "csv_inspect",
            ],
        );
        pane.shows("keel: session", 2);
        pane.until("the command to end", |_| pane.dead());
        let plain = pane.text();
        assert!(plain.contains("✓ csv_inspect /data/orders.csv"), "{plain}");
        // Streamed on the terminal, the answer is not printed a second time.
        assert_eq!(plain.matches("Two rows are ragged.").count(), 1, "{plain}");
        let text = pane.coloured();
        assert_eq!(text.contains("\u{1b}[32m✓"), !no_color, "NO_COLOR={no_color}: {text:?}");
    }
}

/// "Always allow" in chat: `a` approves the call and allows the tool under the call's
/// directory for the rest of the session — the next write there runs unasked — recorded as a
/// policy change that `session show`, `session events` and `session policy` show, and that
/// `session policy --ask` undoes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "terminal tier: needs tmux"]
async fn terminal_chat_always_allows_a_tool_under_a_directory() {
    let write = |id: &str, path: &str| {
        Reply::calls(&[(id, "fs_write_file", &json!({"path": path, "content": id}).to_string())])
    };
    let model = MockModel::start(vec![
        write("c1", "/w/a.md"),
        Reply::text("first written"),
        write("c2", "/w/b.md"),
        Reply::text("second written"),
        Reply::text("it says c1"),
    ])
    .await;
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let grant = format!("{}=/w:rw", work.path().display());
    let url = model.url();
    let home_arg = home.path().display().to_string();
    let pane = Pane::start(
        &[],
        &[
            "--home",
            &home_arg,
            "chat",
            "--new-session",
            "always",
            "--context-window",
            "8192",
            "--no-preprocess",
            "--model-url",
            &url,
            "--model",
            "m",
            "--grant",
            &grant,
            "--tools",
            "fs_write_file",
            "--ask",
            "fs_write_file",
        ],
    );
    pane.shows("/help lists commands", 1);
    pane.line("Write a");
    let asked = pane.shows("always allow fs_write_file under /w [a]", 1);
    assert!(asked.contains("approve once [y]"), "{asked}");
    pane.line("a");
    let done = pane.shows("keel: idle", 1);
    assert!(done.contains("keel: policy: ask fs_write_file"), "{done}");
    assert!(done.contains("allow fs_write_file under /w"), "{done}");
    assert!(done.contains("(undo: keel session policy always --ask fs_write_file)"), "{done}");
    // Each turn's line says how full the context is.
    let idle = done.lines().find(|l| l.starts_with("keel: idle")).unwrap();
    assert!(idle.contains(" · context ") && idle.ends_with("% full (/context)"), "{idle}");
    assert_eq!(std::fs::read_to_string(work.path().join("a.md")).unwrap(), "c1");
    // The next write under /w runs without a question.
    pane.line("Write b");
    let done = pane.shows("keel: idle", 2);
    assert!(done.contains("second written"), "{done}");
    assert_eq!(done.matches("approve once [y]").count(), 1, "asked once: {done}");
    assert_eq!(std::fs::read_to_string(work.path().join("b.md")).unwrap(), "c2");
    // `@/path` attaches a file's text through the grants; outside them, nothing is sent.
    let before = model.requests().len();
    pane.line("What does @/etc/passwd say?");
    pane.shows("is outside every directory granted to session `always`", 1);
    pane.shows("(nothing was sent)", 1);
    assert_eq!(model.requests().len(), before, "the model received nothing");
    pane.line("What does @/w/a.md say?");
    let done = pane.shows("keel: idle", 3);
    assert!(done.contains("keel: attached /w/a.md (2 bytes)"), "{done}");
    let sent = String::from_utf8_lossy(model.requests().last().unwrap()).into_owned();
    assert!(
        sent.contains(
            r#"What does @/w/a.md say?\n\n<file path=\"/w/a.md\" bytes=\"2\">\nc1\n</file>"#
        ),
        "{sent}"
    );
    pane.send(&["C-d"]);
    pane.until("the pane to end", |_| pane.dead());

    let show = keel_json(home.path(), &["session", "show", "always", "--json"]);
    let policy = show["policy"].to_string();
    assert!(policy.contains("/w"), "{show}");
    let events = super::keel(home.path(), &["session", "events", "always"]);
    let events = String::from_utf8_lossy(&events.stdout);
    assert!(events.contains("policy: allow fs_write_file under /w (by "), "{events}");
    let out = super::keel(home.path(), &["session", "policy", "always", "--ask", "fs_write_file"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.trim(), "session always: ask fs_write_file, destructive, external", "{text}");
    let v = keel_json(home.path(), &["session", "policy", "always", "--json"]);
    assert_eq!(v["policy"], "ask fs_write_file, destructive, external");
    let approvals =
        keel_json(home.path(), &["approvals", "--session", "always", "--all", "--json"]);
    assert_eq!(approvals.as_array().unwrap().len(), 1);
    assert_eq!(approvals[0]["status"], "consumed");
}
