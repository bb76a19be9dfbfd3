//! How `keel session show` prints a timeline's parts: checkpoints, capabilities, the plan,
//! task transitions and model calls; and `keel session calls`, a session's tool calls with
//! what their tools logged.

use super::*;

/// A checkpoint's mark in `keel session show`, before the first message it summarizes.
pub(super) fn print_checkpoint(
    cp: &keel::protocol::sessions::CheckpointRecord,
    context_start: i64,
) {
    use keel::protocol::sessions::CheckpointStatus;
    let current = cp.status == CheckpointStatus::Promoted && cp.to == context_start;
    println!(
        "\n── checkpoint {} ({}{}, {}): messages {}–{} {} ──",
        cp.seq,
        cp.status,
        if current { ", current" } else { "" },
        cp.trigger,
        cp.from,
        cp.to,
        match cp.status {
            CheckpointStatus::Promoted => "summarized; requests hold the summary instead",
            CheckpointStatus::Pending => "summarized, not promoted yet",
            CheckpointStatus::Discarded | CheckpointStatus::Failed => "unchanged",
        }
    );
    if let Some(e) = &cp.error {
        println!("   {}", inert(e));
    }
    if let Some(s) = cp.summary.as_ref().filter(|_| current) {
        for line in s.render(cp.to).trim().lines().skip(1) {
            println!("   {}", inert(line));
        }
    }
    println!(
        "   summary call: {} bytes, {} attempt(s), {:.1} s (keel session evidence --compaction {})",
        cp.request_bytes,
        cp.attempts,
        cp.duration_ms / 1e3,
        cp.seq
    );
}

/// How each capability arrived, and each turn's orchestration, in `keel session show`.
pub(super) fn print_capabilities(t: &keel::protocol::sessions::Timeline) {
    use keel::protocol::sessions::{CapabilityKind as Kind, Via};
    let skills: Vec<_> = t.capabilities.iter().filter(|c| c.kind == Kind::Skill).collect();
    let arrived: Vec<_> = t
        .capabilities
        .iter()
        .filter(|c| c.kind == Kind::Skill || !matches!(c.via, Via::Default | Via::Flag))
        .collect();
    if !skills.is_empty() {
        let names: Vec<String> = skills.iter().map(|s| inert(&s.name)).collect();
        println!(
            "
skills  {}",
            names.join(", ")
        );
    }
    if !arrived.is_empty() {
        println!(
            "
capabilities added while the session ran:"
        );
        for c in arrived {
            let turn = c.turn.map(|t| format!(" in turn {t}")).unwrap_or_default();
            println!("  {} {} via {}{turn}", c.kind, inert(&c.name), c.via);
        }
    }
    if t.orchestrations.is_empty() {
        return;
    }
    println!(
        "
capability preparation (the Orchestrator's request: keel session evidence {} --orchestration TURN):",
        t.id
    );
    for o in &t.orchestrations {
        let c = &o.candidates;
        println!(
            "  turn {} {}: recalled {} skill(s), {} tool set(s), {} tool(s), {} memory(ies){}",
            o.turn,
            o.mode,
            c.skills.len(),
            c.toolsets.len(),
            c.tools.len(),
            o.memories.len(),
            o.recall_ms.map(|ms| format!(" in {ms:.1} ms")).unwrap_or_default()
        );
        if let Some(e) = &o.recall_error {
            println!("    recall failed in part: {}", inert(e));
        }
        match (&o.selected, &o.error) {
            (_, Some(e)) => println!("    orchestration failed, nothing added: {}", inert(e)),
            (Some(s), None) => {
                let all: Vec<String> = s
                    .toolsets
                    .iter()
                    .map(|n| format!("tool set {n}"))
                    .chain(s.tools.iter().map(|n| format!("tool {n}")))
                    .chain(s.skills.iter().map(|n| format!("skill {n}")))
                    .collect();
                let chose =
                    if all.is_empty() { "nothing".to_string() } else { inert(&all.join(", ")) };
                let ms =
                    o.duration_ms.map(|ms| format!(" ({:.1} s)", ms / 1e3)).unwrap_or_default();
                println!("    the Orchestrator chose {chose}{ms}");
            }
            (None, None) if o.done => println!("    nothing to choose from: no call"),
            (None, None) => println!("    unfinished (it is made again when the turn resumes)"),
        }
        if !o.dropped.is_empty() {
            println!("    dropped (not candidates): {}", inert(&o.dropped.join(", ")));
        }
    }
}

/// The plan of the current phase in `keel session show`, and how many versions plans had.
pub(super) fn print_plan(t: &keel::protocol::sessions::Timeline) {
    if let Some(steps) = &t.plan {
        println!("\nplan of the current phase:");
        for (i, s) in steps.iter().enumerate() {
            let note = s.note.as_deref().map(|n| format!(" — {}", inert(n))).unwrap_or_default();
            println!("  {}. [{}] {}{note}", i + 1, s.status, inert(&s.text));
        }
    }
    if let Some(last) = t.plan_history.last() {
        let closed = t.plan_history.iter().filter(|v| v.closed).count();
        println!(
            "plan history: {} version(s), last v{} ({}); {closed} phase(s) completed",
            t.plan_history.len(),
            last.version,
            last.change.kind()
        );
    }
}

/// The task transitions of `keel session show`: per turn, what the understanding call
/// answered and what the fixed table did.
pub(super) fn print_transitions(t: &keel::protocol::sessions::Timeline) {
    if t.transitions.is_empty() {
        return;
    }
    println!(
        "\ntask transitions (the understanding call's request: keel session evidence {} --understanding TURN):",
        t.id
    );
    for tr in &t.transitions {
        let relation = tr.relation.map(|r| r.as_str()).unwrap_or("not asked");
        let call = tr.duration_ms.map(|ms| format!(" ({:.1} s)", ms / 1e3)).unwrap_or_default();
        println!(
            "  turn {} {} {relation} → {}{call}{}",
            tr.turn,
            keel::protocol::text::format_time(tr.at_ms),
            tr.mode,
            tr.error
                .as_deref()
                .map(|e| format!("\n    uncertain because {}", inert(e)))
                .unwrap_or_default()
        );
        let terms =
            [("skill", &tr.terms.skill), ("tool", &tr.terms.tool), ("memory", &tr.terms.memory)];
        for (group, list) in terms {
            if !list.is_empty() {
                let list: Vec<String> = list.iter().map(|x| inert(x)).collect();
                println!("    {group} terms: {}", list.join(", "));
            }
        }
    }
}

/// The model calls of `keel session show`: tokens per step and per turn, the requests that
/// were refused, and the estimate of the next request.
pub(super) fn print_model_calls(t: &keel::protocol::sessions::Timeline) {
    if !t.model_calls.is_empty() {
        println!("\nmodel calls:");
        let mut turns: Vec<i64> = t.model_calls.iter().filter_map(|c| c.turn).collect();
        turns.dedup();
        for c in &t.model_calls {
            let tokens = match c.call.usage {
                Some(u) => format!(
                    "{} + {} tokens{}",
                    u.prompt_tokens,
                    u.completion_tokens,
                    u.cached_tokens.map(|n| format!(" ({n} cached)")).unwrap_or_default()
                ),
                None => "tokens not reported".into(),
            };
            let bytes = c.request_bytes.map(|b| format!(", request {b} bytes")).unwrap_or_default();
            let finish = c
                .call
                .finish_reason
                .as_deref()
                .map(|f| format!(", finish {}", inert(f)))
                .unwrap_or_default();
            let warn = if c.call.finish_reason.as_deref() == Some("length") {
                "  ⚠ cut by the token limit"
            } else {
                ""
            };
            println!(
                "  step {} turn {}: {tokens}{bytes}, {:.1} s{finish}{warn}",
                c.step,
                c.turn.map(|t| t.to_string()).unwrap_or_else(|| "-".into()),
                c.call.duration_ms / 1e3
            );
        }
        for turn in turns {
            let sum = keel::protocol::sessions::TurnUsage::of(&t.model_calls, turn);
            println!("  turn {turn}: {}", sum.describe());
        }
    }
    if !t.refused_requests.is_empty() {
        println!("\nrefused requests (keel session evidence {} --refused N):", t.id);
        for r in &t.refused_requests {
            println!(
                "  #{} turn {} step {}: {} after {} attempt(s), request {} bytes: {}",
                r.seq,
                r.turn,
                r.step,
                r.http_status.map(|s| format!("HTTP {s}")).unwrap_or_else(|| "no reply".into()),
                r.attempts,
                r.request_bytes,
                inert(&r.error)
            );
        }
    }
    let e = &t.next_request;
    println!(
        "\nnext request ≈ {} tokens ({} bytes at {:.2} bytes/token, {})",
        e.tokens,
        e.bytes,
        e.bytes_per_token,
        if e.calibrated { "calibrated by the last reported usage" } else { "not yet calibrated" }
    );
    if let Some(room) = &t.room {
        println!("room: {}", room.describe());
    }
}

/// What a session runs under, in `keel session show`: its model, policy, budget and guards.
pub(super) fn print_settings(t: &keel::protocol::sessions::Timeline) {
    println!("model   {}", inert(&t.model.summary(true)));
    println!("policy  {}", inert(&t.policy.summary()));
    for c in &t.settings_changes {
        println!(
            "        {} {} changed by {}: {}",
            keel::protocol::text::format_time(c.at_ms).get(..19).unwrap_or_default(),
            c.setting,
            inert(&c.by),
            inert(&c.change)
        );
    }
    for p in &t.project_instructions {
        println!(
            "project {} (sha256:{}, {} bytes{}): offered as the project's instructions",
            inert(&p.file),
            &p.sha256[..p.sha256.len().min(12)],
            p.bytes,
            if p.cut { ", cut at 16 KiB" } else { "" }
        );
    }
    println!("budget  per call: {}", t.budget.summary());
    if let Some(g) = &t.guards {
        println!("guards  {} model calls a turn at most", g.max_steps);
    }
}

#[derive(Args)]
pub struct CallsArgs {
    /// Session id.
    id: String,
    /// Also what each tool wrote to its log, stderr and stdout.
    #[arg(long)]
    logs: bool,
    /// Print JSON (each call with its `logs`, when it has any).
    #[arg(long)]
    pub json: bool,
}

/// `keel session calls`: one line per call, then (with --logs) what its tool wrote.
pub(super) async fn calls(h: &keel::protocol::setup::Harness, a: CallsArgs) -> ExitCode {
    let t = match h.timeline(&Caller::Operator, &a.id).await {
        Ok(t) => t,
        Err(e) => return super::super::api_fail(a.json, &e),
    };
    let logs_of = |c: &keel::protocol::sessions::TimelineCall| -> Option<serde_json::Value> {
        c.entry.logs.as_deref().and_then(|l| serde_json::from_str(l).ok())
    };
    if a.json {
        let calls: Vec<serde_json::Value> = t
            .tool_calls
            .iter()
            .map(|c| {
                let mut v = json!(c);
                if let Some(l) = logs_of(c) {
                    v["logs"] = l;
                }
                v
            })
            .collect();
        println!("{}", json!({"ok": true, "session_id": t.id, "calls": calls}));
        return ExitCode::SUCCESS;
    }
    if t.tool_calls.is_empty() {
        println!("session {} has made no tool call", t.id);
    }
    for c in &t.tool_calls {
        let e = &c.entry;
        let effect = e.effect.map_or("-".to_string(), |x| x.to_string());
        let outcome = match (&e.error_kind, e.status) {
            (Some(kind), _) => format!("failed ({kind})"),
            (None, status) => status.to_string(),
        };
        let ms = e.duration_ms.map_or("-".to_string(), |m| format!("{m:.1} ms"));
        let logged = if !a.logs && e.logs.is_some() { "  (logs: --logs)" } else { "" };
        println!(
            "step {:<4} {:<22} {:<16} {:<22} {ms}{logged}",
            c.step,
            inert(&e.tool),
            effect,
            outcome
        );
        let Some(l) = logs_of(c).filter(|_| a.logs) else { continue };
        super::super::events::print_logs(&l);
    }
    ExitCode::SUCCESS
}
