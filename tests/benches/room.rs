//! What keel adds to every request, and what a local server's prompt cache keeps of it.
//!
//! 1. keel's fixed part: a new session with every installed tool (the default), keel's
//!    default instructions, at several context windows — the tools loaded, the tool schemas
//!    (full or compact), and the fixed part's share of the window.
//! 2. Prompt re-evaluated: a session of scripted turns (a plan made and updated, a call per
//!    turn, compactions in a 4,096-token window) against a loopback server. Each request is
//!    rendered as a ChatML chat template renders it (the first system message, then the tool
//!    schemas, then the other messages), and the part after the longest prefix it shares with
//!    the previous request is what a server with a prompt cache evaluates again. Printed for
//!    the notes in a second system message (the default) and in the first (`notes_message`
//!    off), with their ratio. Summary calls are left out (their prompt is a different one).
//!
//! `cargo bench -p keel-tests --bench room`. `KEEL_BENCH_TURNS` sets the turns of part 2
//! (default 24). Asserts nothing about time.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use keel::views::Views;
use std::sync::Arc;

use keel::caller::Caller;
use keel::ids::SessionId;
use keel::sandbox::CancelToken;
use keel_tests::mock_model::{MockModel, Reply, Responder};
use serde_json::Value;

#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

/// A request as a ChatML template (Qwen's, SmolLM's) renders it: the first system message and
/// the tool schemas in the system block, then every other message in its own block.
fn render(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).unwrap();
    let msgs = v["messages"].as_array().unwrap();
    let mut out = String::from("<|im_start|>system\n");
    out.push_str(msgs[0]["content"].as_str().unwrap_or(""));
    if let Some(tools) = v["tools"].as_array() {
        out.push_str("\n\n# Tools\n<tools>");
        for t in tools {
            out.push('\n');
            out.push_str(&t["function"].to_string());
        }
        out.push_str("\n</tools>");
    }
    out.push_str("<|im_end|>\n");
    for m in &msgs[1..] {
        let role = m["role"].as_str().unwrap_or("user");
        out.push_str(&format!("<|im_start|>{role}\n"));
        out.push_str(m["content"].as_str().unwrap_or(""));
        for c in m["tool_calls"].as_array().into_iter().flatten() {
            out.push_str(&format!("<tool_call>{}</tool_call>", c["function"]));
        }
        out.push_str("<|im_end|>\n");
    }
    out
}

fn shared_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

/// Turn `k` of the scripted session: a plan at the first turn of every fourth, an update in
/// the others, then one call, then an answer — decided from the request alone.
fn responder() -> Responder {
    Arc::new(|body: &[u8]| {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let user = msgs.iter().rposition(|m| m["role"] == "user").unwrap_or(0);
        let text = msgs[user]["content"].as_str().unwrap_or("");
        let k: usize = text.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        let results = msgs[user..].iter().filter(|m| m["role"] == "tool").count();
        let id = format!("c{k}-{results}");
        match results {
            0 if k.is_multiple_of(4) => Reply::calls(&[(
                &id,
                "plan_create",
                r#"{"steps":["read the part","compare it","note the changes"]}"#,
            )]),
            0 => Reply::calls(&[(
                &id,
                "plan_update",
                &format!(r#"{{"step":{},"status":"done"}}"#, k % 4),
            )]),
            1 => Reply::calls(&[(&id, "fs_list_dir", r#"{"path":"/work"}"#)]),
            _ => Reply::text(&format!("turn {k}: {}", "the part changed as expected; ".repeat(8))),
        }
    })
}

/// A harness on a fresh home in `dir`, its sessions' model at `url`.
async fn harness(dir: &std::path::Path, url: &str) -> keel::harness::Harness {
    let guards = keel::agent::LoopGuards::default();
    keel_tests::harness_with_session(dir, url, "unused", &[], Vec::new(), guards).await
}

async fn fixed_parts(h: &keel::harness::Harness, url: &str) {
    println!("keel's fixed part of a new session with every installed tool, default instructions:");
    println!(
        "{:>8} {:>6} {:>14} {:>8} {:>12} {:>10}",
        "window", "tools", "schemas bytes", "form", "fixed bytes", "of window"
    );
    for window in [None, Some(2048u64), Some(4096), Some(8192), Some(32768)] {
        let id = format!("fixed-{}", window.unwrap_or(0));
        let mut spec = keel_tests::session_spec(url, &id, Vec::new(), None);
        spec.model.context_window = window;
        spec.system_prompt = keel::harness::DEFAULT_SYSTEM_PROMPT.into();
        h.create_session(&Caller::Operator, spec).await.unwrap();
        let room = h.room(&Caller::Operator, &id).await.unwrap();
        let tools =
            h.session(&Caller::Operator, &id).await.unwrap().capabilities.loaded_tools.len();
        let p = room.parts;
        let share = window.map_or("-".to_string(), |w| {
            format!("{:.0} %", p.fixed as f64 / keel::assembly::BYTES_PER_TOKEN / w as f64 * 100.0)
        });
        println!(
            "{:>8} {tools:>6} {:>14} {:>8} {:>12} {share:>10}",
            window.map_or("none".to_string(), |w| w.to_string()),
            p.tool_schemas,
            serde_json::to_value(p.schemas).unwrap().as_str().unwrap().to_string(),
            p.fixed,
        );
    }
}

/// Bytes rendered and re-evaluated over the session's requests, and the requests.
async fn reevaluated(notes_message: bool, turns: usize) -> (usize, usize, usize, usize) {
    let model = MockModel::start_fn_with_context(responder(), 4096 * 4).await;
    let dir = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("part.txt"), "a part of the report\n".repeat(20)).unwrap();
    let h = harness(dir.path(), &model.url()).await;
    let mut spec = keel_tests::session_spec(
        &model.url(),
        "s",
        vec![keel::sandbox::Grant::new(work.path(), "/work", keel::sandbox::Access::Ro).unwrap()],
        Some(vec!["fs_list_dir".into()]),
    );
    spec.model.context_window = Some(4096);
    spec.model.notes_message = notes_message;
    spec.system_prompt = keel::harness::DEFAULT_SYSTEM_PROMPT.into();
    spec.preprocess = None;
    h.create_session(&Caller::Operator, spec).await.unwrap();
    let cancel = CancelToken::new();
    for k in 0..turns {
        let task =
            format!("turn {k} read the next part of the report and compare it with the last");
        let out = h
            .internals()
            .brain
            .submit(&SessionId::from("s"), &task, &cancel, &keel_tests::no_events())
            .await
            .unwrap();
        assert!(
            matches!(out, keel::brain::Submitted::Ran(keel::agent::TurnOutcome::Answer(_))),
            "{out:?}"
        );
    }
    let t = Views::of(h.internals().engine).timeline(&SessionId::from("s")).await.unwrap();
    let mut previous = String::new();
    let (mut rendered, mut again) = (0, 0);
    let requests = model.requests();
    for body in &requests {
        let r = render(body);
        rendered += r.len();
        again += r.len() - shared_prefix(&previous, &r);
        previous = r;
    }
    (rendered, again, requests.len(), t.checkpoints.len())
}

fn main() {
    let turns: usize =
        std::env::var("KEEL_BENCH_TURNS").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async move {
        let model = MockModel::start(Vec::new()).await;
        let dir = tempfile::tempdir().unwrap();
        let h = harness(dir.path(), &model.url()).await;
        fixed_parts(&h, &model.url()).await;
        println!(
            "\nprompt re-evaluated by a server with a prompt cache, ChatML rendering, {turns} turns, 4,096-token window:"
        );
        let per_token = keel::assembly::BYTES_PER_TOKEN;
        let mut results = Vec::new();
        for (name, notes) in [("notes in a second system message", true), ("one system message", false)]
        {
            let (rendered, again, requests, compactions) = reevaluated(notes, turns).await;
            println!(
                "  {name:<34} {requests} requests, {compactions} compactions: {:.0} tokens rendered, {:.0} re-evaluated ({:.0} a request, {:.0} %)",
                rendered as f64 / per_token,
                again as f64 / per_token,
                again as f64 / per_token / requests.max(1) as f64,
                again as f64 / rendered.max(1) as f64 * 100.0
            );
            results.push(again);
        }
        println!(
            "  re-evaluated with the notes apart, against one system message: {:.2}×",
            results[0] as f64 / results[1].max(1) as f64
        );
    });
}
