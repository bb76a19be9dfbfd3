//! Compaction as the loop runs it: before a request that would pass the session's threshold
//! of its context window, after a request the server refused as too long, and on demand.
//!
//! SessionEngine freezes the history at a legal boundary and marks the session
//! `compressing`; SummaryService makes its one call (a refused answer is asked for once more);
//! SessionEngine commits the checkpoint `pending`, then promotes it. A failure leaves the
//! context as it was and says why.

use crate::ids::SessionId;
use std::sync::Arc;
use std::time::Instant;

use crate::agent::summary;
use crate::cancel::CancelToken;
use crate::model::ModelError;
pub use crate::session::compaction::{Aim, Trigger};
use crate::session::compaction::{Frozen, Promotion, SummaryCall};
use crate::session::{RuntimeState, SessionMeta};

use super::{AgentError, AgentService};

/// Of the context window, the part a compaction keeps of the history (the rest is summarized).
pub const KEEP_FRACTION: f64 = 0.25;
/// Of the context window, the most of the history one summary call is sent.
pub const INPUT_FRACTION: f64 = 0.6;
/// Compactions before one request at most: past that, the request is sent as it is (or the
/// turn fails, if it cannot fit).
pub const MAX_ROUNDS: u32 = 3;

/// Bytes the rendered summary is assumed to take, when deciding how much history to keep.
pub const SUMMARY_ALLOWANCE: f64 = 2048.0;

/// What a threshold compaction aims for, for a request `assembled` of a session whose window
/// is `window` tokens and threshold `compact_at` of it: keep as much recent history as leaves
/// the next request, its summary included, well under the threshold — half of the room the
/// system message and tool schemas leave, at most [`KEEP_FRACTION`] of the window — and send
/// one summary call at most [`INPUT_FRACTION`] of the window.
pub fn aim(
    window: u64,
    compact_at: f64,
    per_token: f64,
    assembled: &crate::session::Assembled,
) -> Aim {
    let window_bytes = window as f64 * per_token;
    let fixed = (assembled.head.text.len()
        + assembled.system.text.len()
        + assembled.tools.as_ref().map_or(0, |t| t.text.len())
        + 64) as f64;
    let room = ((window_bytes * compact_at - fixed - SUMMARY_ALLOWANCE) / 2.0).max(0.0);
    Aim {
        keep_bytes: Some(room.min(window_bytes * KEEP_FRACTION) as i64),
        input_bytes: Some((window_bytes * INPUT_FRACTION) as i64),
    }
}

/// How a compaction ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Compaction {
    /// Checkpoint `checkpoint` is the session's context: requests hold its summary and the
    /// messages after `context_start`.
    Compacted { checkpoint: i64, from: i64, context_start: i64, ms: f64 },
    /// No legal boundary is after the context start: nothing to compact.
    Nothing,
    /// The summary call failed, or its answer was refused twice; the context is unchanged.
    Failed(String),
    /// The checkpoint's preconditions no longer held when it was to be promoted.
    Discarded(String),
}

/// What one compaction is asked to do.
pub struct CompactRequest {
    pub trigger: Trigger,
    pub aim: Aim,
    /// The size of the request that led to it: (bytes, estimated tokens).
    pub before: Option<(i64, i64)>,
    /// The state the session returns to.
    pub state_after: RuntimeState,
}

impl AgentService {
    /// Compacts session `id` (see the module doc).
    #[tracing::instrument(name = "compaction", skip_all, fields(session_id = %id))]
    pub async fn compact(
        &self,
        id: &SessionId,
        req: CompactRequest,
        cancel: &CancelToken,
    ) -> Result<Compaction, AgentError> {
        let started = Instant::now();
        let tokens = req.before.map(|(_, t)| t);
        let Some(frozen) = self.engine.begin_compaction(id, req.trigger, req.aim, tokens).await?
        else {
            return Ok(Compaction::Nothing);
        };
        let frozen = Arc::new(frozen);
        let meta = self.engine.meta(id).await?;
        let call = self.summary_call(&meta, &frozen, cancel).await;
        crate::crash::point("after_summary_call");
        let after = match (&call.summary, req.before) {
            (Some(s), Some((bytes, tokens))) if bytes > 0 => {
                let removed = frozen.history_bytes - frozen.kept_bytes;
                let added = s.render(frozen.to).len() as i64;
                let old = meta
                    .runtime
                    .checkpoint
                    .as_ref()
                    .map_or(0, |cp| cp.summary.render(cp.to).len() as i64);
                let bytes_after = (bytes - removed + added - old).max(0);
                Some((tokens as f64 * bytes_after as f64 / bytes as f64).ceil() as i64)
            }
            _ => None,
        };
        let failed = call.error.clone();
        let seq = self
            .engine
            .prepare_checkpoint(id, frozen.clone(), call, (tokens, after), req.state_after)
            .await?;
        if let Some(e) = failed {
            return Ok(Compaction::Failed(e));
        }
        crate::crash::point("after_checkpoint");
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let promoted = self.engine.promote_checkpoint(id, seq, req.state_after, ms).await?;
        crate::crash::point("after_promotion");
        Ok(match promoted {
            Promotion::Promoted { checkpoint, context_start } => Compaction::Compacted {
                checkpoint,
                from: frozen.prev_context_start + 1,
                context_start,
                ms,
            },
            Promotion::Discarded { reason, .. } => Compaction::Discarded(reason),
            Promotion::Settled(s) => {
                Compaction::Discarded(format!("checkpoint {seq} was {s} already"))
            }
        })
    }

    /// SummaryService's call over `frozen`: asked once more when its answer is refused. The
    /// summary is redacted by the session's policy and given the journal's artifacts.
    async fn summary_call(
        &self,
        meta: &SessionMeta,
        frozen: &Frozen,
        cancel: &CancelToken,
    ) -> SummaryCall {
        let config = summary::config(&meta.config.model, meta.config.preprocess.as_ref());
        let request = summary::request_body(&config, frozen);
        let body = bytes::Bytes::from(request.clone());
        let started = Instant::now();
        let mut out = SummaryCall {
            summary: None,
            error: None,
            request,
            reply: None,
            attempts: 0,
            duration_ms: 0.0,
            usage: None,
        };
        for _ in 0..2 {
            match self.model.complete(&config.model, &body, cancel).await {
                Ok(reply) => {
                    out.attempts += reply.attempts;
                    out.usage = reply.usage;
                    let content = reply.content.unwrap_or_default();
                    let content = meta.config.policy.redact(&content).into_owned();
                    match summary::parse(&content) {
                        Ok((mut s, reader)) => {
                            reader.log("summary");
                            if s.active_user_request.is_empty()
                                && let Some(r) = &frozen.active_request
                            {
                                s.active_user_request = r.clone();
                            }
                            s.artifacts = frozen.artifacts.clone();
                            s.failed_calls = frozen.failed_calls.clone();
                            s.turn_calls = frozen.turn_calls.clone();
                            out.summary = Some(s);
                            out.error = None;
                            out.reply = Some(content);
                            break;
                        }
                        Err(e) => {
                            out.error = Some(format!("the summary was refused: {e}"));
                            out.reply = Some(content);
                        }
                    }
                }
                Err(f) => {
                    out.attempts += f.attempts;
                    out.error = Some(if f.last == ModelError::Cancelled {
                        "the summary call was interrupted".to_string()
                    } else {
                        format!("the summary call failed: {f}")
                    });
                    break;
                }
            }
        }
        out.duration_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(e) = &out.error {
            tracing::debug!(error = %e, "compaction failed");
        }
        out
    }
}
