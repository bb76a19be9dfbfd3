//! Full-text recall: the one place a query for SQLite's FTS5 indexes (skills, tools,
//! memories) is built from recall terms or a search query, and the one shape a scored hit has.
//!
//! Scoring is FTS5's own `bm25`; nothing here weighs anything. A score only truncates and
//! orders candidates (and appears in debug logs): what a model is shown is re-sorted by stable
//! reference first (see [`by_reference`]).
//!
//! Ranking is what costs: bm25 reads each matching row's length, so a word found in most rows
//! (a "stop word" of the corpus) would make every recall rank most of the index. [`plan_in`]
//! bounds that work without changing the scoring: it asks the index's vocabulary (an FTS5
//! `fts5vocab` table) how many rows hold each word, keeps the most selective words up to a
//! budget of rows, and ranks at most the newest [`RANK_WINDOW`] rows that match.

use crate::sql::OptionalExtension;

/// Terms one recall group takes at most.
pub const MAX_TERMS: usize = 16;
/// Words of all terms together, at most.
pub const MAX_WORDS: usize = 64;
/// Candidates one recall group returns at most.
pub const MAX_CANDIDATES: usize = 20;
/// Characters of a search query, at most.
pub const MAX_QUERY: usize = 512;

/// Rows the kept words of a recall may match together (by the index's vocabulary) before
/// more common words are left out; the rarest word is always kept.
pub const ROW_BUDGET: i64 = 500;
/// Matching rows ranked at most (the newest ones).
pub const RANK_WINDOW: i64 = 500;

/// The FTS5 query matching any word of `terms`: each word (letters and digits, lowercased,
/// two characters or more) quoted as a string, joined by `OR`, so no term can inject query
/// syntax. `None` when no word is left — then there is nothing to recall.
pub fn fts_query<S: AsRef<str>>(terms: &[S]) -> Option<String> {
    let words = words(terms);
    if words.is_empty() {
        return None;
    }
    Some(or_query(&words))
}

fn or_query(words: &[String]) -> String {
    words.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(" OR ")
}

/// The PostgreSQL text-search query matching any word of `terms` (the same words as
/// [`fts_query`], joined by `|`; a word is letters and digits only, so it carries no query
/// syntax). `None` when no word is left.
pub fn ts_query<S: AsRef<str>>(terms: &[S]) -> Option<String> {
    let words = words(terms);
    if words.is_empty() {
        return None;
    }
    Some(words.join(" | "))
}

/// A planned recall: the FTS5 query, and the lowest row id worth ranking.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub query: String,
    pub min_rowid: i64,
}

/// Rows of an index that belong to one owner (a user's memories): a join of the index's rows
/// to their table that keeps only the owner's, with `?3` the owner.
#[derive(Debug, Clone, Copy)]
pub struct Scope<'a> {
    pub join: &'a str,
    pub owner: &'a str,
}

/// Plans a recall over FTS5 table `index` (whose vocabulary table is `vocab`): the words of
/// `terms`, most selective first, up to [`ROW_BUDGET`] rows, under the column filter `columns`
/// (such as `{text tags}`); and, when more rows than [`RANK_WINDOW`] may match, the row id
/// below which rows are not ranked — counted among the rows of `scope` when given. A word the
/// vocabulary does not hold as written (the index stems words) is kept.
pub fn plan_in<S: AsRef<str>>(
    c: &crate::sql::Connection,
    index: &str,
    vocab: &str,
    columns: Option<&str>,
    scope: Option<Scope<'_>>,
    terms: &[S],
) -> Result<Option<Plan>, crate::store::StoreError> {
    let all = words(terms);
    if all.is_empty() {
        return Ok(None);
    }
    let mut counted: Vec<(i64, String)> = Vec::new();
    let mut unknown: Vec<String> = Vec::new();
    {
        let mut stmt = c.prepare_cached(&format!("SELECT doc FROM {vocab} WHERE term = ?1"))?;
        for w in all {
            match stmt.query_row([&w], |r| r.get::<_, i64>(0)).optional()? {
                Some(n) => counted.push((n, w)),
                None => unknown.push(w),
            }
        }
    }
    counted.sort();
    let (mut kept, mut rows) = (unknown.clone(), 0);
    for (n, w) in counted {
        if !kept.is_empty() && rows + n > ROW_BUDGET {
            break;
        }
        rows += n;
        kept.push(w);
    }
    let query = match columns {
        Some(cols) => format!("{cols} : ({})", or_query(&kept)),
        None => or_query(&kept),
    };
    let mut min_rowid = i64::MIN;
    if rows > RANK_WINDOW || !unknown.is_empty() {
        let (join, owner) = scope.map(|s| (s.join, Some(s.owner))).unwrap_or(("", None));
        let sql = format!(
            "SELECT {index}.rowid FROM {index} {join} WHERE {index} MATCH ?1
             ORDER BY {index}.rowid DESC LIMIT 1 OFFSET ?2"
        );
        let mut stmt = c.prepare_cached(&sql)?;
        let lowest = match owner {
            Some(o) => {
                stmt.query_row(crate::sql::params![query, RANK_WINDOW, o], |r| r.get::<_, i64>(0))
            }
            None => stmt.query_row(crate::sql::params![query, RANK_WINDOW], |r| r.get::<_, i64>(0)),
        }
        .optional()?;
        if let Some(lowest) = lowest {
            min_rowid = lowest + 1;
        }
    }
    Ok(Some(Plan { query, min_rowid }))
}

/// The distinct words of `terms`, bounded.
fn words<S: AsRef<str>>(terms: &[S]) -> Vec<String> {
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
    words
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
    fn a_plan_keeps_the_selective_words_and_bounds_the_ranked_rows() {
        let dir = tempfile::tempdir().unwrap();
        let c = crate::store::open(&dir.path().join("keel.db")).unwrap();
        let n = (RANK_WINDOW + 100) as usize;
        for i in 0..n {
            let text = if i == 7 { "common rare".to_string() } else { format!("common w{i}") };
            crate::memory::add_in(&c, "alice", &text, &[], None).unwrap();
        }
        let plan = plan_in(&c, "memories_fts", "memories_vocab", None, None, &["rare common"])
            .unwrap()
            .unwrap();
        assert_eq!(plan.query, "\"rare\"", "the common word would rank every row");
        assert_eq!(plan.min_rowid, i64::MIN, "one row matches: nothing to bound");
        // Only common words: the rarest is kept, and only the newest rows are ranked.
        let plan = plan_in(&c, "memories_fts", "memories_vocab", None, None, &["common"])
            .unwrap()
            .unwrap();
        assert_eq!(plan.query, "\"common\"");
        assert_eq!(plan.min_rowid, (n as i64) - RANK_WINDOW + 1);
        let hits = crate::memory::recall_in(&c, "alice", &["rare common"], 8).unwrap();
        assert_eq!(hits[0].item.text, "common rare");
        assert!(crate::memory::recall_in(&c, "bob", &["rare"], 8).unwrap().is_empty());
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
