//! Full-text recall: the one place a query for SQLite's FTS5 indexes (skills, tools,
//! memories) is built from recall terms or a search query, and the one shape a scored hit has.
//!
//! Scoring is FTS5's own `bm25`; nothing here weighs anything. A score only truncates and
//! orders candidates (and appears in debug logs): what a model is shown is re-sorted by stable
//! reference first (see [`by_reference`]).

/// Terms one recall group takes at most.
pub const MAX_TERMS: usize = 16;
/// Words of all terms together, at most.
pub const MAX_WORDS: usize = 64;
/// Candidates one recall group returns at most.
pub const MAX_CANDIDATES: usize = 20;
/// Characters of a search query, at most.
pub const MAX_QUERY: usize = 512;

/// The FTS5 query matching any word of `terms`: each word (letters and digits, lowercased,
/// two characters or more) quoted as a string, joined by `OR`, so no term can inject query
/// syntax. `None` when no word is left — then there is nothing to recall.
pub fn fts_query<S: AsRef<str>>(terms: &[S]) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    for term in terms.iter().take(MAX_TERMS) {
        for word in term.as_ref().split(|c: char| !c.is_alphanumeric()) {
            let word = word.to_lowercase();
            if word.chars().count() < 2 || words.contains(&word) {
                continue;
            }
            if words.len() == MAX_WORDS {
                break;
            }
            words.push(word);
        }
    }
    if words.is_empty() {
        return None;
    }
    Some(words.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(" OR "))
}

/// One candidate of a recall group: its stable reference (a name, or a memory's id as text)
/// and its bm25 score (lower is better, as FTS5 reports it).
#[derive(Debug, Clone, PartialEq)]
pub struct Scored<T> {
    pub item: T,
    pub score: f64,
}

/// Sorts candidates by their stable reference, so that the order a model sees them in never
/// depends on scores or on which group finished first.
pub fn by_reference<T, K: Ord>(items: &mut [T], key: impl Fn(&T) -> K) {
    items.sort_by_key(|a| key(a));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_become_quoted_words_and_syntax_cannot_get_in() {
        let q = fts_query(&["CSV validation", "data quality", "csv"]).unwrap();
        assert_eq!(q, "\"csv\" OR \"validation\" OR \"data\" OR \"quality\"");
        // Query syntax in a term is only separators.
        let q = fts_query(&["name:* NEAR(\"x\" y) OR -z"]).unwrap();
        assert_eq!(q, "\"name\" OR \"near\" OR \"or\"");
        assert_eq!(fts_query(&["", "a", "!!"]), None);
        let none: [&str; 0] = [];
        assert_eq!(fts_query(&none), None);
    }

    #[test]
    fn words_are_bounded() {
        let terms: Vec<String> = (0..40).map(|i| format!("w{i}a w{i}b w{i}c")).collect();
        let q = fts_query(&terms).unwrap();
        // 16 terms of 3 words: 48 words.
        assert_eq!(q.matches(" OR ").count() + 1, 48);
        let terms: Vec<String> =
            (0..16).map(|i| (0..9).map(|j| format!("x{i}y{j} ")).collect()).collect();
        let q = fts_query(&terms).unwrap();
        assert_eq!(q.matches(" OR ").count() + 1, MAX_WORDS);
    }
}
