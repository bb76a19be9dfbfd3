//! Traces: keel's `tracing` spans, exported over OTLP/HTTP (protobuf) to a collector.
//!
//! The core marks its work with spans — a turn, its task understanding, each model call
//! (`chat`, with the GenAI attributes), each tool call and its governed chain (sandbox time,
//! fuel, memory, effect, outcome), approvals waited on, compactions, sub-sessions' runners —
//! and the server adds one per HTTP request. This layer turns each span that closes into an
//! OpenTelemetry span and hands it to a batch processor, which exports from a thread of its own.
//!
//! What a span carries is its fields and nothing else: log lines are not exported, and the
//! core puts content (prompts, replies, tools' inputs and outputs) in fields only when
//! `capture_content` is on. Field conventions: `otel.name` names the span, `otel.kind` gives
//! its kind, `otel.parent` carries a W3C `traceparent` to continue, `otel.start_unix_ms`
//! starts the span earlier (an approval's wait); a plain field name `x` is exported as
//! `keel.x`, a dotted one as it is. A sub-session's runner span names the call that spawned
//! it (`keel.parent.session_id`, `keel.parent.call_id`): its spans continue that call's trace,
//! with a link to the call.

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use opentelemetry::trace::{
    Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue, Value};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::trace::{
    BatchSpanProcessor, IdGenerator, RandomIdGenerator, SpanData, SpanEvents, SpanLinks,
    SpanProcessor,
};
use tracing::span::{Attributes, Id, Record};
use tracing::{Subscriber, field::Field};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// Where traces go, and what they carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub endpoint: String,
    pub service: String,
    pub capture_content: bool,
    /// Where the endpoint was set: the variable, or `keel.toml [telemetry] otlp_endpoint`.
    pub from: &'static str,
}

/// The settings from the environment and `[telemetry]` in keel.toml: `None` when no endpoint
/// is set (or `OTEL_SDK_DISABLED=true`). `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is the traces
/// URL itself; `OTEL_EXPORTER_OTLP_ENDPOINT` and `otlp_endpoint` are base URLs, to which
/// `/v1/traces` is added.
pub fn settings(
    env: impl Fn(&str) -> Option<String>,
    table: Option<&keel::protocol::setup::config::TelemetryTable>,
) -> Result<Option<Settings>, String> {
    let env = |k: &str| env(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
    if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    let base = |url: String, from: &str| -> Result<String, String> {
        check_url(&url, from)?;
        Ok(format!("{}/v1/traces", url.trim_end_matches('/')))
    };
    let (endpoint, from) = if let Some(url) = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        check_url(&url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")?;
        (url, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    } else if let Some(url) = env("OTEL_EXPORTER_OTLP_ENDPOINT") {
        (base(url, "OTEL_EXPORTER_OTLP_ENDPOINT")?, "OTEL_EXPORTER_OTLP_ENDPOINT")
    } else if let Some(url) = table.and_then(|t| t.otlp_endpoint.clone()) {
        (base(url, "[telemetry] otlp_endpoint")?, "keel.toml [telemetry] otlp_endpoint")
    } else {
        return Ok(None);
    };
    let service = env("OTEL_SERVICE_NAME")
        .or_else(|| table.and_then(|t| t.service_name.clone()))
        .unwrap_or_else(|| "keel".into());
    let capture_content = table.is_some_and(|t| t.capture_content);
    Ok(Some(Settings { endpoint, service, capture_content, from }))
}

fn check_url(url: &str, from: &str) -> Result<(), String> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
    let ok = rest.is_some_and(|r| {
        let host = r.split(['/', '?', '#']).next().unwrap_or_default();
        !host.is_empty() && !r.chars().any(|c| c.is_whitespace() || c.is_control())
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{from}: `{}` is not an http:// or https:// URL (an OTLP/HTTP collector, such as http://localhost:4318)",
            url.escape_debug()
        ))
    }
}

/// The exporter's processor, flushed and stopped by [`Exporter::shutdown`] (at the process's
/// end: the last spans are sent then).
pub struct Exporter {
    processor: Arc<BatchSpanProcessor>,
}

impl Exporter {
    pub fn shutdown(&self) {
        if let Err(e) = self.processor.shutdown_with_timeout(Duration::from_secs(5)) {
            tracing::warn!("the last spans could not be exported: {e}");
        }
    }
}

/// The layer that exports spans, and the exporter to shut down at the end.
pub fn start(settings: &Settings) -> Result<(Bridge, Exporter), String> {
    keel::protocol::setup::init_tls();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(settings.endpoint.clone())
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("cannot start the trace exporter to {}: {e}", settings.endpoint))?;
    let mut processor = BatchSpanProcessor::builder(exporter).build();
    let resource = opentelemetry_sdk::Resource::builder_empty()
        .with_service_name(settings.service.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    processor.set_resource(&resource);
    let processor = Arc::new(processor);
    keel::protocol::setup::metrics::set_capture_content(settings.capture_content);
    let scope =
        InstrumentationScope::builder("keel").with_version(env!("CARGO_PKG_VERSION")).build();
    let bridge = Bridge {
        processor: Arc::clone(&processor),
        scope,
        ids: RandomIdGenerator::default(),
        calls: Mutex::new(Calls::default()),
    };
    Ok((bridge, Exporter { processor }))
}

/// Spans kept for the log only: a runner lives as long as its session has work, and its
/// turns are traces of their own (or of the request that started the runner).
const NOT_EXPORTED: &[&str] = &["runner"];

/// The layer: one OpenTelemetry span per closed `tracing` span.
pub struct Bridge {
    processor: Arc<BatchSpanProcessor>,
    scope: InstrumentationScope,
    ids: RandomIdGenerator,
    /// Recent tool calls' spans by session and call id, for the sub-sessions they spawn.
    calls: Mutex<Calls>,
}

/// A bounded map of recent tool calls' span contexts.
#[derive(Default)]
struct Calls {
    by_id: HashMap<(String, String), SpanContext>,
    order: VecDeque<(String, String)>,
}

/// Tool calls remembered for their sub-sessions' links.
const MAX_CALLS: usize = 4096;

impl Calls {
    fn put(&mut self, key: (String, String), cx: SpanContext) {
        if self.by_id.insert(key.clone(), cx).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > MAX_CALLS {
            if let Some(old) = self.order.pop_front() {
                self.by_id.remove(&old);
            }
        }
    }
}

/// A span being recorded, kept in its `tracing` span's extensions.
struct Open {
    name: Cow<'static, str>,
    kind: SpanKind,
    start: SystemTime,
    attributes: Vec<KeyValue>,
    context: SpanContext,
    parent: Option<(SpanId, bool)>,
    links: Vec<Link>,
    /// The session the span belongs to (its own `session_id`, else its parent's).
    session: Option<String>,
}

impl Open {
    fn set(&mut self, key: String, value: Value) {
        match self.attributes.iter_mut().find(|kv| kv.key.as_str() == key) {
            Some(kv) => kv.value = value,
            None => self.attributes.push(KeyValue::new(key, value)),
        }
    }

    fn get(&self, key: &str) -> Option<String> {
        self.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
    }
}

/// Fields read off a span: the special `otel.*` ones apart.
#[derive(Default)]
struct Fields {
    attributes: Vec<(String, Value)>,
    name: Option<String>,
    kind: Option<SpanKind>,
    parent: Option<String>,
    start_ms: Option<i64>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "otel.name" => self.name = Some(value.to_string()),
            "otel.kind" => {
                self.kind = Some(match value.as_str().as_ref() {
                    "server" => SpanKind::Server,
                    "client" => SpanKind::Client,
                    "producer" => SpanKind::Producer,
                    "consumer" => SpanKind::Consumer,
                    _ => SpanKind::Internal,
                });
            }
            "otel.parent" => self.parent = Some(value.to_string()),
            "otel.start_unix_ms" => {
                if let Value::I64(ms) = value {
                    self.start_ms = Some(ms);
                }
            }
            "message" => {}
            name if name.contains('.') => self.attributes.push((name.to_string(), value)),
            name => self.attributes.push((format!("keel.{name}"), value)),
        }
    }
}

impl tracing::field::Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_string().into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, i64::try_from(value).map_or_else(|_| Value::F64(value as f64), Value::I64));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}").into()));
    }
}

/// A W3C `traceparent` (`00-TRACE-SPAN-FLAGS`) as a remote span context; `None` if it does
/// not read or names the invalid (all-zero) trace or span.
pub fn parse_traceparent(text: &str) -> Option<SpanContext> {
    let mut parts = text.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    };
    if !hex(version, 2) || version == "ff" || !hex(trace, 32) || !hex(span, 16) || !hex(flags, 2) {
        return None;
    }
    if version == "00" && parts.next().is_some() {
        return None;
    }
    let trace = TraceId::from_hex(trace).ok().filter(|t| *t != TraceId::INVALID)?;
    let span = SpanId::from_hex(span).ok().filter(|s| *s != SpanId::INVALID)?;
    let flags = u8::from_str_radix(flags, 16).ok()?;
    Some(SpanContext::new(trace, span, TraceFlags::new(flags & 1), true, TraceState::default()))
}

impl<S> Layer<S> for Bridge
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let name = attrs.metadata().name();
        if NOT_EXPORTED.contains(&name) {
            return;
        }
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        // The nearest ancestor that is exported.
        let ancestor = span.scope().skip(1).find_map(|s| {
            s.extensions().get::<Open>().map(|o| (o.context.clone(), o.session.clone()))
        });
        let own_session = fields
            .attributes
            .iter()
            .find(|(k, _)| k == "keel.session_id")
            .map(|(_, v)| v.to_string());
        let session = own_session.or_else(|| ancestor.as_ref().and_then(|a| a.1.clone()));
        let mut links = Vec::new();
        let spawned_by = {
            let get = |key: &str| {
                fields.attributes.iter().find(|(k, _)| k == key).map(|(_, v)| v.to_string())
            };
            get("keel.parent.session_id").zip(get("keel.parent.call_id"))
        };
        let spawner = spawned_by.and_then(|key| {
            self.calls.lock().unwrap_or_else(PoisonError::into_inner).by_id.get(&key).cloned()
        });
        if let Some(cx) = &spawner {
            links.push(Link::with_context(cx.clone()));
        }
        let parent = fields
            .parent
            .as_deref()
            .and_then(parse_traceparent)
            .or(spawner)
            .or_else(|| ancestor.map(|a| a.0));
        let (trace_id, flags, parent_id) = match &parent {
            Some(p) => (p.trace_id(), p.trace_flags(), Some((p.span_id(), p.is_remote()))),
            None => (self.ids.new_trace_id(), TraceFlags::SAMPLED, None),
        };
        let context =
            SpanContext::new(trace_id, self.ids.new_span_id(), flags, false, TraceState::default());
        let start = fields
            .start_ms
            .and_then(|ms| u64::try_from(ms).ok())
            .map_or_else(SystemTime::now, |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms));
        let mut open = Open {
            name: Cow::Owned(fields.name.take().unwrap_or_else(|| name.to_string())),
            kind: fields.kind.unwrap_or(SpanKind::Internal),
            start,
            attributes: Vec::new(),
            context,
            parent: parent_id,
            links,
            session,
        };
        for (k, v) in fields.attributes {
            open.set(k, v);
        }
        conventions(name, &mut open);
        if name == "tool_call"
            && let (Some(s), Some(call)) = (open.session.clone(), open.get("keel.call_id"))
        {
            let cx = open.context.clone();
            self.calls.lock().unwrap_or_else(PoisonError::into_inner).put((s, call), cx);
        }
        span.extensions_mut().insert(open);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        let Some(open) = ext.get_mut::<Open>() else { return };
        let mut fields = Fields::default();
        values.record(&mut fields);
        for (k, v) in fields.attributes {
            open.set(k, v);
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        let (Some(span), Some(other)) = (ctx.span(id), ctx.span(follows)) else { return };
        let Some(cx) = other.extensions().get::<Open>().map(|o| o.context.clone()) else {
            return;
        };
        if let Some(open) = span.extensions_mut().get_mut::<Open>() {
            open.links.push(Link::with_context(cx));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(open) = span.extensions_mut().remove::<Open>() else { return };
        if !open.context.is_sampled() {
            return;
        }
        let status = match open.get("error.type") {
            Some(e) => Status::error(e),
            None => Status::Unset,
        };
        let (parent_span_id, parent_span_is_remote) =
            open.parent.unwrap_or((SpanId::INVALID, false));
        let mut links = SpanLinks::default();
        links.links = open.links;
        self.processor.on_end(SpanData {
            span_context: open.context,
            parent_span_id,
            parent_span_is_remote,
            span_kind: open.kind,
            name: open.name,
            start_time: open.start,
            end_time: SystemTime::now(),
            attributes: open.attributes,
            dropped_attributes_count: 0,
            events: SpanEvents::default(),
            links,
            status,
            instrumentation_scope: self.scope.clone(),
        });
    }
}

/// The OpenTelemetry GenAI conventions of keel's own spans: a turn is an agent's invocation
/// in a conversation (the session), a tool call an `execute_tool` span.
fn conventions(name: &str, open: &mut Open) {
    match name {
        "turn" => {
            open.set("gen_ai.operation.name".into(), "invoke_agent".into());
            open.set("gen_ai.agent.name".into(), "keel".into());
            if let Some(s) = open.session.clone() {
                open.set("gen_ai.conversation.id".into(), s.into());
            }
        }
        "tool_call" => {
            let tool = open.get("keel.tool").unwrap_or_default();
            open.name = Cow::Owned(format!("execute_tool {tool}"));
            open.set("gen_ai.operation.name".into(), "execute_tool".into());
            open.set("gen_ai.tool.name".into(), tool.into());
            open.set("gen_ai.tool.type".into(), "function".into());
            if let Some(call) = open.get("keel.call_id") {
                open.set("gen_ai.tool.call.id".into(), call.into());
            }
        }
        "chat" => {
            if let Some(s) = open.session.clone() {
                open.set("gen_ai.conversation.id".into(), s.into());
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_reads_as_the_w3c_format_says() {
        let cx = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
            .expect("valid");
        assert_eq!(cx.trace_id().to_string(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(cx.span_id().to_string(), "00f067aa0ba902b7");
        assert!(cx.is_sampled() && cx.is_remote());
        let unsampled =
            parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
                .expect("valid");
        assert!(!unsampled.is_sampled());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-xyz-00f067aa0ba902b7-01",
        ] {
            assert!(parse_traceparent(bad).is_none(), "{bad:?} read");
        }
    }

    #[test]
    fn the_endpoint_comes_from_the_environment_then_the_file() {
        let table = keel::protocol::setup::config::TelemetryTable {
            otlp_endpoint: Some("http://collector:4318/".into()),
            capture_content: true,
            service_name: Some("agents".into()),
        };
        let none = |_: &str| None;
        let s = settings(none, Some(&table)).unwrap().unwrap();
        assert_eq!(s.endpoint, "http://collector:4318/v1/traces");
        assert_eq!((s.service.as_str(), s.capture_content), ("agents", true));
        let env = |k: &str| match k {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("http://other:4318".to_string()),
            "OTEL_SERVICE_NAME" => Some("svc".to_string()),
            _ => None,
        };
        let s = settings(env, Some(&table)).unwrap().unwrap();
        assert_eq!(
            (s.endpoint.as_str(), s.service.as_str()),
            ("http://other:4318/v1/traces", "svc")
        );
        assert_eq!(s.from, "OTEL_EXPORTER_OTLP_ENDPOINT");
        let traces = |k: &str| {
            (k == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").then(|| "http://t:1/custom".to_string())
        };
        assert_eq!(settings(traces, None).unwrap().unwrap().endpoint, "http://t:1/custom");
        assert_eq!(settings(none, None).unwrap(), None);
        let off = |k: &str| (k == "OTEL_SDK_DISABLED").then(|| "true".to_string());
        assert_eq!(settings(off, Some(&table)).unwrap(), None);
        let bad =
            |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "collector:4318".to_string());
        let e = settings(bad, None).unwrap_err();
        assert!(e.contains("OTEL_EXPORTER_OTLP_ENDPOINT") && e.contains("http://"), "{e}");
    }
}
