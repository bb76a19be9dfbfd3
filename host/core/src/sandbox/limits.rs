//! Per-call resource limits: memory, tables and instances.
//!
//! The limiter refuses growth past the call's budget with a [`LimitExceeded`] error, which traps
//! the guest and lets the sandbox classify the failure exactly (`memory_limit`), instead of
//! guessing from a trap message.

use wasmtime::ResourceLimiter;

/// Which limit a guest hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitExceeded {
    /// Linear memory would have grown past the call's memory budget.
    #[error("memory would grow to {wanted} bytes, over the call's limit of {limit} bytes")]
    Memory { wanted: u64, limit: u64 },
    /// A table would have grown past the element limit.
    #[error("a table would grow to {wanted} elements, over the limit of {limit}")]
    Table { wanted: u64, limit: u64 },
}

/// Limits of one call. Memory is counted across all the component's linear memories.
pub struct CallLimits {
    memory_limit: u64,
    memory_used: u64,
    table_elements: u64,
    max_instances: usize,
    max_tables: usize,
    max_memories: usize,
}

impl CallLimits {
    pub fn new(memory_limit: u64) -> Self {
        Self {
            memory_limit,
            memory_used: 0,
            table_elements: super::MAX_TABLE_ELEMENTS,
            max_instances: super::MAX_INSTANCES_PER_CALL,
            max_tables: super::MAX_TABLES_PER_CALL,
            max_memories: super::MAX_MEMORIES_PER_CALL,
        }
    }

    /// Peak linear memory of the call, in bytes.
    pub fn memory_used(&self) -> u64 {
        self.memory_used
    }
}

impl ResourceLimiter for CallLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let growth = desired.saturating_sub(current) as u64;
        let wanted = self.memory_used.saturating_add(growth);
        if wanted > self.memory_limit {
            return Err(LimitExceeded::Memory { wanted, limit: self.memory_limit }.into());
        }
        self.memory_used = wanted;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired as u64 > self.table_elements {
            return Err(LimitExceeded::Table {
                wanted: desired as u64,
                limit: self.table_elements,
            }
            .into());
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        self.max_instances
    }

    fn tables(&self) -> usize {
        self.max_tables
    }

    fn memories(&self) -> usize {
        self.max_memories
    }
}
