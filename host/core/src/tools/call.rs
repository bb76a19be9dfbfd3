//! The governance chain of one call: resolve → loaded → input schema → policy and approval →
//! budget ceiling → grants → lease → change snapshot → run (by the tool's source) → change set.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use super::ConsumedApproval;
use crate::sandbox::net::{EgressPlan, NetGrants};
use crate::sandbox::{
    Access, Budget, CallError, CallReport, CancelToken, FsPolicy, Grant, Invocation, LoadSource,
    Opened, Prepared,
};
use crate::secrets::{Redactor, SecretStore};

use super::source::{self, HostCall, ToolSource};
use super::{
    ChangeSet, Effect, LeaseRequest, Policy, PolicyDecision, Resolved, ToolRecord, ToolService,
    ToolServiceError, changes,
};

/// One call to make.
#[derive(Debug, Clone)]
pub struct CallRequest<'a> {
    pub tool: &'a str,
    /// JSON object text.
    pub input: &'a str,
    pub grants: &'a [Grant],
    /// Where the call's HTTP requests may go, and the secrets bound to those destinations.
    pub net: &'a NetGrants,
    pub budget: Budget,
    pub cancel: Option<CancelToken>,
    /// When set, only these tools may be called (the tools loaded in a session).
    pub loaded: Option<&'a [String]>,
    /// When set, the policy the call must pass.
    pub policy: Option<&'a Policy>,
    /// The approval consumed for this call, when the policy asks. It must bind this tool,
    /// the component that runs and this exact input.
    pub approval: Option<&'a ConsumedApproval>,
    /// What a component trusted with the `keel:control` interfaces sees of the session (its
    /// plan, discovery of the catalogs and the user's memory); `None`: the call is made outside
    /// a session.
    pub control: Option<crate::control::ControlSession>,
}

/// What a call produced.
#[derive(Debug, Clone)]
pub struct CallOutcome {
    pub tool: ToolRecord,
    pub report: CallReport<serde_json::Value>,
    /// Changes in the read-write grants (calls that may write only).
    pub changes: Option<ChangeSet>,
    /// A component file's call that compiled it: how long that took (`None`: an installed
    /// component, or a file whose compiled artifact was in the cache).
    pub compiled_ms: Option<f64>,
}

impl ToolService {
    /// Step 2: the input must be a JSON object matching the tool's input schema; the error
    /// names each failing field.
    pub fn check_input(
        &self,
        tool: &ToolRecord,
        input: &str,
    ) -> Result<serde_json::Value, ToolServiceError> {
        let invalid =
            |problems| ToolServiceError::InvalidInput { tool: tool.name.clone(), problems };
        let value: serde_json::Value = serde_json::from_str(input)
            .map_err(|e| invalid(vec![format!("input is not valid JSON: {e}")]))?;
        let validator = {
            let mut cache = self.validators.lock().unwrap_or_else(PoisonError::into_inner);
            match cache.get(&tool.spec_digest) {
                Some(v) => v.clone(),
                None => {
                    let v =
                        Arc::new(jsonschema::validator_for(&tool.input_schema).map_err(|e| {
                            invalid(vec![format!(
                                "the tool's input schema cannot be compiled: {e}"
                            )])
                        })?);
                    cache.insert(tool.spec_digest.clone(), v.clone());
                    v
                }
            }
        };
        let problems: Vec<String> = validator
            .iter_errors(&value)
            .take(10)
            .map(|e| {
                let at = e.instance_path().to_string();
                let at = if at.is_empty() { "input".to_string() } else { format!("field `{at}`") };
                format!("{at}: {e}")
            })
            .collect();
        if problems.is_empty() { Ok(value) } else { Err(invalid(problems)) }
    }

    /// Checks network grants before they are stored or used: they fit together, and every
    /// secret they bind is in the store.
    pub fn check_net(&self, net: &NetGrants) -> Result<(), ToolServiceError> {
        net.check()?;
        SecretStore::new(self.home.root()).get(&net.secret_names())?;
        Ok(())
    }

    /// Refuses a grant that would let a tool reach this home (see
    /// [`Home::check_grant`](crate::home::Home::check_grant)); every front-end calls it when
    /// grants are made, and every call again.
    pub fn check_grants(&self, grants: &[Grant]) -> Result<(), ToolServiceError> {
        if grants.is_empty() {
            return Ok(());
        }
        self.check_grants_in(grants, &self.boundary()?)
    }

    /// The home's identities, read now (see [`crate::home::Boundary`]).
    fn boundary(&self) -> Result<crate::home::Boundary, ToolServiceError> {
        self.home.boundary().map_err(|source| ToolServiceError::Io {
            context: "reading keel's home".into(),
            source,
        })
    }

    fn check_grants_in(
        &self,
        grants: &[Grant],
        boundary: &crate::home::Boundary,
    ) -> Result<(), ToolServiceError> {
        for g in grants {
            self.home
                .check_grant_in(&g.host, boundary)
                .map_err(|reason| ToolServiceError::HomeGrant { grant: g.to_string(), reason })?;
        }
        Ok(())
    }

    /// On a shared store, writes the component with `digest` into this host's home from the
    /// database when another host installed it (digest-checked): each host compiles it itself.
    fn fetch_shared_file(&self, digest: &str) -> Result<(), ToolServiceError> {
        let path = self.home.component_path(digest);
        if path.exists() {
            return Ok(());
        }
        let Some(bytes) = super::catalog::shared_file(&self.db(), digest)? else {
            return Ok(());
        };
        if crate::sandbox::sha256_hex(&bytes) != digest {
            return Err(crate::store::StoreError::Corrupt(format!(
                "the stored bytes of component {digest} do not have that digest"
            ))
            .into());
        }
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ToolServiceError::Io {
                context: "making the components directory".into(),
                source,
            })?;
        }
        crate::home::write_private(&path, &bytes).map_err(|source| ToolServiceError::Io {
            context: "writing the component file".into(),
            source,
        })
    }

    /// Loads (from memory, the artifact cache, or by compiling) the component with `digest`.
    pub fn prepared(
        &self,
        digest: &str,
    ) -> Result<(Arc<Prepared>, Option<LoadSource>), ToolServiceError> {
        if let Some(p) = self.in_memory(digest) {
            return Ok((p, None));
        }
        let engine = self.sandbox.engine_hash()?.to_string();
        self.fetch_shared_file(digest)?;
        let recorded = super::catalog::artifact_digest(&self.db(), &engine, digest)?;
        let (component, source, written) =
            self.sandbox.load(digest, recorded.as_deref(), &self.home.component_path(digest))?;
        if let Some(written) = written {
            super::catalog::record_artifact(&self.db(), &engine, digest, &written)?;
        }
        let prepared =
            Arc::new(self.sandbox.prepare(&component, self.trusted_with_control(digest))?);
        self.prepared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(digest.to_string(), prepared.clone());
        Ok((prepared, Some(source)))
    }

    /// The component with `digest`, if this process has loaded it already.
    fn in_memory(&self, digest: &str) -> Option<Arc<Prepared>> {
        self.prepared.lock().unwrap_or_else(PoisonError::into_inner).get(digest).cloned()
    }

    /// [`prepared`](Self::prepared), from an async task: a component not in memory yet is
    /// loaded — perhaps compiled, seconds of CPU — with this worker's other tasks handed to
    /// another thread first, so a runner's lease heartbeats and the other sessions' turns go
    /// on meanwhile.
    fn prepared_aside(&self, digest: &str) -> Result<Arc<Prepared>, ToolServiceError> {
        if let Some(p) = self.in_memory(digest) {
            return Ok(p);
        }
        let load = || self.prepared(digest).map(|(p, _)| p);
        match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(load)
            }
            _ => load(),
        }
    }

    /// The loaded tools as the model sees them, from the current catalog
    /// ([`Catalog::tools_json`](super::Catalog::tools_json)). `None` when no loaded tool is installed, or when the catalog
    /// cannot be read (no tools rather than stale ones).
    #[cfg(any(test, feature = "internals"))]
    pub fn tools_json(&self, loaded: &[String]) -> Option<Arc<str>> {
        self.catalog().ok()?.tools_json(loaded)
    }

    /// Runs one governed call: resolve → input schema → budget ceiling → grants → lease →
    /// change snapshot → sandbox → change set.
    pub async fn call(&self, req: CallRequest<'_>) -> Result<CallOutcome, ToolServiceError> {
        self.call_as(req, None).await
    }

    /// Like [`call`](Self::call), with the tool already resolved by the caller — from the
    /// [`Catalog`](super::Catalog) its step was assembled from — when `resolved` names the requested tool.
    ///
    /// The call is a `call_chain` span carrying what the sandbox measured (time, fuel, peak
    /// memory), the tool's effect class and the outcome, and is counted in the tool-call
    /// metrics.
    #[tracing::instrument(
        name = "call_chain",
        skip_all,
        fields(
            tool = %req.tool,
            keel.effect = tracing::field::Empty,
            keel.outcome = tracing::field::Empty,
            keel.sandbox.ms = tracing::field::Empty,
            keel.sandbox.fuel = tracing::field::Empty,
            keel.sandbox.memory_bytes = tracing::field::Empty,
            error.type = tracing::field::Empty,
        )
    )]
    pub async fn call_as(
        &self,
        req: CallRequest<'_>,
        resolved: Option<Arc<Resolved>>,
    ) -> Result<CallOutcome, ToolServiceError> {
        let started = std::time::Instant::now();
        let out = self.call_governed(req, resolved).await;
        let span = tracing::Span::current();
        let outcome = match &out {
            Ok(o) => {
                span.record("keel.effect", o.tool.effect.as_str());
                span.record("keel.sandbox.ms", o.report.duration.as_secs_f64() * 1e3);
                span.record("keel.sandbox.fuel", o.report.fuel_used);
                span.record("keel.sandbox.memory_bytes", o.report.memory_peak);
                match &o.report.result {
                    Ok(_) => "ok",
                    Err(e) => e.failure().as_str(),
                }
            }
            Err(e) => e.failure().as_str(),
        };
        span.record("keel.outcome", outcome);
        if outcome != "ok" {
            span.record("error.type", outcome);
        }
        crate::metrics::TOOL_CALLS.inc(&[outcome]);
        crate::metrics::TOOL_SECONDS.observe(&[], started.elapsed().as_secs_f64());
        out
    }

    async fn call_governed(
        &self,
        req: CallRequest<'_>,
        resolved: Option<Arc<Resolved>>,
    ) -> Result<CallOutcome, ToolServiceError> {
        if let Some(loaded) = req.loaded
            && !loaded.iter().any(|t| t == req.tool)
        {
            return Err(ToolServiceError::NotLoaded {
                name: req.tool.to_string(),
                loaded: loaded.join(", "),
            });
        }
        let resolved = match resolved.filter(|r| r.record.name == req.tool) {
            Some(r) => r,
            None => self.resolve(req.tool)?,
        };
        let tool = &resolved.record;
        let input = self.check_input(tool, req.input)?;
        match req.policy.map(|p| p.decide_call(&tool.name, tool.effect, Some(req.input))) {
            Some(PolicyDecision::Deny(reason)) => {
                return Err(ToolServiceError::PolicyDenied { reason });
            }
            Some(PolicyDecision::Ask(reason)) => match req.approval {
                None => return Err(ToolServiceError::NeedsApproval { reason }),
                Some(a) if !a.binds(&tool.name, &resolved.digest, req.input) => {
                    return Err(ToolServiceError::ApprovalNotBound { unit: a.unit().to_string() });
                }
                Some(_) => {}
            },
            Some(PolicyDecision::Allow) | None => {}
        }
        let ceiling = self.sandbox.limits().max_memory;
        if req.budget.memory > ceiling {
            return Err(ToolServiceError::OverCeiling {
                what: "memory budget",
                asked: req.budget.memory,
                ceiling,
            });
        }
        Grant::check_disjoint(req.grants)?;
        // Each grant is checked again at its use: never keel's home, and still the directory
        // it was given for — opened once here, without following links, and used through
        // that handle by the guest and the change set alike.
        // The home's identities, read once for this call: no grant is the home, and no object
        // the tool opens below its grants may be one of them (a bind mount or a hard link into
        // the home).
        let boundary = match req.grants.is_empty() {
            true => None,
            false => Some(Arc::new(self.boundary()?)),
        };
        if let Some(b) = &boundary {
            self.check_grants_in(req.grants, b)?;
        }
        let opened = req.grants.iter().map(Grant::opened).collect::<Result<Vec<_>, _>>()?;
        req.net.check()?;
        // The values of the secrets the call may send, read once per call. Every output of the
        // call is redacted of every secret of the home — not only the call's: an earlier call
        // may have left one in a file this call reads — and none leaves towards a destination
        // this call does not bind it to.
        let known = SecretStore::new(self.home.root()).all()?;
        let values = crate::secrets::pick(&known, &req.net.secret_names())?;
        let redactor = Redactor::new(&known);
        let deadline = std::time::Instant::now() + req.budget.timeout;
        let egress = EgressPlan {
            grants: req.net.clone(),
            secrets: req
                .net
                .secrets
                .iter()
                .filter_map(|b| {
                    values.iter().find(|(n, _)| *n == b.name).map(|(_, v)| (b.clone(), v.clone()))
                })
                .collect(),
            known,
            deadline,
        };
        let writes = tool.effect != Effect::ReadOnly;
        let requests: Vec<LeaseRequest> = req
            .grants
            .iter()
            .map(|g| LeaseRequest {
                dir: g.host.clone(),
                exclusive: writes && g.access == Access::Rw,
            })
            .collect();
        let _lease = match self.leases.acquire(requests.clone(), Duration::ZERO) {
            Ok(l) => l,
            Err(_) => {
                let leases = self.leases.clone();
                let wait = req.budget.timeout;
                tokio::task::spawn_blocking(move || leases.acquire(requests, wait)).await.map_err(
                    |e| ToolServiceError::Io {
                        context: "waiting for the workspace lease".into(),
                        source: std::io::Error::other(e.to_string()),
                    },
                )??
            }
        };
        let run = match &resolved.source {
            ToolSource::Component => Run::Component(self.prepared_aside(&resolved.digest)?),
            ToolSource::Host(host) => Run::Host(host.clone()),
        };
        let fs = FsPolicy {
            read_only: !writes,
            remove_existing: tool.effect == Effect::Destructive,
            write_quota: req.budget.write_quota,
            max_created: req.budget.max_files_created,
            undo: None,
        };
        let track = writes && req.grants.iter().any(|g| g.access == Access::Rw);
        // What the call's changes replace is kept, so that a person can undo them.
        let fs = FsPolicy {
            undo: track.then_some(crate::sandbox::UndoBounds {
                max_file: self.undo.max_file,
                max_call: self.undo.max_call,
            }),
            ..fs
        };
        // The walks and hashing are blocking and bounded: a small workspace is walked here,
        // a large one (or much to hash) off the async threads; both stop when the call is
        // cancelled.
        let grants: Arc<[Opened]> = opened.into();
        let before = match track {
            true => match changes::snapshot_inline(&grants, req.cancel.as_ref()) {
                Some(snap) => Some(snap),
                None => {
                    let (g, c) = (grants.clone(), req.cancel.clone());
                    tokio::task::spawn_blocking(move || changes::snapshot(&g, c.as_ref()))
                        .await
                        .ok()
                }
            },
            false => None,
        };
        let report = match run {
            Run::Host(host) => {
                let ctx = HostCall {
                    grants: req.grants,
                    budget: &req.budget,
                    cancel: req.cancel.as_ref(),
                };
                source::run_host(host.as_ref(), input, ctx).await
            }
            Run::Component(prepared) => {
                let control = req
                    .control
                    .clone()
                    .filter(|_| self.trusted_with_control(&resolved.digest))
                    .map(crate::sandbox::ControlCtx::new);
                let report = self
                    .sandbox
                    .invoke(
                        &prepared,
                        Invocation {
                            grants: &grants,
                            fs,
                            cancel: req.cancel.as_ref(),
                            control,
                            egress: Some(egress),
                            boundary: boundary.clone(),
                            ..Invocation::new(&tool.name, req.input, &req.budget)
                        },
                    )
                    .await;
                parsed(report)
            }
        };
        let changes = match before {
            Some(before) => {
                let inline =
                    changes::snapshot_inline(&grants, req.cancel.as_ref()).filter(|after| {
                        changes::bytes_to_hash(&before, after) <= changes::INLINE_HASH_BYTES
                    });
                let done = match inline {
                    Some(after) => {
                        Some((changes::diff(&before, &after, &grants, req.cancel.as_ref()), before))
                    }
                    None => {
                        let (g, c) = (grants.clone(), req.cancel.clone());
                        tokio::task::spawn_blocking(move || {
                            let after = changes::snapshot(&g, c.as_ref());
                            (changes::diff(&before, &after, &g, c.as_ref()), before)
                        })
                        .await
                        .ok()
                    }
                };
                Some(match done {
                    Some((mut set, before)) => {
                        changes::attach_preimages(
                            &mut set,
                            &before,
                            &report.fs.preimages,
                            self.undo.max_session,
                        );
                        set
                    }
                    None => ChangeSet::default(),
                })
            }
            // A snapshot that could not be taken: nothing can be said of the changes.
            None if track => Some(ChangeSet::default()),
            None => None,
        };
        let mut report = report;
        redact_report(&mut report, &redactor);
        let mut changes = changes;
        if let Some(set) = changes.as_mut().filter(|_| !redactor.is_empty()) {
            // A tool may name a file after a secret it read.
            for c in set.created.iter_mut().chain(&mut set.modified).chain(&mut set.deleted) {
                redactor.redact_string(&mut c.path);
            }
        }
        Ok(CallOutcome { tool: tool.clone(), report, changes, compiled_ms: None })
    }
}

/// Replaces every secret value in what a call produced (output, errors, stdio, logs,
/// progress, filesystem denials, every field of the request records) before it leaves the
/// ToolService; the change set's paths are redacted beside it.
fn redact_report(r: &mut CallReport<serde_json::Value>, redactor: &Redactor) {
    if redactor.is_empty() {
        return;
    }
    match &mut r.result {
        Ok(v) => redactor.redact_json(v),
        Err(e) => match e {
            CallError::Tool { message: s, .. }
            | CallError::MemoryLimit { detail: s }
            | CallError::InvalidOutput { reason: s }
            | CallError::Crashed { detail: s }
            | CallError::Setup { detail: s } => redactor.redact_string(s),
            _ => {}
        },
    }
    redactor.redact_string(&mut r.stdout.text);
    redactor.redact_string(&mut r.stderr.text);
    for l in &mut r.logs {
        redactor.redact_string(&mut l.message);
    }
    if let Some(p) = &mut r.progress {
        redactor.redact_string(&mut p.message);
    }
    for d in &mut r.fs.denied {
        redactor.redact_string(d);
    }
    for n in &mut r.net.records {
        redactor.redact_string(&mut n.method);
        redactor.redact_string(&mut n.scheme);
        redactor.redact_string(&mut n.host);
        redactor.redact_string(&mut n.path);
        if let Some(reason) = &mut n.reason {
            redactor.redact_string(reason);
        }
    }
}

/// What runs a call: the component, loaded, or the host tool.
enum Run {
    Component(Arc<Prepared>),
    Host(Arc<dyn super::HostTool>),
}

/// A component's report with its output text parsed as JSON.
fn parsed(report: CallReport<String>) -> CallReport<serde_json::Value> {
    CallReport {
        result: report.result.and_then(|text| {
            serde_json::from_str(&text)
                .map_err(|e| CallError::InvalidOutput { reason: e.to_string() })
        }),
        stdout: report.stdout,
        stderr: report.stderr,
        logs: report.logs,
        dropped_logs: report.dropped_logs,
        progress: report.progress,
        fuel_used: report.fuel_used,
        memory_peak: report.memory_peak,
        duration: report.duration,
        fs: report.fs,
        control_requests: report.control_requests,
        net: report.net,
    }
}
