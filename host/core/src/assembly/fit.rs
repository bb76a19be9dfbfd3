//! Tool results cut to fit a small window: when the history a request must hold — the
//! anchor and the step that just ran, which a compaction never hides — does not fit the
//! model's context, every tool result past one size (the *result cap*) is sent as its head
//! and its tail with a note between them, never the calls themselves. The journal and the
//! stored history keep every result whole; the cap a request was sent with is recorded with
//! its evidence, so the evidence rebuilds it byte for byte.

use std::borrow::Cow;

/// Bytes of a tool result's content kept at least when results are cut to fit: below it, a
/// cut result says too little to act on, and the request fails instead.
pub const MIN_RESULT_CAP: usize = 512;

/// `body`, a stored message, as a request with result cap `cap` sends it: a tool result
/// whose content is longer than `cap` bytes keeps its first and last `cap / 2` bytes (on
/// character boundaries) and says, between them, how much was cut and how to read it.
/// Every other message is sent as it is.
pub fn cut_result(body: &str, cap: usize) -> Cow<'_, str> {
    // A tool result stored with content shorter than the cap cannot need a cut: its body
    // is barely longer than its content.
    if body.len() <= cap || !body.contains("\"tool_call_id\"") {
        return Cow::Borrowed(body);
    }
    let Ok(mut v) = serde_json::from_str::<serde_json::Value>(body) else {
        return Cow::Borrowed(body);
    };
    if v["role"] != "tool" {
        return Cow::Borrowed(body);
    }
    let Some(content) = v["content"].as_str() else { return Cow::Borrowed(body) };
    if content.len() <= cap {
        return Cow::Borrowed(body);
    }
    let half = cap / 2;
    let mut head_end = half;
    while !content.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = content.len() - half;
    while !content.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let cut = tail_start - head_end;
    let shown = format!(
        "{}\n[… keel cut {cut} of this result's {} bytes here so that the request fits the \
         model's context window; the whole result is kept in the session's journal. To read \
         the part cut, call the tool again for less (an offset and a limit, or a narrower \
         query, where the tool takes them).]\n{}",
        &content[..head_end],
        content.len(),
        &content[tail_start..]
    );
    v["content"] = serde_json::Value::String(shown);
    Cow::Owned(v.to_string())
}

/// The history `bodies` as a request with result cap `cap` sends it.
pub fn cut_history(bodies: &[String], cap: Option<usize>) -> Cow<'_, [String]> {
    match cap {
        Some(cap) if bodies.iter().any(|b| matches!(cut_result(b, cap), Cow::Owned(_))) => {
            Cow::Owned(bodies.iter().map(|b| cut_result(b, cap).into_owned()).collect())
        }
        _ => Cow::Borrowed(bodies),
    }
}

/// The largest result cap (at least [`MIN_RESULT_CAP`]) under which `bodies` take at most
/// `room` bytes; `None` when even the smallest cap leaves them larger. Only called once the
/// history is known not to fit whole.
pub fn fitting_cap(bodies: &[String], room: usize) -> Option<usize> {
    let size = |cap: usize| bodies.iter().map(|b| cut_result(b, cap).len()).sum::<usize>();
    if size(MIN_RESULT_CAP) > room {
        return None;
    }
    let longest = bodies.iter().map(String::len).max().unwrap_or(0).max(MIN_RESULT_CAP);
    let (mut lo, mut hi) = (MIN_RESULT_CAP, longest);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if size(mid) <= room { lo = mid } else { hi = mid - 1 }
    }
    Some(lo)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(content: &str) -> String {
        serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": content}).to_string()
    }

    #[test]
    fn a_long_result_keeps_its_head_and_tail_and_says_what_was_cut() {
        let content = format!("{}{}", "a".repeat(3000), "é".repeat(1500));
        let body = result(&content);
        let cut = cut_result(&body, 1000);
        let v: serde_json::Value = serde_json::from_str(&cut).unwrap();
        let shown = v["content"].as_str().unwrap();
        assert!(shown.starts_with(&"a".repeat(500)));
        assert!(shown.ends_with(&"é".repeat(250)));
        assert!(shown.contains("keel cut 5000 of this result's 6000 bytes"), "{shown}");
        assert_eq!(v["tool_call_id"], "c1");
        // Short results, calls and user messages are sent as they are.
        assert!(matches!(cut_result(&result("short"), 1000), Cow::Borrowed(_)));
        let call = serde_json::json!({"role": "assistant", "content": "x".repeat(5000)});
        assert!(matches!(cut_result(&call.to_string(), 600), Cow::Borrowed(_)));
    }

    #[test]
    fn the_fitting_cap_is_the_largest_that_fits_and_none_below_the_floor() {
        let bodies = vec![
            serde_json::json!({"role": "user", "content": "read them"}).to_string(),
            result(&"x".repeat(6000)),
            result(&"y".repeat(6000)),
        ];
        let whole: usize = bodies.iter().map(String::len).sum();
        let cap = fitting_cap(&bodies, whole - 4000).unwrap();
        let sent: usize = cut_history(&bodies, Some(cap)).iter().map(String::len).sum();
        assert!(sent <= whole - 4000, "{sent}");
        let more: usize = cut_history(&bodies, Some(cap + 1)).iter().map(String::len).sum();
        assert!(more > whole - 4000, "the largest cap that fits: {cap}");
        assert_eq!(fitting_cap(&bodies, 600), None);
    }
}
