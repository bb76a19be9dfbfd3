//! Who asks: the principals of the network API (a token's name, role and source), the owner
//! recorded with a session one of them created, and why a request was refused. A leaf: the
//! session stores an [`Owner`], the access tables ([`crate::access`]) store tokens' roles, and
//! the use cases check a principal against both.

/// The name of the admin principal of `KEEL_API_TOKEN`.
pub const ENV_TOKEN_NAME: &str = "KEEL_API_TOKEN";

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Everything: install tools, grant host directories under the grant roots, decide any
    /// approval, see every session.
    Admin,
    /// Create sessions without grants or with a preset, send input to them, see them, and
    /// decide their approvals when the preset allows it.
    User,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Admin => "admin",
            Self::User => "user",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = AccessError;

    fn from_str(s: &str) -> Result<Self, AccessError> {
        match s {
            "admin" => Ok(Self::Admin),
            "user" => Ok(Self::User),
            other => Err(AccessError::Input(format!(
                "`{}` is not a role: use admin or user",
                other.escape_debug()
            ))),
        }
    }
}

/// Where a request's token came from: the two kinds of principal of the API, which share no
/// names (see [`Principal::id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `KEEL_API_TOKEN`: the admin of this `keel serve` process, never stored.
    Env,
    /// A stored token (`keel token add`, and `keel serve`'s own `keel-serve`).
    Token,
}

/// Who made a request: the name of the token it carried, where that token came from and its
/// role.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Principal {
    pub name: String,
    pub role: Role,
    pub source: Source,
}

impl Principal {
    /// The environment's admin (`KEEL_API_TOKEN`).
    pub fn env_admin() -> Self {
        Self { name: ENV_TOKEN_NAME.into(), role: Role::Admin, source: Source::Env }
    }

    /// A stored token's principal.
    pub fn token(name: &str, role: Role) -> Self {
        Self { name: name.to_string(), role, source: Source::Token }
    }

    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The principal's identity, as sessions record who owns them: `env:KEEL_API_TOKEN` or
    /// `token:NAME`. A token named like the environment's admin is still `token:…`: one name
    /// is never two principals.
    pub fn id(&self) -> String {
        match self.source {
            Source::Env => format!("env:{}", self.name),
            Source::Token => format!("token:{}", self.name),
        }
    }

    /// How a decision by this principal is recorded.
    pub fn decider(&self) -> String {
        format!("api token {}", self.name)
    }
}

/// Who created a session over the API, stored with the session: a user token sees and steers
/// only the sessions it owns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Owner {
    /// The creating principal's identity ([`Principal::id`]: `token:NAME` or
    /// `env:KEEL_API_TOKEN`).
    pub principal: String,
    /// The preset its grants came from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<String>,
    /// Whether the owner may decide the session's approvals (admins always may).
    pub user_decides: bool,
}

/// Why an access request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessError {
    /// A name, role or grant that cannot be used.
    #[error("{0}")]
    Input(String),
    #[error("{0}")]
    Exists(String),
    #[error("{0}")]
    NotFound(String),
    /// No token, or one keel does not know (revoked, mistyped).
    #[error("{0}")]
    Unauthorized(String),
    /// A known token whose role does not allow the request.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    Store(String),
}

impl AccessError {
    /// `input`, `conflict`, `not_found`, `unauthorized`, `forbidden` or `store`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Input(_) => "input",
            Self::Exists(_) => "conflict",
            Self::NotFound(_) => "not_found",
            Self::Unauthorized(_) => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::Store(_) => "store",
        }
    }
}

/// Who asks for a use case: the local operator (the CLI, and `keel mcp serve`, whose admin
/// fixed everything when it started), or a principal of the network API. The use cases that
/// take one decide what it may see and do (`api/callers.rs`), the same way for every
/// front-end; a front-end only says who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    Operator,
    Api(Principal),
}

impl Caller {
    /// Refuses a non-admin: `what` says what needed an admin ("installing a tool").
    pub fn require_admin(&self, what: &str) -> Result<(), AccessError> {
        if self.is_admin() {
            return Ok(());
        }
        Err(AccessError::Forbidden(format!(
            "{what} needs an admin token; `{}` is a user token",
            self.name().unwrap_or_default()
        )))
    }

    /// The operator, and the API's admins, may do everything.
    pub fn is_admin(&self) -> bool {
        match self {
            Self::Operator => true,
            Self::Api(p) => p.is_admin(),
        }
    }

    /// Whether the caller is the principal that created a session with owner `owner`.
    pub fn owns(&self, owner: Option<&Owner>) -> bool {
        match self {
            Self::Operator => false,
            Self::Api(p) => owner.is_some_and(|o| o.principal == p.id()),
        }
    }

    /// Whether the caller may see a session with owner `owner` (admins see every session,
    /// users their own).
    pub fn may_see(&self, owner: Option<&Owner>) -> bool {
        self.is_admin() || self.owns(owner)
    }

    /// Whether the caller may decide the approvals of a session with owner `owner`: admins,
    /// and its user when the session's preset lets them.
    pub fn may_decide(&self, owner: Option<&Owner>) -> bool {
        self.is_admin() || (self.owns(owner) && owner.is_some_and(|o| o.user_decides))
    }

    /// The API principal's token name (`None`: the operator).
    pub fn name(&self) -> Option<&str> {
        match self {
            Self::Operator => None,
            Self::Api(p) => Some(&p.name),
        }
    }
}
