//! The process's counters and histograms, and their rendering in the Prometheus text format
//! (`GET /metrics` of `keel serve`).
//!
//! Each family is a `static` here, updated where the fact happens (a turn ends in the agent,
//! a model call in the model client, a tool call in the ToolService, a trap or a request in the
//! sandbox, a commit in the store's writer) and read only by [`render`]. They count what this
//! process did since it started; what the store holds (sessions by state, approvals waiting,
//! live leases) is read from it when scraped, by the use case that renders the page.
//!
//! An update takes one uncontended lock of its family (a few tens of nanoseconds); label
//! values are `'static` names, never data (no session ids, tool names or prompts), so a
//! family's series stay few.

use std::fmt::Write as _;
use std::sync::{Mutex, PoisonError};

/// What a family is.
#[derive(Debug, Clone, Copy)]
pub enum Kind {
    /// Only goes up (reset when the process starts).
    Counter,
    /// Observations counted into buckets of upper bounds (seconds), with their sum.
    Histogram(&'static [f64]),
}

/// One metric family: a name, its help, its label names and its series.
pub struct Family {
    name: &'static str,
    help: &'static str,
    labels: &'static [&'static str],
    kind: Kind,
    series: Mutex<Vec<Series>>,
}

struct Series {
    values: Vec<&'static str>,
    /// A counter's value; a histogram's sum.
    sum: f64,
    count: u64,
    /// A histogram's observations per bucket (not cumulative; the last is above every bound).
    buckets: Vec<u64>,
}

impl Family {
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Self { name, help, labels, kind: Kind::Counter, series: Mutex::new(Vec::new()) }
    }

    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        bounds: &'static [f64],
    ) -> Self {
        Self { name, help, labels, kind: Kind::Histogram(bounds), series: Mutex::new(Vec::new()) }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Adds one to the counter of `values` (one per label name).
    pub fn inc(&self, values: &[&'static str]) {
        self.add(values, 1.0);
    }

    /// Adds `n` to the counter of `values`.
    pub fn add(&self, values: &[&'static str], n: f64) {
        self.with(values, |s| {
            s.sum += n;
            s.count += 1;
        });
    }

    /// Counts one observation of `v` (seconds, say) in the histogram of `values`.
    pub fn observe(&self, values: &[&'static str], v: f64) {
        let Kind::Histogram(bounds) = self.kind else {
            return self.add(values, v);
        };
        let at = bounds.iter().position(|b| v <= *b).unwrap_or(bounds.len());
        self.with(values, |s| {
            s.sum += v;
            s.count += 1;
            if s.buckets.len() <= bounds.len() {
                s.buckets.resize(bounds.len() + 1, 0);
            }
            s.buckets[at] += 1;
        });
    }

    /// The counter's value (a histogram's count) for `values`: 0 before the first update.
    pub fn get(&self, values: &[&str]) -> f64 {
        let series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.iter().find(|s| s.values == values).map_or(0.0, |s| match self.kind {
            Kind::Counter => s.sum,
            Kind::Histogram(_) => s.count as f64,
        })
    }

    fn with(&self, values: &[&'static str], f: impl FnOnce(&mut Series)) {
        debug_assert_eq!(values.len(), self.labels.len(), "{}: label values", self.name);
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        let i = match series.iter().position(|s| s.values == values) {
            Some(i) => i,
            None => {
                series.push(Series {
                    values: values.to_vec(),
                    sum: 0.0,
                    count: 0,
                    buckets: vec![],
                });
                series.len() - 1
            }
        };
        f(&mut series[i]);
    }

    /// Writes the family in the text format: its help, its type and each series (a counter
    /// without labels shows 0 before its first update).
    pub fn render(&self, out: &mut Text) {
        let kind = match self.kind {
            Kind::Counter => "counter",
            Kind::Histogram(_) => "histogram",
        };
        out.head(self.name, self.help, kind);
        let mut series: Vec<_> = {
            let g = self.series.lock().unwrap_or_else(PoisonError::into_inner);
            g.iter().map(|s| (s.values.clone(), s.sum, s.count, s.buckets.clone())).collect()
        };
        series.sort_by(|a, b| a.0.cmp(&b.0));
        if series.is_empty() && self.labels.is_empty() {
            series.push((Vec::new(), 0.0, 0, Vec::new()));
        }
        for (values, sum, count, buckets) in series {
            let labels: Vec<(&str, &str)> =
                self.labels.iter().copied().zip(values.iter().copied()).collect();
            match self.kind {
                Kind::Counter => out.sample(self.name, "", &labels, sum),
                Kind::Histogram(bounds) => {
                    let mut below = 0u64;
                    for (i, bound) in bounds.iter().enumerate() {
                        below += buckets.get(i).copied().unwrap_or(0);
                        let le = bound.to_string();
                        let mut l = labels.clone();
                        l.push(("le", &le));
                        out.sample(self.name, "_bucket", &l, below as f64);
                    }
                    let mut l = labels.clone();
                    l.push(("le", "+Inf"));
                    out.sample(self.name, "_bucket", &l, count as f64);
                    out.sample(self.name, "_sum", &labels, sum);
                    out.sample(self.name, "_count", &labels, count as f64);
                }
            }
        }
    }
}

/// A page in the Prometheus text format (version 0.0.4), written family by family.
#[derive(Default)]
pub struct Text(String);

/// The content type of [`Text`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Text {
    /// A family's `# HELP` and `# TYPE` lines (`kind`: `counter`, `gauge`, `histogram`).
    pub fn head(&mut self, name: &str, help: &str, kind: &str) {
        let help = help.replace('\\', "\\\\").replace('\n', "\\n");
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample line: `name` + `suffix`, its labels (values escaped) and its value.
    pub fn sample(&mut self, name: &str, suffix: &str, labels: &[(&str, &str)], value: f64) {
        let _ = write!(self.0, "{name}{suffix}");
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let v = v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n");
                let _ = write!(self.0, "{k}=\"{v}\"");
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", number(value));
    }

    /// A gauge family read when scraped: its head and one sample per label set.
    pub fn gauge(&mut self, name: &str, help: &str, samples: &[(Vec<(&str, &str)>, f64)]) {
        self.head(name, help, "gauge");
        for (labels, value) in samples {
            self.sample(name, "", labels, *value);
        }
    }

    /// A counter read from elsewhere (the store's own counts) when scraped.
    pub fn counter(&mut self, name: &str, help: &str, value: f64) {
        self.head(name, help, "counter");
        self.sample(name, "", &[], value);
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

/// A value as the text format writes it.
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf".into() } else { "-Inf".into() }
    } else {
        v.to_string()
    }
}

/// Bounds of the turn and model-call histograms, in seconds.
pub const SLOW_SECONDS: &[f64] =
    &[0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0];
/// Bounds of the tool-call histogram, in seconds.
pub const CALL_SECONDS: &[f64] =
    &[0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0];
/// Bounds of the commit histogram, in seconds.
pub const COMMIT_SECONDS: &[f64] =
    &[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0];

/// Turns ended, by how: `answer`, `stopped`, `interrupted`, `waiting_approval`, `failed`.
pub static TURNS: Family =
    Family::counter("keel_turns_total", "Turns ended, by outcome.", &["outcome"]);
pub static TURN_SECONDS: Family = Family::histogram(
    "keel_turn_duration_seconds",
    "How long a turn ran, from its start to its end (an approval wait ends it).",
    &[],
    SLOW_SECONDS,
);
/// Model calls (each with its retries), by outcome: `ok` or the error's kind
/// (`timeout`, `status`, `context_too_long` …).
pub static MODEL_CALLS: Family = Family::counter(
    "keel_model_calls_total",
    "Model calls, by outcome (ok or error kind).",
    &["outcome"],
);
pub static MODEL_SECONDS: Family = Family::histogram(
    "keel_model_call_duration_seconds",
    "How long a model call took, retries included.",
    &[],
    SLOW_SECONDS,
);
/// Tokens the model servers reported: `input`, `output`, `cached` (of the input).
pub static MODEL_TOKENS: Family = Family::counter(
    "keel_model_tokens_total",
    "Tokens the model servers reported using, by kind (input, output, cached input).",
    &["kind"],
);
/// Governed tool calls, by outcome: `ok` or the failure kind (`timeout`, `policy_denied` …).
pub static TOOL_CALLS: Family = Family::counter(
    "keel_tool_calls_total",
    "Governed tool calls, by outcome (ok or failure kind).",
    &["outcome"],
);
pub static TOOL_SECONDS: Family = Family::histogram(
    "keel_tool_call_duration_seconds",
    "How long a governed tool call took, checks and sandbox included.",
    &[],
    CALL_SECONDS,
);
/// Calls the sandbox stopped, by kind: `timeout`, `fuel_exhausted`, `memory_limit`,
/// `stack_overflow`, `crashed` (a trap in the guest).
pub static SANDBOX_TRAPS: Family = Family::counter(
    "keel_sandbox_traps_total",
    "Tool calls the sandbox stopped, by kind.",
    &["kind"],
);
/// Tools' outgoing HTTP requests, by outcome: `ok`, `denied` (refused by keel, nothing sent),
/// `failed`, `cancelled`.
pub static EGRESS: Family = Family::counter(
    "keel_egress_requests_total",
    "Outgoing HTTP requests of tools, by outcome (denied: refused by keel, nothing sent).",
    &["outcome"],
);
pub static COMMIT: Family = Family::histogram(
    "keel_store_commit_duration_seconds",
    "How long the store's writer took to commit a transaction that changed something.",
    &[],
    COMMIT_SECONDS,
);
/// Approvals decided, by decision (`approve`, `reject`).
pub static APPROVALS_DECIDED: Family = Family::counter(
    "keel_approvals_decided_total",
    "Approval units decided, by decision.",
    &["decision"],
);
/// HTTP requests `keel serve` answered, by status class (`2xx` …).
pub static HTTP_REQUESTS: Family = Family::counter(
    "keel_http_requests_total",
    "HTTP requests keel serve answered, by status class.",
    &["status"],
);

/// Whether spans carry content — a model call's request and reply, a tool call's input and
/// output (`[telemetry] capture_content`): off unless turned on. What they carry is what the
/// session's history holds, after the session's redaction; a secret's value never (tools'
/// outputs are redacted of the secrets they were given before anything else sees them).
static CAPTURE_CONTENT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Turns content capture on or off for the process ([`capture_content`]).
pub fn set_capture_content(on: bool) {
    CAPTURE_CONTENT.store(on, std::sync::atomic::Ordering::Relaxed);
}

/// Whether spans carry content (see [`set_capture_content`]).
pub fn capture_content() -> bool {
    CAPTURE_CONTENT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Most bytes of content a span attribute carries.
pub const MAX_CAPTURED: usize = 16 * 1024;

/// `bytes` as a span attribute's text: lossy UTF-8, cut at [`MAX_CAPTURED`] with a note.
pub fn captured(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    if text.len() <= MAX_CAPTURED {
        return text.into_owned();
    }
    let mut end = MAX_CAPTURED;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… [{} bytes in all]", &text[..end], bytes.len())
}

/// Every family of the process, in the order [`render`] writes them.
pub static ALL: &[&Family] = &[
    &TURNS,
    &TURN_SECONDS,
    &MODEL_CALLS,
    &MODEL_SECONDS,
    &MODEL_TOKENS,
    &TOOL_CALLS,
    &TOOL_SECONDS,
    &SANDBOX_TRAPS,
    &EGRESS,
    &COMMIT,
    &APPROVALS_DECIDED,
    &HTTP_REQUESTS,
];

/// Writes every family of the process to `out`.
pub fn render(out: &mut Text) {
    for f in ALL {
        f.render(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_and_a_histogram_render_in_the_text_format() {
        let c = Family::counter("t_calls_total", "Calls.", &["outcome"]);
        c.inc(&["ok"]);
        c.inc(&["ok"]);
        c.add(&["a\"b"], 3.0);
        let h = Family::histogram("t_seconds", "Time,\nin seconds.", &[], &[0.1, 1.0]);
        h.observe(&[], 0.0625);
        h.observe(&[], 0.5);
        h.observe(&[], 7.0);
        let empty = Family::counter("t_none_total", "None yet.", &[]);
        let mut t = Text::default();
        c.render(&mut t);
        h.render(&mut t);
        empty.render(&mut t);
        assert_eq!(
            t.into_string(),
            "# HELP t_calls_total Calls.\n# TYPE t_calls_total counter\n\
             t_calls_total{outcome=\"a\\\"b\"} 3\nt_calls_total{outcome=\"ok\"} 2\n\
             # HELP t_seconds Time,\\nin seconds.\n# TYPE t_seconds histogram\n\
             t_seconds_bucket{le=\"0.1\"} 1\nt_seconds_bucket{le=\"1\"} 2\n\
             t_seconds_bucket{le=\"+Inf\"} 3\nt_seconds_sum 7.5625\nt_seconds_count 3\n\
             # HELP t_none_total None yet.\n# TYPE t_none_total counter\nt_none_total 0\n"
        );
        assert_eq!(c.get(&["ok"]), 2.0);
        assert_eq!(h.get(&[]), 3.0);
        assert_eq!(c.get(&["other"]), 0.0);
    }
}
