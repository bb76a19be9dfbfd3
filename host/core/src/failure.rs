//! Why a tool call failed: the closed set of kinds a call's result may carry. The journal
//! stores the kind (`tool_calls.error_kind`), the model reads it (`{"error": {"kind": …}}`),
//! events and front-ends show it — one set, so a kind the host does not know is a read error,
//! never a silent default.

crate::stored_enum! {
    /// Why a tool call failed.
    pub enum FailureKind: "call failure kind" {
        // The tool's own typed errors (`keel:tool`'s `tool-error`).
        InvalidInput = "invalid_input",
        UnknownTool = "unknown_tool",
        NotFound = "not_found",
        Denied = "denied",
        /// The session's policy refused the call before it ran (a `--deny` rule).
        PolicyDenied = "policy_denied",
        Failed = "failed",
        // The sandbox stopped the call.
        Timeout = "timeout",
        FuelExhausted = "fuel_exhausted",
        MemoryLimit = "memory_limit",
        StackOverflow = "stack_overflow",
        OutputTooLarge = "output_too_large",
        InvalidOutput = "invalid_output",
        Cancelled = "cancelled",
        Crashed = "crashed",
        Setup = "setup",
        // The ToolService could not run the call.
        Store = "store",
        Load = "load",
        Config = "config",
        Grant = "grant",
        GrantMoved = "grant_moved",
        Busy = "busy",
        Secrets = "secrets",
        Io = "io",
        InvalidName = "invalid_name",
        /// A component from a registry lacks the signature of a trusted key covering it.
        Unverified = "unverified",
        /// An upgrade that widens what a component can do, not accepted (`--accept-wider`).
        Wider = "wider",
        /// A registry artifact older than the installed one, not allowed (`--allow-downgrade`).
        Downgrade = "downgrade",
        NotInstalled = "not_installed",
        Builtin = "builtin",
        HostTool = "host_tool",
        ReservedName = "reserved_name",
        AlreadyInstalled = "already_installed",
        DescribeFailed = "describe_failed",
        InvalidSpecs = "invalid_specs",
        NameClash = "name_clash",
        OverCeiling = "over_ceiling",
        NeedsApproval = "needs_approval",
        ApprovalNotBound = "approval_not_bound",
        McpServer = "mcp_server",
        // An MCP server's tool could not be reached, or the store under it failed.
        Exists = "exists",
        Input = "input",
        Conflict = "conflict",
        Corrupt = "corrupt",
        McpConnect = "mcp_connect",
        McpRequest = "mcp_request",
        // The call pipeline refused or closed the call.
        DuplicateCallId = "duplicate_call_id",
        CutOff = "cut_off",
        Rejected = "rejected",
        Interrupted = "interrupted",
        OutcomeUnknown = "outcome_unknown",
        NotRun = "not_run",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_and_an_unknown_one_is_refused() {
        for k in FailureKind::ALL {
            assert_eq!(k.as_str().parse::<FailureKind>().unwrap(), *k);
        }
        let e = "exploded".parse::<FailureKind>().unwrap_err();
        assert!(e.to_string().contains("not a known call failure kind"), "{e}");
    }
}
