//! The use cases of network access: API tokens and grant presets.

use super::*;

/// API tokens and grant presets: who may use keel over the network, and with which grants.
impl Harness {
    /// Makes token `name` with `role`; returns its secret (shown once: only its hash is kept).
    pub async fn token_add(
        &self,
        caller: &Caller,
        name: &str,
        role: crate::access::Role,
    ) -> Result<String, ApiError> {
        caller.require_admin("making a token")?;
        let n = name.to_string();
        Ok(self.db.run(move |c| crate::access::add_token_in(c, &n, role)).await?)
    }

    /// Stores token `name` by its hash, replacing one of that name (how `keel serve` keeps the
    /// admin token it writes to the home).
    pub async fn token_put_hashed(
        &self,
        caller: &Caller,
        name: &str,
        role: crate::access::Role,
        hash: String,
    ) -> Result<(), ApiError> {
        caller.require_admin("storing a token")?;
        let n = name.to_string();
        Ok(self.db.run(move |c| crate::access::put_token_in(c, &n, role, &hash)).await?)
    }

    /// Every token (names and roles, never secrets).
    pub async fn tokens(
        &self,
        caller: &Caller,
    ) -> Result<Vec<crate::access::TokenRecord>, ApiError> {
        caller.require_admin("listing tokens")?;
        Ok(self.db.read(crate::access::tokens_in).await?)
    }

    /// Revokes token `name`: requests carrying it are refused from now on.
    pub async fn token_revoke(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<crate::access::TokenRecord, ApiError> {
        caller.require_admin("revoking a token")?;
        let n = name.to_string();
        Ok(self.db.run(move |c| crate::access::revoke_in(c, &n)).await?)
    }

    /// The version of the tokens, which every token added, replaced or revoked moves (by any
    /// process on this home).
    pub async fn access_version(&self) -> Result<i64, ApiError> {
        Ok(self.db.read(crate::access::access_version_in).await?)
    }

    /// The principal a presented token stands for; `unauthorized` for an unknown token. This
    /// is how a caller comes to be, so it takes none.
    pub async fn authenticate(&self, token: &str) -> Result<crate::access::Principal, ApiError> {
        self.authenticate_hash(&crate::access::token_hash(token)).await
    }

    /// The principal of the token whose SHA-256 is `hash` (a login cookie carries the hash,
    /// not the token); `unauthorized` for an unknown one.
    pub async fn authenticate_hash(
        &self,
        hash: &str,
    ) -> Result<crate::access::Principal, ApiError> {
        let hash = hash.to_string();
        self.db.read(move |c| crate::access::principal_in(c, &hash)).await?.ok_or_else(|| {
            crate::access::AccessError::Unauthorized(
                "the token is not valid (revoked, or never made): see `keel token list`".into(),
            )
            .into()
        })
    }

    /// Defines grant preset `name` (replacing one of that name with `replace`).
    pub async fn preset_add(
        &self,
        caller: &Caller,
        name: &str,
        grants: Vec<Grant>,
        user_decides: bool,
        replace: bool,
    ) -> Result<crate::access::Preset, ApiError> {
        caller.require_admin("defining a grant preset")?;
        self.tools.check_grants(&grants).map_err(|e| ApiError::Grant(e.to_string()))?;
        let n = name.to_string();
        Ok(self
            .db
            .run(move |c| crate::access::add_preset_in(c, &n, &grants, user_decides, replace))
            .await?)
    }

    /// Every grant preset (any caller may read them; what a user is shown of their grants is
    /// [`shown::grants`]).
    pub async fn presets(&self, _caller: &Caller) -> Result<Vec<crate::access::Preset>, ApiError> {
        Ok(self.db.read(crate::access::presets_in).await?)
    }

    /// Grant preset `name` (any caller may read it).
    pub async fn preset(
        &self,
        _caller: &Caller,
        name: &str,
    ) -> Result<crate::access::Preset, ApiError> {
        let n = name.to_string();
        self.db.read(move |c| crate::access::preset_in(c, &n)).await?.ok_or_else(|| {
            crate::access::AccessError::NotFound(format!(
                "no preset is named `{}` (an admin defines them with `keel grant preset add`)",
                name.escape_debug()
            ))
            .into()
        })
    }

    /// Removes grant preset `name` (sessions created with it keep their grants).
    pub async fn preset_remove(
        &self,
        caller: &Caller,
        name: &str,
    ) -> Result<crate::access::Preset, ApiError> {
        caller.require_admin("removing a grant preset")?;
        let n = name.to_string();
        Ok(self.db.run(move |c| crate::access::remove_preset_in(c, &n)).await?)
    }
}
