//! The HTTP listeners of keel's network front-ends (`keel serve` and its metrics listener,
//! `keel mcp serve --http`): they accept connections and serve each with hyper under bounds a
//! slow or idle client cannot outlast, so that what one client holds is bounded and everyone
//! else is still served. Every listener of a process draws on one [`Budget`].
//!
//! - **Headers** must arrive within [`Bounds::header_timeout`] of a request's first byte.
//! - **A request body** must arrive whole within [`Bounds::anonymous_body_timeout`] while the
//!   request has not proved who it is, within [`Bounds::body_timeout`] once it has (see
//!   [`Seat::claim`]); past it the body reads fail with [`BodyTimeout`] (the front-end
//!   answers 408).
//! - **An idle connection** (no request in progress and no byte for
//!   [`Bounds::idle_timeout`]) is closed.
//! - **At most [`Bounds::max_connections`]** are open, across every listener. A new
//!   connection past the cap takes the place of the connection idle the longest (a half-sent
//!   request counts as idle: no handler runs for it), else of the one whose request without a
//!   credential started first; when every connection is serving a request that proved who it
//!   is, the newcomer gets a 503.
//! - **Requests without a credential** in progress (login forms, the token-less metrics page,
//!   anything before its token is checked) are at most [`Bounds::anonymous_share`]; past it
//!   the oldest of them gives way.
//! - **One user's token** holds at most [`Bounds::per_user`] requests in progress (event
//!   streams included), and users together at most [`Bounds::users_share`]: the rest is the
//!   admins' room. A request past its share is refused (429) when it claims its seat.
//!
//! A request is "in progress" from the moment its handler starts until its response body
//! ends (an event stream stays in progress as long as it is open).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body::{Frame, SizeHint};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;

pub use keel::protocol::setup::config::Bounds;

/// A request body that took longer than its deadline.
#[derive(Debug, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimeout(pub Duration);

/// Whether `e` (or what caused it) is a [`BodyTimeout`].
pub fn is_body_timeout(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if e.is::<BodyTimeout>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// A body with what the listener adds to it: a request body fails once its seat's deadline
/// passes; a response body keeps its request in progress until it ends or is dropped.
struct Guarded {
    inner: Body,
    /// The request's seat (its body deadline) and the sleep towards that deadline.
    deadline: Option<(Seat, Instant, Pin<Box<tokio::time::Sleep>>)>,
    /// Set once the request body was read to its end.
    read: Option<Arc<AtomicBool>>,
    _busy: Option<Busy>,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        if let Poll::Ready(frame) = Pin::new(&mut self.inner).poll_frame(cx) {
            if let Some(read) = &self.read
                && (frame.is_none() || self.inner.is_end_stream())
            {
                read.store(true, Ordering::Release);
            }
            return Poll::Ready(frame);
        }
        if let Some((seat, at, sleep)) = &mut self.deadline {
            // The deadline moves once, when the request proves who it is.
            let now = seat.0.deadline();
            if now != *at {
                *at = now;
                sleep.as_mut().reset(tokio::time::Instant::from_std(now));
            }
            if sleep.as_mut().poll(cx).is_ready() {
                let limit = seat.0.limit();
                return Poll::Ready(Some(Err(axum::Error::new(BodyTimeout(limit)))));
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// One open connection as the listener sees it.
struct Conn {
    /// Milliseconds since the budget began at the last byte read or request finished.
    active_at: AtomicU64,
    /// Requests in progress.
    busy: AtomicUsize,
    /// Requests in progress that have not proved who they are (changed under the budget's
    /// lock only, so a look under it never sees a request half counted).
    unclaimed: AtomicUsize,
    /// Requests whose credential is being checked (a store read): they do not give way as
    /// requests without a credential meanwhile.
    verifying: AtomicUsize,
    /// Milliseconds since the budget began when its current request started.
    busy_since: AtomicU64,
    /// Whether a request on it ever proved who it is: an idle connection that never did gives
    /// way before one that did.
    trusted: AtomicBool,
    /// Told when the connection must close now (it was displaced).
    close: Notify,
}

impl Conn {
    /// Serving a request that has not proved who it is (read under the budget's lock).
    fn anonymous(&self) -> bool {
        self.unclaimed.load(Ordering::Acquire) > 0 && self.verifying.load(Ordering::Acquire) == 0
    }
}

/// Who holds a claimed seat.
#[derive(Debug, Clone)]
struct Claim {
    who: String,
    admin: bool,
}

/// A request's place in the budget, in its extensions: the front-end claims it for the
/// principal the request proved to be ([`Seat::claim`]), which lengthens its body deadline
/// and counts it in that principal's share.
#[derive(Clone)]
pub struct Seat(Arc<SeatState>);

struct SeatState {
    budget: Budget,
    conn: Arc<Conn>,
    peer: std::net::SocketAddr,
    local: std::net::SocketAddr,
    started: Instant,
    claim: Mutex<Option<Claim>>,
}

impl SeatState {
    fn deadline(&self) -> Instant {
        self.started + self.limit()
    }

    fn limit(&self) -> Duration {
        let claimed = self.claim.lock().unwrap_or_else(PoisonError::into_inner).is_some();
        match claimed {
            true => self.budget.0.bounds.body_timeout,
            false => self.budget.0.bounds.anonymous_body_timeout(),
        }
    }
}

/// Why a seat could not be claimed.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error(
        "{held} requests of this token are in progress, its share of the server's connections \
         ([serve] max_connections_per_user): close an event stream or try again"
    )]
    Share { held: usize },
    #[error(
        "the connections users may hold are all in use (the rest is kept for admins): try again"
    )]
    Room,
}

impl Seat {
    /// Marks the request as having its credential checked until the guard is dropped:
    /// meanwhile it does not give way as a request without one (a flood of those would
    /// otherwise outrun a store read).
    pub fn verifying(&self) -> Verifying {
        self.0.conn.verifying.fetch_add(1, Ordering::AcqRel);
        Verifying(self.0.conn.clone())
    }

    /// The address the request came from.
    pub fn peer(&self) -> std::net::SocketAddr {
        self.0.peer
    }

    /// The address the request was sent to (the listener's).
    pub fn local(&self) -> std::net::SocketAddr {
        self.0.local
    }

    /// Claims the seat for principal `who` (an admin or not): its body now has the full body
    /// deadline, and it counts in `who`'s share. Refused when a user (not an admin) would
    /// hold more than their share, or users together more than theirs. A second claim of
    /// the same seat changes nothing.
    pub fn claim(&self, who: &str, admin: bool) -> Result<(), Refused> {
        let b = &self.0.budget.0;
        let mut state = b.state.lock().unwrap_or_else(PoisonError::into_inner);
        let mut claim = self.0.claim.lock().unwrap_or_else(PoisonError::into_inner);
        if claim.is_some() {
            return Ok(());
        }
        if !admin {
            let held = state.held.get(who).copied().unwrap_or(0);
            if held >= b.bounds.per_user() {
                b.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Share { held });
            }
            if state.users >= b.bounds.users_share() {
                b.refused.fetch_add(1, Ordering::Relaxed);
                return Err(Refused::Room);
            }
            state.users += 1;
            *state.held.entry(who.to_string()).or_default() += 1;
        }
        state.anonymous = state.anonymous.saturating_sub(1);
        self.0.conn.unclaimed.fetch_sub(1, Ordering::AcqRel);
        self.0.conn.trusted.store(true, Ordering::Release);
        *claim = Some(Claim { who: who.to_string(), admin });
        Ok(())
    }
}

/// A credential being checked (see [`Seat::verifying`]).
pub struct Verifying(Arc<Conn>);

impl Drop for Verifying {
    fn drop(&mut self) {
        self.0.verifying.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request in progress on a connection: counted until it is dropped (its response body
/// ended).
struct Busy(Seat);

impl Busy {
    fn new(seat: Seat) -> Self {
        let s = &seat.0;
        s.conn.busy_since.store(millis(&s.budget.0.epoch), Ordering::Release);
        s.conn.busy.fetch_add(1, Ordering::AcqRel);
        let b = &s.budget.0;
        let mut state = b.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.anonymous += 1;
        s.conn.unclaimed.fetch_add(1, Ordering::AcqRel);
        // Past the share of requests without a credential, the oldest of them gives way.
        if state.anonymous > b.bounds.anonymous_share() {
            let oldest = state
                .conns
                .iter()
                .filter(|(_, c)| !Arc::ptr_eq(c, &s.conn) && c.anonymous())
                .min_by_key(|(_, c)| c.busy_since.load(Ordering::Acquire))
                .map(|(id, _)| *id);
            if let Some(c) = oldest.and_then(|id| state.conns.remove(&id)) {
                c.close.notify_one();
                b.displaced.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(state);
        Self(seat)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let s = &self.0.0;
        let b = &s.budget.0;
        let claim = s.claim.lock().unwrap_or_else(PoisonError::into_inner).clone();
        {
            let mut state = b.state.lock().unwrap_or_else(PoisonError::into_inner);
            match claim {
                None => {
                    state.anonymous = state.anonymous.saturating_sub(1);
                    s.conn.unclaimed.fetch_sub(1, Ordering::AcqRel);
                }
                Some(Claim { admin: true, .. }) => {}
                Some(Claim { who, admin: false }) => {
                    state.users = state.users.saturating_sub(1);
                    if let Some(n) = state.held.get_mut(&who) {
                        *n -= 1;
                        if *n == 0 {
                            state.held.remove(&who);
                        }
                    }
                }
            }
        }
        s.conn.active_at.store(millis(&b.epoch), Ordering::Release);
        s.conn.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

fn millis(epoch: &Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// What a budget counts, under one lock.
#[derive(Default)]
struct State {
    conns: HashMap<u64, Arc<Conn>>,
    /// Requests in progress without a claimed seat.
    anonymous: usize,
    /// Requests in progress claimed by users (not admins), all together and by principal.
    users: usize,
    held: HashMap<String, usize>,
}

/// The connections of every listener of a process, and what they may hold: made once (its
/// cap fitted to the open-file limit) and shared by each listener the process serves.
#[derive(Clone)]
pub struct Budget(Arc<Table>);

struct Table {
    bounds: Bounds,
    epoch: Arc<Instant>,
    next: AtomicU64,
    state: Mutex<State>,
    /// Connections displaced or refused for the cap (for the log and tests).
    displaced: AtomicU64,
    /// Seats refused for a share.
    refused: AtomicU64,
}

impl Budget {
    /// A budget of `bounds`, its cap fitted to the open-file limit.
    pub fn new(bounds: Bounds) -> Self {
        Self::exact(bounds.fitted())
    }

    fn exact(bounds: Bounds) -> Self {
        Self(Arc::new(Table {
            bounds,
            epoch: Arc::new(Instant::now()),
            next: AtomicU64::new(0),
            state: Mutex::new(State::default()),
            displaced: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        }))
    }

    /// The bounds it keeps (the cap as fitted).
    pub fn bounds(&self) -> Bounds {
        self.0.bounds
    }

    /// Admits a new connection; past the cap, the one idle the longest is told to close,
    /// else the one whose request without a credential started first. `None` when every
    /// connection is serving a request that proved who it is.
    fn admit(&self) -> Option<(u64, Arc<Conn>)> {
        let t = &self.0;
        let mut state = t.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.conns.len() >= t.bounds.max_connections {
            if !Self::displace(&mut state.conns) {
                return None;
            }
            t.displaced.fetch_add(1, Ordering::Relaxed);
        }
        let id = t.next.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            active_at: AtomicU64::new(millis(&t.epoch)),
            busy: AtomicUsize::new(0),
            unclaimed: AtomicUsize::new(0),
            verifying: AtomicUsize::new(0),
            busy_since: AtomicU64::new(0),
            trusted: AtomicBool::new(false),
            close: Notify::new(),
        });
        state.conns.insert(id, conn.clone());
        Some((id, conn))
    }

    /// Tells a connection to close, in this order: the one idle the longest of those on which
    /// no request ever proved who it is (a flood of new connections, accepted faster than
    /// their requests start, is that); else the oldest serving only a request without a
    /// credential; else the one idle the longest (an authenticated client's kept-alive
    /// connection). False if none is any of these.
    fn displace(conns: &mut HashMap<u64, Arc<Conn>>) -> bool {
        let idle = |trusted: bool| {
            conns
                .iter()
                .filter(|(_, c)| {
                    c.busy.load(Ordering::Acquire) == 0
                        && c.trusted.load(Ordering::Acquire) == trusted
                })
                .min_by_key(|(_, c)| c.active_at.load(Ordering::Acquire))
                .map(|(id, _)| *id)
        };
        let anonymous = || {
            conns
                .iter()
                .filter(|(_, c)| c.anonymous())
                .min_by_key(|(_, c)| c.busy_since.load(Ordering::Acquire))
                .map(|(id, _)| *id)
        };
        let chosen = idle(false).or_else(anonymous).or_else(|| idle(true));
        match chosen.and_then(|id| conns.remove(&id)) {
            Some(c) => {
                c.close.notify_one();
                true
            }
            None => false,
        }
    }

    /// Makes room for a connection the process could not accept (out of file descriptors).
    fn make_room(&self) {
        let mut state = self.0.state.lock().unwrap_or_else(PoisonError::into_inner);
        if Self::displace(&mut state.conns) {
            self.0.displaced.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn remove(&self, id: u64) {
        self.0.state.lock().unwrap_or_else(PoisonError::into_inner).conns.remove(&id);
    }

    #[cfg(test)]
    fn open(&self) -> usize {
        self.0.state.lock().unwrap().conns.len()
    }
}

/// A stream that notes when it last read a byte.
struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
    epoch: Arc<Instant>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.conn.active_at.store(millis(&self.epoch), Ordering::Release);
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// How long a stopping listener waits for requests in progress.
const DRAIN: Duration = Duration::from_secs(5);

/// The answer to a connection past the cap when every open one is serving a request.
const FULL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
connection: close\r\ncontent-length: 103\r\n\r\n\
{\"ok\":false,\"error\":{\"kind\":\"busy\",\"message\":\"the server is at its connection cap: try again\"}}\n";

/// Serves `router` on `listener` within `budget` (shared with the process's other listeners)
/// until `shutdown` completes; then stops accepting, lets requests in progress finish (at
/// most 5 s) and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    budget: Budget,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let stopping = Arc::new(tokio::sync::watch::Sender::new(false));
    let mut shutdown = std::pin::pin!(shutdown);
    let mut tasks = tokio::task::JoinSet::new();
    let displaced_before = budget.0.displaced.load(Ordering::Relaxed);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
            Some(_) = tasks.join_next(), if !tasks.is_empty() => continue,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors (or another transient failure): make room by
                // closing the longest-idle connection, and try again shortly.
                tracing::warn!("accepting a connection failed: {e}");
                budget.make_room();
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Some((id, conn)) = budget.admit() else {
            tasks.spawn(refuse_full(stream));
            continue;
        };
        let budget = budget.clone();
        let router = router.clone();
        let stopping = stopping.subscribe();
        tasks.spawn(async move {
            connection(stream, peer, conn, budget.clone(), router, stopping).await;
            budget.remove(id);
        });
    }
    let _ = stopping.send(true);
    let _ = tokio::time::timeout(DRAIN + Duration::from_secs(1), async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    let displaced = budget.0.displaced.load(Ordering::Relaxed) - displaced_before;
    if displaced > 0 {
        tracing::info!("{displaced} connections were closed for the connection cap or shares");
    }
    Ok(())
}

async fn refuse_full(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let _ = tokio::time::timeout(Duration::from_secs(1), stream.write_all(FULL)).await;
}

/// Serves one connection until the client closes it, it idles out, it is displaced, or the
/// listener stops.
async fn connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    conn: Arc<Conn>,
    budget: Budget,
    router: axum::Router,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) {
    let epoch = budget.0.epoch.clone();
    let bounds = budget.0.bounds;
    let local = stream.local_addr().unwrap_or(peer);
    let io = TokioIo::new(Tracked { inner: stream, conn: conn.clone(), epoch: epoch.clone() });
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let seat = Seat(Arc::new(SeatState {
                budget: budget.clone(),
                conn: conn.clone(),
                peer,
                local,
                started: Instant::now(),
                claim: Mutex::new(None),
            }));
            let busy = Busy::new(seat.clone());
            let router = router.clone();
            async move {
                let read = Arc::new(AtomicBool::new(http_body::Body::is_end_stream(req.body())));
                let at = seat.0.deadline();
                let sleep = Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(at)));
                let mut req = req.map(|b| {
                    Body::new(Guarded {
                        inner: Body::new(b),
                        deadline: Some((seat.clone(), at, sleep)),
                        read: Some(read.clone()),
                        _busy: None,
                    })
                });
                req.extensions_mut().insert(seat);
                let res = tower::ServiceExt::oneshot(router, req).await;
                res.map(|mut r| {
                    // Answered before its body was read (refused, say): the rest of the body
                    // is never read, so the connection cannot carry another request. Say so,
                    // so that the client does not send one on it.
                    if !read.load(Ordering::Acquire) {
                        r.headers_mut().insert(
                            axum::http::header::CONNECTION,
                            axum::http::HeaderValue::from_static("close"),
                        );
                    }
                    r.map(|b| {
                        Body::new(Guarded {
                            inner: b,
                            deadline: None,
                            read: None,
                            _busy: Some(busy),
                        })
                    })
                })
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(bounds.header_timeout);
    let served = builder.serve_connection(io, service);
    let mut served = std::pin::pin!(served);
    loop {
        let idle_left = if conn.busy.load(Ordering::Acquire) > 0 {
            bounds.idle_timeout
        } else {
            let since = millis(&epoch).saturating_sub(conn.active_at.load(Ordering::Acquire));
            bounds.idle_timeout.saturating_sub(Duration::from_millis(since))
        };
        tokio::select! {
            _ = served.as_mut() => return,
            () = conn.close.notified() => return,
            () = tokio::time::sleep(idle_left) => {
                let since = millis(&epoch).saturating_sub(conn.active_at.load(Ordering::Acquire));
                if conn.busy.load(Ordering::Acquire) == 0
                    && Duration::from_millis(since) >= bounds.idle_timeout
                {
                    return;
                }
            }
            _ = stopping.changed() => {
                served.as_mut().graceful_shutdown();
                let _ = tokio::time::timeout(DRAIN, served.as_mut()).await;
                return;
            }
        }
    }
}

/// Whether a `Host` header names a loopback address (`localhost`, `127.0.0.1`, `[::1]`, with
/// or without a port): what a scraper on the same machine sends, and what a page from another
/// site rebinding a name to loopback cannot.
pub fn loopback_host(host: &str) -> bool {
    let name = match host.rsplit_once(':') {
        Some((n, port)) if port.chars().all(|c| c.is_ascii_digit()) => n,
        _ => host,
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_checked() {
        Bounds::default().check().unwrap();
        let b = Bounds { header_timeout: Duration::ZERO, ..Default::default() };
        assert!(b.check().unwrap_err().contains("header_timeout_secs"));
        let b = Bounds { max_connections: 0, ..Default::default() };
        assert!(b.check().unwrap_err().contains("max_connections"));
        let b = Bounds { max_per_user: Some(2000), ..Default::default() };
        assert!(b.check().unwrap_err().contains("max_connections_per_user"));
        let d = Bounds::default();
        assert_eq!((d.anonymous_share(), d.per_user(), d.users_share()), (128, 256, 896));
        assert_eq!(d.anonymous_body_timeout(), d.header_timeout);
        let one = Bounds { max_connections: 1, ..Default::default() };
        assert_eq!((one.anonymous_share(), one.per_user(), one.users_share()), (1, 1, 1));
    }

    fn budget(cap: usize) -> Budget {
        Budget::exact(Bounds { max_connections: cap, ..Default::default() })
    }

    fn seat(b: &Budget, conn: &Arc<Conn>) -> Seat {
        Seat(Arc::new(SeatState {
            budget: b.clone(),
            conn: conn.clone(),
            peer: "127.0.0.1:1".parse().unwrap(),
            local: "127.0.0.1:2".parse().unwrap(),
            started: Instant::now(),
            claim: Mutex::new(None),
        }))
    }

    #[test]
    fn the_longest_idle_connection_gives_way_then_the_oldest_without_a_credential() {
        let b = budget(3);
        let (a, ca) = b.admit().unwrap();
        let (_, cb) = b.admit().unwrap();
        let (c, cc) = b.admit().unwrap();
        ca.active_at.store(5, Ordering::Release);
        cb.active_at.store(10, Ordering::Release);
        cc.active_at.store(20, Ordering::Release);
        let sb = seat(&b, &cb);
        let _busy_b = Busy::new(sb.clone());
        sb.claim("admin", true).unwrap();
        // A fourth connection displaces `a` (idle), not `b` (serving an admin).
        let (_, cd) = b.admit().unwrap();
        assert!(!b.0.state.lock().unwrap().conns.contains_key(&a));
        assert_eq!(b.open(), 3);
        // `c` and `d` serve requests without a credential, `c`'s the older: it gives way.
        cc.busy_since.store(1, Ordering::Release);
        let _busy_c = Busy::new(seat(&b, &cc));
        cc.busy_since.store(1, Ordering::Release);
        let sd = seat(&b, &cd);
        let _busy_d = Busy::new(sd.clone());
        let (_, _ce) = b.admit().unwrap();
        assert!(!b.0.state.lock().unwrap().conns.contains_key(&c));
        // Once `d` claims its seat, nothing more can give way.
        sd.claim("alice", false).unwrap();
        let e_seat = seat(&b, &_ce);
        let _busy_e = Busy::new(e_seat.clone());
        e_seat.claim("bob", false).unwrap();
        assert!(b.admit().is_none(), "every connection serves a request that proved who it is");
        assert_eq!(b.0.displaced.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_user_holds_their_share_and_admins_keep_room() {
        // 16 connections: a user may hold 4, users together 14; anonymous requests 2.
        let b = budget(16);
        assert_eq!((b.bounds().per_user(), b.bounds().users_share()), (4, 14));
        let mut held = Vec::new();
        for _ in 0..16 {
            let (_, c) = b.admit().unwrap();
            let s = seat(&b, &c);
            held.push((Busy::new(s.clone()), s));
        }
        for (_, s) in &held[..4] {
            s.claim("alice", false).unwrap();
        }
        let refused = held[4].1.claim("alice", false).unwrap_err();
        assert!(matches!(refused, Refused::Share { held: 4 }), "{refused}");
        for (i, (_, s)) in held[4..14].iter().enumerate() {
            s.claim(&format!("user{}", i / 4), false).unwrap();
        }
        assert!(matches!(held[14].1.claim("carol", false), Err(Refused::Room)));
        // An admin is never refused a seat.
        held[14].1.claim("root", true).unwrap();
        held[15].1.claim("root", true).unwrap();
        // A finished request gives its share back.
        held.remove(0);
        let (_, c) = b.admit().unwrap();
        let s = seat(&b, &c);
        let _busy = Busy::new(s.clone());
        s.claim("alice", false).unwrap();
    }

    #[test]
    fn an_authenticated_clients_idle_connection_gives_way_last() {
        let b = budget(3);
        let (_, admin) = b.admit().unwrap();
        let s = seat(&b, &admin);
        drop({
            let busy = Busy::new(s.clone());
            s.claim("admin", true).unwrap();
            busy
        });
        admin.active_at.store(0, Ordering::Release);
        // Two new connections, accepted after the admin's went idle: they give way first.
        let (x, cx) = b.admit().unwrap();
        let (_, cy) = b.admit().unwrap();
        cx.active_at.store(10, Ordering::Release);
        cy.active_at.store(20, Ordering::Release);
        let _ = b.admit().unwrap();
        assert!(!b.0.state.lock().unwrap().conns.contains_key(&x));
        assert_eq!(b.open(), 3);
        assert!(b.0.state.lock().unwrap().conns.values().any(|c| Arc::ptr_eq(c, &admin)));
    }

    #[test]
    fn past_the_anonymous_share_the_oldest_request_without_a_credential_gives_way() {
        let b = budget(16);
        assert_eq!(b.bounds().anonymous_share(), 2);
        let mut held = Vec::new();
        for i in 0..3 {
            let (_, c) = b.admit().unwrap();
            c.busy_since.store(i, Ordering::Release);
            held.push((Busy::new(seat(&b, &c)), c));
        }
        // The third displaced the first (the oldest request without a credential).
        assert_eq!(b.open(), 2);
        assert_eq!(b.0.displaced.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_seat_claimed_gets_the_full_body_deadline() {
        let b = Budget::exact(Bounds {
            header_timeout: Duration::from_secs(5),
            body_timeout: Duration::from_secs(60),
            ..Default::default()
        });
        let (_, c) = b.admit().unwrap();
        let s = seat(&b, &c);
        assert_eq!(s.0.limit(), Duration::from_secs(5));
        s.claim("alice", false).unwrap();
        assert_eq!(s.0.limit(), Duration::from_secs(60));
    }

    #[test]
    fn a_timed_out_body_is_recognised_through_its_wrappers() {
        let e = axum::Error::new(BodyTimeout(Duration::from_secs(1)));
        assert!(is_body_timeout(&e));
        let other = std::io::Error::other("x");
        assert!(!is_body_timeout(&other));
    }
}
