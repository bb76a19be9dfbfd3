//! A scripted OpenAI-compatible model server on loopback, speaking real HTTP/1.1: it records
//! every request body byte for byte and answers each request with the next scripted reply.
//!
//! Task-understanding calls (their system message is keel's understanding instructions) are
//! kept apart: they are recorded in [`MockModel::understanding_requests`], not in
//! [`MockModel::requests`], and answered from their own script
//! ([`MockModel::push_understanding`]), or with `uncertain` and no terms when it is empty.
//! Orchestrator calls are kept apart the same way ([`MockModel::orchestration_requests`],
//! [`MockModel::push_orchestration`]; nothing is selected when its script is empty) — so the
//! business script of a test is the loop's alone.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One scripted reply.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with a JSON body (a non-streamed completion).
    Json(Value),
    /// 200 with SSE events (`data: …`), ended by `data: [DONE]` unless `cut`.
    Sse { events: Vec<Value>, cut: bool },
    /// Any status, with an optional `Retry-After` (seconds) and a body.
    Status { code: u16, retry_after: Option<u32>, body: String },
    /// 200 with an empty body.
    Empty,
    /// A redirect (`code`, e.g. 301 or 307) to `location`.
    Redirect { code: u16, location: String },
    /// Waits, then replies.
    Delay(Duration, Box<Reply>),
    /// 200 with SSE events sent one at a time, `gap` apart (a slow local model streaming),
    /// then `data: [DONE]` after one more gap; the connection closes after it.
    Drip { events: Vec<Value>, gap: Duration },
}

impl Reply {
    /// This reply with the server's token `usage` added: as a last stream event without
    /// choices (as servers send it when asked with `stream_options.include_usage`), or in the
    /// JSON body.
    pub fn with_usage(self, prompt: u64, completion: u64, cached: Option<u64>) -> Self {
        let mut usage = json!({"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion});
        if let Some(c) = cached {
            usage["prompt_tokens_details"] = json!({"cached_tokens": c});
        }
        match self {
            Reply::Sse { mut events, cut } => {
                events.push(json!({"choices": [], "usage": usage}));
                Reply::Sse { events, cut }
            }
            Reply::Json(mut v) => {
                v["usage"] = usage;
                Reply::Json(v)
            }
            other => other,
        }
    }

    /// The events of a streamed reply (empty for any other).
    pub fn events(&self) -> Vec<Value> {
        match self {
            Reply::Sse { events, .. } | Reply::Drip { events, .. } => events.clone(),
            _ => Vec::new(),
        }
    }

    /// A non-streamed completion whose message content is `content`.
    pub fn completion(content: &str) -> Self {
        Reply::Json(json!({"choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": content}}]}))
    }

    /// A task-understanding answer: `relation` and the three groups of recall terms.
    pub fn understanding(relation: &str, skill: &[&str], tool: &[&str], memory: &[&str]) -> Self {
        Self::completion(
            &json!({"task_relation": relation, "skill_recall_terms": skill,
                "tool_recall_terms": tool, "memory_recall_terms": memory})
            .to_string(),
        )
    }

    /// An Orchestrator answer: the tool sets, tools and skills to add.
    pub fn selection(toolsets: &[&str], tools: &[&str], skills: &[&str]) -> Self {
        Self::completion(
            &json!({"toolsets": toolsets, "tools": tools, "skills": skills}).to_string(),
        )
    }

    /// A summary-call answer: the active request restated, and `notes`.
    pub fn summary(request: &str, notes: &[&str]) -> Self {
        Self::completion(
            &json!({"active_user_request": request, "decisions": ["keep going"], "constraints": [],
                "open_questions": [], "next_actions": ["continue the task"], "notes": notes})
            .to_string(),
        )
    }

    /// A streamed final answer, split in two content deltas.
    pub fn text(answer: &str) -> Self {
        let (a, b) = answer.split_at(answer.len() / 2);
        Reply::Sse {
            events: vec![
                json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": a}}]}),
                json!({"choices": [{"index": 0, "delta": {"content": b}}]}),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ],
            cut: false,
        }
    }

    /// A final answer streamed slowly: each of `pieces` a content delta, `gap` apart (a slow
    /// local model).
    pub fn drip_text(pieces: &[&str], gap: Duration) -> Self {
        let mut events: Vec<Value> = pieces
            .iter()
            .map(|p| json!({"choices": [{"index": 0, "delta": {"content": p}}]}))
            .collect();
        events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}));
        Reply::Drip { events, gap }
    }

    /// Streamed tool calls `(id, name, arguments)`, each with its id and name repeated in every
    /// delta and its arguments split across two chunks (as several real servers do).
    pub fn calls(calls: &[(&str, &str, &str)]) -> Self {
        let mut events = vec![
            json!({"choices": [{"index": 0, "delta": {"role": "assistant", "content": null}}]}),
        ];
        for (i, (id, name, args)) in calls.iter().enumerate() {
            let cut = args.len() / 2;
            let cut = (0..=cut).rev().find(|c| args.is_char_boundary(*c)).unwrap_or(0);
            for part in [&args[..cut], &args[cut..]] {
                events.push(json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                    {"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": part}}
                ]}}]}));
            }
        }
        events.push(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]}));
        Reply::Sse { events, cut: false }
    }
}

/// Computes a reply from the request body (for servers that answer many sessions at once).
pub type Responder = Arc<dyn Fn(&[u8]) -> Reply + Send + Sync>;

/// The server.
pub struct MockModel {
    addr: SocketAddr,
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    heads: Arc<Mutex<Vec<String>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
    understanding: Arc<Mutex<VecDeque<Reply>>>,
    understanding_requests: Arc<Mutex<Vec<Vec<u8>>>>,
    orchestration: Arc<Mutex<VecDeque<Reply>>>,
    orchestration_requests: Arc<Mutex<Vec<Vec<u8>>>>,
    summary: Arc<Mutex<VecDeque<Reply>>>,
    summary_requests: Arc<Mutex<Vec<Vec<u8>>>>,
    info: Arc<Mutex<ServerInfo>>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared {
    requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// The request line and headers of each recorded request.
    heads: Arc<Mutex<Vec<String>>>,
    script: Arc<Mutex<VecDeque<Reply>>>,
    /// Replies to task-understanding calls, and those calls' bodies.
    understanding: Arc<Mutex<VecDeque<Reply>>>,
    understanding_requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Replies to Orchestrator calls, and those calls' bodies.
    orchestration: Arc<Mutex<VecDeque<Reply>>>,
    orchestration_requests: Arc<Mutex<Vec<Vec<u8>>>>,
    /// Replies to summary calls (compactions), and those calls' bodies.
    summary: Arc<Mutex<VecDeque<Reply>>>,
    summary_requests: Arc<Mutex<Vec<Vec<u8>>>>,
    responder: Option<Responder>,
    record: bool,
    /// Answer 500 to a request whose history holds tool-call arguments that are not a JSON
    /// object, as llama.cpp's server does with any tool-capable template.
    strict: bool,
    /// Refuse a request longer than this many bytes as longer than the context window, with
    /// llama.cpp's HTTP 400 `exceed_context_size_error`.
    context_bytes: Option<usize>,
    /// Whether that refusal names the window (`n_ctx`), as llama.cpp's does; else it says
    /// only `context_length_exceeded`, as some servers do.
    context_named: bool,
    /// What `GET` requests see: the model list and llama.cpp's `/props`.
    info: Arc<Mutex<ServerInfo>>,
}

/// What the server answers to `GET {base}/models` and `GET /props` (404 for one unset), and
/// the paths of the GET requests it received.
#[derive(Default)]
struct ServerInfo {
    models: Option<Value>,
    props: Option<Value>,
    gets: Vec<String>,
}

impl Drop for MockModel {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl MockModel {
    /// Starts a server that answers with `script`, in order (a request past its end gets 500).
    pub async fn start(script: Vec<Reply>) -> Self {
        Self::start_with(script, None, true, false, None).await
    }

    /// Like [`start`](Self::start), but refusing — with llama.cpp's HTTP 400 "the request
    /// exceeds the available context size", without using up a scripted reply — every request
    /// of more than `bytes` bytes, as a server with a small context window does.
    pub async fn start_with_context(script: Vec<Reply>, bytes: usize) -> Self {
        Self::start_with(script, None, true, false, Some(bytes)).await
    }

    /// Like [`start`](Self::start), but refusing — with llama.cpp's HTTP 500 "Failed to parse
    /// tool call arguments as JSON", without using up a scripted reply — every request whose
    /// messages carry tool-call arguments that are not a JSON object.
    pub async fn start_strict(script: Vec<Reply>) -> Self {
        Self::start_with(script, None, true, true, None).await
    }

    /// Starts a server that computes each reply with `responder` and records nothing.
    pub async fn start_fn(responder: Responder) -> Self {
        Self::start_with(Vec::new(), Some(responder), false, false, None).await
    }

    /// A server that computes each reply with `responder` from the request alone, records
    /// the requests, and refuses every request of more than `bytes` bytes as longer than its
    /// context (as [`start_with_context`](Self::start_with_context)): a model that acts only
    /// on what a small window shows it.
    pub async fn start_fn_with_context(responder: Responder, bytes: usize) -> Self {
        Self::start_with(Vec::new(), Some(responder), true, false, Some(bytes)).await
    }

    async fn start_with(
        script: Vec<Reply>,
        responder: Option<Responder>,
        record: bool,
        strict: bool,
        context_bytes: Option<usize>,
    ) -> Self {
        Self::start_full(script, responder, record, strict, context_bytes, true).await
    }

    /// Like [`start_with_context`](Self::start_with_context), but the refusal names no window:
    /// HTTP 400 `context_length_exceeded` and nothing more.
    pub async fn start_with_unnamed_context(script: Vec<Reply>, bytes: usize) -> Self {
        Self::start_full(script, None, true, false, Some(bytes), false).await
    }

    async fn start_full(
        script: Vec<Reply>,
        responder: Option<Responder>,
        record: bool,
        strict: bool,
        context_bytes: Option<usize>,
        context_named: bool,
    ) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let requests = Arc::new(Mutex::new(Vec::new()));
        let heads = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(VecDeque::from(script)));
        let understanding = Arc::new(Mutex::new(VecDeque::new()));
        let understanding_requests = Arc::new(Mutex::new(Vec::new()));
        let orchestration = Arc::new(Mutex::new(VecDeque::new()));
        let orchestration_requests = Arc::new(Mutex::new(Vec::new()));
        let summary = Arc::new(Mutex::new(VecDeque::new()));
        let summary_requests = Arc::new(Mutex::new(Vec::new()));
        let info = Arc::new(Mutex::new(ServerInfo::default()));
        let shared = Arc::new(Shared {
            summary: summary.clone(),
            summary_requests: summary_requests.clone(),
            orchestration: orchestration.clone(),
            orchestration_requests: orchestration_requests.clone(),
            requests: requests.clone(),
            heads: heads.clone(),
            script: script.clone(),
            understanding: understanding.clone(),
            understanding_requests: understanding_requests.clone(),
            responder,
            record,
            strict,
            context_bytes,
            context_named,
            info: info.clone(),
        });
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(stream, &shared).await;
                });
            }
        });
        Self {
            addr,
            requests,
            heads,
            script,
            understanding,
            understanding_requests,
            orchestration,
            orchestration_requests,
            summary,
            summary_requests,
            info,
            task,
        }
    }

    /// Makes `GET /v1/models` answer `models` and `GET /props` answer `props` (llama.cpp's
    /// server properties); `None` leaves one answering 404.
    pub fn serve_info(&self, models: Option<Value>, props: Option<Value>) {
        if let Ok(mut i) = self.info.lock() {
            i.models = models;
            i.props = props;
        }
    }

    /// The paths of the GET requests received so far, in order.
    pub fn gets(&self) -> Vec<String> {
        self.info.lock().map(|i| i.gets.clone()).unwrap_or_default()
    }

    /// The base URL (the part before `/chat/completions`).
    pub fn url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// Every request body received so far, in order.
    pub fn requests(&self) -> Vec<Vec<u8>> {
        self.requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// The request line and headers of every request received so far, in order.
    pub fn heads(&self) -> Vec<String> {
        self.heads.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Every task-understanding request body received so far, in order.
    pub fn understanding_requests(&self) -> Vec<Vec<u8>> {
        self.understanding_requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Appends replies to the script of task-understanding calls.
    pub fn push_understanding(&self, replies: Vec<Reply>) {
        if let Ok(mut s) = self.understanding.lock() {
            s.extend(replies);
        }
    }

    /// Every Orchestrator request body received so far, in order.
    pub fn orchestration_requests(&self) -> Vec<Vec<u8>> {
        self.orchestration_requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Appends replies to the script of Orchestrator calls (an empty script answers that
    /// nothing is to be added).
    pub fn push_orchestration(&self, replies: Vec<Reply>) {
        if let Ok(mut s) = self.orchestration.lock() {
            s.extend(replies);
        }
    }

    /// Every summary-call (compaction) request body received so far, in order.
    pub fn summary_requests(&self) -> Vec<Vec<u8>> {
        self.summary_requests.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Appends replies to the script of summary calls (an empty script answers with a valid
    /// summary, [`Reply::summary`]).
    pub fn push_summary(&self, replies: Vec<Reply>) {
        if let Ok(mut s) = self.summary.lock() {
            s.extend(replies);
        }
    }

    /// Appends replies to the script.
    pub fn push(&self, replies: Vec<Reply>) {
        if let Ok(mut s) = self.script.lock() {
            s.extend(replies);
        }
    }
}

/// True when a request is a task-understanding call (its system message is keel's
/// understanding instructions).
pub fn is_understanding(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return false };
    v["messages"][0]["role"] == "system"
        && v["messages"][0]["content"].as_str().is_some_and(|c| c == keel::understand::INSTRUCTIONS)
}

/// True when a request is an Orchestrator call (its system message is keel's orchestration
/// instructions).
pub fn is_orchestration(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return false };
    v["messages"][0]["role"] == "system"
        && v["messages"][0]["content"]
            .as_str()
            .is_some_and(|c| c == keel::brain::orchestrate::INSTRUCTIONS)
}

/// True when a request is a summary call of a compaction (its system message is keel's
/// summary instructions).
pub fn is_summary(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return false };
    v["messages"][0]["role"] == "system"
        && v["messages"][0]["content"]
            .as_str()
            .is_some_and(|c| c == keel::agent::summary::INSTRUCTIONS)
}

/// True when a request's messages hold a tool call whose arguments are not a JSON object.
fn has_unparsable_tool_arguments(body: &[u8]) -> bool {
    let Ok(v) = serde_json::from_slice::<Value>(body) else { return false };
    v["messages"].as_array().into_iter().flatten().any(|m| {
        m["tool_calls"].as_array().into_iter().flatten().any(|c| {
            let args = c["function"]["arguments"].as_str().unwrap_or("");
            !serde_json::from_str::<Value>(args).is_ok_and(|a| a.is_object())
        })
    })
}

async fn serve(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    // Keep-alive: answer requests on this connection until the client closes it.
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let header_end = loop {
            if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        };
        let head = String::from_utf8_lossy(&buf[..header_end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buf.len() < header_end + len {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Ok(());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        let body: Vec<u8> = buf[header_end..header_end + len].to_vec();
        let buf_head: Vec<u8> = buf[..header_end].to_vec();
        buf.drain(..header_end + len);
        if let Some(path) = head.strip_prefix("get ").and_then(|r| r.split(' ').next()) {
            let answer = match shared.info.lock() {
                Ok(mut info) => {
                    info.gets.push(path.to_string());
                    match path {
                        "/v1/models" => info.models.clone(),
                        "/props" => info.props.clone(),
                        _ => None,
                    }
                }
                Err(_) => None,
            };
            let (status, text) = match answer {
                Some(v) => ("200 OK", v.to_string()),
                None => ("404 Not Found", "Not Found".to_string()),
            };
            let reply = format!(
                "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{text}",
                text.len()
            );
            stream.write_all(reply.as_bytes()).await?;
            continue;
        }
        let scripted = match &shared.responder {
            // A server with a context of its own refuses every request past it, a summary
            // call's too (a summary request it refuses is recorded as one).
            _ if shared.context_bytes.is_some_and(|max| body.len() > max) => {
                if is_summary(&body)
                    && let Ok(mut r) = shared.summary_requests.lock()
                {
                    r.push(body.clone());
                }
                let refusal = if shared.context_named {
                    json!({"error": {"code": 400, "type": "exceed_context_size_error",
                        "message": "the request exceeds the available context size, try increasing it",
                        "n_prompt_tokens": body.len() / 4,
                        "n_ctx": shared.context_bytes.unwrap_or(0) / 4}})
                } else {
                    json!({"error": {"code": "context_length_exceeded", "type": "invalid_request_error",
                        "message": "context_length_exceeded"}})
                };
                Some(Reply::Status { code: 400, retry_after: None, body: refusal.to_string() })
            }
            _ if is_understanding(&body) => {
                if let Ok(mut r) = shared.understanding_requests.lock() {
                    r.push(body.clone());
                }
                Some(
                    shared
                        .understanding
                        .lock()
                        .ok()
                        .and_then(|mut s| s.pop_front())
                        .unwrap_or_else(|| Reply::understanding("uncertain", &[], &[], &[])),
                )
            }
            _ if is_orchestration(&body) => {
                if let Ok(mut r) = shared.orchestration_requests.lock() {
                    r.push(body.clone());
                }
                Some(
                    shared
                        .orchestration
                        .lock()
                        .ok()
                        .and_then(|mut s| s.pop_front())
                        .unwrap_or_else(|| Reply::selection(&[], &[], &[])),
                )
            }
            _ if is_summary(&body) => {
                if let Ok(mut r) = shared.summary_requests.lock() {
                    r.push(body.clone());
                }
                Some(
                    shared
                        .summary
                        .lock()
                        .ok()
                        .and_then(|mut s| s.pop_front())
                        .unwrap_or_else(|| Reply::summary("carry on", &["the last step's notes"])),
                )
            }
            _ if shared.strict && has_unparsable_tool_arguments(&body) => Some(Reply::Status {
                code: 500,
                retry_after: None,
                body: json!({"error": {"code": 500, "type": "server_error",
                    "message": "Failed to parse tool call arguments as JSON"}})
                .to_string(),
            }),
            Some(f) => Some(f(&body)),
            None => shared.script.lock().ok().and_then(|mut s| s.pop_front()),
        };
        if shared.record
            && !is_understanding(&body)
            && !is_orchestration(&body)
            && !is_summary(&body)
            && let Ok(mut r) = shared.requests.lock()
        {
            r.push(body);
            if let Ok(mut h) = shared.heads.lock() {
                h.push(String::from_utf8_lossy(&buf_head).into_owned());
            }
        }
        let mut reply = scripted.unwrap_or(Reply::Status {
            code: 500,
            retry_after: None,
            body: "script exhausted".into(),
        });
        while let Reply::Delay(d, inner) = reply {
            tokio::time::sleep(d).await;
            reply = *inner;
        }
        if let Reply::Drip { events, gap } = &reply {
            stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
                )
                .await?;
            stream.flush().await?;
            for e in events {
                tokio::time::sleep(*gap).await;
                stream.write_all(format!("data: {e}\n\n").as_bytes()).await?;
                stream.flush().await?;
            }
            tokio::time::sleep(*gap).await;
            stream.write_all(b"data: [DONE]\n\n").await?;
            return stream.shutdown().await;
        }
        if let Reply::Sse { events, cut: true } = &reply {
            // A stream cut mid-way: no [DONE], no length, and the connection closes.
            let mut out = String::from(
                "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n",
            );
            for e in events {
                out.push_str(&format!("data: {e}\n\n"));
            }
            stream.write_all(out.as_bytes()).await?;
            return stream.shutdown().await;
        }
        let (status, content_type, extra, body) = match reply {
            Reply::Json(v) => (200, "application/json", String::new(), v.to_string()),
            Reply::Sse { events, cut } => {
                let mut b = String::new();
                for e in events {
                    b.push_str(&format!("data: {e}\n\n"));
                }
                if !cut {
                    b.push_str("data: [DONE]\n\n");
                }
                (200, "text/event-stream", String::new(), b)
            }
            Reply::Status { code, retry_after, body } => {
                let ra = retry_after.map(|s| format!("retry-after: {s}\r\n")).unwrap_or_default();
                (code, "text/plain", ra, body)
            }
            Reply::Empty | Reply::Delay(..) | Reply::Drip { .. } => {
                (200, "application/json", String::new(), String::new())
            }
            Reply::Redirect { code, location } => {
                (code, "text/plain", format!("location: {location}\r\n"), String::new())
            }
        };
        let out = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\n{extra}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(out.as_bytes()).await?;
    }
}

/// A responder that plays a fixed plan of tool calls per turn, from the request alone (so it
/// answers correctly however often a request is repeated after a crash): in a turn whose user
/// message ends with the word TAG, the k-th model call (k = tool results so far in the turn)
/// calls `plan[k]` with `{"label": "TAG-k"}` under a fresh call id; after the plan, it answers
/// `done TAG`.
pub fn plan_responder(plan: Vec<String>) -> Responder {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    Arc::new(move |body: &[u8]| {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let last_user = msgs.iter().rposition(|m| m["role"] == "user").unwrap_or(0);
        let tag = msgs
            .get(last_user)
            .and_then(|m| m["content"].as_str())
            .and_then(|c| c.split_whitespace().last())
            .unwrap_or("x")
            .to_string();
        let k = msgs[last_user..].iter().filter(|m| m["role"] == "tool").count();
        match plan.get(k) {
            Some(tool) => {
                let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let id = format!("call-{n}-{}", std::process::id());
                let args = json!({"label": format!("{tag}-{k}")}).to_string();
                Reply::calls(&[(&id, tool, &args)])
            }
            None => Reply::text(&format!("done {tag}")),
        }
    })
}

/// Sessions of a workgroup, as [`workgroup_responder`] plays them. Each session is told apart
/// by its first user message:
/// - `… spawn {"children": [{"purpose", "input", "grants"?}, …]}`: a coordinator. Its first
///   model call spawns every child in one step (parallel calls); later, once as many terminal
///   notifications as children are in its history, it answers `coordinator done: ` with the
///   first line of each notification's text; until then it answers `waiting`.
/// - `CHILD TAG [effect:TOOL]`: a worker. With `effect:TOOL` it first calls TOOL with
///   `{"label": TAG}`; then it answers `answer TAG`.
/// - `CHILD TAG ask`: a worker that asks its parent (`session_ask`), ends its turn, and answers
///   `answer TAG: ANSWER` with the parent's reply; a coordinator answers a question with
///   `session_send` of `ANSWER 42`.
///
/// Every reply follows from the request alone, so a request repeated after a crash gets the
/// same kind of answer. `arrivals` records when each worker's first request came, by tag.
pub struct WorkgroupScript {
    pub responder: Responder,
    pub arrivals: Arc<Mutex<Vec<(String, std::time::Instant)>>>,
}

/// A responder for workgroup tests: see [`WorkgroupScript`]. Workers answer after `delay`.
pub fn workgroup_responder(delay: Duration) -> WorkgroupScript {
    let counter = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let arrivals: Arc<Mutex<Vec<(String, std::time::Instant)>>> = Arc::default();
    let seen = arrivals.clone();
    let responder: Responder = Arc::new(move |body: &[u8]| {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let msgs = v["messages"].as_array().cloned().unwrap_or_default();
        let users: Vec<String> = msgs
            .iter()
            .filter(|m| m["role"] == "user")
            .filter_map(|m| m["content"].as_str().map(str::to_string))
            .collect();
        let first = users.first().cloned().unwrap_or_default();
        let tools = msgs.iter().filter(|m| m["role"] == "tool").count();
        let next_id = || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            format!("call-{n}-{}", std::process::id())
        };
        if let Some((_, spec)) = first.split_once("spawn ") {
            let spec: Value =
                serde_json::from_str(spec.lines().next().unwrap_or("")).unwrap_or(Value::Null);
            let children = spec["children"].as_array().cloned().unwrap_or_default();
            // A child's question: answer it.
            let last = msgs.last();
            if let Some(q) =
                last.filter(|m| m["role"] == "user").and_then(|m| m["content"].as_str())
                && q.lines()
                    .next()
                    .is_some_and(|l| l.starts_with("[keel: sub-session ") && l.ends_with(" asks]"))
            {
                let child = q.split_whitespace().nth(2).unwrap_or("").to_string();
                let args = json!({"session": child, "input": "ANSWER 42"}).to_string();
                return Reply::calls(&[(&next_id(), "session_send", &args)]);
            }
            if tools == 0 {
                let calls: Vec<(String, String)> =
                    children.iter().map(|c| (next_id(), c.to_string())).collect();
                let calls: Vec<(&str, &str, &str)> = calls
                    .iter()
                    .map(|(id, a)| (id.as_str(), "session_spawn", a.as_str()))
                    .collect();
                return Reply::calls(&calls);
            }
            let terminal: Vec<String> = users
                .iter()
                .filter(|u| {
                    u.starts_with("[keel: sub-session ")
                        && u.lines().next().is_some_and(|l| {
                            [": result]", ": failure]", ": interrupted]", ": budget_exhausted]"]
                                .iter()
                                .any(|k| l.ends_with(k))
                        })
                })
                .map(|u| u.lines().nth(1).unwrap_or("").to_string())
                .collect();
            if terminal.len() >= children.len() {
                return Reply::text(&format!("coordinator done: {}", terminal.join(" | ")));
            }
            return Reply::text("waiting");
        }
        let mut words = first.split_whitespace();
        let tag = match (words.next(), words.next()) {
            (Some("CHILD"), Some(t)) => t.to_string(),
            _ => return Reply::text("unscripted session"),
        };
        if first.split_whitespace().any(|w| w == "ask") {
            return match (users.len(), tools) {
                (1, 0) => {
                    let args = json!({"question": "which answer?"}).to_string();
                    Reply::calls(&[(&next_id(), "session_ask", &args)])
                }
                (1, _) => Reply::text("asked"),
                _ => Reply::text(&format!(
                    "answer {tag}: {}",
                    users.last().cloned().unwrap_or_default()
                )),
            };
        }
        let effect =
            first.split_whitespace().find_map(|w| w.strip_prefix("effect:")).map(str::to_string);
        if tools == 0 && users.len() == 1 {
            if let Ok(mut a) = seen.lock() {
                a.push((tag.clone(), std::time::Instant::now()));
            }
            if let Some(tool) = effect {
                let args = json!({"label": tag}).to_string();
                return Reply::calls(&[(&next_id(), &tool, &args)]);
            }
        }
        Reply::Delay(delay, Box::new(Reply::text(&format!("answer {tag}"))))
    });
    WorkgroupScript { responder, arrivals }
}

/// The task of a coordinator that spawns `children` (`(purpose, input, grants)`), for
/// [`workgroup_responder`].
pub fn spawn_task(prefix: &str, children: &[(&str, &str, &[&str])]) -> String {
    let children: Vec<Value> = children
        .iter()
        .map(|(p, i, g)| {
            let mut c = json!({"purpose": p, "input": i});
            if !g.is_empty() {
                c["grants"] = json!(g);
            }
            c
        })
        .collect();
    format!("{prefix} spawn {}", json!({"children": children}))
}
