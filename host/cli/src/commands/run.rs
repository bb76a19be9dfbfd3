//! `keel run "TASK"`: create or continue a session and run its turn.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use keel::api::{Caller, SessionSpec};
use keel::protocol::sessions::LoopGuards;
use keel::protocol::sessions::{CancelToken, Grant};
use keel::protocol::setup::{DEFAULT_SYSTEM_PROMPT, Harness, ModelFlags, model_config};

use super::turn::{cancel_on_ctrl_c, open_harness, report, streaming};
use super::{BudgetArgs, EXIT_REFUSED, EXIT_SETUP, fail};

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
    /// Continue session ID. An id that does not exist is an error naming the closest ones;
    /// nothing is created (default: a new session with a generated id).
    #[arg(long, value_name = "ID", conflicts_with_all = ["new_session", "continue_last"])]
    pub session: Option<String>,
    /// Create a new session with this id; an id that exists is an error.
    #[arg(long, value_name = "ID", conflicts_with = "continue_last")]
    new_session: Option<String>,
    /// Continue the most recently active session of this user (--user, KEEL_USER, else the
    /// operating-system user) in this home.
    #[arg(long = "continue", id = "continue_last")]
    continue_last: bool,
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
    #[arg(long, value_name = "DURATION", value_parser = keel::protocol::text::parse_duration)]
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
    /// Do not offer the `AGENTS.md` at the root of each granted directory to a new session
    /// as the project's instructions (by default it is: marked as file content, at most
    /// 16 KiB of it, shown with its digest by `session show`).
    #[arg(long)]
    pub no_project_instructions: bool,
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
    #[arg(long, value_name = "DURATION", requires = "main", value_parser = keel::protocol::text::parse_duration)]
    child_deadline: Option<std::time::Duration>,
    /// After how long a parent is told that a sub-session is still working (and again after
    /// each such period), e.g. 5m; 0s: never (default 10m).
    #[arg(long, value_name = "DURATION", requires = "main", value_parser = keel::protocol::text::parse_duration)]
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
    pub fn limits(&self) -> Option<keel::protocol::sessions::Limits> {
        if !self.main {
            return None;
        }
        let d = keel::protocol::sessions::Limits::default();
        Some(keel::protocol::sessions::Limits {
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

pub async fn execute(home: PathBuf, a: RunArgs) -> ExitCode {
    if a.task.trim().is_empty() {
        return fail(a.json, "input", "the task is empty: say what to do", EXIT_REFUSED);
    }
    let (h, id) = match open_session(&home, &a.session, a.json).await {
        Ok((h, opened)) => (h, opened.id),
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

/// Opens the harness and the session `a` names (see [`session_in`]). An error is printed (as
/// JSON with `json`) and returned as the exit code.
pub async fn open_session(
    home: &PathBuf,
    a: &SessionArgs,
    json: bool,
) -> Result<(Harness, Opened), ExitCode> {
    let (home_dir, h) = match open_harness(home).await {
        Ok(x) => x,
        Err(e) => return Err(fail(json, "setup", &e, EXIT_SETUP)),
    };
    let opened = session_in(&h, &home_dir, a, json).await?;
    Ok((h, opened))
}

/// The session a command runs in.
pub struct Opened {
    pub id: String,
    /// Whether it existed (continued) rather than was created now.
    pub continued: bool,
}

/// The typed user `a` names (`--user`, `KEEL_USER`), else the operating-system user's.
pub fn user_of(a: &SessionArgs) -> String {
    use keel::protocol::setup::{UserKind, default_user, typed_user};
    typed_user(&a.user.clone().unwrap_or_else(default_user), UserKind::Local)
}

/// The sessions of `user` in this home, most recently active first.
pub async fn sessions_of(
    h: &Harness,
    user: &str,
) -> Result<Vec<keel::protocol::sessions::SessionSummary>, keel::api::ApiError> {
    let filter = keel::api::SessionFilter { user: Some(user.to_string()), ..Default::default() };
    h.find_sessions(&Caller::Operator, &filter).await
}

/// The session `a` names in `h`: with `--session`, one that exists, continued (its settings
/// kept; the flags only a new session takes are named on stderr); with `--continue`, the most
/// recently active one of the user; else a new one with `a`'s settings (`--new-session`: with
/// that id). Continuing and creating never stand in for each other: an unknown id is an error
/// with the closest ids, a taken one is an error too.
pub async fn session_in(
    h: &Harness,
    home_dir: &keel::protocol::setup::Home,
    a: &SessionArgs,
    json: bool,
) -> Result<Opened, ExitCode> {
    let continued = if let Some(id) = &a.session {
        match h.session_exists(&Caller::Operator, id).await {
            Ok(true) => Some(id.clone()),
            Ok(false) => {
                let known = match h.sessions(&Caller::Operator).await {
                    Ok(list) => list.into_iter().map(|s| s.id).collect::<Vec<_>>(),
                    Err(e) => return Err(super::api_fail(json, &e)),
                };
                let near = keel::protocol::text::closest(id, known.iter().map(String::as_str));
                return Err(fail(
                    json,
                    "not_found",
                    &format!(
                        "session `{}` does not exist{}; nothing was created (to start a session \
                         with this id: --new-session {})",
                        id.escape_debug(),
                        keel::protocol::text::did_you_mean(&near),
                        id.escape_debug()
                    ),
                    EXIT_REFUSED,
                ));
            }
            Err(e) => return Err(super::api_fail(json, &e)),
        }
    } else if a.continue_last {
        let user = user_of(a);
        match sessions_of(h, &user).await {
            Ok(list) => match list.first() {
                Some(s) => Some(s.id.clone()),
                None => {
                    return Err(fail(
                        json,
                        "not_found",
                        &format!(
                            "no session of user `{user}` in this home to continue: start one \
                             without --continue"
                        ),
                        EXIT_REFUSED,
                    ));
                }
            },
            Err(e) => return Err(super::api_fail(json, &e)),
        }
    } else {
        None
    };
    if let Some(id) = &a.new_session {
        match h.session_exists(&Caller::Operator, id).await {
            Ok(false) => {}
            Ok(true) => {
                return Err(fail(
                    json,
                    "conflict",
                    &format!(
                        "session `{}` exists; continue it with --session {}",
                        id.escape_debug(),
                        id.escape_debug()
                    ),
                    EXIT_REFUSED,
                ));
            }
            Err(e) => return Err(super::api_fail(json, &e)),
        }
    }
    let id = if let Some(id) = continued {
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
                "keel: session {id} keeps the model settings and user it was created with; those flags apply to new sessions (to move it to another model: keel session set {id} --model-url URL --model NAME)"
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
        let model = match model_config(home_dir, &flags) {
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
        let preprocess = match keel::protocol::setup::preprocess_config(
            home_dir,
            &model,
            a.preprocess_model.as_deref(),
            a.no_preprocess,
        ) {
            Ok(p) => p,
            Err(e) => return Err(fail(json, e.kind(), &e.to_string(), EXIT_REFUSED)),
        };
        let spec = SessionSpec {
            id: a.new_session.clone(),
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
            project_instructions: !a.no_project_instructions,
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
            Ok(id) => return Ok(Opened { id: id.into_string(), continued: false }),
            Err(e) => return Err(fail(json, e.kind(), &e.to_string(), EXIT_REFUSED)),
        }
    };
    Ok(Opened { id, continued: true })
}
