//! The wasmtime engine keel runs every tool on, and its epoch ticker.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

use super::SandboxLimits;

/// How often the epoch advances; deadlines and cancellation are checked at this granularity.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// Bytes of each linear memory slot kept resident (reset by memset) between calls.
pub const KEEP_RESIDENT_MEMORY: usize = 2 << 20;
/// Bytes of each table slot kept resident between calls.
pub const KEEP_RESIDENT_TABLE: usize = 64 << 10;
/// Bytes of each async stack kept resident between calls.
pub const KEEP_RESIDENT_STACK: usize = 256 << 10;

/// Builds the engine: Cranelift, component model, fuel, epoch interruption, async calls (so a
/// call blocked in a host import can still be stopped), and the pooling allocator.
pub fn build_engine(limits: &SandboxLimits) -> wasmtime::Result<Engine> {
    let mut pool = PoolingAllocationConfig::default();
    let n = limits.max_concurrent_calls;
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(16))
        .total_memories(n.saturating_mul(4))
        .total_tables(n.saturating_mul(16))
        .total_stacks(n)
        .max_memory_size(usize::try_from(limits.max_memory).unwrap_or(usize::MAX))
        // Reset the first pages of a slot with memset instead of madvise: a typical tool touches
        // about 1 MiB, and madvise in a multi-threaded host costs a TLB shootdown per call.
        .linear_memory_keep_resident(KEEP_RESIDENT_MEMORY)
        .table_keep_resident(KEEP_RESIDENT_TABLE)
        .async_stack_keep_resident(KEEP_RESIDENT_STACK)
        // Where the kernel offers PAGEMAP_SCAN (Linux 6.7+), reset only the pages a call
        // actually wrote: a guest's 1 MiB stack region is mostly never touched, and memsetting
        // all of it was ≈ 9 % of the host's CPU under load. Elsewhere, the memset above.
        .pagemap_scan(Enabled::Auto);
    let mut cfg = Config::new();
    cfg.wasm_component_model(true)
        .consume_fuel(true)
        .epoch_interruption(true)
        .max_wasm_stack(limits.max_wasm_stack)
        .async_stack_size(limits.max_wasm_stack + 1024 * 1024)
        .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
    Engine::new(&cfg)
}

/// A stable hex digest of everything that makes a precompiled artifact loadable by this engine.
pub fn compatibility_hash(engine: &Engine) -> String {
    struct ShaHasher(Sha256);
    impl Hasher for ShaHasher {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = ShaHasher(Sha256::new());
    engine.precompile_compatibility_hash().hash(&mut h);
    hex::encode(&h.0.finalize()[..16])
}

/// A thread that advances the engine's epoch every [`EPOCH_TICK`]; stopped on drop.
pub struct EpochTicker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EpochTicker {
    pub fn start(engine: &Engine) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let engine = engine.clone();
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("keel-epoch".into()).spawn(move || {
            // Parked, not asleep, between ticks: dropping the ticker unparks it, so a process
            // does not wait up to a tick to exit. A wake-up before the tick is due (spurious,
            // or the unpark) does not advance the epoch.
            let mut due = std::time::Instant::now() + EPOCH_TICK;
            while !flag.load(Ordering::Acquire) {
                let now = std::time::Instant::now();
                if now < due {
                    std::thread::park_timeout(due - now);
                    continue;
                }
                engine.increment_epoch();
                due = now + EPOCH_TICK;
            }
        })?;
        Ok(Self { stop, thread: Some(thread) })
    }
}

impl Drop for EpochTicker {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
