//! The crash harness: runs the real `keel` binary over the scripted model server and kills it
//! with SIGKILL — at every named crash point (`KEEL_CRASH_AT`, compiled into test builds only)
//! and at random times — then restarts it, lets the session finish, and checks: no
//! acknowledged fact lost, no duplicate execution of a non-idempotent call, `PRAGMA
//! integrity_check` ok, recovering twice gives the same state. The effect-counting guest appends
//! one line per execution to a log in the granted workspace.
//!
//! Random kills: `KEEL_CRASH_ITERATIONS` (default 25); the slow tier runs 200:
//! `KEEL_CRASH_ITERATIONS=200 cargo test --release --test crash -- --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use keel::assembly::Assembly;
use keel::ids::SessionId;
use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use keel_tests::log_lines;
use keel_tests::mock_model::{MockModel, Reply, plan_responder, spawn_task, workgroup_responder};
use rusqlite::Connection;
use serde_json::Value;

struct Rig {
    home: tempfile::TempDir,
    work: tempfile::TempDir,
    url: String,
    model: MockModel,
    /// Business model requests the server answered (`None`: not counted).
    business: Option<Arc<AtomicUsize>>,
}

fn keel_cmd(home: &Path, args: &[&str], crash_at: Option<&str>) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_keel"));
    c.arg("--home").arg(home).args(args).env_remove("KEEL_CRASH_AT");
    if let Some(p) = crash_at {
        c.env("KEEL_CRASH_AT", p);
    }
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    c
}

impl Rig {
    async fn new(plan: &[&str]) -> Self {
        let plan = plan_responder(plan.iter().map(|s| s.to_string()).collect());
        let business = Arc::new(AtomicUsize::new(0));
        let counted = business.clone();
        let model = MockModel::start_fn(Arc::new(move |body: &[u8]| {
            counted.fetch_add(1, Ordering::SeqCst);
            plan(body)
        }))
        .await;
        Self { business: Some(business), ..Self::with_model(model) }
    }

    fn with_model(model: MockModel) -> Self {
        let rig = Self {
            home: tempfile::tempdir().unwrap(),
            work: tempfile::tempdir().unwrap(),
            url: model.url(),
            model,
            business: None,
        };
        let out = rig.keel(
            &["tool", "install", keel_tests::guests::EFFECTS_COMPONENT, "--name", "effects"],
            None,
        );
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        rig
    }

    fn db(&self) -> PathBuf {
        self.home.path().join("keel.db")
    }

    fn keel(&self, args: &[&str], crash_at: Option<&str>) -> Output {
        let home = self.home.path().to_path_buf();
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let crash_at = crash_at.map(str::to_string);
        // Blocking child processes off the async workers (the model server runs there).
        tokio::task::block_in_place(|| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            keel_cmd(&home, &args, crash_at.as_deref()).output().unwrap()
        })
    }

    /// `keel run TASK` in `session`: created (`--new-session`) unless it exists.
    fn run_args(&self, session: &str, task: &str) -> Vec<String> {
        let grant = format!("{}=/work:rw", self.work.path().display());
        let flag = if self.session_exists(session) { "--session" } else { "--new-session" };
        [
            "run",
            task,
            flag,
            session,
            "--grant",
            &grant,
            "--tools",
            "effect_append,effect_put,effect_send,effect_peek",
            "--model-url",
            &self.url,
            "--model",
            "m",
            "--max-steps",
            "50",
            "--json",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    fn run(&self, session: &str, task: &str, crash_at: Option<&str>) -> Output {
        let mut args = self.run_args(session, task);
        if self.session_exists(session) {
            // Grants and tools are fixed at creation.
            let keep = ["--grant", "--tools"];
            let mut i = 0;
            while i < args.len() {
                if keep.contains(&args[i].as_str()) {
                    args.drain(i..i + 2);
                } else {
                    i += 1;
                }
            }
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.keel(&args, crash_at)
    }

    fn spawn_run(&self, session: &str, task: &str) -> Child {
        let mut args = self.run_args(session, task);
        if self.session_exists(session) {
            args.drain(4..6);
            args.drain(4..6);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        keel_cmd(self.home.path(), &args, None).spawn().unwrap()
    }

    fn session_exists(&self, id: &str) -> bool {
        self.query(|c| {
            c.query_row("SELECT COUNT(*) FROM sessions WHERE id=?1", [id], |r| r.get::<_, i64>(0))
        })
        .unwrap_or(0)
            > 0
    }

    fn query<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> rusqlite::Result<T> {
        let c = Connection::open_with_flags(self.db(), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        c.busy_timeout(Duration::from_secs(10))?;
        f(&c)
    }

    fn state(&self, id: &str) -> String {
        self.query(|c| c.query_row("SELECT state FROM sessions WHERE id=?1", [id], |r| r.get(0)))
            .unwrap()
    }

    fn integrity(&self) -> String {
        self.query(|c| c.query_row("PRAGMA integrity_check", [], |r| r.get(0))).unwrap()
    }

    /// Every fact recovery may touch, as text (for "recovering twice gives the same state").
    fn dump(&self) -> String {
        self.query(|c| {
            let mut out = String::new();
            for (table, order) in [
                ("sessions", "id"),
                ("messages", "session_id, seq"),
                ("tool_calls", "session_id, step, position"),
                ("approvals", "id"),
                ("open_steps", "session_id"),
                ("inbox", "session_id, seq"),
                ("runner_leases", "session_id"),
            ] {
                let mut stmt = c.prepare(&format!("SELECT * FROM {table} ORDER BY {order}"))?;
                let n = stmt.column_count();
                let rows = stmt.query_map([], |r| {
                    let cells: Vec<String> = (0..n)
                        .map(|i| {
                            format!(
                                "{:?}",
                                r.get_ref(i)
                                    .map(|v| v.data_type())
                                    .ok()
                                    .and(r.get::<_, rusqlite::types::Value>(i).ok())
                            )
                        })
                        .collect();
                    Ok(cells.join("|"))
                })?;
                for row in rows {
                    out.push_str(&format!("{table}: {}\n", row?));
                }
            }
            Ok(out)
        })
        .unwrap()
    }

    /// The acknowledged facts: committed messages and finished journal rows.
    fn facts(&self) -> BTreeMap<String, String> {
        self.query(|c| {
            let mut out = BTreeMap::new();
            let mut stmt = c.prepare("SELECT session_id, seq, body FROM messages")?;
            for row in stmt.query_map([], |r| {
                Ok((format!("m/{}/{}", r.get::<_, String>(0)?, r.get::<_, i64>(1)?), r.get(2)?))
            })? {
                let (k, v) = row?;
                out.insert(k, v);
            }
            let mut stmt = c.prepare(
                "SELECT session_id, step, call_id, status, result FROM tool_calls WHERE status IN ('done', 'unknown')",
            )?;
            for row in stmt.query_map([], |r| {
                Ok((
                    format!("c/{}/{}/{}", r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, String>(2)?),
                    format!("{}:{:?}", r.get::<_, String>(3)?, r.get::<_, Option<String>>(4)?),
                ))
            })? {
                let (k, v) = row?;
                out.insert(k, v);
            }
            let mut stmt = c.prepare("SELECT session_id, seq, text FROM inbox")?;
            for row in stmt.query_map([], |r| {
                Ok((format!("i/{}/{}", r.get::<_, String>(0)?, r.get::<_, i64>(1)?), r.get(2)?))
            })? {
                let (k, v) = row?;
                out.insert(k, v);
            }
            Ok(out)
        })
        .unwrap_or_default()
    }

    /// Recovers twice without resuming; both must leave the same state.
    fn recover_twice_same(&self) {
        let a = self.keel(&["recover", "--no-resume", "--json"], None);
        assert!(a.status.success(), "{}", String::from_utf8_lossy(&a.stderr));
        let first = self.dump();
        let b = self.keel(&["recover", "--no-resume", "--json"], None);
        assert!(b.status.success());
        assert_eq!(first, self.dump(), "recovering twice must give the same state");
    }

    /// Resumes until `session` is idle (a few tries: a resume itself is never killed here).
    fn finish(&self, session: &str) -> Output {
        let mut last = None;
        for _ in 0..4 {
            let out = self.keel(&["recover", "--json"], None);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            last = Some(out);
            if self.state(session) == "idle" {
                break;
            }
        }
        last.unwrap()
    }

    fn journal(&self, session: &str) -> Vec<(String, String, Option<String>, Option<String>)> {
        self.query(|c| {
            let mut stmt = c.prepare(
                "SELECT tool, input, status, error_kind FROM tool_calls WHERE session_id=?1 ORDER BY step, position",
            )?;
            let rows = stmt
                .query_map([session], |r| {
                    let input: String = r.get(1)?;
                    let label = serde_json::from_str::<Value>(&input).ok().and_then(|v| v["label"].as_str().map(str::to_string)).unwrap_or_default();
                    Ok((r.get::<_, String>(0)?, label, r.get::<_, Option<String>>(2)?, r.get::<_, Option<String>>(3)?))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })
        .unwrap()
    }

    fn lines(&self, name: &str) -> Vec<String> {
        log_lines(self.work.path(), name)
    }
}

impl Rig {
    /// How many answers of `session` end with `tag`.
    fn answers(&self, session: &str, tag: &str) -> i64 {
        self.query(|c| {
            c.query_row(
                "SELECT COUNT(*) FROM messages WHERE session_id=?1 AND role='assistant' AND body LIKE ?2",
                [session.to_string(), format!("%{tag}\"%")],
                |r| r.get(0),
            )
        })
        .unwrap()
    }

    /// The events of `session`, oldest first.
    fn events(&self, session: &str) -> Vec<Value> {
        self.query(|c| {
            let mut stmt =
                c.prepare("SELECT body FROM session_events WHERE session_id=?1 ORDER BY seq")?;
            let rows = stmt.query_map([session], |r| r.get::<_, String>(0))?;
            Ok(rows.map(|b| serde_json::from_str(&b.unwrap()).unwrap()).collect())
        })
        .unwrap()
    }

    /// After kills (`kills` of them) and recovery, every fact of `session` has exactly its
    /// events, once: each call's final journal status one `tool_call` event; each compaction
    /// one closing event; each model call (as many as the server answered) a
    /// `model_call_started` before it — announced again when a runner resumed it — and never
    /// two open at once; each understanding call made its `understanding_started`, each
    /// Orchestrator call its announcing `capabilities_recalled` (a kill may come between an
    /// announcement and its request: one unanswered announcement per kill at most).
    fn check_events(&self, session: &str, kills: usize, what: &str) {
        self.check_session_events(session, what);
        self.check_announced(&[session], kills, what);
    }

    /// The checks of [`check_events`](Self::check_events) that hold for one session whatever
    /// other sessions the server answered: each call's final status once, each compaction
    /// closed once, model calls announced before they end and never two open at once.
    fn check_session_events(&self, session: &str, what: &str) {
        let events = self.events(session);
        let rows: Vec<(i64, String, String)> = self
            .query(|c| {
                let mut stmt =
                    c.prepare("SELECT step, call_id, status FROM tool_calls WHERE session_id=?1")?;
                let rows = stmt.query_map([session], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                rows.collect()
            })
            .unwrap();
        for (step, call, status) in &rows {
            let n = events
                .iter()
                .filter(|e| {
                    e["kind"] == "tool_call"
                        && e["step"] == *step
                        && e["call_id"] == call.as_str()
                        && e["status"] == status.as_str()
                })
                .count();
            assert_eq!(
                n, 1,
                "{what}: call {call} ({status}) has {n} `{status}` events: {events:#?}"
            );
        }
        let mut compacting = false;
        let mut calling: Option<i64> = None;
        for e in &events {
            match e["kind"].as_str().unwrap() {
                "compaction_started" => {
                    assert!(!compacting, "{what}: a compaction was never closed: {events:#?}");
                    compacting = true;
                }
                "compacted"
                | "compaction_failed"
                | "checkpoint_discarded"
                | "compaction_abandoned" => {
                    assert!(compacting, "{what}: {e} closes no compaction: {events:#?}");
                    compacting = false;
                }
                "model_call_started" => {
                    if let Some(open) = calling {
                        assert!(
                            e["resumed"] == true && e["step"] == open,
                            "{what}: model call {open} announced twice without a resume: {events:#?}"
                        );
                    }
                    calling = e["step"].as_i64();
                }
                "model_call_finished" | "model_call_failed" => {
                    assert_eq!(calling, e["step"].as_i64(), "{what}: {e} was not announced");
                    calling = None;
                }
                _ => {}
            }
        }
        assert!(!compacting, "{what}: the last compaction was never closed: {events:#?}");
    }

    /// The calls of `sessions` (every session the server answered) were announced: as many
    /// `…_started` events as the server answered calls, or up to one more per kill (a kill may
    /// come between an announcement and its request).
    fn check_announced(&self, sessions: &[&str], kills: usize, what: &str) {
        let events: Vec<Value> = sessions.iter().flat_map(|s| self.events(s)).collect();
        let kinds = |k: &str| events.iter().filter(|e| e["kind"] == k).count();
        let within = |announced: usize, made: usize, call: &str| {
            assert!(
                announced >= made && announced <= made + kills,
                "{what}: {made} {call} calls made, {announced} announced, {kills} kills: {events:#?}"
            );
        };
        if let Some(business) = &self.business {
            let (made, started) = (business.load(Ordering::SeqCst), kinds("model_call_started"));
            within(started, made, "model");
        }
        within(
            kinds("understanding_started"),
            self.model.understanding_requests().len(),
            "understanding",
        );
        let announced = events
            .iter()
            .filter(|e| e["kind"] == "capabilities_recalled" && e["call"] == true)
            .count();
        within(announced, self.model.orchestration_requests().len(), "Orchestrator");
    }
}

fn killed(out: &Output) -> bool {
    out.status.signal() == Some(9)
}

/// C2: a crash at each commit boundary, for each effect class; the documented outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c2_crash_at_every_named_point() {
    // (crash point, tool, log, expected executions, expected journal status, expected error kind)
    type Case =
        (&'static str, &'static str, &'static str, usize, &'static str, Option<&'static str>);
    let cases: &[Case] = &[
        // Nothing was durable: the model call is made again and the call runs once.
        ("before_intent", "effect_append", "effects.log", 1, "done", None),
        // The intent is durable, the effect never happened: reported "outcome unknown", not re-run.
        ("after_intent", "effect_append", "effects.log", 0, "unknown", Some("outcome_unknown")),
        // The effect happened, its result was lost: "outcome unknown", never run twice.
        ("after_effect", "effect_append", "effects.log", 1, "unknown", Some("outcome_unknown")),
        // The result is durable: nothing runs again.
        ("after_result", "effect_append", "effects.log", 1, "done", None),
        // Idempotent calls are simply run again.
        ("after_intent", "effect_put", "puts.log", 1, "done", None),
        ("after_effect", "effect_put", "puts.log", 2, "done", None),
        ("after_result", "effect_put", "puts.log", 1, "done", None),
    ];
    for (i, &(point, tool, log, runs, status, kind)) in cases.iter().enumerate() {
        let rig = Rig::new(&[tool]).await;
        let session = format!("c2-{i}");
        let out = rig.run(&session, &format!("task T{i}"), Some(point));
        assert!(
            killed(&out),
            "{point}/{tool}: not killed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(rig.integrity(), "ok");
        rig.recover_twice_same();
        let out = rig.finish(&session);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(rig.state(&session), "idle", "{point}/{tool}: {v}");
        assert_eq!(rig.lines(log).len(), runs, "{point}/{tool}: executions");
        let j = rig.journal(&session);
        assert_eq!(j.len(), 1, "{point}/{tool}: {j:?}");
        assert_eq!(j[0].2.as_deref(), Some(status), "{point}/{tool}: {j:?}");
        assert_eq!(j[0].3.as_deref(), kind, "{point}/{tool}: {j:?}");
        if status == "unknown" {
            // D3: the model is told, in the result paired with its call.
            let told: i64 = rig
                .query(|c| {
                    c.query_row(
                        "SELECT COUNT(*) FROM messages WHERE session_id=?1 AND role='tool' AND body LIKE '%outcome unknown, verify before retrying%'",
                        [&session],
                        |r| r.get(0),
                    )
                })
                .unwrap();
            assert_eq!(told, 1, "{point}/{tool}: the model is told the outcome is unknown");
        }
        assert_eq!(rig.integrity(), "ok");
        rig.check_events(&session, 1, &format!("{point}/{tool}"));
        println!("C2 {point:>13} × {tool:<13}: executions {runs}, journal {status}");
    }
}

/// Task understanding: killed between the understanding call and the commit of its
/// transition. The input was durable before the call; after recovery the turn is understood
/// again, its transition committed once, and the input runs exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_understanding_call_and_its_transition_runs_the_input_once() {
    let rig = Rig::new(&["effect_append"]).await;
    let out = rig.run("u", "task U1", Some("after_understanding_call"));
    assert!(killed(&out), "not killed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rig.integrity(), "ok");
    let transitions = |rig: &Rig| -> i64 {
        rig.query(|c| {
            c.query_row("SELECT COUNT(*) FROM task_transitions WHERE session_id='u'", [], |r| {
                r.get(0)
            })
        })
        .unwrap()
    };
    assert_eq!(transitions(&rig), 0, "the kill came before the transition's commit");
    rig.recover_twice_same();
    rig.finish("u");
    assert_eq!(rig.state("u"), "idle");
    assert_eq!(transitions(&rig), 1);
    assert_eq!(rig.lines("effects.log").len(), 1, "the input ran once");
    let (users, inputs, turns): (i64, i64, i64) = rig
        .query(|c| {
            c.query_row(
                "SELECT (SELECT COUNT(*) FROM messages WHERE session_id='u' AND role='user'),
                        (SELECT COUNT(*) FROM inbox WHERE session_id='u'),
                        (SELECT turns FROM sessions WHERE id='u')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
        })
        .unwrap();
    assert_eq!((users, inputs, turns), (1, 1, 1));
    let phase: Option<String> = rig
        .query(|c| {
            c.query_row("SELECT phase_goal FROM session_config WHERE session_id='u'", [], |r| {
                r.get(0)
            })
        })
        .unwrap();
    assert_eq!(phase.as_deref(), Some("task U1"));
    assert_eq!(rig.integrity(), "ok");
    assert_eq!(rig.model.understanding_requests().len(), 2, "the call was made again, once");
    rig.check_events("u", 1, "after_understanding_call");
}

/// A kill between the Orchestrator's call and its commit: the transition and the recall are
/// committed, the selection is not. After recovery the turn's preparation runs again — one
/// more call — and commits once: the skill is loaded once, the input runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_orchestration_call_and_its_commit_prepares_the_turn_once() {
    let rig = Rig::new(&["effect_append"]).await;
    let skill = tempfile::tempdir().unwrap();
    std::fs::write(
        skill.path().join("SKILL.md"),
        "---\nname: csv-audit\ndescription: Audit a CSV file.\n---\nCheck every row.\n",
    )
    .unwrap();
    let out = rig.keel(&["skill", "install", skill.path().to_str().unwrap()], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    rig.model.push_understanding(vec![Reply::understanding(
        "establish_task",
        &["csv audit"],
        &[],
        &[],
    )]);
    let pick = || Reply::selection(&[], &[], &["csv-audit"]);
    rig.model.push_orchestration(vec![pick(), pick()]);
    let out = rig.run("o", "task O1", Some("after_orchestration_call"));
    assert!(killed(&out), "not killed: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rig.integrity(), "ok");
    let counts = |rig: &Rig| -> (i64, i64, i64) {
        rig.query(|c| {
            c.query_row(
                "SELECT (SELECT COUNT(*) FROM task_transitions WHERE session_id='o'),
                        (SELECT COUNT(*) FROM orchestrations WHERE session_id='o' AND done=1),
                        (SELECT COUNT(*) FROM session_capabilities
                            WHERE session_id='o' AND kind='skill')",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
            )
        })
        .unwrap()
    };
    assert_eq!(counts(&rig), (1, 0, 0), "transition and recall committed, the selection not");
    rig.recover_twice_same();
    rig.finish("o");
    assert_eq!(rig.state("o"), "idle");
    assert_eq!(counts(&rig), (1, 1, 1));
    assert_eq!(rig.model.orchestration_requests().len(), 2, "the call was made again, once");
    assert_eq!(rig.lines("effects.log").len(), 1, "the input ran once");
    assert_eq!(rig.integrity(), "ok");
    rig.check_events("o", 1, "after_orchestration_call");
}

/// D2 through a real kill: approved, killed right after the decision; after restart the
/// stored call runs exactly once. And a kill after an approved call's intent: outcome unknown,
/// the approval is spent and is not reused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_survive_kills() {
    for (point, runs, status) in [("after_decision", 1, "done"), ("after_intent", 0, "unknown")] {
        let rig = Rig::new(&["effect_send"]).await;
        let out = rig.run("ap", "send A", None);
        assert_eq!(out.status.code(), Some(4), "waits: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["outcome"], "waiting_approval");
        let unit = v["approvals"][0].as_str().unwrap().to_string();
        // D1: a restart leaves it pending under the same id, nothing executed.
        rig.recover_twice_same();
        let list = rig.keel(&["approvals", "--json"], None);
        let units: Value = serde_json::from_slice(&list.stdout).unwrap();
        assert_eq!(units[0]["id"], unit.as_str());
        assert_eq!(units[0]["input"], r#"{"label":"A-0"}"#);
        assert!(rig.lines("sent.log").is_empty());
        let out = rig.keel(&["approve", &unit, "--json"], Some(point));
        assert!(killed(&out), "{point}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(rig.integrity(), "ok");
        rig.recover_twice_same();
        rig.finish("ap");
        assert_eq!(rig.state("ap"), "idle");
        assert_eq!(rig.lines("sent.log").len(), runs, "{point}");
        let j = rig.journal("ap");
        assert_eq!(j[0].2.as_deref(), Some(status), "{point}: {j:?}");
        let again = rig.keel(&["approve", &unit, "--json"], None);
        assert_eq!(again.status.code(), Some(2), "an approval is used once");
        rig.check_events("ap", 1, point);
        println!("D2 {point:>14}: executions {runs}, journal {status}");
    }
}

/// C5: a crash in the middle of a migration leaves the old schema, and the next start migrates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c5_crash_during_a_migration() {
    let home = tempfile::tempdir().unwrap();
    let db = home.path().join("keel.db");
    {
        let c = keel::store::open_at_version(&db, 2).unwrap();
        c.execute(
            "INSERT INTO sessions (id, created_at, state, loaded_tools, policy, budget, model, system_prompt, meta_version)
             VALUES ('old', 1, 'idle', '[]', '{}', '{}', '{}', 'p', 1)",
            [],
        )
        .unwrap();
    }
    let schema = || {
        let c = Connection::open(&db).unwrap();
        let v: i64 =
            c.query_row("SELECT MAX(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
        let open_steps: i64 = c
            .query_row("SELECT COUNT(*) FROM sqlite_master WHERE name='open_steps'", [], |r| {
                r.get(0)
            })
            .unwrap();
        let active: i64 = c
            .query_row(
                "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name='active_turn'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        let ok: String = c.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
        (v, open_steps, active, ok)
    };
    let out = tokio::task::block_in_place(|| {
        keel_cmd(home.path(), &["session", "list", "--json"], Some("mid_migration"))
            .output()
            .unwrap()
    });
    assert!(killed(&out), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(schema(), (2, 0, 0, "ok".to_string()), "the old schema, not half of the new");
    let out = tokio::task::block_in_place(|| {
        keel_cmd(home.path(), &["session", "list", "--json"], None).output().unwrap()
    });
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(schema(), (keel::store::schema_version(), 1, 1, "ok".to_string()));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["id"], "old", "the data survived the upgrade");
    // Migration 6 moved the session's configuration out of its row.
    let c = Connection::open(&db).unwrap();
    let prompt: String = c
        .query_row("SELECT system_prompt FROM session_config WHERE session_id='old'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(prompt, "p");
    let left: i64 = c
        .query_row(
            "SELECT COUNT(*) FROM pragma_table_info('sessions') WHERE name IN ('system_prompt', 'model', 'session_goal')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(left, 0);
    // Migration 7: the old session has no pins yet (it runs the installed versions until it
    // pins them), and the installed tools' versions are kept.
    let pins: String = c
        .query_row("SELECT tool_pins FROM session_config WHERE session_id='old'", [], |r| r.get(0))
        .unwrap();
    assert_eq!(pins, "{}");
    let versions: i64 =
        c.query_row("SELECT COUNT(*) FROM tool_versions", [], |r| r.get(0)).unwrap();
    assert!(versions > 0);
}

/// Lets `child` run until `deadline`, then kills it (SIGKILL). Returns what was acknowledged
/// (committed) when it ended — read just before the kill — and whether it was killed.
fn kill_at(rig: &Rig, mut child: Child, deadline: Instant) -> (BTreeMap<String, String>, bool) {
    loop {
        if child.try_wait().unwrap().is_some() {
            return (rig.facts(), false);
        }
        if Instant::now() >= deadline {
            let facts = rig.facts();
            child.kill().unwrap();
            child.wait().unwrap();
            return (facts, true);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// C1 (and D3): SIGKILL at random times during a long workload, many times.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c1_random_kills() {
    let iterations: usize =
        std::env::var("KEEL_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(25);
    let (mut rng, seed) = keel_tests::Rng::from_env();
    println!("C1: {iterations} iterations, KEEL_CRASH_SEED={seed}");
    let plan = [
        "effect_append",
        "effect_put",
        "effect_peek",
        "effect_append",
        "effect_append",
        "effect_put",
    ];
    let rig = Rig::new(&plan).await;
    // Calibrate: how long one uninterrupted run takes.
    let started = Instant::now();
    let out = rig.run("rnd", "task warmup", None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let full = started.elapsed();
    let (mut kills, mut lost, mut unknown) = (0usize, 0usize, 0usize);
    for i in 0..iterations {
        let task = format!("task R{i}");
        let child = rig.spawn_run("rnd", &task);
        let at = Duration::from_micros(rng.below(full.as_micros() as u64 * 12 / 10));
        let (facts, killed) = kill_at(&rig, child, Instant::now() + at);
        kills += usize::from(killed);
        assert_eq!(rig.integrity(), "ok", "iteration {i}");
        rig.recover_twice_same();
        let after = rig.facts();
        let missing: Vec<&String> =
            facts.iter().filter(|(k, v)| after.get(*k) != Some(*v)).map(|(k, _)| k).collect();
        lost += missing.len();
        assert!(
            missing.is_empty(),
            "iteration {i}: acknowledged facts lost or changed: {missing:?}"
        );
        // The input may not have been acknowledged before the kill: submit it again then.
        let acknowledged = after.values().any(|v| v == &task);
        if !acknowledged {
            let out = rig.run("rnd", &task, None);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        rig.finish("rnd");
        assert_eq!(rig.state("rnd"), "idle", "iteration {i}");
    }
    // Every non-idempotent call ran at most once, and exactly once when its result says so.
    let mut counts: HashMap<String, usize> = HashMap::new();
    for l in rig.lines("effects.log") {
        *counts.entry(l).or_default() += 1;
    }
    let duplicates = counts.values().filter(|n| **n > 1).count();
    for (tool, label, status, kind) in rig.journal("rnd") {
        if tool != "effect_append" {
            continue;
        }
        let n = counts.get(&label).copied().unwrap_or(0);
        match status.as_deref() {
            Some("done") if kind.is_none() => assert_eq!(n, 1, "{label} done but ran {n} times"),
            Some("unknown") => {
                unknown += 1;
                assert!(n <= 1, "{label}: outcome unknown but ran {n} times");
            }
            _ => assert!(n <= 1, "{label}: ran {n} times"),
        }
    }
    assert_eq!(duplicates, 0, "duplicate executions: {counts:?}");
    assert_eq!(lost, 0);
    rig.check_events("rnd", kills, "C1");
    println!(
        "C1: {kills} kills survived in {iterations} iterations; facts lost 0; duplicate executions 0; \
         outcomes reported unknown {unknown}; integrity ok after every kill; recovery idempotent every time"
    );
}

/// A long task (about 1.5 KB) ending with its tag: a session whose context window is 4,096
/// tokens and whose threshold is 0.6 of it (with the tool schemas and the system message
/// taking about 7.5 KB) compacts at nearly every turn.
fn long_task(tag: &str) -> String {
    format!("{} {tag}", "please keep this context in mind while working on the task ".repeat(25))
}

impl Rig {
    /// Runs `task` in compaction session `session`, created with a small context window.
    fn run_compacting(&self, session: &str, task: &str, crash_at: Option<&str>) -> Output {
        let mut args = self.run_args(session, task);
        if self.session_exists(session) {
            args.drain(4..8);
        } else {
            args.extend(["--context-window", "4096", "--compact-at", "0.6"].map(String::from));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.keel(&args, crash_at)
    }

    /// Runs turns `PREFIX1`… of `session` (at most four) with the process set to hold at crash
    /// point `point` (`KEEL_CRASH_HOLD`, the file `hold` in the home): the first that reaches
    /// it, alive and held there, and the tag its answer will carry (`done PREFIXn`).
    fn held_at(&self, session: &str, prefix: &str, point: &str) -> Option<(Child, String)> {
        let hold = self.home.path().join("hold");
        let reached = self.home.path().join("hold.reached");
        for n in 1..5 {
            let args = self.run_args(session, &long_task(&format!("{prefix}{n}")));
            let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
            args.drain(4..8);
            let mut child = keel_cmd(self.home.path(), &args, Some(point))
                .env("KEEL_CRASH_HOLD", &hold)
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            loop {
                if reached.exists() {
                    return Some((child, format!("done {prefix}{n}")));
                }
                if let Some(status) = child.try_wait().unwrap() {
                    assert!(status.success(), "turn {prefix}{n} failed");
                    break;
                }
                assert!(Instant::now() < deadline, "turn {prefix}{n} hangs");
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        None
    }

    fn spawn_compacting(&self, session: &str, task: &str) -> Child {
        let mut args = self.run_args(session, task);
        args.drain(4..8);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        keel_cmd(self.home.path(), &args, None).spawn().unwrap()
    }

    /// The context is either the old one or the new one, never a mix: no checkpoint is left
    /// pending, the context start is the last promoted checkpoint's end (0 without one), and
    /// every recorded request rebuilds byte for byte from the facts. Returns the promoted
    /// checkpoints.
    async fn check_context(&self, session: &str) -> i64 {
        let (pending, start, promoted_to, promoted): (i64, i64, i64, i64) = self
            .query(|c| {
                c.query_row(
                    "SELECT (SELECT COUNT(*) FROM checkpoints WHERE session_id=?1 AND status='pending'),
                            (SELECT context_start FROM sessions WHERE id=?1),
                            COALESCE((SELECT range_to FROM checkpoints WHERE session_id=?1
                                      AND status='promoted' ORDER BY seq DESC LIMIT 1), 0),
                            (SELECT COUNT(*) FROM checkpoints WHERE session_id=?1 AND status='promoted')",
                    [session],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
                )
            })
            .unwrap();
        assert_eq!(pending, 0, "a checkpoint was left pending after recovery");
        assert_eq!(
            start, promoted_to,
            "the context start is not the last promoted checkpoint's end"
        );
        let steps: i64 = self
            .query(|c| {
                c.query_row("SELECT COUNT(*) FROM evidence WHERE session_id=?1", [session], |r| {
                    r.get(0)
                })
            })
            .unwrap();
        let db = keel::store::Db::open(&self.db()).unwrap();
        let engine = keel::session::SessionEngine::new(db, keel::harness::REACTIONS);
        for step in 1..=steps {
            Assembly::of(&engine)
                .evidence(&SessionId::from(session), Some(step))
                .await
                .unwrap_or_else(|e| panic!("the evidence of step {step} does not rebuild: {e}"));
        }
        promoted
    }
}

/// Compaction: killed after the summary call (nothing of the compaction is durable), after
/// the pending checkpoint's commit (recovery promotes it), and after its promotion. Each time
/// the context is whole — old or new — and the turn finishes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_at_each_point_of_a_compaction_leaves_the_old_or_the_new_context() {
    // (crash point, state at the kill, checkpoints promoted right after recovery)
    for (point, state, promoted) in [
        ("after_summary_call", "compressing", 0),
        ("after_checkpoint", "compressing", 1),
        ("after_promotion", "running", 1),
    ] {
        let rig = Rig::new(&[]).await;
        let out = rig.run_compacting("k", &long_task("K0"), None);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // The turn that first compacts is killed at the point.
        let mut tag = None;
        for n in 1..5 {
            let out = rig.run_compacting("k", &long_task(&format!("K{n}")), Some(point));
            if killed(&out) {
                tag = Some(format!("done K{n}"));
                break;
            }
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        let tag = tag.unwrap_or_else(|| panic!("{point}: no compaction in four turns"));
        assert_eq!(rig.integrity(), "ok");
        assert_eq!(rig.state("k"), state, "{point}");
        rig.recover_twice_same();
        assert_eq!(rig.check_context("k").await, promoted, "{point}");
        rig.finish("k");
        assert_eq!(rig.state("k"), "idle", "{point}");
        assert_eq!(rig.answers("k", &tag), 1, "{point}: the turn answered once");
        assert!(rig.check_context("k").await >= 1, "{point}: compacted in the end");
        assert_eq!(rig.integrity(), "ok");
        rig.check_events("k", 1, point);
        println!("compaction crash at {point:>18}: context whole, turn answered once");
    }
}

/// A runner that dies after another process's startup recovery looked (its lease was live
/// then) is recovered by whichever runner takes its lease over: a turn submitted in a process
/// that opened while the dying runner was alive — as a `keel session send` started then —
/// closes the dead runner's compaction (`compaction_abandoned`) and records the recovery
/// before its own turn runs, and the session ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runner_that_dies_after_startup_recovery_is_recovered_by_the_one_taking_its_lease() {
    let rig = Rig::new(&[]).await;
    let out = rig.run_compacting("t", &long_task("T0"), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (mut child, _) =
        rig.held_at("t", "T", "after_summary_call").expect("no compaction in four turns");
    let hold = rig.home.path().join("hold");
    assert_eq!(rig.state("t"), "compressing");
    // This process opens keel while the compaction's runner is alive: its startup recovery
    // leaves the session to that runner.
    let home = keel::home::Home::at(rig.home.path()).unwrap();
    let guards = keel::agent::LoopGuards::default();
    let h = keel::harness::Harness::open(home, keel_tests::test_limits(), None, guards, &|_| {})
        .await
        .unwrap();
    assert_eq!(rig.state("t"), "compressing", "startup recovery left a live runner's session");
    // Then that runner dies, and a turn is submitted here: it takes the dead runner's lease.
    std::fs::write(&hold, "go").unwrap();
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    assert_eq!(status.signal(), Some(9), "killed at the point");
    let id = SessionId::from("t");
    let cancel = keel::cancel::CancelToken::new();
    h.internals()
        .brain
        .submit(&id, &long_task("T9"), &cancel, &keel_tests::no_events())
        .await
        .unwrap();
    let events = rig.events("t");
    let kinds: Vec<&str> = events.iter().filter_map(|e| e["kind"].as_str()).collect();
    // The dead runner's compaction (the first), closed by the recovery before the turn went
    // on (and compacted again).
    let started = kinds.iter().position(|k| *k == "compaction_started").unwrap();
    let closed = kinds[started + 1..]
        .iter()
        .find(|k| matches!(**k, "compaction_abandoned" | "compacted" | "compaction_started"));
    assert_eq!(closed, Some(&"compaction_abandoned"), "the dead runner's compaction: {kinds:?}");
    let detail = events.iter().any(|e| {
        e["kind"] == "state" && e["detail"].as_str().is_some_and(|d| d.starts_with("recovered"))
    });
    assert!(detail, "the recovery was recorded: {events:?}");
    rig.finish("t");
    assert_eq!(rig.state("t"), "idle");
    rig.check_context("t").await;
    rig.check_session_events("t", "taken over after startup recovery");
    assert_eq!(rig.integrity(), "ok");
}

/// The discard path of recovery: a compaction's process holds at `after_checkpoint` (its
/// pending checkpoint committed) while another process changes the session (an admin unloads
/// one of its tools, so its settings version moves), then dies there. Recovery discards the
/// checkpoint — the context stays the old one — loses no acknowledged fact, and the turn
/// finishes once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_the_session_outran_is_discarded_at_recovery_and_nothing_is_lost() {
    let rig = Rig::new(&[]).await;
    let out = rig.run_compacting("d", &long_task("D0"), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let hold = rig.home.path().join("hold");
    let context = |rig: &Rig| -> (i64, String) {
        rig.query(|c| {
            c.query_row(
                "SELECT context_start, (SELECT group_concat(seq || ':' || status) FROM checkpoints
                 WHERE session_id='d') FROM sessions WHERE id='d'",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        })
        .unwrap()
    };
    let (mut child, tag) =
        rig.held_at("d", "D", "after_checkpoint").expect("no compaction in four turns");
    let (start, checkpoints) = context(&rig);
    assert!(checkpoints.ends_with(":pending"), "{checkpoints}");
    // Another process changes the session while the compaction's process is alive (its lease
    // is live, so this process's startup recovery leaves the session alone) ...
    let out = rig.keel(&["session", "unload", "--tool", "effect_peek", "d", "--json"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(context(&rig), (start, checkpoints.clone()), "nobody touched the checkpoint");
    // ... then the compaction's process dies before promoting its checkpoint.
    let facts = rig.facts();
    std::fs::write(&hold, "go").unwrap();
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    assert_eq!(status.signal(), Some(9), "killed at the point");
    rig.recover_twice_same();
    let (after, checkpoints) = context(&rig);
    assert_eq!(after, start, "the context stays the old one");
    assert!(checkpoints.ends_with(":discarded"), "{checkpoints}");
    let reason: String = rig
        .query(|c| {
            c.query_row(
                "SELECT error FROM checkpoints WHERE session_id='d' ORDER BY seq DESC LIMIT 1",
                [],
                |r| r.get(0),
            )
        })
        .unwrap();
    assert!(reason.contains("settings changed"), "{reason}");
    let now = rig.facts();
    let lost: Vec<&String> =
        facts.iter().filter(|(k, v)| now.get(*k) != Some(*v)).map(|(k, _)| k).collect();
    assert!(lost.is_empty(), "acknowledged facts lost or changed: {lost:?}");
    rig.check_context("d").await;
    rig.finish("d");
    assert_eq!(rig.state("d"), "idle");
    assert_eq!(rig.answers("d", &tag), 1, "the turn answered once");
    rig.check_context("d").await;
    rig.check_events("d", 1, "discarded checkpoint");
    assert_eq!(rig.integrity(), "ok");
    println!("checkpoint discarded at recovery ({reason}); context kept, nothing lost");
}

/// SIGKILL at random times while a session compacts at nearly every turn, until at least
/// `KEEL_CRASH_COMPACTIONS` (default 50) compactions were promoted: after every kill the
/// context is old or new (never a mix), no acknowledged fact is lost, and integrity holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_kills_during_compactions_leave_the_old_or_the_new_context() {
    let target: i64 =
        std::env::var("KEEL_CRASH_COMPACTIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let (mut rng, seed) = keel_tests::Rng::from_env();
    println!("compaction kills: until {target} compactions, KEEL_CRASH_SEED={seed}");
    let rig = Rig::new(&[]).await;
    let started = Instant::now();
    let out = rig.run_compacting("rc", &long_task("W0"), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = rig.run_compacting("rc", &long_task("W1"), None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let full = started.elapsed() / 2;
    let (mut kills, mut i, mut promoted) = (0usize, 0usize, 0i64);
    while promoted < target {
        assert!(i < target as usize * 4, "{promoted} compactions after {i} turns");
        let task = long_task(&format!("R{i}"));
        let child = rig.spawn_compacting("rc", &task);
        let at = Duration::from_micros(rng.below(full.as_micros() as u64 * 12 / 10));
        let (facts, killed) = kill_at(&rig, child, Instant::now() + at);
        kills += usize::from(killed);
        assert_eq!(rig.integrity(), "ok", "turn {i}");
        rig.recover_twice_same();
        rig.check_context("rc").await;
        let after = rig.facts();
        let missing: Vec<&String> =
            facts.iter().filter(|(k, v)| after.get(*k) != Some(*v)).map(|(k, _)| k).collect();
        assert!(missing.is_empty(), "turn {i}: acknowledged facts lost or changed: {missing:?}");
        if !after.values().any(|v| v == &task) {
            let out = rig.run_compacting("rc", &task, None);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        }
        rig.finish("rc");
        assert_eq!(rig.state("rc"), "idle", "turn {i}");
        promoted = rig.check_context("rc").await;
        i += 1;
    }
    assert_eq!(rig.integrity(), "ok");
    rig.check_events("rc", kills, "random kills during compactions");
    println!(
        "compaction kills: {kills} kills in {i} turns, {promoted} compactions promoted; the context was \
         old or new after every kill, integrity ok, no acknowledged fact lost"
    );
}

/// A delegation killed at each of its steps — after the spawn's commit, mid-child (after the
/// child's non-idempotent effect ran, before its result was committed), after the child's
/// answer, before the parent takes the child's event — then recovered: every event between
/// the sessions is delivered once and taken once, no child is created or run twice, the
/// effect ran once, and the main session answers with both children's results.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delegation_killed_at_each_step_delivers_every_event_exactly_once() {
    for point in ["after_spawn", "after_effect", "after_child_answer", "before_parent_consumes"] {
        let model = MockModel::start_fn(workgroup_responder(Duration::ZERO).responder).await;
        let rig = Rig::with_model(model);
        let task = spawn_task(
            "MAIN",
            &[("append", "CHILD A effect:effect_append", &[]), ("plain", "CHILD B", &[])],
        );
        let grant = format!("{}=/work:rw", rig.work.path().display());
        let args = [
            "run",
            &task,
            "--main",
            "--new-session",
            "main",
            "--grant",
            &grant,
            "--model-url",
            &rig.url,
            "--model",
            "m",
            "--json",
        ];
        let out = rig.keel(&args, Some(point));
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{point}: not killed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        rig.recover_twice_same();
        let out = rig.keel(&["recover", "--json"], None);
        assert!(out.status.success(), "{point}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(rig.integrity(), "ok", "{point}");
        let (children, events, unconsumed, answer): (i64, Vec<(String, i64)>, i64, String) = rig
            .query(|c| {
                let children = c.query_row("SELECT COUNT(*) FROM subsessions WHERE main_id='main'", [], |r| r.get(0))?;
                let events = c
                    .prepare("SELECT e.id, (SELECT COUNT(*) FROM inbox i WHERE i.event_id = e.id) FROM workgroup_events e")?
                    .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                    .collect::<Result<_, _>>()?;
                let unconsumed = c.query_row("SELECT COUNT(*) FROM inbox WHERE consumed_at IS NULL", [], |r| r.get(0))?;
                let body: String = c.query_row(
                    "SELECT body FROM messages WHERE session_id='main' AND role='assistant' ORDER BY seq DESC LIMIT 1",
                    [],
                    |r| r.get(0),
                )?;
                Ok((children, events, unconsumed, body))
            })
            .unwrap();
        assert_eq!(children, 2, "{point}: a child was created twice");
        assert_eq!(events.len(), 4, "{point}: two requests and two terminal events: {events:?}");
        for (id, n) in &events {
            assert_eq!(*n, 1, "{point}: event {id} is in {n} inbox rows");
        }
        assert_eq!(unconsumed, 0, "{point}: an event was never taken");
        assert!(answer.contains("coordinator done: "), "{point}: {answer}");
        assert!(answer.contains("answer B"), "{point}: {answer}");
        // The non-idempotent effect ran once; killed after it ran, its outcome is unknown and
        // the child answers without running it again.
        // The non-idempotent effect ran at most once. A kill between its intent and its result
        // (at after_effect; or, at another point, while the child's call was running) leaves
        // it `unknown`, and it is not run again; a recorded result means it ran exactly once.
        let lines = log_lines(rig.work.path(), "effects.log");
        let status: String = rig
            .query(|c| {
                c.query_row("SELECT status FROM tool_calls WHERE tool='effect_append'", [], |r| {
                    r.get(0)
                })
            })
            .unwrap();
        match status.as_str() {
            "done" => assert_eq!(lines, vec!["A"], "{point}"),
            "unknown" => assert!(lines.len() <= 1, "{point}: ran {} times", lines.len()),
            other => panic!("{point}: the effect's call ended `{other}`"),
        }
        if point == "after_effect" {
            assert_eq!((status.as_str(), lines), ("unknown", vec!["A".to_string()]), "{point}");
        }
        if point != "after_effect" {
            assert!(answer.contains("answer A"), "{point}: {answer}");
        }
        // Every session of the workgroup: each fact has exactly its events.
        let sessions: Vec<String> = rig
            .query(|c| c.prepare("SELECT id FROM sessions")?.query_map([], |r| r.get(0))?.collect())
            .unwrap();
        for s in &sessions {
            rig.check_session_events(s, &format!("{point}/{s}"));
        }
        let ids: Vec<&str> = sessions.iter().map(String::as_str).collect();
        rig.check_announced(&ids, 1, point);
    }
}
