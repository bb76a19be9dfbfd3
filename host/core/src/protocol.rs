//! The one vocabulary keel's front-ends speak — the HTTP API and console and keel as an MCP
//! server (`keel-server`), and the `keel` command — besides the use cases themselves
//! ([`crate::api`]): the ids they name things by, the views and events they show, the
//! settings and requests they build, the errors they map to exit codes and statuses, and the
//! few helpers that turn text into those. Each item is the owner's own type, re-exported: a
//! front-end names it here and nowhere else, so an owner's module can change without a
//! front-end noticing, and what the front-ends may reach is this list (a test of the layers
//! fails on a front-end path that is neither here nor in `api`).

/// The ids a front-end names sessions, calls and approval units by.
pub mod ids {
    pub use crate::ids::{CallId, SessionId, UnitId};
}

/// A session as a front-end shows and steers it: its settings, state and views, a turn's
/// outcome and progress, approvals, workgroups and compaction.
pub mod sessions {
    pub use crate::agent::compact::Compaction;
    pub use crate::agent::{Event, Events, LoopGuards, TurnOutcome};
    pub use crate::brain::Submitted;
    pub use crate::cancel::CancelToken;
    pub use crate::compaction::{CheckpointRecord, CheckpointStatus, ConversationRewind};
    pub use crate::failure::FailureKind;
    pub use crate::live::LiveReader;
    pub use crate::meta::SessionMeta;
    pub use crate::model::{DEFAULT_BASE_URL, ModelClient, ModelConfig};
    pub use crate::policy::{Effect, PolicyChange, call_directory};
    pub use crate::preparation::capabilities::{Kind as CapabilityKind, Via};
    pub use crate::sandbox::{Access, Budget, Grant, SandboxLimits};
    pub use crate::session::{
        ApprovalStatus, ApprovalUnit, DIRECT_CALL_PREFIX, Decision, JournalStatus, ModelChange,
        ModelShown, Origin, Policy, RewoundConversation, RuntimeState,
    };
    pub use crate::shown::goal_reference;
    pub use crate::views::{SessionSummary, Timeline, TimelineCall, TimelineMessage, TurnUsage};
    pub use crate::workgroup::{Delegation, Limits, Member, Workgroup};
}

/// A session's events, as stored and followed.
pub mod events {
    pub use crate::session::{EventRow, SessionEvent};
}

/// A session's network grants and what its calls sent.
pub mod net {
    pub use crate::sandbox::check_header;
    pub use crate::sandbox::net::{
        DEFAULT_NET_MAX_BYTES, DEFAULT_NET_MAX_REQUESTS, LoopbackException, NetGrants, NetRecord,
        NetRule, SecretBinding,
    };
}

/// Tools: a direct call's request, installs, what the catalog records, registry pushes, and
/// the MCP vocabulary of external servers and of keel as one.
pub mod tools {
    pub use crate::oci::Pushed;
    pub use crate::sandbox::{Carried, NAME_SECTION, VERSION_SECTION, carried, custom_section};
    pub use crate::tools::{CallOutcome, CallRequest, FileInspection, InstallMode, ToolRecord};

    /// External MCP servers, and the MCP terms keel serves its tools in.
    pub mod mcp {
        pub use crate::tools::mcp::{
            McpLoad, PROTOCOL_VERSIONS, ServerSpec, Transport, annotations,
        };
    }
}

/// Who calls: API tokens, roles, grant presets and roots.
pub mod access {
    pub use crate::access::{
        AccessError, ENV_TOKEN_NAME, GrantRoots, Preset, Principal, Role, check_supplied_token,
        new_token, token_hash,
    };
}

/// Opening a home and what it is set up with: the harness, its settings file, the store,
/// secrets and signing keys, the process's metrics and TLS provider, the host's identity and
/// the local user.
pub mod setup {
    pub use crate::brain::host_id;
    pub use crate::harness::{
        DEFAULT_SYSTEM_PROMPT, Harness, ModelFlags, model_config, model_settings, preprocess_config,
    };
    pub use crate::home::{Home, write_private};
    pub use crate::memory::{Kind as UserKind, default_user, typed as typed_user};
    pub use crate::model::{ServedModel, ServerProbe, ServerProps};
    pub use crate::store::{Location, StoreError, schema_version};
    pub use crate::tls::init as init_tls;

    /// `keel.toml`: reading it and the settings front-ends use.
    pub mod config {
        pub use crate::config::{
            Bounds, HttpLimits, SECRET_ENV, Setting, TelemetryTable, env, path, read,
            registry_limits, store_location, store_settings, synchronous, take_secret_env,
        };
    }

    /// Copying one machine's store into a shared one.
    pub mod copy {
        pub use crate::store::copy::{Copied, sqlite_to_postgres};
    }

    /// Secret values and the key they are sealed with.
    pub mod secrets {
        pub use crate::secrets::{
            MAX_SECRET_BYTES, Secret, SecretError, SecretStore, rotate_key, valid_secret_name,
        };
    }

    /// Signing keys exported sealed, imported, and found in the environment.
    pub mod keys {
        pub use crate::keys::{
            KEY_VAR, KeyError, MAX_EXPORT_BYTES, PASSPHRASE_VAR, Seal, Unseal, export, find,
            needs_passphrase, open,
        };
    }

    /// Signing keys and components' embedded signatures.
    pub mod signing {
        pub use crate::signing::{PublicKey, generate, is_signed, public_of, sign, verify};
    }

    /// The process's metrics a front-end serves and counts.
    pub mod metrics {
        pub use crate::metrics::{CONTENT_TYPE, HTTP_REQUESTS, set_capture_content};
    }
}

/// Text a person types or reads: durations, sizes and times, names and their suggestions,
/// digests.
pub mod text {
    pub use crate::digest::sha256_hex;
    pub use crate::names::{closest, component_name_for, did_you_mean, valid_component_name};
    pub use crate::units::{format_time, parse_age, parse_duration, parse_size};
}
