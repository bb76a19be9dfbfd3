//! `keel run "TASK"`: create or continue a session and run its turn.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Args;
use keel::agent::{Event, Events, LoopGuards, TurnOutcome};
use keel::api::{Caller, SessionSpec};
use keel::brain::Submitted;
use keel::harness::{DEFAULT_SYSTEM_PROMPT, Harness, ModelFlags, model_config};
use keel::home::Home;
use keel::model::ModelClient;
use keel::sandbox::{CancelToken, Grant, SandboxLimits};
use keel::session::TurnUsage;
use serde_json::json;

pub use super::fail;
use super::{BudgetArgs, EXIT_REFUSED, EXIT_SETUP, EXIT_TOOL_ERROR, inert_block};

/// Exit code of an interrupted turn.
pub const EXIT_INTERRUPTED: u8 = 130;
/// Exit code of a turn that stopped to wait for an approval.
pub const EXIT_WAITING: u8 = 4;

#[derive(Args)]
pub struct RunArgs {
    /// The task, in plain words.
    task: String,
    #[command(flatten)]
    session: SessionArgs,
    /// Print one JSON object instead of the answer.
    #[arg(long)]
    json: bool,
}

/// The session a command runs turns in: one to continue, or the settings of a new one.
#[derive(Args)]
pub struct SessionArgs {
    /// Session id to create or continue (default: a new session with a generated id).
    #[arg(long)]
    session: Option<String>,
    /// Grant a host directory to the session: HOST_DIR[=GUEST_PATH][:ro|:rw]. Repeatable.
    #[arg(long = "grant", value_name = "HOST_DIR[=GUEST][:ro|:rw]")]
    grants: Vec<Grant>,
    #[command(flatten)]
    net: super::NetArgs,
    /// Tools to load, comma-separated (default: every installed tool).
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Deny a tool or an effect class (read-only, workspace-write, external, destructive).
    /// Repeatable.
    #[arg(long = "deny", value_name = "TOOL|EFFECT")]
    deny: Vec<String>,
    /// Ask for approval before every call of a tool or effect class (default: destructive
    /// and external). Repeatable.
    #[arg(long = "ask", value_name = "TOOL|EFFECT")]
    ask: Vec<String>,
    /// Run a tool or effect class without asking (overrides the default asks). Repeatable.
    #[arg(long = "allow", value_name = "TOOL|EFFECT")]
    allow: Vec<String>,
    /// Model server base URL, the part before /chat/completions (env KEEL_MODEL_URL).
    #[arg(long)]
    model_url: Option<String>,
    /// Model name (env KEEL_MODEL).
    #[arg(long)]
    model: Option<String>,
    /// Sampling temperature sent with every model call of a new session (env
    /// KEEL_TEMPERATURE; default: the server's).
    #[arg(long, value_name = "T")]
    temperature: Option<f64>,
    /// Most tokens per model reply for a new session (env KEEL_MAX_TOKENS; default: the
    /// server's).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_tokens: Option<u32>,
    /// Longest wait without progress in a model call of a new session — until the reply
    /// begins, then between its parts (a slow reply that keeps coming is never cut), e.g. 120s
    /// or 5m (env KEEL_MODEL_TIMEOUT; default 120s).
    #[arg(long, value_name = "DURATION", value_parser = keel::units::parse_duration)]
    model_timeout: Option<std::time::Duration>,
    /// The model's context window in tokens, stored with a new session: a request estimated
    /// past --compact-at of it is preceded by a compaction (env KEEL_CONTEXT_WINDOW; default:
    /// `[model] context_window`, else none — compaction only on demand or when the server
    /// refuses a request as too long).
    #[arg(long, value_name = "TOKENS", value_parser = clap::value_parser!(u64).range(512..))]
    context_window: Option<u64>,
    /// The fraction of the context window a request may fill before the session is compacted
    /// (env KEEL_COMPACT_AT; default 0.8).
    #[arg(long, value_name = "FRACTION")]
    compact_at: Option<f64>,
    /// Redact matches of this regular expression in tool results before the model, the
    /// history, the journal or a summary sees them (a new session's policy). Repeatable.
    #[arg(long = "redact", value_name = "REGEX")]
    redact: Vec<String>,
    #[command(flatten)]
    budget: BudgetArgs,
    /// Model calls per turn at most (1 or more) of a new session, stored with it: `session
    /// send`, `approve` and `recover` run its turns with the same limit (default 24).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    max_steps: Option<u32>,
    /// Do not make the task-understanding call of each input for a new session (stored with
    /// it): the first input sets the goals and they stay; a change of task is not noticed,
    /// and no skills, tools or memories are recalled and orchestrated.
    #[arg(long)]
    no_preprocess: bool,
    /// The user a new session works for, stored with it: their long-term memory is recalled
    /// and written (env KEEL_USER; default: the operating-system user).
    #[arg(long, value_name = "NAME", env = "KEEL_USER")]
    user: Option<String>,
    /// Model of the task-understanding call of a new session (env KEEL_PREPROCESS_MODEL;
    /// default: `[model.preprocess] model` in keel.toml, else the session's model).
    #[arg(long, value_name = "NAME", conflicts_with = "no_preprocess")]
    preprocess_model: Option<String>,
    #[command(flatten)]
    workgroup: WorkgroupArgs,
}

/// A main session and the limits of its workgroup.
#[derive(Args)]
pub struct WorkgroupArgs {
    /// Start a main session: it coordinates and routes (no task understanding of its own) and
    /// hands work to sub-sessions with session_spawn; each sub-session understands its own task
    /// and runs under its own runner. The command returns when no session of the workgroup
    /// has work left.
    #[arg(long)]
    main: bool,
    /// Live sub-sessions of one session, at most (finished ones do not count; default 8).
    #[arg(long, value_name = "N", requires = "main", value_parser = clap::value_parser!(u32).range(1..=256))]
    max_children: Option<u32>,
    /// How deep delegation goes: the main session is 0, its children 1 (default 2).
    #[arg(long, value_name = "N", requires = "main", value_parser = clap::value_parser!(u32).range(1..=8))]
    max_depth: Option<u32>,
    /// How long one request of a sub-session may take before it is stopped, e.g. 10m
    /// (default 30m).
    #[arg(long, value_name = "DURATION", requires = "main", value_parser = keel::units::parse_duration)]
    child_deadline: Option<std::time::Duration>,
    /// After how long a parent is told that a sub-session is still working (and again after
    /// each such period), e.g. 5m; 0s: never (default 10m).
    #[arg(long, value_name = "DURATION", requires = "main", value_parser = keel::units::parse_duration)]
    wait_notice: Option<std::time::Duration>,
    /// Model steps of the whole workgroup, at most (default: no limit).
    #[arg(long, value_name = "N", requires = "main", value_parser = clap::value_parser!(i64).range(1..))]
    workgroup_max_steps: Option<i64>,
    /// Tokens of the whole workgroup, as the server reports them, at most (default: no limit).
    #[arg(long, value_name = "N", requires = "main", value_parser = clap::value_parser!(i64).range(1..))]
    workgroup_max_tokens: Option<i64>,
}

impl WorkgroupArgs {
    /// The limits of a new main session (`None`: not a main session).
    pub fn limits(&self) -> Option<keel::session::workgroup::Limits> {
        if !self.main {
            return None;
        }
        let d = keel::session::workgroup::Limits::default();
        Some(keel::session::workgroup::Limits {
            max_live_children: self.max_children.unwrap_or(d.max_live_children),
            max_depth: self.max_depth.unwrap_or(d.max_depth),
            child_deadline_secs: self
                .child_deadline
                .map_or(d.child_deadline_secs, |t| t.as_secs().max(1)),
            wait_notice_secs: self.wait_notice.map_or(d.wait_notice_secs, |t| t.as_secs()),
            max_steps: self.workgroup_max_steps,
            max_tokens: self.workgroup_max_tokens,
        })
    }
}

/// No in-process events: the commands print progress from the session's durable events
/// ([`super::events::Progress`]).
pub fn quiet() -> Events {
    Arc::new(|_: &Event| {})
}

/// The model's text on stderr as it arrives (the durable events carry the rest of the
/// progress); a newline ends each streamed reply. Stdout stays the answer alone.
pub fn streaming() -> Events {
    let open = Arc::new(std::sync::atomic::AtomicBool::new(false));
    Arc::new(move |e: &Event| {
        use std::io::Write;
        use std::sync::atomic::Ordering;
        match e {
            Event::TextDelta { text, .. } => {
                let mut err = std::io::stderr().lock();
                if !open.swap(true, Ordering::SeqCst) {
                    let _ = write!(err, "keel: ▸ ");
                }
                let _ = write!(err, "{}", super::inert_block(text));
                let _ = err.flush();
            }
            Event::TextRestarted { .. } => {
                // The attempt that showed the text failed; the call is made again.
                let was_open = open.swap(true, Ordering::SeqCst);
                eprint!(
                    "{}keel: ▸ (the reply was cut off; asked again) ",
                    if was_open { "\n" } else { "" }
                );
            }
            Event::ModelReplied { .. } | Event::State(_) if open.swap(false, Ordering::SeqCst) => {
                eprintln!();
            }
            _ => {}
        }
    })
}

/// Opens the harness of `home`, with first-party installs reported on stderr.
pub async fn open_harness(home: &PathBuf) -> Result<(Home, Harness), String> {
    let home =
        Home::at(home).map_err(|e| format!("cannot use keel home {}: {e}", home.display()))?;
    let guards = LoopGuards::default();
    let progress = |m: &str| eprintln!("keel: {m}");
    let harness = Harness::open(
        home.clone(),
        SandboxLimits::default(),
        ModelClient::key_from_env(),
        guards,
        &progress,
    )
    .await
    .map_err(|e| e.to_string())?;
    Ok((home, harness))
}

/// Cancels `cancel` on Ctrl-C.
pub fn cancel_on_ctrl_c(cancel: &CancelToken) {
    let c = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("keel: interrupting…");
            c.cancel();
        }
    });
}

/// Prints the outcome of a submit to session `id` and returns the exit code.
pub async fn report(json_out: bool, h: &Harness, id: &str, submitted: &Submitted) -> ExitCode {
    let meta = h.session(&Caller::Operator, id).await;
    let harness_state = meta.as_ref().map(|m| m.runtime.state.to_string()).unwrap_or_default();
    let turn = meta.map(|m| m.runtime.turns).unwrap_or(0);
    let tokens = h.turn_usage(&Caller::Operator, id, turn).await.unwrap_or_default();
    report_with(json_out, id, &harness_state, submitted, &tokens)
}

/// What a turn cost, for the end of its summary line (` · this turn: …`; empty without a
/// model call).
pub fn this_turn(tokens: &TurnUsage) -> String {
    if tokens.model_calls > 0 {
        format!(" · this turn: {}", tokens.describe())
    } else {
        String::new()
    }
}

fn report_with(
    json_out: bool,
    id: &str,
    harness_state: &str,
    submitted: &Submitted,
    tokens: &TurnUsage,
) -> ExitCode {
    let (outcome, answer, code) = match submitted {
        Submitted::Ran(TurnOutcome::Answer(a)) => ("answer", a.clone(), 0),
        Submitted::Ran(TurnOutcome::Stopped(n)) => ("stopped", n.clone(), 0),
        Submitted::Ran(TurnOutcome::Interrupted) => {
            ("interrupted", String::new(), EXIT_INTERRUPTED)
        }
        Submitted::Ran(TurnOutcome::Failed(e)) => ("failed", e.clone(), EXIT_TOOL_ERROR),
        Submitted::Ran(TurnOutcome::WaitingApproval(_)) => {
            ("waiting_approval", String::new(), EXIT_WAITING)
        }
        Submitted::Queued { .. } => ("queued", String::new(), 0),
    };
    let approvals = match submitted {
        Submitted::Ran(TurnOutcome::WaitingApproval(units)) => units.clone(),
        _ => Vec::new(),
    };
    let this_turn = this_turn(tokens);
    if json_out {
        if !this_turn.is_empty() {
            eprintln!("keel: session {id} ({harness_state}){this_turn}");
        }
        println!(
            "{}",
            json!({"ok": code == 0 || code == EXIT_WAITING, "session_id": id, "state": harness_state,
                   "outcome": outcome, "answer": answer, "approvals": approvals,
                   "finish_reason": tokens.finish_reason, "tokens": tokens})
        );
    } else {
        match submitted {
            Submitted::Ran(TurnOutcome::Failed(e)) => eprintln!(
                "{} {}",
                super::style::paint(super::style::Tone::Bad, "error:"),
                inert_block(e)
            ),
            Submitted::Ran(TurnOutcome::Interrupted) => eprintln!("keel: session {id} interrupted"),
            Submitted::Ran(TurnOutcome::WaitingApproval(units)) => eprintln!(
                "keel: session {id} waits for approval ({}); review with `keel approvals --session {id}`, \
                 then `keel approve UNIT` or `keel reject UNIT` — the turn resumes from there",
                units.join(", ")
            ),
            Submitted::Queued { inbox_seq } => eprintln!(
                "keel: session {id} is running in another process; your input is queued (#{inbox_seq}) and it will run it next"
            ),
            _ => println!("{}", inert_block(&answer)),
        }
        eprintln!("keel: session {id} ({harness_state}){this_turn}");
    }
    ExitCode::from(code)
}

pub async fn execute(home: PathBuf, a: RunArgs) -> ExitCode {
    if a.task.trim().is_empty() {
        return fail(a.json, "input", "the task is empty: say what to do", EXIT_REFUSED);
    }
    let (h, id) = match open_session(&home, &a.session, a.json).await {
        Ok(x) => x,
        Err(code) => return code,
    };
    eprintln!("keel: session {id}");
    let cancel = CancelToken::new();
    cancel_on_ctrl_c(&cancel);
    let progress = super::events::Progress::start(&h, &id).await;
    let submitted = h.send(&Caller::Operator, &id, &a.task, &cancel, &streaming()).await;
    progress.finish().await;
    let submitted = match submitted {
        Ok(s) => s,
        Err(e) => return super::api_fail(a.json, &e),
    };
    let code = report(a.json, &h, &id, &submitted).await;
    super::workgroup::after_run(a.json, &h, &id, code).await
}

/// Opens the harness and the session `a` names — continued when it exists (its settings kept;
/// the flags that only a new session takes are named on stderr), else created with `a`'s
/// settings. An error is printed (as JSON with `json`) and returned as the exit code.
pub async fn open_session(
    home: &PathBuf,
    a: &SessionArgs,
    json: bool,
) -> Result<(Harness, String), ExitCode> {
    let (home_dir, h) = match open_harness(home).await {
        Ok(x) => x,
        Err(e) => return Err(fail(json, "setup", &e, EXIT_SETUP)),
    };
    let existing = match &a.session {
        Some(id) => match h.session_exists(&Caller::Operator, id).await {
            Ok(b) => b,
            Err(e) => return Err(super::api_fail(json, &e)),
        },
        None => false,
    };
    let id = if existing {
        let id = a.session.clone().unwrap_or_default();
        if !a.grants.is_empty() || a.net.given() {
            return Err(fail(
                json,
                "grant",
                &format!(
                    "session `{id}` exists; its grants (directories and network) are fixed at creation (start a new session to change them)"
                ),
                EXIT_REFUSED,
            ));
        }
        if a.model_url.is_some()
            || a.model.is_some()
            || a.temperature.is_some()
            || a.max_tokens.is_some()
            || a.model_timeout.is_some()
            || a.context_window.is_some()
            || a.compact_at.is_some()
            || !a.redact.is_empty()
            || a.no_preprocess
            || a.preprocess_model.is_some()
        {
            eprintln!(
                "keel: session {id} keeps the model settings and user it was created with; those flags apply to new sessions"
            );
        }
        if a.workgroup.main {
            eprintln!(
                "keel: session {id} keeps the role and limits it was created with; --main and its limits apply to new sessions"
            );
        }
        if a.max_steps.is_some() {
            eprintln!(
                "keel: session {id} keeps the loop guards it was created with; --max-steps applies to new sessions"
            );
        }
        if !a.tools.is_empty()
            && let Err(e) = h.add_session_tools(&Caller::Operator, &id, &a.tools).await
        {
            return Err(fail(json, e.kind(), &e.to_string(), EXIT_REFUSED));
        }
        id
    } else {
        let flags = ModelFlags {
            url: a.model_url.clone(),
            model: a.model.clone(),
            temperature: a.temperature,
            max_tokens: a.max_tokens,
            timeout: a.model_timeout,
            context_window: a.context_window,
            compact_at: a.compact_at,
        };
        let model = match model_config(&home_dir, &flags) {
            Ok(Some(m)) => m,
            Ok(None) => {
                return Err(fail(
                    json,
                    "config",
                    "no model configured: pass --model-url URL --model NAME, set KEEL_MODEL_URL and KEEL_MODEL, \
                     or add a [model] table to keel.toml in the keel home",
                    EXIT_REFUSED,
                ));
            }
            Err(e) => return Err(fail(json, e.kind(), &e.to_string(), EXIT_REFUSED)),
        };
        let preprocess = match keel::harness::preprocess_config(
            &home_dir,
            &model,
            a.preprocess_model.as_deref(),
            a.no_preprocess,
        ) {
            Ok(p) => p,
            Err(e) => return Err(fail(json, e.kind(), &e.to_string(), EXIT_REFUSED)),
        };
        let spec = SessionSpec {
            id: a.session.clone(),
            grants: a.grants.clone(),
            net: a.net.grants(),
            tools: (!a.tools.is_empty()).then(|| a.tools.clone()),
            allow: a.allow.clone(),
            ask: a.ask.clone(),
            deny: a.deny.clone(),
            redact: a.redact.clone(),
            budget: a.budget.budget(),
            model,
            system_prompt: DEFAULT_SYSTEM_PROMPT.to_string(),
            guards: LoopGuards {
                max_steps: a.max_steps.unwrap_or(LoopGuards::default().max_steps),
                ..LoopGuards::default()
            },
            preprocess,
            user: a.user.clone(),
            owner: None,
            main: a.workgroup.limits(),
        };
        match h.create_session(&Caller::Operator, spec).await {
            Ok(id) => id.into_string(),
            Err(e) => return Err(fail(json, e.kind(), &e.to_string(), EXIT_REFUSED)),
        }
    };
    Ok((h, id))
}
