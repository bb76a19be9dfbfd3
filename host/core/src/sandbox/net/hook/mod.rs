//! The egress hook: every `wasi:http` request a guest sends passes here, and only here.
//!
//! In order: the destination (scheme, host, port) must match a grant; the request body is
//! read within the call's byte cap; the secrets bound to the destination are written into it
//! (placeholders substituted, the auth headers the guest set replaced) and a placeholder bound
//! elsewhere refuses the request; the name is resolved once, here, and **every** address must
//! be public (a loopback address only under a testing exception for this name and port); the
//! connection goes to an address that was checked (no second lookup); TLS is verified by the
//! platform's verifier; the response body counts against the same cap. No redirect is
//! followed here: a guest that follows one sends a new request, which is checked like any.
//!
//! Before anything is sent, a request that carries the value of a granted secret (as it is,
//! URL-encoded, hex or base64) towards a destination that secret is not bound to is refused,
//! and an authority with userinfo (`user@host`) is refused. A call starts at most
//! `max_requests` requests and has at most [`MAX_CONCURRENT_REQUESTS`] in flight; its byte cap
//! counts request lines and headers as well as bodies. When the call ends, requests still in
//! flight are cancelled and recorded as such, with what they had sent.
//!
//! Each request leaves a [`NetRecord`] (method, host, port, path, status, bytes, time, and why
//! it was refused) — never a body or a header — from the moment it starts.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

use super::addr;
use super::grant::{MAX_CONCURRENT_REQUESTS, NetGrants, Scheme, SecretBinding, normalise_host};
use super::reflect::Reflections;
use crate::sandbox::descriptors::Descriptors;
use crate::secrets::Secret;

mod fill;
mod wire;

use fill::fill_secrets;
use wire::{Metered, connect, exchange, resolve};

/// Records kept per call at most (the rest are counted).
pub const MAX_NET_RECORDS: usize = 256;

/// What one request did, as the call's report and journal keep it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NetRecord {
    pub method: String,
    pub scheme: String,
    pub host: String,
    pub port: u16,
    /// The path, without the query (which may hold a credential).
    pub path: String,
    /// The response status (`None`: no response).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    /// Bytes sent: the request line, the headers and the body.
    pub sent: u64,
    /// Response body bytes received (so far, for a body the guest did not read to its end).
    pub received: u64,
    /// Milliseconds from the request to its response's head (or its refusal or failure).
    pub ms: f64,
    /// `ok`, `denied` (refused by keel; nothing was sent), `failed`, or `cancelled` (the call
    /// ended first; `sent` says what had been handed to the connection).
    pub outcome: String,
    /// Why it was denied or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What one call may do on the network: its grants, the values of the secrets they bind, and
/// the call's deadline.
pub struct EgressPlan {
    pub grants: NetGrants,
    /// The value of each bound secret, by binding.
    pub secrets: Vec<(SecretBinding, Secret)>,
    /// Every secret of the home, bound to this call or not: none may leave towards a
    /// destination the call does not bind it to (the `reflect` module).
    pub known: Vec<(String, Secret)>,
    pub deadline: Instant,
}

impl EgressPlan {
    /// A plan that refuses every request (no grants).
    pub fn none(deadline: Instant) -> Self {
        Self { grants: NetGrants::default(), secrets: Vec::new(), known: Vec::new(), deadline }
    }
}

/// The state the hook shares with the requests it started.
#[derive(Default)]
struct Ledger {
    records: Mutex<(Vec<NetRecord>, u64)>,
    bytes: AtomicU64,
    /// Requests started (refused ones included).
    started: AtomicU64,
    /// Requests whose connection is open.
    active: AtomicUsize,
    /// The call has ended: requests in flight stop.
    ended: std::sync::atomic::AtomicBool,
    end: tokio::sync::Notify,
}

/// A request counted as in flight until it is dropped.
struct InFlight(Arc<Ledger>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Ledger {
    /// Stores `r`, returning its index (`None`: over the cap, counted only).
    fn push(&self, r: NetRecord) -> Option<usize> {
        let mut g = self.records.lock().unwrap_or_else(PoisonError::into_inner);
        if g.0.len() >= MAX_NET_RECORDS {
            g.1 += 1;
            return None;
        }
        g.0.push(r);
        Some(g.0.len() - 1)
    }

    fn update(&self, at: Option<usize>, f: impl FnOnce(&mut NetRecord)) {
        if let Some(i) = at {
            let mut g = self.records.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(r) = g.0.get_mut(i) {
                f(r);
            }
        }
    }

    /// Takes `n` bytes from the call's cap, or says how many were left.
    fn take(&self, n: u64, cap: u64) -> Result<(), u64> {
        let before = self.bytes.fetch_add(n, Ordering::Relaxed);
        if before + n > cap { Err(cap.saturating_sub(before)) } else { Ok(()) }
    }

    /// Resolves when the call has ended.
    async fn ended(&self) {
        loop {
            let notified = self.end.notified();
            if self.ended.load(Ordering::SeqCst) {
                return;
            }
            notified.await;
        }
    }
}

/// The hooks of one call (see the module docs).
pub struct Egress {
    plan: Arc<EgressPlan>,
    ledger: Arc<Ledger>,
    reflections: Arc<std::sync::OnceLock<Arc<Reflections>>>,
    /// The process's descriptors for tools: each connection holds one.
    descriptors: Arc<Descriptors>,
}

/// The records of a call's requests, and how many more were not kept.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetReport {
    pub records: Vec<NetRecord>,
    pub dropped: u64,
}

impl Egress {
    pub fn new(plan: EgressPlan, descriptors: Arc<Descriptors>) -> Self {
        Self {
            plan: Arc::new(plan),
            ledger: Arc::default(),
            reflections: Arc::default(),
            descriptors,
        }
    }

    /// The forms of every known secret, built at the call's first request (most calls send
    /// none).
    fn reflections(&self) -> Arc<Reflections> {
        self.reflections
            .get_or_init(|| {
                // The bound values are looked for too, whatever `known` holds.
                let mut known = self.plan.known.clone();
                for (b, v) in &self.plan.secrets {
                    if !known.iter().any(|(n, _)| *n == b.name) {
                        known.push((b.name.clone(), v.clone()));
                    }
                }
                Arc::new(Reflections::new(&known))
            })
            .clone()
    }

    fn sender(&self) -> Sender {
        Sender {
            plan: self.plan.clone(),
            ledger: self.ledger.clone(),
            reflections: self.reflections(),
            descriptors: self.descriptors.clone(),
        }
    }

    /// Ends the call's network use: requests still in flight are cancelled (their
    /// connections dropped) and recorded as `cancelled`, with what they had sent; no new one
    /// starts. Returns the report.
    pub fn finish(&self) -> NetReport {
        self.ledger.ended.store(true, Ordering::SeqCst);
        self.ledger.end.notify_waiters();
        let mut g = self.ledger.records.lock().unwrap_or_else(PoisonError::into_inner);
        for r in g.0.iter_mut().filter(|r| r.outcome == PENDING) {
            r.outcome = "cancelled".into();
            r.reason = Some(cancelled_reason(r.sent).into());
        }
        NetReport { records: g.0.clone(), dropped: g.1 }
    }

    /// Sends `request` as the hook does for a guest.
    #[cfg(any(test, feature = "internals"))]
    pub async fn send(
        &self,
        request: http::Request<WasiBody>,
    ) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
        send(self.sender(), request).await
    }

    /// A GET of `url` from the host through the same checks, its body read to the end:
    /// the status and the body's size (used by the benchmarks, and to try grants).
    #[cfg(any(test, feature = "internals"))]
    pub async fn get(&self, url: &str) -> Result<(u16, u64), String> {
        let body =
            http_body_util::Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync();
        let request = http::Request::get(url).body(body).map_err(|e| e.to_string())?;
        let (response, io) = self.send(request).await.map_err(|e| format!("{e:?}"))?;
        let status = response.status().as_u16();
        let bytes =
            response.into_body().collect().await.map_err(|e| format!("{e:?}"))?.to_bytes().len()
                as u64;
        let _ = Pin::from(io).await;
        Ok((status, bytes))
    }
}

/// The connection's remaining work after the response head arrived.
pub type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for Egress {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        Box::new(send(self.sender(), request))
    }
}

/// A refusal or failure of one request, before or after anything was sent.
struct Stop {
    denied: bool,
    reason: String,
    error: Error,
}

fn deny(reason: impl Into<String>) -> Stop {
    Stop { denied: true, reason: reason.into(), error: Error::HttpRequestDenied }
}

fn fail(reason: impl Into<String>, error: Error) -> Stop {
    Stop { denied: false, reason: reason.into(), error }
}

/// The outcome of a request whose record is open.
const PENDING: &str = "pending";

/// Why a request the call's end cancelled is recorded so, by whether it had been sent.
fn cancelled_reason(sent: u64) -> &'static str {
    if sent > 0 {
        "the call ended while the request was in flight; it was cancelled after it was handed to the connection"
    } else {
        "the call ended before the request was sent; it was cancelled"
    }
}

/// What one request needs of its call's hook.
struct Sender {
    plan: Arc<EgressPlan>,
    ledger: Arc<Ledger>,
    reflections: Arc<Reflections>,
    descriptors: Arc<Descriptors>,
}

async fn send(
    sender: Sender,
    request: http::Request<WasiBody>,
) -> Result<(http::Response<WasiBody>, IoFuture), Error> {
    let Sender { plan, ledger, reflections, descriptors } = sender;
    let started = Instant::now();
    let (parts, body) = request.into_parts();
    let uri = &parts.uri;
    let scheme = match uri.scheme_str() {
        Some("https") => Some(Scheme::Https),
        Some("http") => Some(Scheme::Http),
        _ => None,
    };
    let host = uri.host().and_then(normalise_host).unwrap_or_default();
    let port = uri.port_u16().or(scheme.map(Scheme::default_port)).unwrap_or(0);
    let record = NetRecord {
        method: parts.method.to_string(),
        scheme: uri.scheme_str().unwrap_or("").to_string(),
        host: host.clone(),
        port,
        path: uri.path().to_string(),
        status: None,
        sent: 0,
        received: 0,
        ms: 0.0,
        outcome: PENDING.into(),
        reason: None,
    };
    // Recorded from the start: a request still in flight when the call ends is in the report.
    let at = ledger.push(record.clone());
    let finish = |outcome: &str, reason: Option<String>| {
        let ms = started.elapsed().as_secs_f64() * 1e3;
        ledger.update(at, |r| {
            if r.outcome == PENDING {
                r.outcome = outcome.into();
                r.reason = reason;
            }
            r.ms = ms;
        });
    };
    let number = ledger.started.fetch_add(1, Ordering::SeqCst) + 1;
    let active = ledger.active.fetch_add(1, Ordering::SeqCst) + 1;
    let in_flight = InFlight(ledger.clone());
    let limit = if ledger.ended.load(Ordering::SeqCst) {
        Some("the call has ended; no request starts after it".to_string())
    } else if number > plan.grants.max_requests {
        Some(format!(
            "the call may start {} requests in all (--net-max-requests) and this is request {number}; nothing was sent",
            plan.grants.max_requests
        ))
    } else if active > MAX_CONCURRENT_REQUESTS {
        Some(format!(
            "the call has {MAX_CONCURRENT_REQUESTS} requests in flight, the most it may; wait for one to finish (nothing was sent)"
        ))
    } else {
        None
    };
    if let Some(reason) = limit {
        finish("denied", Some(reason));
        return Err(Error::HttpRequestDenied);
    }
    let userinfo = uri.authority().is_some_and(|a| a.as_str().contains('@'));
    let attempt = async {
        let Some(scheme) = scheme else {
            return Err(deny(format!(
                "scheme `{}` is not allowed (https, or http where a grant says http://)",
                record.scheme
            )));
        };
        if host.is_empty() {
            return Err(deny("the request names no host"));
        }
        if userinfo {
            return Err(deny(
                "the URL carries a user name or password before the host (user@host); keel sends credentials only as bound secrets",
            ));
        }
        check_grant(&plan.grants, scheme, &host, port)?;
        let cap = plan.grants.max_bytes;
        let body = read_body(body, &ledger, cap).await?;
        check_reflections(&reflections, &plan.secrets, &parts, &body, scheme, &host, port)?;
        let bound: Vec<&(SecretBinding, Secret)> =
            plan.secrets.iter().filter(|(b, _)| b.binds(scheme, &host, port)).collect();
        let (request, head) = fill_secrets(parts, body, &bound, &plan.secrets)?;
        // The request line and headers count against the same cap as bodies.
        if let Err(left) = ledger.take(head, cap) {
            return Err(Stop {
                denied: true,
                reason: format!(
                    "the request line and headers ({head} bytes) pass the call's network byte cap of {cap} bytes ({left} were left); nothing was sent"
                ),
                error: Error::HttpRequestDenied,
            });
        }
        let sent = head + request.body().size_hint().exact().unwrap_or(0);
        // One of the process's descriptors for tools, held as long as the connection: a
        // request queues for it until the call's deadline.
        let fd = descriptors.take(1, plan.deadline).await.map_err(|e| deny(e.to_string()))?;
        let addrs = resolve(&plan, &host, port).await?;
        let stream = connect(&addrs, plan.deadline).await?;
        ledger.update(at, |r| r.sent = sent);
        let (response, io) = exchange(stream, scheme, &host, request, plan.deadline).await?;
        Ok((response, io, sent, fd))
    };
    let outcome = tokio::select! {
        biased;
        () = ledger.ended() => None,
        r = attempt => Some(r),
    };
    let Some(outcome) = outcome else {
        // The call ended first: the request is cancelled (its connection dropped here).
        let ms = started.elapsed().as_secs_f64() * 1e3;
        ledger.update(at, |r| {
            r.outcome = "cancelled".into();
            r.reason = Some(cancelled_reason(r.sent).into());
            r.ms = ms;
        });
        return Err(Error::ConnectionTerminated);
    };
    match outcome {
        Ok((response, io, sent, fd)) => {
            let status = response.status().as_u16();
            ledger.update(at, |r| {
                r.status = Some(status);
                r.sent = sent;
            });
            finish("ok", None);
            let cap = plan.grants.max_bytes;
            let (head, incoming) = response.into_parts();
            let body = Metered { inner: incoming, ledger: ledger.clone(), at, cap };
            // The connection's remaining work stops when the call ends; the request counts as
            // in flight until then.
            let io: IoFuture = Box::new(async move {
                let _in_flight = in_flight;
                let _fd = fd;
                let ledger = _in_flight.0.clone();
                tokio::select! {
                    biased;
                    () = ledger.ended() => Ok(()),
                    r = Pin::from(io) => r,
                }
            });
            Ok((http::Response::from_parts(head, body.boxed_unsync()), io))
        }
        Err(stop) => {
            let outcome = if stop.denied { "denied" } else { "failed" };
            finish(outcome, Some(stop.reason));
            Err(stop.error)
        }
    }
}

/// Refuses a request that carries a granted secret's value towards a destination the secret
/// is not bound to (see [`super::reflect`]).
fn check_reflections(
    reflections: &Reflections,
    secrets: &[(SecretBinding, Secret)],
    parts: &http::request::Parts,
    body: &[u8],
    scheme: Scheme,
    host: &str,
    port: u16,
) -> Result<(), Stop> {
    let uri = parts.uri.to_string();
    let places = std::iter::once(("URL", uri.as_bytes()))
        .chain(parts.headers.iter().map(|(_, v)| ("a header", v.as_bytes())))
        .chain(std::iter::once(("the body", body)));
    for (place, bytes) in places {
        if let Some(found) = reflections.elsewhere(secrets, bytes, scheme, host, port) {
            let bound = match found.binding {
                Some(b) => format!(
                    "which is bound to {}://{}:{}, not to this destination",
                    b.scheme.as_str(),
                    super::grant::HostPattern::Exact(b.host.clone()),
                    b.port
                ),
                None => "which this call binds to no destination".to_string(),
            };
            return Err(deny(format!(
                "{place} carries the value of secret `{}` ({}), {bound}; nothing was sent",
                found.name, found.form
            )));
        }
    }
    Ok(())
}

fn check_grant(grants: &NetGrants, scheme: Scheme, host: &str, port: u16) -> Result<(), Stop> {
    if grants.allow.iter().any(|r| r.allows(scheme, host, port)) {
        return Ok(());
    }
    let shown = super::grant::HostPattern::Exact(host.to_string());
    Err(deny(if grants.allow.is_empty() {
        format!(
            "no network is granted to this call, so {}://{shown}:{port} was not contacted (grant it with --net)",
            scheme.as_str()
        )
    } else {
        format!(
            "no --net grant allows {}://{shown}:{port} (granted: {})",
            scheme.as_str(),
            grants.allow.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
        )
    }))
}

/// Reads the request body within what is left of the call's byte cap.
async fn read_body(body: WasiBody, ledger: &Ledger, cap: u64) -> Result<Bytes, Stop> {
    let mut body = std::pin::pin!(body);
    let mut out = bytes::BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| fail(format!("reading the request body: {e}"), e))?;
        if let Ok(data) = frame.into_data() {
            if let Err(left) = ledger.take(data.len() as u64, cap) {
                return Err(Stop {
                    denied: true,
                    reason: format!(
                        "the request body passes the call's network byte cap of {cap} bytes ({left} were left); nothing was sent"
                    ),
                    error: Error::HttpRequestBodySize(Some(left)),
                });
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out.freeze())
}
