//! A session's events (a JSON page, or a Server-Sent Events stream that resumes after a
//! drop and ends when the token is revoked) and the files inside its grants.

use super::*;

#[derive(Deserialize, IntoParams)]
pub struct EventsQuery {
    /// Events after this sequence number (default 0). `Last-Event-ID` overrides it.
    pub after: Option<i64>,
    /// At most this many (JSON only; default and maximum 1000).
    pub limit: Option<usize>,
}

/// Largest number of events of one JSON answer.
const MAX_EVENTS: usize = 1000;

/// The session's durable events: Server-Sent Events with `Accept: text/event-stream`
/// (resumable with `Last-Event-ID`; each event's id is its sequence number, its data the
/// event as JSON with its `kind`; a store failure arrives as a `failure` event), a JSON array
/// otherwise. The stream also carries the text a model is writing, as it arrives: transient
/// `text_delta` events (`{"step", "text"}`, no id; `"restart": true` when the text so far is
/// void because its call is made again) before the durable message.
#[utoipa::path(get, path = "/sessions/{id}/events", params(("id" = String, Path), EventsQuery), responses((status = 200, description = "a JSON array, or an event stream", body = Object), (status = 404, body = ErrorBody)))]
pub(super) async fn events(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<EventsQuery>,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let last_id = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.trim().parse::<i64>().map_err(|_| {
                Failure::new("input", "Last-Event-ID must be an event's sequence number")
            })
        })
        .transpose()?;
    let after = last_id.or(q.after).unwrap_or(0).max(0);
    // What a user is not shown of the host (the model server, grants' host directories),
    // replaced in every event they get: an error may quote it.
    let hidden = Arc::new(match caller.is_admin() {
        true => keel::api::shown::Hidden::new(&caller.who(), &[], &[]),
        false => {
            let meta = app.harness.session(&caller.who(), &id).await?;
            keel::api::shown::Hidden::of_session(&caller.who(), &meta)
        }
    });
    let stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !stream {
        let limit = q.limit.unwrap_or(MAX_EVENTS).clamp(1, MAX_EVENTS);
        let rows = app.harness.events(&caller.who(), &id, after, limit).await?;
        let mut rows = json!(rows);
        hidden.value(&mut rows);
        return Ok(Json(json!({"ok": true, "events": rows})).into_response());
    }
    let rx = app.harness.follow(&caller.who(), &id, after, Duration::from_millis(100)).await?;
    let text = app.harness.follow_text(&caller.who(), &id).await?;
    let tick = tokio::time::interval(Duration::from_millis(100));
    let follow = Follow {
        rx,
        text,
        tick,
        access: Some(app.access.subscribe()),
        stopping: app.stopping.subscribe(),
        app,
        caller,
        hidden,
        ended: false,
    };
    let events = futures_util::stream::unfold(follow, |mut f| async move {
        if f.ended {
            return None;
        }
        loop {
            tokio::select! {
                row = f.rx.recv() => {
                    let event = match row? {
                        // Unnamed events (an EventSource's `message`): the kind is in the data.
                        Ok(row) => {
                            let mut data = json!(row);
                            f.hidden.value(&mut data);
                            let data = data.to_string();
                            Event::default().id(row.seq.to_string()).data(data)
                        }
                        Err(e) => failure_event(e.kind(), &e.to_string()),
                    };
                    return Some((Ok::<_, Infallible>(event), f));
                }
                _ = f.tick.tick() => {
                    let deltas = f.text.poll();
                    if deltas.is_empty() {
                        continue;
                    }
                    // The pieces read in one look go as one event; after a restart (the text
                    // so far is void, the call is made again), only what followed it.
                    let restart = deltas.iter().rposition(|d| d.restart);
                    let step = deltas.last().map_or(0, |d| d.step);
                    let text: String =
                        deltas[restart.unwrap_or(0)..].iter().map(|d| d.text.as_str()).collect();
                    let text = f.hidden.text(&text).into_owned();
                    let mut data = json!({"step": step, "text": text});
                    if restart.is_some() {
                        data["restart"] = json!(true);
                    }
                    let event = Event::default().event("text_delta").data(data.to_string());
                    return Some((Ok(event), f));
                }
                // The server stops (SIGTERM, Ctrl-C): the stream ends at once, so that the
                // connection closes and the port is free for the next start.
                _ = f.stopping.changed() => {
                    f.ended = true;
                    let why = "the server is stopping: this stream ends here (reconnect with Last-Event-ID)";
                    return Some((Ok(failure_event("unavailable", why)), f));
                }
                changed = async { f.access.as_mut()?.changed().await.ok() }, if f.access.is_some() => {
                    if changed.is_none() {
                        f.access = None;
                    } else if !f.app.still_valid(&f.caller).await {
                        // The token was revoked (or the login ended): the stream ends now.
                        f.ended = true;
                        let why = "the token of this stream was revoked: it ends here";
                        return Some((Ok(failure_event("unauthorized", why)), f));
                    }
                }
            }
        }
    });
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

/// An open event stream: the session's events, and the tokens' version to re-check its caller
/// against.
struct Follow {
    rx: tokio::sync::mpsc::Receiver<
        Result<keel::protocol::events::EventRow, keel::protocol::setup::StoreError>,
    >,
    /// The text a model is writing, read every tick.
    text: keel::protocol::sessions::LiveReader,
    tick: tokio::time::Interval,
    access: Option<tokio::sync::watch::Receiver<i64>>,
    /// Whether the server is stopping.
    stopping: tokio::sync::watch::Receiver<bool>,
    app: Arc<App>,
    caller: Caller,
    hidden: Arc<keel::api::shown::Hidden>,
    ended: bool,
}

fn failure_event(kind: &str, message: &str) -> Event {
    Event::default()
        .event("failure")
        .data(json!({"error": {"kind": kind, "message": message}}).to_string())
}

#[derive(Deserialize, IntoParams)]
pub struct FilesQuery {
    /// The grant's guest path (e.g. `/work`).
    pub grant: String,
    /// A directory inside the grant (default: its root).
    pub path: Option<String>,
}

/// One directory inside one of the session's grants (nothing outside them is read).
#[utoipa::path(get, path = "/sessions/{id}/files", params(("id" = String, Path), FilesQuery), responses((status = 200, body = crate::http::files::Listing), (status = 404, body = ErrorBody)))]
pub(super) async fn files(
    State(app): Shared,
    caller: Caller,
    Path(id): Path<String>,
    Query(q): Query<FilesQuery>,
) -> Result<Json<crate::http::files::Listing>, Failure> {
    let meta = app.harness.session(&caller.who(), &id).await?;
    let path = q.path.unwrap_or_default();
    crate::http::files::listing(&caller.who(), &meta, q.grant, path).await.map(Json)
}
