//! Store: the SQLite database (rusqlite, WAL, `synchronous=FULL` unless configured otherwise:
//! [`Synchronous`]).
//!
//! Owns the connection setup and the numbered schema migrations, each applied in its own
//! transaction together with its version record, so a crash mid-migration leaves the old or
//! the new schema, never half. It holds no business rules: the owners' modules write their
//! facts, each change in one transaction.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, TransactionBehavior};

/// Prepared statements kept per connection.
pub const STATEMENT_CACHE: usize = 128;

/// How long a writer waits for another process's lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Numbered migrations; append only, never edit one that shipped.
/// The schema version this build migrates a database to.
pub fn schema_version() -> i64 {
    MIGRATIONS.last().map(|m| m.0).unwrap_or(0)
}

const MIGRATIONS: &[(i64, &str)] = &[
    (
        1,
        "CREATE TABLE components (
        name         TEXT PRIMARY KEY,
        digest       TEXT NOT NULL,
        size         INTEGER NOT NULL,
        source       TEXT NOT NULL,
        builtin      INTEGER NOT NULL,
        installed_at TEXT NOT NULL
    );
    CREATE TABLE tools (
        name          TEXT PRIMARY KEY,
        component     TEXT NOT NULL REFERENCES components(name) ON DELETE CASCADE,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        output_schema TEXT,
        effect        TEXT NOT NULL,
        idempotent    INTEGER NOT NULL,
        spec_digest   TEXT NOT NULL
    );
    CREATE INDEX tools_by_component ON tools(component);",
    ),
    (
        2,
        "CREATE TABLE sessions (
        id                  TEXT PRIMARY KEY,
        created_at          INTEGER NOT NULL,
        session_goal        TEXT,
        phase_goal          TEXT,
        state               TEXT NOT NULL,
        state_detail        TEXT,
        loaded_tools        TEXT NOT NULL,
        policy              TEXT NOT NULL,
        budget              TEXT NOT NULL,
        model               TEXT NOT NULL,
        system_prompt       TEXT NOT NULL,
        meta_version        INTEGER NOT NULL,
        context_start       INTEGER NOT NULL DEFAULT 0,
        steps               INTEGER NOT NULL DEFAULT 0,
        turns               INTEGER NOT NULL DEFAULT 0,
        interrupt_requested INTEGER NOT NULL DEFAULT 0
    );
    CREATE TABLE session_grants (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        host       TEXT NOT NULL,
        guest      TEXT NOT NULL,
        access     TEXT NOT NULL,
        PRIMARY KEY (session_id, guest)
    );
    CREATE TABLE messages (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        seq        INTEGER NOT NULL,
        turn       INTEGER NOT NULL,
        role       TEXT NOT NULL,
        body       TEXT NOT NULL,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE inbox (
        session_id  TEXT NOT NULL REFERENCES sessions(id),
        seq         INTEGER NOT NULL,
        text        TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        consumed_at INTEGER,
        PRIMARY KEY (session_id, seq)
    );
    CREATE TABLE tool_calls (
        session_id       TEXT NOT NULL REFERENCES sessions(id),
        step             INTEGER NOT NULL,
        call_id          TEXT NOT NULL,
        position         INTEGER NOT NULL,
        tool             TEXT NOT NULL,
        input            TEXT NOT NULL,
        input_digest     TEXT NOT NULL,
        component_digest TEXT,
        effect           TEXT,
        status           TEXT NOT NULL,
        result           TEXT,
        error_kind       TEXT,
        changes          TEXT,
        duration_ms      REAL,
        created_at       INTEGER NOT NULL,
        finished_at      INTEGER,
        PRIMARY KEY (session_id, step, call_id)
    );
    CREATE TABLE evidence (
        session_id   TEXT NOT NULL REFERENCES sessions(id),
        step         INTEGER NOT NULL,
        created_at   INTEGER NOT NULL,
        head         TEXT NOT NULL,
        system_hash  TEXT NOT NULL,
        tools_hash   TEXT,
        history_from INTEGER NOT NULL,
        history_to   INTEGER NOT NULL,
        body_sha256  TEXT NOT NULL,
        meta_version INTEGER NOT NULL,
        PRIMARY KEY (session_id, step)
    );
    CREATE TABLE blobs (
        hash TEXT PRIMARY KEY,
        body TEXT NOT NULL
    );
    CREATE TABLE runner_leases (
        session_id   TEXT PRIMARY KEY,
        owner        TEXT NOT NULL,
        heartbeat_ms INTEGER NOT NULL
    );",
    ),
    (
        3,
        "ALTER TABLE sessions ADD COLUMN active_turn INTEGER;
    ALTER TABLE tool_calls ADD COLUMN idempotent INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE tool_calls ADD COLUMN approval_id TEXT;
    CREATE TABLE open_steps (
        session_id TEXT PRIMARY KEY REFERENCES sessions(id),
        step       INTEGER NOT NULL,
        turn       INTEGER NOT NULL,
        assistant  TEXT NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE approvals (
        id               TEXT PRIMARY KEY,
        session_id       TEXT NOT NULL REFERENCES sessions(id),
        step             INTEGER NOT NULL,
        call_id          TEXT NOT NULL,
        result_id        TEXT NOT NULL,
        tool             TEXT NOT NULL,
        effect           TEXT NOT NULL,
        component_digest TEXT NOT NULL,
        input            TEXT NOT NULL,
        input_digest     TEXT NOT NULL,
        grants           TEXT NOT NULL,
        why              TEXT NOT NULL,
        status           TEXT NOT NULL,
        created_at       INTEGER NOT NULL,
        decided_at       INTEGER,
        decision_reason  TEXT,
        consumed_at      INTEGER
    );
    CREATE INDEX approvals_by_session ON approvals(session_id, status);
    CREATE UNIQUE INDEX approvals_live_per_call ON approvals(session_id, step, call_id)
        WHERE status IN ('pending', 'approved');",
    ),
    (
        4,
        // The catalog's own version: every change to components or tools, by any connection,
        // bumps it, so a cached catalog stays valid across the (frequent) commits of sessions.
        "CREATE TABLE catalog_version (
        id      INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
    INSERT INTO catalog_version (id, version) VALUES (1, 0);
    CREATE TRIGGER components_inserted AFTER INSERT ON components
        BEGIN UPDATE catalog_version SET version = version + 1; END;
    CREATE TRIGGER components_updated AFTER UPDATE ON components
        BEGIN UPDATE catalog_version SET version = version + 1; END;
    CREATE TRIGGER components_deleted AFTER DELETE ON components
        BEGIN UPDATE catalog_version SET version = version + 1; END;
    CREATE TRIGGER tools_inserted AFTER INSERT ON tools
        BEGIN UPDATE catalog_version SET version = version + 1; END;
    CREATE TRIGGER tools_updated AFTER UPDATE ON tools
        BEGIN UPDATE catalog_version SET version = version + 1; END;
    CREATE TRIGGER tools_deleted AFTER DELETE ON tools
        BEGIN UPDATE catalog_version SET version = version + 1; END;",
    ),
    (
        5,
        // A session's `meta_version` changes whenever anything a request is built from or a
        // call is governed by changes (goals, tools, policy, budget, model, prompt, grants),
        // whichever statement changed it: the assembly caches the parsed meta by version.
        "CREATE TRIGGER session_meta_changed
        AFTER UPDATE OF session_goal, phase_goal, loaded_tools, policy, budget, model, system_prompt
        ON sessions WHEN NEW.meta_version = OLD.meta_version
        BEGIN UPDATE sessions SET meta_version = OLD.meta_version + 1 WHERE id = NEW.id; END;
    CREATE TRIGGER session_grant_added AFTER INSERT ON session_grants
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = NEW.session_id; END;
    CREATE TRIGGER session_grant_changed AFTER UPDATE ON session_grants
        BEGIN UPDATE sessions SET meta_version = meta_version + 1
              WHERE id IN (OLD.session_id, NEW.session_id); END;
    CREATE TRIGGER session_grant_removed AFTER DELETE ON session_grants
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = OLD.session_id; END;",
    ),
    (
        6,
        // A session's configuration (goals, tools, policy, budget, model, prompt) moves to a
        // table of its own. Every step updates its session's row (state, step counter); with
        // the configuration beside them a row was about 900 bytes for `keel run` (and larger
        // with a long task as the goal), four to a page, so the commits of many sessions
        // dirtied many pages. `sessions` keeps the counters: dozens of rows to a page.
        "CREATE TABLE session_config (
        session_id    TEXT PRIMARY KEY REFERENCES sessions(id),
        session_goal  TEXT,
        phase_goal    TEXT,
        loaded_tools  TEXT NOT NULL,
        policy        TEXT NOT NULL,
        budget        TEXT NOT NULL,
        model         TEXT NOT NULL,
        system_prompt TEXT NOT NULL
    );
    INSERT INTO session_config
        SELECT id, session_goal, phase_goal, loaded_tools, policy, budget, model, system_prompt
        FROM sessions;
    DROP TRIGGER session_meta_changed;
    ALTER TABLE sessions DROP COLUMN session_goal;
    ALTER TABLE sessions DROP COLUMN phase_goal;
    ALTER TABLE sessions DROP COLUMN loaded_tools;
    ALTER TABLE sessions DROP COLUMN policy;
    ALTER TABLE sessions DROP COLUMN budget;
    ALTER TABLE sessions DROP COLUMN model;
    ALTER TABLE sessions DROP COLUMN system_prompt;
    CREATE TRIGGER session_config_changed AFTER UPDATE ON session_config
        BEGIN UPDATE sessions SET meta_version = meta_version + 1
              WHERE id IN (OLD.session_id, NEW.session_id); END;",
    ),
    (
        7,
        // Every version of every tool ever installed (until its component is removed), so
        // that a session keeps running the component digests it loaded after an upgrade;
        // a session's pins (tool name -> component digest) live with its configuration.
        "CREATE TABLE tool_versions (
        name          TEXT NOT NULL,
        digest        TEXT NOT NULL,
        component     TEXT NOT NULL,
        description   TEXT NOT NULL,
        input_schema  TEXT NOT NULL,
        output_schema TEXT,
        effect        TEXT NOT NULL,
        idempotent    INTEGER NOT NULL,
        spec_digest   TEXT NOT NULL,
        PRIMARY KEY (name, digest)
    );
    INSERT OR IGNORE INTO tool_versions
        SELECT t.name, c.digest, t.component, t.description, t.input_schema, t.output_schema,
               t.effect, t.idempotent, t.spec_digest
        FROM tools t JOIN components c ON c.name = t.component;
    ALTER TABLE session_config ADD COLUMN tool_pins TEXT NOT NULL DEFAULT '{}';",
    ),
    (
        8,
        // What each model call came to, with its evidence: the turn, the request's size, the
        // reply's finish reason and the tokens the server reported. Requests the server
        // refused (or that failed otherwise) keep their evidence too, in their own table: a
        // refused request commits no step, so the next one reuses its step number.
        "ALTER TABLE evidence ADD COLUMN turn INTEGER;
    ALTER TABLE evidence ADD COLUMN body_bytes INTEGER;
    ALTER TABLE evidence ADD COLUMN finish_reason TEXT;
    ALTER TABLE evidence ADD COLUMN prompt_tokens INTEGER;
    ALTER TABLE evidence ADD COLUMN completion_tokens INTEGER;
    ALTER TABLE evidence ADD COLUMN cached_tokens INTEGER;
    ALTER TABLE evidence ADD COLUMN duration_ms REAL;
    ALTER TABLE evidence ADD COLUMN attempts INTEGER;
    CREATE TABLE refused_requests (
        session_id   TEXT NOT NULL REFERENCES sessions(id),
        seq          INTEGER NOT NULL,
        turn         INTEGER NOT NULL,
        step         INTEGER NOT NULL,
        created_at   INTEGER NOT NULL,
        http_status  INTEGER,
        error        TEXT NOT NULL,
        attempts     INTEGER NOT NULL,
        duration_ms  REAL NOT NULL,
        head         TEXT NOT NULL,
        system_hash  TEXT NOT NULL,
        tools_hash   TEXT,
        history_from INTEGER NOT NULL,
        history_to   INTEGER NOT NULL,
        body_sha256  TEXT NOT NULL,
        body_bytes   INTEGER NOT NULL,
        meta_version INTEGER NOT NULL,
        PRIMARY KEY (session_id, seq)
    );",
    ),
    (
        9,
        // Durable session events (session::events), written with the facts they report.
        "CREATE TABLE session_events (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        seq        INTEGER NOT NULL,
        at_ms      INTEGER NOT NULL,
        kind       TEXT NOT NULL,
        body       TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)
    );",
    ),
    (
        10,
        // A session's loop guards (JSON; NULL: those of the harness that runs its turns).
        "ALTER TABLE session_config ADD COLUMN guards TEXT;",
    ),
    (
        11,
        // Task understanding and transitions (session::transition): a session's settings for
        // the understanding call (JSON; NULL: off), the turn that opened the current phase,
        // one transition row per turn (what the call answered, what the fixed table did, the
        // call's request kept byte for byte in `blobs` by its SHA-256), and the plan of each
        // phase as an append-only list of versions (session::plan).
        "ALTER TABLE session_config ADD COLUMN preprocess TEXT;
    ALTER TABLE session_config ADD COLUMN phase_turn INTEGER;
    CREATE TABLE task_transitions (
        session_id   TEXT NOT NULL REFERENCES sessions(id),
        turn         INTEGER NOT NULL,
        at_ms        INTEGER NOT NULL,
        relation     TEXT,
        mode         TEXT NOT NULL,
        session_goal TEXT,
        phase_goal   TEXT,
        terms        TEXT NOT NULL,
        error        TEXT,
        body_sha256  TEXT,
        body_bytes   INTEGER,
        reply        TEXT,
        duration_ms  REAL,
        attempts     INTEGER,
        PRIMARY KEY (session_id, turn)
    );
    CREATE TABLE plan_versions (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        version    INTEGER NOT NULL,
        phase_turn INTEGER NOT NULL,
        at_ms      INTEGER NOT NULL,
        change     TEXT NOT NULL,
        steps      TEXT NOT NULL,
        closed     INTEGER NOT NULL DEFAULT 0,
        call_id    TEXT,
        PRIMARY KEY (session_id, version)
    );
    CREATE INDEX plan_versions_by_call ON plan_versions(session_id, call_id);
    CREATE TRIGGER plan_changed AFTER INSERT ON plan_versions
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = NEW.session_id; END;",
    ),
    (
        12,
        // Capabilities on demand. Skills (skills::): every version by the SHA-256 of its
        // content, with its reference files, and the installed one by name. Long-term memory
        // (memory::), by user. Full-text indexes (FTS5, bm25) over skills, tools and memories,
        // kept in step with their tables by triggers. A session's user, the capabilities it
        // loaded and how each arrived (session::capabilities), and one orchestration row per
        // turn that prepared capabilities (what was recalled, asked and added).
        "CREATE TABLE skill_versions (
        digest      TEXT PRIMARY KEY,
        name        TEXT NOT NULL,
        description TEXT NOT NULL,
        body        TEXT NOT NULL,
        files       TEXT NOT NULL,
        tools       TEXT NOT NULL
    );
    CREATE TABLE skill_files (
        digest  TEXT NOT NULL REFERENCES skill_versions(digest),
        path    TEXT NOT NULL,
        content BLOB NOT NULL,
        PRIMARY KEY (digest, path)
    );
    CREATE TABLE skills (
        name         TEXT PRIMARY KEY,
        digest       TEXT NOT NULL REFERENCES skill_versions(digest),
        source       TEXT NOT NULL,
        installed_at TEXT NOT NULL
    );
    CREATE VIRTUAL TABLE skills_fts USING fts5(name, description, body, tokenize='porter unicode61');
    CREATE TRIGGER skill_indexed AFTER INSERT ON skills BEGIN
        INSERT INTO skills_fts(rowid, name, description, body)
            SELECT NEW.rowid, v.name, v.description, v.body FROM skill_versions v
            WHERE v.digest = NEW.digest;
    END;
    CREATE TRIGGER skill_unindexed AFTER DELETE ON skills BEGIN
        DELETE FROM skills_fts WHERE rowid = OLD.rowid;
    END;
    CREATE TRIGGER skill_reindexed AFTER UPDATE ON skills BEGIN
        DELETE FROM skills_fts WHERE rowid = OLD.rowid;
        INSERT INTO skills_fts(rowid, name, description, body)
            SELECT NEW.rowid, v.name, v.description, v.body FROM skill_versions v
            WHERE v.digest = NEW.digest;
    END;
    CREATE VIRTUAL TABLE tools_fts USING fts5(name, description, tokenize='porter unicode61');
    INSERT INTO tools_fts(rowid, name, description) SELECT rowid, name, description FROM tools;
    CREATE TRIGGER tool_indexed AFTER INSERT ON tools BEGIN
        INSERT INTO tools_fts(rowid, name, description) VALUES (NEW.rowid, NEW.name, NEW.description);
    END;
    CREATE TRIGGER tool_unindexed AFTER DELETE ON tools BEGIN
        DELETE FROM tools_fts WHERE rowid = OLD.rowid;
    END;
    CREATE TRIGGER tool_reindexed AFTER UPDATE ON tools BEGIN
        DELETE FROM tools_fts WHERE rowid = OLD.rowid;
        INSERT INTO tools_fts(rowid, name, description) VALUES (NEW.rowid, NEW.name, NEW.description);
    END;
    CREATE TABLE memories (
        id         INTEGER PRIMARY KEY,
        user       TEXT NOT NULL,
        text       TEXT NOT NULL,
        tags       TEXT NOT NULL,
        at_ms      INTEGER NOT NULL,
        session_id TEXT,
        call_id    TEXT
    );
    CREATE INDEX memories_by_user ON memories(user, id);
    CREATE UNIQUE INDEX memories_by_call ON memories(session_id, call_id) WHERE call_id IS NOT NULL;
    CREATE VIRTUAL TABLE memories_fts USING fts5(user, text, tags, tokenize='porter unicode61');
    CREATE TRIGGER memory_indexed AFTER INSERT ON memories BEGIN
        INSERT INTO memories_fts(rowid, user, text, tags) VALUES (NEW.id, NEW.user, NEW.text, NEW.tags);
    END;
    CREATE TRIGGER memory_unindexed AFTER DELETE ON memories BEGIN
        DELETE FROM memories_fts WHERE rowid = OLD.id;
    END;
    ALTER TABLE session_config ADD COLUMN user TEXT;
    CREATE TABLE session_capabilities (
        session_id TEXT NOT NULL REFERENCES sessions(id),
        kind       TEXT NOT NULL,
        name       TEXT NOT NULL,
        via        TEXT NOT NULL,
        turn       INTEGER,
        at_ms      INTEGER NOT NULL,
        digest     TEXT,
        call_id    TEXT,
        PRIMARY KEY (session_id, kind, name)
    );
    CREATE TRIGGER skill_loaded AFTER INSERT ON session_capabilities WHEN NEW.kind = 'skill'
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = NEW.session_id; END;
    CREATE TRIGGER skill_unloaded AFTER DELETE ON session_capabilities WHEN OLD.kind = 'skill'
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = OLD.session_id; END;
    CREATE TABLE orchestrations (
        session_id   TEXT NOT NULL REFERENCES sessions(id),
        turn         INTEGER NOT NULL,
        at_ms        INTEGER NOT NULL,
        mode         TEXT NOT NULL,
        candidates   TEXT NOT NULL,
        memories     TEXT NOT NULL,
        recall_error TEXT,
        recall_ms    REAL,
        body_sha256  TEXT,
        body_bytes   INTEGER,
        reply        TEXT,
        selected     TEXT,
        dropped      TEXT,
        error        TEXT,
        duration_ms  REAL,
        attempts     INTEGER,
        done         INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (session_id, turn)
    );
    CREATE VIRTUAL TABLE skills_vocab USING fts5vocab(skills_fts, 'row');
    CREATE VIRTUAL TABLE tools_vocab USING fts5vocab(tools_fts, 'row');
    CREATE VIRTUAL TABLE memories_vocab USING fts5vocab(memories_fts, 'row');
    CREATE TRIGGER orchestration_recorded AFTER INSERT ON orchestrations
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = NEW.session_id; END;
    CREATE TRIGGER orchestration_finished AFTER UPDATE ON orchestrations
        BEGIN UPDATE sessions SET meta_version = meta_version + 1 WHERE id = NEW.session_id; END;",
    ),
    (
        13,
        // Context compaction. A checkpoint is committed `pending` with its preconditions, then
        // promoted (in the transaction that advances `context_start`) or discarded; a failed
        // attempt is kept as `failed`. Nothing of the history is deleted. A request made after a
        // compaction inside the active turn repeats the turn's user message (`anchor`).
        "CREATE TABLE checkpoints (
        session_id         TEXT NOT NULL REFERENCES sessions(id),
        seq                INTEGER NOT NULL,
        status             TEXT NOT NULL,
        trigger            TEXT NOT NULL,
        turn               INTEGER,
        created_at         INTEGER NOT NULL,
        decided_at         INTEGER,
        range_from         INTEGER NOT NULL,
        range_to           INTEGER NOT NULL,
        prev_context_start INTEGER NOT NULL,
        last_message       INTEGER NOT NULL,
        meta_version       INTEGER NOT NULL,
        anchor             INTEGER,
        previous           INTEGER,
        summary            TEXT,
        artifacts          TEXT,
        body_sha256        TEXT,
        body_bytes         INTEGER,
        reply              TEXT,
        error              TEXT,
        attempts           INTEGER,
        duration_ms        REAL,
        prompt_tokens      INTEGER,
        completion_tokens  INTEGER,
        tokens_before      INTEGER,
        tokens_after       INTEGER,
        PRIMARY KEY (session_id, seq)
    );
    ALTER TABLE evidence ADD COLUMN anchor INTEGER;
    ALTER TABLE refused_requests ADD COLUMN anchor INTEGER;",
    ),
    (
        14,
        // External MCP servers. A server is a `components` row of kind `mcp` (so its tools are
        // a tool set like a component's, found by recall and pinned by sessions); its
        // transport, the claims its tools made and the digest each was accepted at are kept
        // in `mcp_servers`.
        "ALTER TABLE components ADD COLUMN kind TEXT NOT NULL DEFAULT 'component';
    CREATE TABLE mcp_servers (
        name          TEXT PRIMARY KEY,
        spec          TEXT NOT NULL,
        server_info   TEXT NOT NULL,
        tools         TEXT NOT NULL,
        added_at      INTEGER NOT NULL,
        refreshed_at  INTEGER NOT NULL
    );",
    ),
    (
        15,
        // The HTTP API: tokens (stored as their SHA-256, never in plain text) with a role,
        // the grant presets an admin defines for users, who created a session over the API
        // (and under which preset), and who decided each approval.
        "CREATE TABLE api_tokens (
        name        TEXT PRIMARY KEY,
        role        TEXT NOT NULL,
        hash        TEXT NOT NULL UNIQUE,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE grant_presets (
        name          TEXT PRIMARY KEY,
        grants        TEXT NOT NULL,
        user_decides  INTEGER NOT NULL,
        created_at    INTEGER NOT NULL
    );
    ALTER TABLE session_config ADD COLUMN owner TEXT;
    ALTER TABLE approvals ADD COLUMN decided_by TEXT;",
    ),
    (
        16,
        // Workgroups: a main session and the sub-sessions it (and they) delegated to; the
        // durable events between them, each delivered into its receiver's inbox once (the
        // inbox row names the event, unique), in the sender's transaction.
        "ALTER TABLE session_config ADD COLUMN role TEXT NOT NULL DEFAULT 'sub';
    CREATE TABLE workgroups (
        main_id     TEXT PRIMARY KEY REFERENCES sessions(id),
        limits      TEXT NOT NULL,
        preprocess  TEXT,
        tools       TEXT NOT NULL,
        created_at  INTEGER NOT NULL
    );
    CREATE TABLE subsessions (
        session_id   TEXT PRIMARY KEY REFERENCES sessions(id),
        parent_id    TEXT NOT NULL REFERENCES sessions(id),
        main_id      TEXT NOT NULL REFERENCES workgroups(main_id),
        depth        INTEGER NOT NULL,
        purpose      TEXT NOT NULL,
        spawn_call   TEXT NOT NULL,
        status       TEXT NOT NULL,
        requests     INTEGER NOT NULL,
        deadline_at  INTEGER,
        stop_reason  TEXT,
        question     TEXT,
        terminal     TEXT,
        text         TEXT,
        created_at   INTEGER NOT NULL,
        ended_at     INTEGER
    );
    CREATE INDEX subsessions_parent ON subsessions(parent_id, status);
    CREATE INDEX subsessions_main ON subsessions(main_id);
    CREATE TABLE workgroup_events (
        id            TEXT PRIMARY KEY,
        main_id       TEXT NOT NULL REFERENCES workgroups(main_id),
        from_session  TEXT NOT NULL,
        to_session    TEXT NOT NULL,
        kind          TEXT NOT NULL,
        body          TEXT NOT NULL,
        created_at    INTEGER NOT NULL,
        inbox_seq     INTEGER NOT NULL
    );
    CREATE INDEX workgroup_events_main ON workgroup_events(main_id, created_at);
    ALTER TABLE inbox ADD COLUMN event_id TEXT;
    CREATE UNIQUE INDEX inbox_event ON inbox(event_id) WHERE event_id IS NOT NULL;",
    ),
    // Network grants of a session (JSON; NULL: none), the request records of a call, and the
    // network grants in force when an approval was asked.
    (
        17,
        "ALTER TABLE session_config ADD COLUMN net TEXT;
    ALTER TABLE tool_calls ADD COLUMN net TEXT;
    ALTER TABLE approvals ADD COLUMN net TEXT;",
    ),
    // The digest of every compiled artifact keel wrote (a cached artifact is loaded only if its
    // bytes match), and the identity of each granted directory (device and inode when it was
    // granted; a sub-session's grant also names the directory it was opened from, as JSON).
    (
        18,
        "CREATE TABLE artifacts (
        engine      TEXT NOT NULL,
        component   TEXT NOT NULL,
        digest      TEXT NOT NULL,
        written_at  INTEGER NOT NULL,
        PRIMARY KEY (engine, component)
    );
    ALTER TABLE session_grants ADD COLUMN dev INTEGER;
    ALTER TABLE session_grants ADD COLUMN ino INTEGER;
    ALTER TABLE session_grants ADD COLUMN within TEXT;",
    ),
    // Principals are typed: a session's user and a memory's are `local:NAME` (this machine's
    // users) or `token:NAME` (an API token's), so one name never means two principals.
    // Sessions created over the API (with an owner) worked for their token.
    (
        19,
        "UPDATE session_config SET user = CASE WHEN owner IS NOT NULL THEN 'token:' ELSE 'local:' END || user
       WHERE user IS NOT NULL AND user NOT LIKE 'local:%' AND user NOT LIKE 'token:%';
    UPDATE memories SET user = CASE
        WHEN session_id IN (SELECT session_id FROM session_config WHERE owner IS NOT NULL) THEN 'token:'
        ELSE 'local:' END || user
       WHERE user NOT LIKE 'local:%' AND user NOT LIKE 'token:%';
    UPDATE memories_fts SET user = (SELECT user FROM memories WHERE id = memories_fts.rowid);",
    ),
    // The API's principals are typed too: a session's owner is `env:KEEL_API_TOKEN` (the
    // environment's admin) or `token:NAME` (a stored token), so a token can never be named
    // into another principal's sessions. Every change to the tokens bumps `access_version`,
    // which a running `keel serve` watches to end a revoked token's streams and logins at once.
    (
        20,
        "UPDATE session_config SET owner = json_remove(json_set(owner, '$.principal',
           CASE WHEN json_extract(owner, '$.token') = 'KEEL_API_TOKEN' THEN 'env:KEEL_API_TOKEN'
                ELSE 'token:' || json_extract(owner, '$.token') END), '$.token')
       WHERE owner IS NOT NULL AND json_extract(owner, '$.token') IS NOT NULL;
    CREATE TABLE access_version (
        id      INTEGER PRIMARY KEY CHECK (id = 1),
        version INTEGER NOT NULL
    );
    INSERT INTO access_version (id, version) VALUES (1, 0);
    CREATE TRIGGER api_tokens_inserted AFTER INSERT ON api_tokens
        BEGIN UPDATE access_version SET version = version + 1; END;
    CREATE TRIGGER api_tokens_updated AFTER UPDATE ON api_tokens
        BEGIN UPDATE access_version SET version = version + 1; END;
    CREATE TRIGGER api_tokens_deleted AFTER DELETE ON api_tokens
        BEGIN UPDATE access_version SET version = version + 1; END;",
    ),
];

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database {path}: {source}")]
    Open {
        path: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("the database commit failed: {message}")]
    Commit { message: String },
    #[error("the database writer has stopped")]
    WriterGone,
    /// What was asked for does not exist (a session, a step's evidence …).
    #[error("{0}")]
    NotFound(String),
    /// The request conflicts with what is stored (a session id taken, an approval used).
    #[error("{0}")]
    Conflict(String),
    /// The request itself cannot be stored (an empty input, an id keel cannot use).
    #[error("{0}")]
    Input(String),
    /// Stored data does not read back as keel wrote it (unreadable, or altered).
    #[error("{0}")]
    Corrupt(String),
    /// A task of the store or of its caller failed (it panicked or could not start).
    #[error("{0}")]
    Task(String),
    #[error(
        "database schema version {found} is newer than this keel understands ({known}); \
         upgrade keel"
    )]
    TooNew { found: i64, known: i64 },
}

impl StoreError {
    /// A stable name of the error's kind: `not_found`, `conflict`, `input`, `corrupt`, or
    /// `store` for a failure of the database itself.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Input(_) => "input",
            Self::Corrupt(_) => "corrupt",
            Self::Open { .. }
            | Self::Sql(_)
            | Self::Commit { .. }
            | Self::WriterGone
            | Self::Task(_)
            | Self::TooNew { .. } => "store",
        }
    }
}

mod writer;

pub use writer::{Db, DbStats};

/// A value as the JSON text of a column.
pub fn json<T: serde::Serialize>(v: &T) -> Result<String, StoreError> {
    serde_json::to_string(v)
        .map_err(|e| StoreError::Corrupt(format!("a value cannot be encoded: {e}")))
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// How durably a commit is written (SQLite's `synchronous` in WAL mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Synchronous {
    /// Every commit's WAL write is synced (one fsync) before keel reports it: a power loss
    /// loses nothing that was reported committed. The default.
    #[default]
    Full,
    /// Commits are not synced; the WAL is synced at checkpoints. A crash of keel loses
    /// nothing, a power loss or kernel crash may lose the last commits (never the database's
    /// consistency). No fsync on a step's path.
    Normal,
    /// Nothing is ever synced: a power loss may corrupt the database. For throwaway homes.
    Off,
}

impl Synchronous {
    /// The value of `PRAGMA synchronous`.
    pub fn pragma(self) -> &'static str {
        match self {
            Self::Full => "FULL",
            Self::Normal => "NORMAL",
            Self::Off => "OFF",
        }
    }
}

impl std::str::FromStr for Synchronous {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(Self::Full),
            "normal" => Ok(Self::Normal),
            "off" => Ok(Self::Off),
            _ => Err(format!(
                "`{}` is not a synchronous mode: use full (every commit synced, the default), \
                 normal (synced at checkpoints) or off (never synced)",
                s.escape_debug()
            )),
        }
    }
}

/// Opens (creating if needed) the database at `path` and brings its schema up to date, with
/// every commit synced (`synchronous=FULL`).
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    open_with(path, Synchronous::Full)
}

/// Like [`open`], committing as durably as `sync` says.
///
/// SQLite is built without its own directory syncs (`SQLITE_DISABLE_DIRSYNC`: it would sync
/// the directory the first time every process syncs the WAL). The directory entries that
/// matter are the database's and its WAL's; when either file is new, this syncs the directory
/// once, before any business commit, unless nothing is synced at all (`synchronous=off`).
pub fn open_with(path: &Path, sync: Synchronous) -> Result<Connection, StoreError> {
    let open_err = |source| StoreError::Open { path: path.display().to_string(), source };
    let new_files = !path.exists() || !wal_path(path).exists();
    if !path.exists() {
        // Created private: SQLite gives the WAL and shared-memory files the database's mode.
        crate::home::touch_private(path).map_err(|e| {
            StoreError::Task(format!("cannot create the database {}: {e}", path.display()))
        })?;
    }
    let mut conn = Connection::open(path).map_err(open_err)?;
    conn.busy_timeout(BUSY_TIMEOUT).map_err(open_err)?;
    conn.pragma_update(None, "journal_mode", "WAL").map_err(open_err)?;
    conn.pragma_update(None, "synchronous", sync.pragma()).map_err(open_err)?;
    conn.pragma_update(None, "foreign_keys", "ON").map_err(open_err)?;
    tune(&conn).map_err(open_err)?;
    migrate(&mut conn)?;
    if new_files && sync != Synchronous::Off {
        sync_parent(path)?;
    }
    Ok(conn)
}

/// The WAL file of the database at `path`.
fn wal_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push("-wal");
    name.into()
}

/// Makes the directory entries of `path`'s directory durable.
fn sync_parent(path: &Path) -> Result<(), StoreError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::Task(format!("cannot sync the directory {}: {e}", dir.display())))
}

/// Per-connection settings of every connection keel opens.
pub(crate) fn tune(conn: &Connection) -> rusqlite::Result<()> {
    // Every business operation uses cached statements; the default cache (16) is smaller than
    // the writer's working set.
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    // Query-planner stability: without it, a cached statement whose plan could depend on a
    // bound value is re-prepared whenever that value changes — on every call of the hot
    // statements here (it was a third of the writer's CPU).
    conn.set_db_config(rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG, true)?;
    Ok(())
}

/// Opens the database at `path` with its schema brought only up to migration `version` — how a
/// database written by an older keel looks (for upgrade tests).
#[doc(hidden)]
pub fn open_at_version(path: &Path, version: i64) -> Result<Connection, StoreError> {
    let mut conn = Connection::open(path)
        .map_err(|source| StoreError::Open { path: path.display().to_string(), source })?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    migrate_to(&mut conn, version)?;
    Ok(conn)
}

fn migrate(conn: &mut Connection) -> Result<(), StoreError> {
    migrate_to(conn, i64::MAX)
}

fn migrate_to(conn: &mut Connection, up_to: i64) -> Result<(), StoreError> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)",
    )?;
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    for &(version, sql) in MIGRATIONS.iter().filter(|m| m.0 <= up_to) {
        let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let done: bool = tx.query_row(
            "SELECT EXISTS(SELECT 1 FROM schema_migrations WHERE version = ?1)",
            [version],
            |r| r.get(0),
        )?;
        if !done {
            tx.execute_batch(sql)?;
            tx.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (?1, datetime('now'))",
                [version],
            )?;
            crate::crash::point("mid_migration");
        }
        tx.commit()?;
    }
    let found: i64 =
        conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| {
            r.get(0)
        })?;
    if found > known {
        return Err(StoreError::TooNew { found, known });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migration_20_types_the_owners_of_sessions() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.db");
        let c = open_at_version(&path, 19).unwrap();
        for (id, owner) in [
            ("a", r#"{"token":"alice","user_decides":true}"#),
            ("e", r#"{"token":"KEEL_API_TOKEN","user_decides":false}"#),
        ] {
            c.execute(
                "INSERT INTO sessions (id, created_at, state, meta_version) VALUES (?1, 0, 'idle', 0)",
                [id],
            )
            .unwrap();
            c.execute(
                "INSERT INTO session_config (session_id, loaded_tools, policy, budget, model, system_prompt, owner)
                 VALUES (?1, '[]', '{}', '{}', '{}', '', ?2)",
                [id, owner],
            )
            .unwrap();
        }
        drop(c);
        let mut c = Connection::open(&path).unwrap();
        migrate(&mut c).unwrap();
        let owner = |id: &str| -> serde_json::Value {
            let text: String = c
                .query_row("SELECT owner FROM session_config WHERE session_id = ?1", [id], |r| {
                    r.get(0)
                })
                .unwrap();
            serde_json::from_str(&text).unwrap()
        };
        assert_eq!(
            owner("a"),
            serde_json::json!({"principal": "token:alice", "user_decides": true})
        );
        assert_eq!(owner("e")["principal"], "env:KEEL_API_TOKEN");
        let v: i64 = c.query_row("SELECT version FROM access_version", [], |r| r.get(0)).unwrap();
        c.execute(
            "INSERT INTO api_tokens (name, role, hash, created_at) VALUES ('x', 'user', 'h', 0)",
            [],
        )
        .unwrap();
        c.execute("DELETE FROM api_tokens WHERE name = 'x'", []).unwrap();
        let w: i64 = c.query_row("SELECT version FROM access_version", [], |r| r.get(0)).unwrap();
        assert_eq!(w, v + 2);
    }
}
