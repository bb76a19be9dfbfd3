//! Recall benchmark: prints figures, asserts nothing about time.
//!
//! `cargo bench -p keel-tests --bench recall`. Builds a real keel store (SQLite file, FTS5
//! indexes kept by the migrations' triggers) holding 10,000 skills, 10,000 tools (500
//! components of 20) and 100,000 memories of one user, then measures, over many recall-term
//! sets drawn from the same vocabulary as the corpus: the latency p50/p99 of each recall group
//! (skills, tools with their tool sets, memories) on a read connection, and of the three in
//! parallel as a turn's preparation runs them. Also the time to install 1,000 skills from
//! directories on disk (read, check, digest, commit) through the use-case API.
//!
//! `KEEL_BENCH_SKILLS`, `KEEL_BENCH_TOOLS`, `KEEL_BENCH_MEMORIES`, `KEEL_BENCH_QUERIES` and
//! `KEEL_BENCH_INSTALLS` change the sizes.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::time::{Duration, Instant};

use keel::api::Caller;
use keel::search::MAX_CANDIDATES;
use keel::store::Db;

/// The allocator the `keel` binary uses.
#[global_allocator]
static ALLOCATOR: keel::Allocator = keel::Allocator;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// A small deterministic generator (xorshift), so every run builds the same corpus.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// An index in `0..n`, skewed towards small ones (a few words are common, most are rare).
    fn skewed(&mut self, n: usize) -> usize {
        let u = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((u * u * u) * n as f64) as usize % n
    }
}

const BASE: &[&str] = &[
    "csv",
    "audit",
    "report",
    "invoice",
    "order",
    "customer",
    "release",
    "notes",
    "changelog",
    "document",
    "convert",
    "pdf",
    "word",
    "spreadsheet",
    "summary",
    "review",
    "code",
    "test",
    "deploy",
    "database",
    "query",
    "schema",
    "migration",
    "backup",
    "restore",
    "email",
    "draft",
    "translate",
    "research",
    "citation",
    "source",
    "verify",
    "quality",
    "metric",
    "dashboard",
    "chart",
    "plot",
    "image",
    "resize",
    "compress",
    "archive",
    "search",
    "index",
    "file",
    "directory",
    "rename",
    "delete",
    "copy",
    "sync",
    "upload",
    "download",
    "api",
    "request",
    "response",
    "json",
    "yaml",
    "xml",
    "parse",
    "validate",
    "format",
    "lint",
    "style",
    "security",
    "secret",
    "scan",
    "license",
    "dependency",
    "update",
    "version",
    "tag",
    "branch",
    "merge",
    "issue",
    "ticket",
    "calendar",
    "meeting",
    "agenda",
    "minutes",
    "budget",
    "forecast",
    "sales",
    "finance",
    "payroll",
    "tax",
    "contract",
    "legal",
    "policy",
    "compliance",
    "risk",
    "incident",
    "alert",
    "log",
    "trace",
    "latency",
    "error",
    "retry",
    "queue",
    "cache",
    "session",
    "user",
];

/// The vocabulary: common base words and many rare made-up ones.
fn vocabulary() -> Vec<String> {
    let mut v: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
    for i in 0..4000 {
        v.push(format!("term{i}x"));
    }
    v
}

fn sentence(rng: &mut Rng, vocab: &[String], words: usize) -> String {
    (0..words).map(|_| vocab[rng.skewed(vocab.len())].as_str()).collect::<Vec<_>>().join(" ")
}

fn stats(mut s: Vec<Duration>) -> (f64, f64, f64) {
    s.sort();
    let at = |q: f64| s[((s.len() as f64 - 1.0) * q).round() as usize].as_secs_f64() * 1e3;
    let mean = s.iter().sum::<Duration>().as_secs_f64() * 1e3 / s.len() as f64;
    (at(0.5), at(0.99), mean)
}

fn row(name: &str, s: Vec<Duration>) {
    let (p50, p99, mean) = stats(s);
    println!("{name:<44} p50 {p50:>7.2} ms   p99 {p99:>7.2} ms   mean {mean:>7.2} ms");
}

fn main() {
    let (n_skills, n_tools, n_memories) = (
        env_usize("KEEL_BENCH_SKILLS", 10_000),
        env_usize("KEEL_BENCH_TOOLS", 10_000),
        env_usize("KEEL_BENCH_MEMORIES", 100_000),
    );
    let queries = env_usize("KEEL_BENCH_QUERIES", 500);
    let installs = env_usize("KEEL_BENCH_INSTALLS", 1_000);
    let rt =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let db = Db::open(&dir.path().join("keel.db")).unwrap();
    let vocab = vocabulary();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    println!(
        "keel recall benchmark: {n_skills} skills, {n_tools} tools, {n_memories} memories, {queries} term sets"
    );

    // The corpus, in batches of one transaction each.
    let started = Instant::now();
    let mut skills = Vec::new();
    for i in 0..n_skills {
        let description = sentence(&mut rng, &vocab, 14);
        let body = sentence(&mut rng, &vocab, 220);
        skills.push(keel::skills::SkillPackage {
            name: format!("skill-{i}"),
            description,
            body,
            ignored_keys: Vec::new(),
            files: Vec::new(),
            components: Vec::new(),
            digest: keel::digest::sha256_hex(format!("skill-{i}").as_bytes()),
        });
    }
    for chunk in skills.chunks(500) {
        let chunk = chunk.to_vec();
        rt.block_on(db.run(move |c| {
            for p in &chunk {
                keel::skills::install_in(c, p, "bench", false)?;
            }
            Ok(())
        }))
        .unwrap();
    }
    let mut tools = Vec::new();
    for i in 0..n_tools {
        tools.push((
            format!("tool_{i}"),
            format!("set-{}", i / 20),
            sentence(&mut rng, &vocab, 18),
        ));
    }
    for chunk in tools.chunks(2000) {
        let chunk = chunk.to_vec();
        rt.block_on(db.run(move |c| {
            for (name, set, description) in &chunk {
                c.execute(
                    "INSERT OR IGNORE INTO components (name, digest, size, source, builtin, installed_at)
                     VALUES (?1, ?1, 0, 'bench', 0, '0')",
                    [set],
                )?;
                c.execute(
                    "INSERT INTO tools (name, component, description, input_schema, output_schema,
                         effect, idempotent, spec_digest)
                     VALUES (?1, ?2, ?3, '{}', NULL, 'read-only', 1, ?1)",
                    [name, set, description],
                )?;
            }
            Ok(())
        }))
        .unwrap();
    }
    let mut memories = Vec::new();
    for _ in 0..n_memories {
        memories.push(sentence(&mut rng, &vocab, 20));
    }
    for chunk in memories.chunks(5000) {
        let chunk = chunk.to_vec();
        rt.block_on(db.run(move |c| {
            for text in &chunk {
                keel::memory::add_in(c, "alice", text, &["bench".to_string()], None)?;
            }
            Ok(())
        }))
        .unwrap();
    }
    println!("corpus built in {:.1} s", started.elapsed().as_secs_f64());

    // Term sets as task understanding gives them: a few short phrases per group.
    let term_sets: Vec<Vec<String>> = (0..queries)
        .map(|_| {
            let n = 2 + rng.skewed(6);
            (0..n)
                .map(|_| {
                    let words = 1 + (rng.next() % 3) as usize;
                    sentence(&mut rng, &vocab, words)
                })
                .collect()
        })
        .collect();
    let time = |f: &dyn Fn(&[String]) -> usize| -> (Vec<Duration>, usize) {
        let mut samples = Vec::with_capacity(term_sets.len());
        let mut found = 0;
        for t in &term_sets {
            let started = Instant::now();
            found += f(t);
            samples.push(started.elapsed());
        }
        (samples, found)
    };
    let (s, found_skills) = time(&|t| {
        db.read_blocking(|c| keel::skills::recall_in(c, t, MAX_CANDIDATES)).unwrap().len()
    });
    row("skills (name, description, body)", s);
    let (s, found_tools) = time(&|t| {
        db.read_blocking(|c| {
            let hits = keel::tools::recall_in(c, t, MAX_CANDIDATES)?;
            let mut sets: Vec<String> = Vec::new();
            for h in &hits {
                if !sets.contains(&h.item.component) {
                    keel::tools::toolset_in(c, &h.item.component)?;
                    sets.push(h.item.component.clone());
                }
            }
            Ok(hits.len())
        })
        .unwrap()
    });
    row("tools (and their tool sets)", s);
    let (s, found_memories) = time(&|t| {
        db.read_blocking(|c| keel::memory::recall_in(c, "alice", t, keel::memory::RECALLED))
            .unwrap()
            .len()
    });
    row("memories of the user", s);
    let mut parallel = Vec::new();
    for t in &term_sets {
        let (a, b, m) = (t.clone(), t.clone(), t.clone());
        let started = Instant::now();
        rt.block_on(async {
            let _ = tokio::join!(
                db.read(move |c| keel::skills::recall_in(c, &a, MAX_CANDIDATES)),
                db.read(move |c| keel::tools::recall_in(c, &b, MAX_CANDIDATES)),
                db.read(move |c| keel::memory::recall_in(c, "alice", &m, keel::memory::RECALLED)),
            );
        });
        parallel.push(started.elapsed());
    }
    row("all three groups in parallel", parallel);
    println!(
        "candidates per term set: {:.1} skills, {:.1} tools, {:.1} memories",
        found_skills as f64 / queries as f64,
        found_tools as f64 / queries as f64,
        found_memories as f64 / queries as f64
    );

    // Installing skills from disk through the use-case API.
    let source = tempfile::tempdir().unwrap();
    for i in 0..installs {
        let d = source.path().join(format!("inst-{i}"));
        std::fs::create_dir_all(&d).unwrap();
        let text = format!(
            "---\nname: inst-{i}\ndescription: {}\n---\n{}\n",
            sentence(&mut rng, &vocab, 14),
            sentence(&mut rng, &vocab, 220)
        );
        std::fs::write(d.join("SKILL.md"), text).unwrap();
        std::fs::write(d.join("reference.md"), sentence(&mut rng, &vocab, 300)).unwrap();
    }
    let home = keel::home::Home::at(dir.path().join("home")).unwrap();
    let h = rt
        .block_on(keel::harness::Harness::open(
            home,
            keel_tests::test_limits(),
            None,
            keel::agent::LoopGuards::default(),
            &|_| {},
        ))
        .unwrap();
    let started = Instant::now();
    let mut each = Vec::with_capacity(installs);
    for i in 0..installs {
        let one = Instant::now();
        rt.block_on(h.install_skill(
            &Caller::Operator,
            &source.path().join(format!("inst-{i}")),
            keel::tools::InstallMode::New,
        ))
        .unwrap();
        each.push(one.elapsed());
    }
    let total = started.elapsed();
    println!(
        "install {installs} skills from directories: {:.2} s in all, {:.2} ms each on average",
        total.as_secs_f64(),
        total.as_secs_f64() * 1e3 / installs as f64
    );
    row("install one skill (read, check, commit)", each);
}
