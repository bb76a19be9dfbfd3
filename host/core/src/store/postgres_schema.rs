//! The schema of a PostgreSQL store: the same tables as SQLite's, in PostgreSQL's types
//! (`BIGINT` for integers, `DOUBLE PRECISION` for reals, `BYTEA` for bytes), with triggers as
//! functions and full-text search as weighted `tsvector` columns with GIN indexes in place of
//! FTS5 tables. Versioned with SQLite's migrations: a PostgreSQL database starts at the
//! baseline (the schema of SQLite migration [`BASELINE`]), and every later migration is written
//! once for both (`migrations::SHARED`).

/// The SQLite migration whose schema a new PostgreSQL database starts from.
pub(super) const BASELINE: i64 = 22;

/// The schema a new PostgreSQL database starts from: SQLite's at migration [`BASELINE`].
pub(super) const BASELINE_SQL: &str = r#"
    CREATE TABLE components (
            name         TEXT PRIMARY KEY,
            digest       TEXT NOT NULL,
            size         BIGINT NOT NULL,
            source       TEXT NOT NULL,
            builtin      BIGINT NOT NULL,
            installed_at TEXT NOT NULL
        , kind TEXT NOT NULL DEFAULT 'component', signer TEXT, signer_key TEXT, unsigned_allowed BIGINT NOT NULL DEFAULT 0, manifest_digest TEXT);
    CREATE TABLE tools (
            name          TEXT PRIMARY KEY,
            component     TEXT NOT NULL REFERENCES components(name) ON DELETE CASCADE,
            description   TEXT NOT NULL,
            input_schema  TEXT NOT NULL,
            output_schema TEXT,
            effect        TEXT NOT NULL,
            idempotent    BIGINT NOT NULL,
            spec_digest   TEXT NOT NULL
        );
    CREATE INDEX tools_by_component ON tools(component);
    ALTER TABLE tools ADD COLUMN fts tsvector GENERATED ALWAYS AS
        (setweight(to_tsvector('english', name), 'A')
         || setweight(to_tsvector('english', description), 'B')) STORED;
    CREATE INDEX tools_fts ON tools USING GIN (fts);
    CREATE TABLE sessions (
            id                  TEXT PRIMARY KEY,
            created_at          BIGINT NOT NULL,
            state               TEXT NOT NULL,
            state_detail        TEXT,
            meta_version        BIGINT NOT NULL,
            context_start       BIGINT NOT NULL DEFAULT 0,
            steps               BIGINT NOT NULL DEFAULT 0,
            turns               BIGINT NOT NULL DEFAULT 0,
            interrupt_requested BIGINT NOT NULL DEFAULT 0
        , active_turn BIGINT);
    CREATE TABLE session_grants (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            host       TEXT NOT NULL,
            guest      TEXT NOT NULL,
            access     TEXT NOT NULL, dev BIGINT, ino BIGINT, within TEXT,
            PRIMARY KEY (session_id, guest)
        );
    CREATE TABLE messages (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            seq        BIGINT NOT NULL,
            turn       BIGINT NOT NULL,
            role       TEXT NOT NULL,
            body       TEXT NOT NULL,
            created_at BIGINT NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
    CREATE TABLE inbox (
            session_id  TEXT NOT NULL REFERENCES sessions(id),
            seq         BIGINT NOT NULL,
            text        TEXT NOT NULL,
            created_at  BIGINT NOT NULL,
            consumed_at BIGINT, event_id TEXT,
            PRIMARY KEY (session_id, seq)
        );
    CREATE TABLE tool_calls (
            session_id       TEXT NOT NULL REFERENCES sessions(id),
            step             BIGINT NOT NULL,
            call_id          TEXT NOT NULL,
            position         BIGINT NOT NULL,
            tool             TEXT NOT NULL,
            input            TEXT NOT NULL,
            input_digest     TEXT NOT NULL,
            component_digest TEXT,
            effect           TEXT,
            status           TEXT NOT NULL,
            result           TEXT,
            error_kind       TEXT,
            changes          TEXT,
            duration_ms      DOUBLE PRECISION,
            created_at       BIGINT NOT NULL,
            finished_at      BIGINT, idempotent BIGINT NOT NULL DEFAULT 0, approval_id TEXT, net TEXT,
            PRIMARY KEY (session_id, step, call_id)
        );
    CREATE TABLE evidence (
            session_id   TEXT NOT NULL REFERENCES sessions(id),
            step         BIGINT NOT NULL,
            created_at   BIGINT NOT NULL,
            head         TEXT NOT NULL,
            system_hash  TEXT NOT NULL,
            tools_hash   TEXT,
            history_from BIGINT NOT NULL,
            history_to   BIGINT NOT NULL,
            body_sha256  TEXT NOT NULL,
            meta_version BIGINT NOT NULL, turn BIGINT, body_bytes BIGINT, finish_reason TEXT, prompt_tokens BIGINT, completion_tokens BIGINT, cached_tokens BIGINT, duration_ms DOUBLE PRECISION, attempts BIGINT, anchor BIGINT,
            PRIMARY KEY (session_id, step)
        );
    CREATE TABLE blobs (
            hash TEXT PRIMARY KEY,
            body TEXT NOT NULL
        );
    CREATE TABLE runner_leases (
            session_id   TEXT PRIMARY KEY,
            owner        TEXT NOT NULL,
            heartbeat_ms BIGINT NOT NULL
        );
    CREATE TABLE open_steps (
            session_id TEXT PRIMARY KEY REFERENCES sessions(id),
            step       BIGINT NOT NULL,
            turn       BIGINT NOT NULL,
            assistant  TEXT NOT NULL,
            created_at BIGINT NOT NULL
        );
    CREATE TABLE approvals (
            id               TEXT PRIMARY KEY,
            session_id       TEXT NOT NULL REFERENCES sessions(id),
            step             BIGINT NOT NULL,
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
            created_at       BIGINT NOT NULL,
            decided_at       BIGINT,
            decision_reason  TEXT,
            consumed_at      BIGINT
        , decided_by TEXT, net TEXT);
    CREATE INDEX approvals_by_session ON approvals(session_id, status);
    CREATE UNIQUE INDEX approvals_live_per_call ON approvals(session_id, step, call_id)
            WHERE status IN ('pending', 'approved');
    CREATE TABLE catalog_version (
            id      BIGINT PRIMARY KEY CHECK (id = 1),
            version BIGINT NOT NULL
        );
    CREATE TABLE session_config (
            session_id    TEXT PRIMARY KEY REFERENCES sessions(id),
            session_goal  TEXT,
            phase_goal    TEXT,
            loaded_tools  TEXT NOT NULL,
            policy        TEXT NOT NULL,
            budget        TEXT NOT NULL,
            model         TEXT NOT NULL,
            system_prompt TEXT NOT NULL
        , tool_pins TEXT NOT NULL DEFAULT '{}', guards TEXT, preprocess TEXT, phase_turn BIGINT, "user" TEXT, owner TEXT, role TEXT NOT NULL DEFAULT 'sub', net TEXT);
    CREATE TABLE tool_versions (
            name          TEXT NOT NULL,
            digest        TEXT NOT NULL,
            component     TEXT NOT NULL,
            description   TEXT NOT NULL,
            input_schema  TEXT NOT NULL,
            output_schema TEXT,
            effect        TEXT NOT NULL,
            idempotent    BIGINT NOT NULL,
            spec_digest   TEXT NOT NULL,
            PRIMARY KEY (name, digest)
        );
    CREATE TABLE refused_requests (
            session_id   TEXT NOT NULL REFERENCES sessions(id),
            seq          BIGINT NOT NULL,
            turn         BIGINT NOT NULL,
            step         BIGINT NOT NULL,
            created_at   BIGINT NOT NULL,
            http_status  BIGINT,
            error        TEXT NOT NULL,
            attempts     BIGINT NOT NULL,
            duration_ms  DOUBLE PRECISION NOT NULL,
            head         TEXT NOT NULL,
            system_hash  TEXT NOT NULL,
            tools_hash   TEXT,
            history_from BIGINT NOT NULL,
            history_to   BIGINT NOT NULL,
            body_sha256  TEXT NOT NULL,
            body_bytes   BIGINT NOT NULL,
            meta_version BIGINT NOT NULL, anchor BIGINT,
            PRIMARY KEY (session_id, seq)
        );
    CREATE TABLE session_events (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            seq        BIGINT NOT NULL,
            at_ms      BIGINT NOT NULL,
            kind       TEXT NOT NULL,
            body       TEXT NOT NULL,
            PRIMARY KEY (session_id, seq)
        );
    CREATE TABLE task_transitions (
            session_id   TEXT NOT NULL REFERENCES sessions(id),
            turn         BIGINT NOT NULL,
            at_ms        BIGINT NOT NULL,
            relation     TEXT,
            mode         TEXT NOT NULL,
            session_goal TEXT,
            phase_goal   TEXT,
            terms        TEXT NOT NULL,
            error        TEXT,
            body_sha256  TEXT,
            body_bytes   BIGINT,
            reply        TEXT,
            duration_ms  DOUBLE PRECISION,
            attempts     BIGINT,
            PRIMARY KEY (session_id, turn)
        );
    CREATE TABLE plan_versions (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            version    BIGINT NOT NULL,
            phase_turn BIGINT NOT NULL,
            at_ms      BIGINT NOT NULL,
            change     TEXT NOT NULL,
            steps      TEXT NOT NULL,
            closed     BIGINT NOT NULL DEFAULT 0,
            call_id    TEXT,
            PRIMARY KEY (session_id, version)
        );
    CREATE INDEX plan_versions_by_call ON plan_versions(session_id, call_id);
    CREATE TABLE skill_versions (
            digest      TEXT PRIMARY KEY,
            name        TEXT NOT NULL,
            description TEXT NOT NULL,
            body        TEXT NOT NULL,
            files       TEXT NOT NULL,
            tools       TEXT NOT NULL
        );
    ALTER TABLE skill_versions ADD COLUMN fts tsvector GENERATED ALWAYS AS
        (setweight(to_tsvector('english', name), 'A')
         || setweight(to_tsvector('english', description), 'B')
         || setweight(to_tsvector('english', body), 'D')) STORED;
    CREATE TABLE skill_files (
            digest  TEXT NOT NULL REFERENCES skill_versions(digest),
            path    TEXT NOT NULL,
            content BYTEA NOT NULL,
            PRIMARY KEY (digest, path)
        );
    CREATE TABLE skills (
            name         TEXT PRIMARY KEY,
            digest       TEXT NOT NULL REFERENCES skill_versions(digest),
            source       TEXT NOT NULL,
            installed_at TEXT NOT NULL
        , manifest_digest TEXT);
    END;
    END;
    END;
    END;
    END;
    END;
    CREATE TABLE memories (
            id         BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
            "user"       TEXT NOT NULL,
            text       TEXT NOT NULL,
            tags       TEXT NOT NULL,
            at_ms      BIGINT NOT NULL,
            session_id TEXT,
            call_id    TEXT
        );
    CREATE INDEX memories_by_user ON memories("user", id);
    ALTER TABLE memories ADD COLUMN fts tsvector GENERATED ALWAYS AS
        (setweight(to_tsvector('english', text), 'B') || setweight(to_tsvector('english', tags), 'A')) STORED;
    CREATE INDEX memories_fts ON memories USING GIN (fts);
    CREATE UNIQUE INDEX memories_by_call ON memories(session_id, call_id) WHERE call_id IS NOT NULL;
    END;
    END;
    CREATE TABLE session_capabilities (
            session_id TEXT NOT NULL REFERENCES sessions(id),
            kind       TEXT NOT NULL,
            name       TEXT NOT NULL,
            via        TEXT NOT NULL,
            turn       BIGINT,
            at_ms      BIGINT NOT NULL,
            digest     TEXT,
            call_id    TEXT,
            PRIMARY KEY (session_id, kind, name)
        );
    CREATE TABLE orchestrations (
            session_id   TEXT NOT NULL REFERENCES sessions(id),
            turn         BIGINT NOT NULL,
            at_ms        BIGINT NOT NULL,
            mode         TEXT NOT NULL,
            candidates   TEXT NOT NULL,
            memories     TEXT NOT NULL,
            recall_error TEXT,
            recall_ms    DOUBLE PRECISION,
            body_sha256  TEXT,
            body_bytes   BIGINT,
            reply        TEXT,
            selected     TEXT,
            dropped      TEXT,
            error        TEXT,
            duration_ms  DOUBLE PRECISION,
            attempts     BIGINT,
            done         BIGINT NOT NULL DEFAULT 0,
            PRIMARY KEY (session_id, turn)
        );
    CREATE TABLE checkpoints (
            session_id         TEXT NOT NULL REFERENCES sessions(id),
            seq                BIGINT NOT NULL,
            status             TEXT NOT NULL,
            trigger            TEXT NOT NULL,
            turn               BIGINT,
            created_at         BIGINT NOT NULL,
            decided_at         BIGINT,
            range_from         BIGINT NOT NULL,
            range_to           BIGINT NOT NULL,
            prev_context_start BIGINT NOT NULL,
            last_message       BIGINT NOT NULL,
            meta_version       BIGINT NOT NULL,
            anchor             BIGINT,
            previous           BIGINT,
            summary            TEXT,
            artifacts          TEXT,
            body_sha256        TEXT,
            body_bytes         BIGINT,
            reply              TEXT,
            error              TEXT,
            attempts           BIGINT,
            duration_ms        DOUBLE PRECISION,
            prompt_tokens      BIGINT,
            completion_tokens  BIGINT,
            tokens_before      BIGINT,
            tokens_after       BIGINT,
            PRIMARY KEY (session_id, seq)
        );
    CREATE TABLE mcp_servers (
            name          TEXT PRIMARY KEY,
            spec          TEXT NOT NULL,
            server_info   TEXT NOT NULL,
            tools         TEXT NOT NULL,
            added_at      BIGINT NOT NULL,
            refreshed_at  BIGINT NOT NULL
        );
    CREATE TABLE api_tokens (
            name        TEXT PRIMARY KEY,
            role        TEXT NOT NULL,
            hash        TEXT NOT NULL UNIQUE,
            created_at  BIGINT NOT NULL
        );
    CREATE TABLE grant_presets (
            name          TEXT PRIMARY KEY,
            grants        TEXT NOT NULL,
            user_decides  BIGINT NOT NULL,
            created_at    BIGINT NOT NULL
        );
    CREATE TABLE workgroups (
            main_id     TEXT PRIMARY KEY REFERENCES sessions(id),
            limits      TEXT NOT NULL,
            preprocess  TEXT,
            tools       TEXT NOT NULL,
            created_at  BIGINT NOT NULL
        );
    CREATE TABLE subsessions (
            session_id   TEXT PRIMARY KEY REFERENCES sessions(id),
            parent_id    TEXT NOT NULL REFERENCES sessions(id),
            main_id      TEXT NOT NULL REFERENCES workgroups(main_id),
            depth        BIGINT NOT NULL,
            purpose      TEXT NOT NULL,
            spawn_call   TEXT NOT NULL,
            status       TEXT NOT NULL,
            requests     BIGINT NOT NULL,
            deadline_at  BIGINT,
            stop_reason  TEXT,
            question     TEXT,
            terminal     TEXT,
            text         TEXT,
            created_at   BIGINT NOT NULL,
            ended_at     BIGINT
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
            created_at    BIGINT NOT NULL,
            inbox_seq     BIGINT NOT NULL,
            rowid         BIGINT GENERATED ALWAYS AS IDENTITY
        );
    CREATE INDEX workgroup_events_main ON workgroup_events(main_id, created_at);
    CREATE UNIQUE INDEX inbox_event ON inbox(event_id) WHERE event_id IS NOT NULL;
    CREATE TABLE artifacts (
            engine      TEXT NOT NULL,
            component   TEXT NOT NULL,
            digest      TEXT NOT NULL,
            written_at  BIGINT NOT NULL,
            PRIMARY KEY (engine, component)
        );
    CREATE TABLE access_version (
            id      BIGINT PRIMARY KEY CHECK (id = 1),
            version BIGINT NOT NULL
        );
    CREATE TABLE trusted_keys (
            name       TEXT PRIMARY KEY,
            public_key TEXT NOT NULL UNIQUE,
            packages   TEXT NOT NULL,
            added_at   TEXT NOT NULL
        );
    INSERT INTO catalog_version (id, version) VALUES (1, 0);
    INSERT INTO access_version (id, version) VALUES (1, 0);
    CREATE FUNCTION keel_catalog_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN UPDATE catalog_version SET version = version + 1; RETURN NULL; END $$;
    CREATE TRIGGER components_changed AFTER INSERT OR UPDATE OR DELETE ON components
        FOR EACH ROW EXECUTE FUNCTION keel_catalog_changed();
    CREATE TRIGGER tools_changed AFTER INSERT OR UPDATE OR DELETE ON tools
        FOR EACH ROW EXECUTE FUNCTION keel_catalog_changed();
    CREATE FUNCTION keel_access_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN UPDATE access_version SET version = version + 1; RETURN NULL; END $$;
    CREATE TRIGGER api_tokens_changed AFTER INSERT OR UPDATE OR DELETE ON api_tokens
        FOR EACH ROW EXECUTE FUNCTION keel_access_changed();
    CREATE FUNCTION keel_meta_changed() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF TG_OP <> 'DELETE' THEN
            UPDATE sessions SET meta_version = meta_version + 1 WHERE id = NEW.session_id;
        END IF;
        IF TG_OP = 'DELETE' OR (TG_OP = 'UPDATE' AND OLD.session_id IS DISTINCT FROM NEW.session_id) THEN
            UPDATE sessions SET meta_version = meta_version + 1 WHERE id = OLD.session_id;
        END IF;
        RETURN NULL;
    END $$;
    CREATE TRIGGER session_grants_changed AFTER INSERT OR UPDATE OR DELETE ON session_grants
        FOR EACH ROW EXECUTE FUNCTION keel_meta_changed();
    CREATE TRIGGER session_config_changed AFTER UPDATE ON session_config
        FOR EACH ROW EXECUTE FUNCTION keel_meta_changed();
    CREATE TRIGGER plan_changed AFTER INSERT ON plan_versions
        FOR EACH ROW EXECUTE FUNCTION keel_meta_changed();
    CREATE TRIGGER skill_loaded AFTER INSERT ON session_capabilities
        FOR EACH ROW WHEN (NEW.kind = 'skill') EXECUTE FUNCTION keel_meta_changed();
    CREATE TRIGGER skill_unloaded AFTER DELETE ON session_capabilities
        FOR EACH ROW WHEN (OLD.kind = 'skill') EXECUTE FUNCTION keel_meta_changed();
    CREATE TRIGGER orchestration_changed AFTER INSERT OR UPDATE ON orchestrations
        FOR EACH ROW EXECUTE FUNCTION keel_meta_changed();
"#;

#[cfg(test)]
mod tests {
    use super::super::migrations::{self, SHARED};

    #[test]
    fn both_databases_migrate_to_the_same_version() {
        let sqlite: Vec<i64> = migrations::sqlite().map(|m| m.0).collect();
        let postgres: Vec<i64> = migrations::postgres().map(|m| m.0).collect();
        assert_eq!(sqlite.last(), postgres.last(), "both end at the same migration");
        assert_eq!(sqlite.last(), Some(&migrations::latest()));
        assert_eq!(postgres.first(), Some(&super::BASELINE));
        assert_eq!(SHARED.first().map(|m| m.version), Some(super::BASELINE + 1));
        for list in [&sqlite, &postgres] {
            assert!(list.windows(2).all(|w| w[0] + 1 == w[1]), "{list:?}");
        }
    }

    #[test]
    fn a_shared_migration_reads_as_postgresql_in_its_types() {
        assert_eq!(
            migrations::postgres_text(
                "ALTER TABLE t ADD COLUMN n INTEGER NOT NULL DEFAULT 0; CREATE TABLE b (x BLOB, \
                 r real, integer_count INTEGER, note TEXT DEFAULT 'an INTEGER');"
            ),
            "ALTER TABLE t ADD COLUMN n BIGINT NOT NULL DEFAULT 0; CREATE TABLE b (x BYTEA, \
             r DOUBLE PRECISION, integer_count BIGINT, note TEXT DEFAULT 'an INTEGER');"
        );
        // What PostgreSQL gets of each shared migration names none of SQLite's types.
        for (version, sql) in migrations::postgres().skip(1) {
            for word in sql.split(|c: char| !c.is_ascii_alphanumeric() && c != '_') {
                assert!(
                    !["INTEGER", "BLOB", "REAL"].contains(&word.to_ascii_uppercase().as_str()),
                    "migration {version}: {sql}"
                );
            }
        }
    }
}
