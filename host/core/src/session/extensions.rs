//! The per-engine state of the owners beside the kernel: one value per type (a feature's
//! caches), made on first use and shared by every clone of the engine. The kernel holds it
//! without knowing the types.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub(crate) struct Extensions(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl Extensions {
    /// The engine's `T`, made with `T::default()` the first time.
    pub(crate) fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut map = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let value = map.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default()));
        match value.clone().downcast::<T>() {
            Ok(value) => value,
            // The map is keyed by the value's own type: this arm is never taken.
            Err(_) => Arc::new(T::default()),
        }
    }
}
