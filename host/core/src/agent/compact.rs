//! Compaction as the loop runs it: before a request that would pass the session's threshold
//! of its context window, after a request the server refused as too long, and on demand.
//!
//! SessionEngine freezes the history at a legal boundary and marks the session
//! `compressing`; SummaryService makes its one call (a refused answer is asked for once more);
//! SessionEngine commits the checkpoint `pending`, then promotes it. A failure leaves the
//! context as it was and says why.

use crate::assembly::Assembly;
use crate::ids::SessionId;
use std::sync::Arc;
use std::time::Instant;

use crate::agent::summary;
use crate::cancel::CancelToken;
pub use crate::compaction::{Aim, Trigger};
use crate::compaction::{Frozen, Promotion, Summary, SummaryCall};
use crate::meta::SessionMeta;
use crate::model::ModelError;
use crate::session::RuntimeState;

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
/// is `window` tokens and whose requests are held under `ceiling` tokens: keep as much recent
/// history as leaves the next request, its summary included, well under the ceiling — half
/// of the room the system message and tool schemas leave, at most [`KEEP_FRACTION`] of the
/// window — and send one summary call at most [`INPUT_FRACTION`] of the window.
pub fn aim(
    window: u64,
    ceiling: f64,
    per_token: f64,
    assembled: &crate::assembly::Assembled,
) -> Aim {
    let window_bytes = window as f64 * per_token;
    let compact_at = ceiling / window as f64;
    let fixed = (assembled.room.fixed + 64) as f64;
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

/// Of the tokens a request may use (the window less the reply's reserve), the part its
/// estimated size is held under — summary calls and ordinary requests alike: the estimate is
/// of bytes per token, and the server's tokenizer may count more.
pub const ESTIMATE_SAFETY: f64 = 0.85;

/// Tokens an ordinary request keeps for its reply at most when the session sets no
/// `max_tokens`.
pub const REPLY_RESERVE: u64 = 1024;

/// The tokens an ordinary request of a session with model settings `model` keeps free for
/// its reply in a window of `window` tokens: the session's `max_tokens` (at most half the
/// window), else an eighth of the window, at most [`REPLY_RESERVE`]. A request that fills
/// the window leaves the model no room to answer: llama.cpp cuts the reply at its context,
/// tool calls and all.
pub fn reply_reserve(model: &crate::model::ModelConfig, window: u64) -> u64 {
    match model.max_tokens {
        Some(m) => u64::from(m).min(window / 2),
        None => (window / 8).min(REPLY_RESERVE),
    }
}

/// The most tokens (as estimated) an ordinary request may take in a window of `window`:
/// the window less the reply's reserve, held under [`ESTIMATE_SAFETY`] of it.
pub fn request_limit(model: &crate::model::ModelConfig, window: u64) -> f64 {
    window.saturating_sub(reply_reserve(model, window)) as f64 * ESTIMATE_SAFETY
}

/// What one compaction is asked to do.
pub struct CompactRequest {
    pub trigger: Trigger,
    pub aim: Aim,
    /// The context window the summary calls must fit, in tokens: the session's, or what a
    /// refusal said (or, when it said no number, less than the request it refused). `None`:
    /// the session's, if it has one.
    pub window: Option<u64>,
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
        let Some(frozen) = crate::compaction::Compaction::of(&self.engine)
            .begin(id, req.trigger, req.aim, tokens)
            .await?
        else {
            return Ok(Compaction::Nothing);
        };
        let frozen = Arc::new(frozen);
        let meta = SessionMeta::read(&self.engine, id).await?;
        let window = req.window.or(meta.config.model.context_window);
        let per_token = Assembly::of(&self.engine).bytes_per_token(id).await?;
        let call = self.summary_call(&meta, &frozen, window.map(|w| (w, per_token)), cancel).await;
        crate::crash::point("after_summary_call");
        let after = match (&call.summary, req.before) {
            (Some(s), Some((bytes, tokens))) if bytes > 0 => {
                let removed = frozen.history_bytes - frozen.kept_bytes;
                let added = s.render(frozen.to).len() as i64;
                let old =
                    meta.checkpoint.as_ref().map_or(0, |cp| cp.summary.render(cp.to).len() as i64);
                let bytes_after = (bytes - removed + added - old).max(0);
                Some((tokens as f64 * bytes_after as f64 / bytes as f64).ceil() as i64)
            }
            _ => None,
        };
        let failed = call.error.clone().filter(|_| call.summary.is_none());
        let seq = crate::compaction::Compaction::of(&self.engine)
            .prepare_checkpoint(id, frozen.clone(), call, (tokens, after), req.state_after)
            .await?;
        if let Some(e) = failed {
            return Ok(Compaction::Failed(e));
        }
        crate::crash::point("after_checkpoint");
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let promoted = crate::compaction::Compaction::of(&self.engine)
            .promote_checkpoint(id, seq, req.state_after, ms)
            .await?;
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

    /// SummaryService's calls over `frozen`. With a window (tokens, and the session's bytes
    /// per token), each request — instructions, schema, previous summary, the range, JSON
    /// escaping and all — is held under the window less the reply's reserve
    /// ([`summary::reply_reserve`], also the call's `max_tokens`): a range that does not fit
    /// one call is summarized over several, each given the summary so far. A refused answer is
    /// asked for once more, with a note saying why (cut by the token limit, repeating itself,
    /// not JSON) and half the messages; a request the server refuses as too long is sent again
    /// with half the messages. The summary is redacted by the session's policy and given the
    /// journal's artifacts.
    async fn summary_call(
        &self,
        meta: &SessionMeta,
        frozen: &Frozen,
        window: Option<(u64, f64)>,
        cancel: &CancelToken,
    ) -> SummaryCall {
        let mut config = summary::config(&meta.config.model, meta.config.preprocess.as_ref());
        let budget = window.map(|(w, per_token)| {
            let reserve = summary::reply_reserve(w);
            config.model.max_tokens = Some(reserve);
            (w.saturating_sub(u64::from(reserve)) as f64 * per_token * ESTIMATE_SAFETY) as usize
        });
        let limits = summary::limits(&config);
        let started = Instant::now();
        let mut out = SummaryCall {
            summary: None,
            error: None,
            request: Vec::new(),
            reply: None,
            attempts: 0,
            duration_ms: 0.0,
            usage: None,
        };
        let mut rest: &[crate::compaction::FrozenMessage] = &frozen.messages;
        let mut previous = frozen.previous.clone();
        let mut last = None;
        let mut calls = 0u32;
        'range: while last.is_none() || !rest.is_empty() {
            let part = |take: usize, previous: &Option<(i64, crate::compaction::Summary)>| Frozen {
                messages: rest[..take].to_vec(),
                previous: previous.clone(),
                ..frozen.clone()
            };
            // The most messages whose request fits the budget (one at least).
            let mut take = match budget {
                None => rest.len(),
                Some(b) => {
                    let fits =
                        |n: usize| summary::request_body(&config, &part(n, &previous)).len() <= b;
                    let (mut lo, mut hi) = (1usize, rest.len());
                    while lo < hi {
                        let mid = (lo + hi).div_ceil(2);
                        if fits(mid) { lo = mid } else { hi = mid - 1 }
                    }
                    lo.min(rest.len())
                }
            };
            let mut note: Option<String> = None;
            let mut answered = false;
            for _ in 0..2 {
                let request =
                    summary::request_body_noted(&config, &part(take, &previous), note.as_deref());
                out.request = request.clone();
                calls += 1;
                match self.model.complete(&config.model, &bytes::Bytes::from(request), cancel).await
                {
                    Ok(reply) => {
                        out.attempts += reply.attempts;
                        if let Some(u) = &reply.usage {
                            let sum = out.usage.get_or_insert(crate::model::Usage {
                                prompt_tokens: 0,
                                completion_tokens: 0,
                                cached_tokens: None,
                            });
                            sum.prompt_tokens += u.prompt_tokens;
                            sum.completion_tokens += u.completion_tokens;
                        }
                        let content = reply.content.unwrap_or_default();
                        let content = meta.config.policy.redact(&content).into_owned();
                        match summary::parse(&content, reply.finish_reason.as_deref(), limits) {
                            Ok((s, reader)) => {
                                reader.log("summary");
                                previous = Some((0, s.clone()));
                                last = Some(s);
                                out.error = None;
                                out.reply = Some(content);
                                answered = true;
                                break;
                            }
                            Err(e) => {
                                let cause = summary::refusal_cause(
                                    &content,
                                    reply.finish_reason.as_deref(),
                                    &e,
                                );
                                out.error = Some(format!("the summary was refused: {cause}"));
                                out.reply = Some(content);
                                note = Some(summary::retry_note(&cause, limits));
                                take = take.div_ceil(2);
                            }
                        }
                    }
                    Err(f) if matches!(f.last, ModelError::ContextTooLong { .. }) && take > 1 => {
                        out.attempts += f.attempts;
                        out.error = Some(format!("the summary call failed: {f}"));
                        take = take.div_ceil(2);
                    }
                    Err(f) => {
                        out.attempts += f.attempts;
                        out.error = Some(if f.last == ModelError::Cancelled {
                            "the summary call was interrupted".to_string()
                        } else {
                            format!("the summary call failed: {f}")
                        });
                        break 'range;
                    }
                }
            }
            if !answered {
                break;
            }
            rest = &rest[take..];
        }
        let made = match (&out.error, last) {
            (None, Some(s)) => Some(s),
            // The model could not summarize (twice) or the call failed: keel's own summary,
            // from the session's record — a compaction does not depend on the model. Not when
            // a person interrupted it.
            (Some(_), _) if !cancel.is_cancelled() => Some(Summary::mechanical(frozen)),
            _ => None,
        };
        if let Some(mut s) = made {
            s.active_user_request = frozen.request();
            s.artifacts = frozen.artifacts.clone();
            s.failed_calls = frozen.failed_calls.clone();
            s.turn_calls = frozen.turn_calls.clone();
            out.summary = Some(s);
        }
        if calls > 1 {
            tracing::debug!(
                calls,
                messages = frozen.messages.len(),
                "summary made over several calls"
            );
        }
        out.duration_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(e) = &out.error {
            tracing::debug!(error = %e, "compaction failed");
        }
        out
    }
}
