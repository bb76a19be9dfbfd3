//! # keel
//!
//! An agent harness whose every tool is a WebAssembly component. This crate is its core: the
//! owner spine, the tool runtime, the store and the use cases every front-end goes through.
//! The front-ends are other crates — `keel-server` (the HTTP API and console, keel as an MCP
//! server) and the `keel` binary — and can reach only what this crate exports: the use cases
//! ([`api`]) and the vocabulary they speak ([`protocol`]). The owner modules below are public
//! only with the `internals` feature, which the tests and benchmarks turn on to check an owner
//! directly; these docs are built with it.
//!
//! Owners (one module each, one owner per fact):
//! - [`sandbox`] — ProcessSandbox: runs one component call under a budget, with only the
//!   granted directories and, through its egress hook, only the granted network
//!   destinations. Decides nothing about what is allowed.
//! - [`secrets`] — the secrets broker: the encrypted store of credentials, and the redactor
//!   every call's output passes.
//! - [`tools`] — ToolService: the tool catalog (install, validate, pin by digest) and the
//!   governance chain of one call (resolve → schema → lease → sandbox → normalise).
//! - [`session`] — SessionEngine: sessions, history, inbox, journal, approvals, evidence and
//!   events; request assembly; the SQL of recovery.
//! - [`agent`] — AgentService: the model/tool loop of one turn and its loop guards.
//! - [`brain`] — Brain: one runner per session, submit, drain, recovery, interrupts, the
//!   Orchestrator's call.
//! - [`model`] — the model provider: one OpenAI-compatible exchange, and the liberal reader of
//!   the JSON answers of keel's own calls ([`model::answer`]); [`understand`] — the task
//!   understanding call's request, answer and transition table.
//! - [`store`] — the store: SQLite (one machine, the default) or PostgreSQL (several hosts),
//!   its writer, numbered migrations for both, event wake-ups, and copying SQLite into
//!   PostgreSQL; [`sql`] — the one database interface both run behind (values, statements,
//!   rows), below every module that stores anything.
//! - [`harness`] — the owners of one home wired together; [`api`] — the use cases every
//!   front-end reaches them through.
//! - [`home`] — where keel keeps its state (`--home`, `KEEL_HOME`); [`config`] — its settings
//!   file, `keel.toml`.
//! - Leaf modules every owner may use: [`policy`] (effect classes, allow/ask/deny), [`ids`]
//!   (session, call and approval unit ids), [`stored`] (enums stored as names), [`grant`]
//!   (directory grants), [`caller`] (the API's principals and a session's owner), [`cancel`],
//!   [`digest`], [`failure`] (why a tool call failed), [`plan`] (plan steps and the one function that changes them), [`names`] (the
//!   naming rules of what is installed), [`units`], [`metrics`] (the process's counters and histograms), [`tls`], [`crash`] (test crash points),
//!   [`builtin`] (the first-party components), [`signing`] (components' embedded signatures).
//! - Around the spine: [`memory`] (per-user long-term memory) and [`search`] (its and the
//!   catalogs' full-text recall); [`skills`]; [`control`] (what a control call asks for);
//!   [`access`] (API tokens and grant presets); [`tools::mcp`] (external MCP servers, a tool
//!   source).
//!
//! Layers, bottom first — a module uses only modules of a layer below its own, checked by a
//! test over the `crate::` paths (`tests/all/layers.rs`): `tls`; `sql`; leaves; `oci`, `live`; `store`; `config`; `search`;
//! `memory`; `model`; `understand`; `secrets`; `control`; `sandbox`; `skills`; `tools`;
//! `session`; `agent`; `brain`; `access`; `harness`; `api`.
#![cfg_attr(not(test), deny(clippy::print_stdout, clippy::print_stderr))]

pub mod api;
pub mod protocol;

/// Declares the owner modules: public with the `internals` feature (tests and benchmarks check
/// an owner directly), private without it, so a front-end can name only [`api`] and
/// [`protocol`] — the compiler's rule, not a convention.
macro_rules! owners {
    ($($name:ident),* $(,)?) => {
        $(
            #[cfg(feature = "internals")]
            pub mod $name;
            #[cfg(not(feature = "internals"))]
            mod $name;
        )*
    };
}

// `stored` exports `stored_enum!` at the root, which a module declared by a macro cannot.
#[cfg(feature = "internals")]
pub mod stored;
#[cfg(not(feature = "internals"))]
mod stored;

owners!(
    access,
    agent,
    assembly,
    brain,
    builtin,
    caller,
    cancel,
    change,
    compaction,
    config,
    control,
    crash,
    digest,
    failure,
    grant,
    harness,
    home,
    ids,
    keys,
    live,
    memory,
    meta,
    metrics,
    model,
    names,
    oci,
    plan,
    policy,
    preparation,
    project,
    sandbox,
    search,
    secrets,
    session,
    shown,
    signing,
    skills,
    sql,
    store,
    tls,
    tools,
    understand,
    undo,
    units,
    views,
    workgroup,
);

/// The memory allocator of the `keel` binary, and of anything that embeds keel and wants the
/// same figures: a step allocates and frees many small strings and JSON values on several
/// threads at once, and the system allocator's locking and consolidation were about a tenth
/// of a busy host's CPU (see `docs/PERFORMANCE.md`).
pub use mimalloc::MiMalloc as Allocator;
