//! The numbered schema migrations, oldest first; append only, never edit one that shipped.
//!
//! Over 600 lines, on purpose: it is one list of SQL in the order it is applied, and reads
//! best whole (each migration is applied in its own transaction by [`super`]).

/// (version, SQL) of each migration SQLite alone has: those before PostgreSQL's baseline
/// (`postgres_schema::BASELINE`), whose schema a PostgreSQL store starts from.
const SQLITE_ONLY: &[(i64, &str)] = &[
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
    // Signatures and trust: the publishers' keys an admin trusts (each for the packages its
    // glob covers), and what an install recorded of a component's signature — the trusted
    // key that signed it, or that it was installed unsigned on purpose (`--allow-unsigned`).
    (
        21,
        "CREATE TABLE trusted_keys (
        name       TEXT PRIMARY KEY,
        public_key TEXT NOT NULL UNIQUE,
        packages   TEXT NOT NULL,
        added_at   TEXT NOT NULL
    );
    ALTER TABLE components ADD COLUMN signer TEXT;
    ALTER TABLE components ADD COLUMN signer_key TEXT;
    ALTER TABLE components ADD COLUMN unsigned_allowed INTEGER NOT NULL DEFAULT 0;",
    ),
    // Components and skills installed from a registry: the digest of the manifest the
    // reference (kept in `source`) named when it was pulled, so a tag that moved is seen.
    (
        22,
        "ALTER TABLE components ADD COLUMN manifest_digest TEXT;
    ALTER TABLE skills ADD COLUMN manifest_digest TEXT;",
    ),
];

/// A migration after PostgreSQL's baseline, written once for both databases: its SQL in
/// SQLite's spelling, which [`postgres_text`] turns into PostgreSQL's (the column types), and
/// PostgreSQL's own text only where a translation would not do (`postgres`).
pub(super) struct Shared {
    pub version: i64,
    pub sql: &'static str,
    pub postgres: Option<&'static str>,
}

/// Every migration after PostgreSQL's baseline, oldest first.
pub(super) const SHARED: &[Shared] = &[
    Shared {
        version: 23,
        sql: "ALTER TABLE runner_leases ADD COLUMN fence INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE session_events ADD COLUMN fence INTEGER;",
        postgres: None,
    },
    // Installed components' bytes, so that every host of a shared store can compile them (on
    // SQLite the home's `components/` directory keeps them and this table stays empty).
    Shared {
        version: 24,
        sql: "CREATE TABLE component_files (digest TEXT PRIMARY KEY, bytes BLOB NOT NULL);",
        postgres: None,
    },
    // Skills from a registry are signed like components: the trusted key whose detached
    // signature covered the bundle's manifest, or that it was installed unsigned on purpose.
    Shared {
        version: 25,
        sql: "ALTER TABLE skills ADD COLUMN signer TEXT;
    ALTER TABLE skills ADD COLUMN signer_key TEXT;
    ALTER TABLE skills ADD COLUMN unsigned_allowed INTEGER NOT NULL DEFAULT 0;",
        postgres: None,
    },
    // A request whose history's tool results were cut to fit a small window records the
    // size it cut them to, so that its evidence rebuilds byte for byte.
    Shared {
        version: 26,
        sql: "ALTER TABLE evidence ADD COLUMN result_cap INTEGER;
    ALTER TABLE refused_requests ADD COLUMN result_cap INTEGER;",
        postgres: None,
    },
    // What changes from turn to turn (goals, plan, summary, memories) is sent as a second
    // system message, stored by content hash like the first.
    Shared {
        version: 27,
        sql: "ALTER TABLE evidence ADD COLUMN notes_hash TEXT;
    ALTER TABLE refused_requests ADD COLUMN notes_hash TEXT;",
        postgres: None,
    },
    // A title a person gave the session (`keel session title`); without one, lists show its
    // goal.
    Shared {
        version: 28,
        sql: "ALTER TABLE session_config ADD COLUMN title TEXT;",
        postgres: None,
    },
    // What tools' changes replaced, kept to undo them: the bytes once per content, and which
    // of them each session holds.
    Shared {
        version: 29,
        sql: "CREATE TABLE file_blobs (sha256 TEXT PRIMARY KEY, bytes BLOB NOT NULL);
    CREATE TABLE session_preimages (
        session_id TEXT NOT NULL,
        sha256     TEXT NOT NULL,
        size       INTEGER NOT NULL,
        PRIMARY KEY (session_id, sha256)
    );",
        postgres: None,
    },
    // What a call's tool wrote to its log, stdout and stderr, kept with the call for its
    // author (bounded and redacted; never sent to the model).
    Shared { version: 30, sql: "ALTER TABLE tool_calls ADD COLUMN logs TEXT;", postgres: None },
    // The version a component carries (its `version` custom section), shown by `tool list`
    // and compared by `tool outdated`.
    Shared { version: 31, sql: "ALTER TABLE components ADD COLUMN version TEXT;", postgres: None },
];

/// SQLite's migrations, oldest first: (version, SQL).
pub(super) fn sqlite() -> impl Iterator<Item = (i64, std::borrow::Cow<'static, str>)> {
    let own = SQLITE_ONLY.iter().map(|&(v, sql)| (v, sql.into()));
    own.chain(SHARED.iter().map(|m| (m.version, m.sql.into())))
}

/// PostgreSQL's migrations, oldest first: its baseline, then the shared ones in its spelling.
pub(super) fn postgres() -> impl Iterator<Item = (i64, std::borrow::Cow<'static, str>)> {
    let baseline = std::iter::once((
        super::postgres_schema::BASELINE,
        super::postgres_schema::BASELINE_SQL.into(),
    ));
    baseline.chain(SHARED.iter().map(|m| match m.postgres {
        Some(own) => (m.version, own.into()),
        None => (m.version, postgres_text(m.sql).into()),
    }))
}

/// The schema version this build migrates a database to.
pub(super) fn latest() -> i64 {
    SHARED.last().map_or(SQLITE_ONLY.last().map_or(0, |m| m.0), |m| m.version)
}

/// SQLite's spelling of a migration made PostgreSQL's: the column types `INTEGER`, `REAL` and
/// `BLOB` (whole words, any case, outside quoted text) become `BIGINT`, `DOUBLE PRECISION` and
/// `BYTEA`; the rest is the same in both.
pub(super) fn postgres_text(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 16);
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut String| {
        let replaced = match word.to_ascii_uppercase().as_str() {
            "INTEGER" => "BIGINT",
            "REAL" => "DOUBLE PRECISION",
            "BLOB" => "BYTEA",
            _ => word.as_str(),
        };
        out.push_str(replaced);
        word.clear();
    };
    let mut quoted = false;
    for c in sql.chars() {
        if c == '\'' {
            quoted = !quoted;
        }
        if !quoted && (c.is_ascii_alphanumeric() || c == '_') {
            word.push(c);
        } else {
            flush(&mut word, &mut out);
            out.push(c);
        }
    }
    flush(&mut word, &mut out);
    out
}
