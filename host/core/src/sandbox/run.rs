//! One call: a fresh store, the budget, the guest call, and the classification of failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::component::Instance;
use wasmtime::{Engine, Store, Trap};

use crate::policy::Effect;

use super::control::ControlCtx;
use super::descriptors::Descriptors;
use super::error::{CallError, ToolErrorKind};
use super::fs::{FsPolicy, FsReach, FsReport};
use super::host_api::{LogRecord, Progress, ToolSpec, WitEffect, WitToolError};
use super::limits::{CallLimits, LimitExceeded};
use super::net::{Egress, EgressPlan};
use super::pipe::{CappedPipe, Captured};
use super::wasi::{self, CallState};
use super::{Budget, CancelToken, Prepared};
use crate::grant::Opened;

/// Bytes of stderr quoted in a crash report.
const CRASH_STDERR_TAIL: usize = 2048;
/// Bytes of a tool's error message kept (the rest is cut, with a marker saying how much).
pub const MAX_ERROR_MESSAGE: usize = 16 * 1024;
/// Bytes the guest may hand the host in one transfer (a host call's arguments, or a call's
/// result) when the output cap is smaller: a single write of a few MiB stays possible.
pub const MIN_TRANSFER_CAP: u64 = 16 << 20;
/// Bytes `describe` may return in all.
pub const MAX_DESCRIBE_BYTES: u64 = 16 << 20;
/// Fuel handed to the guest at a time; the reported fuel use of a stopped call is exact to
/// within this.
const FUEL_SLICE: u64 = 10_000_000;
/// What wasmtime says when a transfer from the guest passes the store's hostcall fuel.
const TRANSFER_CAP_MESSAGE: &str = "fuel allocated for hostcalls has been exhausted";

/// A tool description exactly as a component returned it (validated by the caller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawSpec {
    pub name: String,
    pub description: String,
    pub input_schema: String,
    pub output_schema: Option<String>,
    pub effect: crate::policy::Effect,
    pub idempotent: bool,
}

/// Everything one call produced, whether it succeeded or not.
#[derive(Debug, Clone, PartialEq)]
pub struct CallReport<T> {
    pub result: Result<T, CallError>,
    pub stdout: Captured,
    pub stderr: Captured,
    pub logs: Vec<LogRecord>,
    pub dropped_logs: u64,
    pub progress: Option<Progress>,
    pub fuel_used: u64,
    /// Peak linear memory, in bytes.
    pub memory_peak: u64,
    pub duration: Duration,
    /// What the filesystem guard counted and refused.
    pub fs: FsReport,
    /// The changes a control component asked for (a call that succeeded only).
    pub control_requests: Vec<crate::control::ControlRequest>,
    /// The HTTP requests the call sent or was refused (never bodies or headers).
    pub net: super::net::NetReport,
}

/// One call of a component's tool, as a value: the tool and its input, and everything the call
/// may use. [`Invocation::new`] gives the narrowest call — no directories, a read-only
/// filesystem, no cancellation, no control context, every HTTP request refused — and a caller
/// widens only the fields its call needs.
pub struct Invocation<'a> {
    pub tool: &'a str,
    /// The call's JSON input.
    pub input: &'a str,
    /// The directories the guest sees, opened by the caller (identities checked:
    /// [`crate::grant::Grant::open`]).
    pub grants: &'a [Opened],
    /// What the filesystem guard lets the guest do in them.
    pub fs: FsPolicy,
    pub budget: &'a Budget,
    pub cancel: Option<&'a CancelToken>,
    /// What a trusted control component sees of its session (`None`: the control interfaces
    /// answer that the call runs outside a session).
    pub control: Option<ControlCtx>,
    /// The plan its HTTP requests are checked against (`None`: every request refused).
    pub egress: Option<EgressPlan>,
    /// The keel home no object the guest opens may lie in (`None`: no home to keep out, as
    /// for a call outside any home).
    pub boundary: Option<std::sync::Arc<crate::home::Boundary>>,
}

impl<'a> Invocation<'a> {
    /// Tool `tool` on JSON `input` under `budget`, with nothing else granted.
    pub fn new(tool: &'a str, input: &'a str, budget: &'a Budget) -> Self {
        Self {
            tool,
            input,
            grants: &[],
            fs: FsPolicy::read_only(),
            budget,
            cancel: None,
            control: None,
            egress: None,
            boundary: None,
        }
    }
}

enum Action<'a> {
    Describe,
    Invoke { tool: &'a str, input: &'a str, max_output: u64 },
}

enum Output {
    Specs(Vec<RawSpec>),
    Text(String),
}

pub async fn describe(
    engine: &Engine,
    prepared: &Prepared,
    budget: &Budget,
    descriptors: &Arc<Descriptors>,
) -> CallReport<Vec<RawSpec>> {
    let report =
        execute(engine, prepared, Action::Describe, Invocation::new("", "", budget), descriptors)
            .await;
    map_report(report, |o| match o {
        Output::Specs(s) => Ok(s),
        Output::Text(_) => {
            Err(CallError::InvalidOutput { reason: "describe returned text".into() })
        }
    })
}

pub async fn invoke(
    engine: &Engine,
    prepared: &Prepared,
    call: Invocation<'_>,
    descriptors: &Arc<Descriptors>,
) -> CallReport<String> {
    let action =
        Action::Invoke { tool: call.tool, input: call.input, max_output: call.budget.max_output };
    let report = execute(engine, prepared, action, call, descriptors).await;
    map_report(report, |o| match o {
        Output::Text(t) => Ok(t),
        Output::Specs(_) => {
            Err(CallError::InvalidOutput { reason: "invoke returned specs".into() })
        }
    })
}

fn map_report<A, B>(r: CallReport<A>, f: impl FnOnce(A) -> Result<B, CallError>) -> CallReport<B> {
    CallReport {
        result: r.result.and_then(f),
        stdout: r.stdout,
        stderr: r.stderr,
        logs: r.logs,
        dropped_logs: r.dropped_logs,
        progress: r.progress,
        fuel_used: r.fuel_used,
        memory_peak: r.memory_peak,
        duration: r.duration,
        fs: r.fs,
        control_requests: r.control_requests,
        net: r.net,
    }
}

/// Counts a call the sandbox stopped, by kind, and the call's HTTP requests, by outcome
/// ([`crate::metrics`]).
fn count<T>(result: &Result<T, CallError>, net: &super::net::NetReport) {
    if let Err(
        e @ (CallError::Timeout { .. }
        | CallError::FuelExhausted { .. }
        | CallError::MemoryLimit { .. }
        | CallError::StackOverflow
        | CallError::Crashed { .. }),
    ) = result
    {
        crate::metrics::SANDBOX_TRAPS.inc(&[e.kind()]);
    }
    for r in &net.records {
        let outcome = match r.outcome.as_str() {
            "ok" => "ok",
            "denied" => "denied",
            "cancelled" => "cancelled",
            _ => "failed",
        };
        crate::metrics::EGRESS.inc(&[outcome]);
    }
}

async fn execute(
    engine: &Engine,
    prepared: &Prepared,
    action: Action<'_>,
    call: Invocation<'_>,
    descriptors: &Arc<Descriptors>,
) -> CallReport<Output> {
    let Invocation { grants, fs, budget, cancel, control, egress: net, boundary, .. } = call;
    let started = Instant::now();
    let net = net.unwrap_or_else(|| EgressPlan::none(started + budget.timeout));
    let stdout = CappedPipe::new(budget.max_stdio);
    let stderr = CappedPipe::new(budget.max_stdio);
    let report = |result: Result<Output, CallError>, store: Option<&Store<CallState>>| {
        let control_requests = match store {
            Some(s) if result.is_ok() => {
                s.data().control.as_ref().map(|c| c.requests.clone()).unwrap_or_default()
            }
            _ => Vec::new(),
        };
        // The call is over: its requests still in flight are cancelled and recorded.
        let net = store.map(|s| s.data().egress.finish()).unwrap_or_default();
        let (logs, dropped_logs, progress, fuel_used, memory_peak, fs) = match store {
            Some(s) => {
                // Compiled code keeps the fuel it burns in a register and writes it back only
                // at some points; a call stopped mid-loop (deadline, cancellation) leaves the
                // store's reading stale by at most one fuel slice (see FUEL_SLICE).
                let left = s.get_fuel().unwrap_or(0);
                (
                    s.data().host.logs.clone(),
                    s.data().host.dropped_logs,
                    s.data().host.progress.clone(),
                    budget.fuel.saturating_sub(left),
                    s.data().limits.memory_used(),
                    s.data().fs.report(),
                )
            }
            None => (Vec::new(), 0, None, 0, 0, FsReport::default()),
        };
        count(&result, &net);
        CallReport {
            result,
            stdout: stdout.captured(),
            stderr: stderr.captured(),
            logs,
            dropped_logs,
            progress,
            fuel_used,
            memory_peak,
            duration: started.elapsed(),
            fs,
            control_requests,
            net,
        }
    };
    // Each grant holds two of the process's descriptors for tools (its handle and the
    // guest's preopen): the call waits for them, until its deadline.
    let _grant_fds = match descriptors.take(2 * grants.len(), started + budget.timeout).await {
        Ok(p) => p,
        Err(e) => return report(Err(CallError::Setup { detail: e.to_string() }), None),
    };
    let ctx = match wasi::build_ctx(grants, fs.read_only, &stdout, &stderr) {
        Ok(c) => c,
        Err(e) => return report(Err(CallError::Setup { detail: format!("{e:#}") }), None),
    };
    let reach = FsReach {
        grants: grants.iter().map(|g| (g.guest.clone(), g.dir.clone())).collect(),
        boundary,
        descriptors: descriptors.clone(),
    };
    let egress = Egress::new(net, descriptors.clone());
    let mut state = CallState::new(ctx, CallLimits::new(budget.memory), (fs, reach), egress);
    state.control = control;
    let mut store = Store::new(engine, state);
    store.limiter(|s| &mut s.limits);
    if let Err(e) = store.set_fuel(budget.fuel) {
        return report(Err(CallError::Setup { detail: format!("{e:#}") }), Some(&store));
    }
    // Every string or list the guest hands the host is capped while it is lifted, before the
    // host allocates it (a result is lifted before the guest's post-return frees it).
    let (transfer_cap, output_limit) = match action {
        Action::Describe => (MAX_DESCRIBE_BYTES, MAX_DESCRIBE_BYTES),
        Action::Invoke { max_output, .. } => (max_output.max(MIN_TRANSFER_CAP), max_output),
    };
    store.set_hostcall_fuel(usize::try_from(transfer_cap).unwrap_or(usize::MAX));
    // Yield to the executor at every epoch tick, so the deadline and cancellation below are
    // observed even while the guest spins.
    store.epoch_deadline_async_yield_and_update(1);
    // Hand the guest its fuel in slices, so the fuel used is known to within one slice even
    // when the call is stopped mid-loop.
    if let Err(e) = store.fuel_async_yield_interval(Some(FUEL_SLICE)) {
        return report(Err(CallError::Setup { detail: format!("{e:#}") }), Some(&store));
    }
    let outcome = {
        let run = run_action(&mut store, prepared, &action);
        let cancelled = async {
            match cancel {
                Some(c) => c.cancelled().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = run => r,
            () = tokio::time::sleep(budget.timeout) => Err(Stop::Timeout),
            () = cancelled => Err(Stop::Cancelled),
        }
    };
    let result = outcome.map_err(|stop| match stop {
        Stop::Timeout => CallError::Timeout { limit: budget.timeout },
        Stop::Cancelled => CallError::Cancelled,
        Stop::Error(e) => e,
        Stop::Trap(e) => classify(e, budget, output_limit, &stderr.captured()),
    });
    report(result, Some(&store))
}

enum Stop {
    Timeout,
    Cancelled,
    Error(CallError),
    Trap(wasmtime::Error),
}

async fn run_action(
    store: &mut Store<CallState>,
    prepared: &Prepared,
    action: &Action<'_>,
) -> Result<Output, Stop> {
    let instance: Instance =
        prepared.pre.instantiate_async(&mut *store).await.map_err(Stop::Trap)?;
    match action {
        Action::Describe => {
            let f = instance
                .get_typed_func::<(), (Vec<ToolSpec>,)>(&mut *store, &prepared.describe)
                .map_err(Stop::Trap)?;
            let (specs,) = f.call_async(&mut *store, ()).await.map_err(Stop::Trap)?;
            Ok(Output::Specs(specs.into_iter().map(raw_spec).collect()))
        }
        Action::Invoke { tool, input, max_output } => {
            let f = instance
                .get_typed_func::<(&str, &str), (Result<String, WitToolError>,)>(
                    &mut *store,
                    &prepared.invoke,
                )
                .map_err(Stop::Trap)?;
            // The result is copied into host memory (capped by the hostcall fuel set above)
            // before the guest's post-return runs and frees it.
            let (result,) = f.call_async(&mut *store, (tool, input)).await.map_err(Stop::Trap)?;
            match result {
                Ok(text) => {
                    if text.len() as u64 > *max_output {
                        return Err(Stop::Error(CallError::OutputTooLarge {
                            bytes: Some(text.len() as u64),
                            limit: *max_output,
                        }));
                    }
                    if let Err(e) = serde_json::from_str::<serde::de::IgnoredAny>(&text) {
                        return Err(Stop::Error(CallError::InvalidOutput {
                            reason: e.to_string(),
                        }));
                    }
                    Ok(Output::Text(text))
                }
                Err(e) => {
                    let (kind, message) = match e {
                        WitToolError::InvalidInput(m) => (ToolErrorKind::InvalidInput, m),
                        WitToolError::UnknownTool(m) => (ToolErrorKind::UnknownTool, m),
                        WitToolError::NotFound(m) => (ToolErrorKind::NotFound, m),
                        WitToolError::Denied(m) => (ToolErrorKind::Denied, m),
                        WitToolError::Failed(m) => (ToolErrorKind::Failed, m),
                    };
                    Err(Stop::Error(CallError::Tool { kind, message: cap_message(message) }))
                }
            }
        }
    }
}

/// Cuts a tool's error message to [`MAX_ERROR_MESSAGE`] bytes, saying how much was cut.
fn cap_message(mut m: String) -> String {
    if m.len() <= MAX_ERROR_MESSAGE {
        return m;
    }
    let mut end = MAX_ERROR_MESSAGE;
    while !m.is_char_boundary(end) {
        end -= 1;
    }
    let cut = m.len() - end;
    m.truncate(end);
    m.push_str(&format!(" … [{cut} more bytes of the message cut]"));
    m
}

fn raw_spec(s: ToolSpec) -> RawSpec {
    RawSpec {
        name: s.name,
        description: s.description,
        input_schema: s.input_schema,
        output_schema: s.output_schema,
        effect: match s.effect {
            WitEffect::ReadOnly => Effect::ReadOnly,
            WitEffect::WorkspaceWrite => Effect::WorkspaceWrite,
            WitEffect::External => Effect::External,
            WitEffect::Destructive => Effect::Destructive,
        },
        idempotent: s.idempotent,
    }
}

/// Turns a wasmtime error from instantiation or the call into a typed [`CallError`].
fn classify(
    err: wasmtime::Error,
    budget: &Budget,
    output_limit: u64,
    stderr: &Captured,
) -> CallError {
    if let Some(limit) = err.downcast_ref::<LimitExceeded>() {
        return CallError::MemoryLimit { detail: limit.to_string() };
    }
    if let Some(exit) = err.downcast_ref::<wasmtime_wasi::I32Exit>() {
        return CallError::Crashed { detail: format!("the tool called exit({})", exit.0) };
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::OutOfFuel) => CallError::FuelExhausted { limit: budget.fuel },
        Some(Trap::StackOverflow) => CallError::StackOverflow,
        Some(Trap::Interrupt) => CallError::Timeout { limit: budget.timeout },
        Some(trap) => {
            let tail = stderr_tail(stderr);
            let detail = if tail.is_empty() {
                format!("{trap}")
            } else {
                format!("{trap}; its stderr ends with: {tail}")
            };
            CallError::Crashed { detail }
        }
        None => {
            let text = format!("{err:#}");
            if text.contains(TRANSFER_CAP_MESSAGE) {
                // wasmtime keeps the fuel error's type private; its message is the contract.
                CallError::OutputTooLarge { bytes: None, limit: output_limit }
            } else if text.contains("forcing trap when growing memory") {
                CallError::MemoryLimit { detail: text }
            } else {
                CallError::Crashed { detail: text }
            }
        }
    }
}

/// The end of a crashed call's stderr, on one line: control characters (newlines, escape
/// sequences) are shown escaped, so the quote cannot draw lines of its own in a message.
fn stderr_tail(stderr: &Captured) -> String {
    let text = stderr.text.trim_end();
    let mut start = text.len().saturating_sub(CRASH_STDERR_TAIL);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..]
        .chars()
        .flat_map(|c| {
            let escaped: Vec<char> =
                if c.is_control() { c.escape_default().collect() } else { vec![c] };
            escaped
        })
        .collect()
}
