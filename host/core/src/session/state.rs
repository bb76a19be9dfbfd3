//! The runtime state a user sees: the one vocabulary of a session's state, below every
//! other file of the kernel.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::store::StoreError;

/// The runtime state a user sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RuntimeState {
    Idle,
    PreparingContext,
    Running,
    WaitingApproval,
    Compressing,
    Interrupted,
    Failed,
}

impl RuntimeState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Idle => "idle",
            Self::PreparingContext => "preparing_context",
            Self::Running => "running",
            Self::WaitingApproval => "waiting_approval",
            Self::Compressing => "compressing",
            Self::Interrupted => "interrupted",
            Self::Failed => "failed",
        }
    }
}

impl fmt::Display for RuntimeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RuntimeState {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "idle" => Self::Idle,
            "preparing_context" => Self::PreparingContext,
            "running" => Self::Running,
            "waiting_approval" => Self::WaitingApproval,
            "compressing" => Self::Compressing,
            "interrupted" => Self::Interrupted,
            "failed" => Self::Failed,
            other => return Err(StoreError::Corrupt(format!("unknown session state `{other}`"))),
        })
    }
}
