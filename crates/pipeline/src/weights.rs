//! The weight store: where the trainer publishes new policy weights and the rollout module
//! takes them.
//!
//! What it is: the newest weights as an `Arc<Transformer>` snapshot and their [`PolicyVersion`],
//! behind a mutex, with a condition variable for callers that need a version not yet published.
//! It implements [`stoke_rollout::LiveWeights`], so a generation can take new weights between
//! decode steps (`WeightSync::InFlight`). What it is not: the staleness gate (which decides when
//! a generation may start) or a checkpoint (nothing is written to disk).
//!
//! Invariants:
//! - What the store holds is always a deep copy ([`Transformer::snapshot`]): the trainer keeps
//!   updating its own parameters in place, and readers keep the `Arc` of the version they took,
//!   unaffected, for as long as they need it (a generation in progress, for instance).
//! - Versions go up by exactly one per publication, from 0 (the weights given to `new`).
//! - Every published model has the initial model's config, device and dtype (a generation that
//!   switches weights in flight keeps its KV cache, which needs that).
//! - The copy is made outside the lock, so readers are never blocked by it; only the swap of the
//!   `Arc` is under the lock.
//! - After [`WeightStore::close`], `wait_for` returns `None` for versions not yet published (and
//!   publishing is refused, as the staleness gate does), so blocked rollout threads can exit.
//! - [`WeightStore::with_history`] keeps the newest `n` versions (the newest alone by default);
//!   a fixed-lag pipeline asks for an exact older version with [`WeightStore::wait_for_exact`].

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use stoke_model::Transformer;
use stoke_rollout::LiveWeights;

use crate::error::PipelineError;
use crate::staleness::PolicyVersion;

#[derive(Debug)]
struct StoreState {
    model: Arc<Transformer>,
    version: PolicyVersion,
    /// Older versions still kept, oldest first (at most `kept - 1`).
    older: VecDeque<(PolicyVersion, Arc<Transformer>)>,
    /// Versions kept, the newest included (at least 1).
    kept: usize,
    closed: bool,
    /// Total time spent copying weights in `new` and `publish`.
    publish_seconds: f64,
    /// Callers blocked in `wait_for` right now (lets tests observe a blocked thread).
    waiting: usize,
}

/// The copy the rollout decodes with: a deep snapshot, and in bf16 an inference-only copy
/// (`Transformer::inference_copy`: the weights packed once, no f32 linear weights), so decoding
/// does not repack them every token and runs the fused decode step. Packed and per-call bf16 products take the same bf16 values and sum in
/// f32, so the rollout's log-probs are the trainer's up to f32 summation order (the IS-ratio
/// statistics show the mismatch).
fn rollout_copy(model: &Transformer) -> Result<Transformer, PipelineError> {
    if model.precision() == stoke_types::Precision::Bf16 {
        // Only the packed bf16 weights, not an f32 copy of the linear layers next to them.
        return Ok(model.inference_copy()?);
    }
    Ok(model.snapshot()?)
}

/// What else happens when the trainer publishes a version: remote rollout writes the weights to
/// a shared path and has its servers load them (`remote::rollout::RemotePublisher`). It runs on
/// the trainer's thread before the version becomes current, so the staleness gate (published
/// after the store) grants no ticket of that version before the servers hold it.
pub trait PublishHook: Send + Sync {
    fn publish(&self, model: &Transformer, version: PolicyVersion) -> Result<(), PipelineError>;
}

/// The newest policy weights, shared as `Arc<WeightStore>` between the trainer and rollout.
pub struct WeightStore {
    state: Mutex<StoreState>,
    published: Condvar,
    hook: Mutex<Option<Arc<dyn PublishHook>>>,
}

impl std::fmt::Debug for WeightStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightStore")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl WeightStore {
    /// Version 0: a snapshot of `initial`; only the newest version is kept.
    pub fn new(initial: &Transformer) -> Result<WeightStore, PipelineError> {
        WeightStore::with_history(initial, 1)
    }

    /// Version 0: a snapshot of `initial`; the newest `versions` versions stay readable through
    /// [`WeightStore::wait_for_exact`] (each one a rollout copy in memory).
    pub fn with_history(
        initial: &Transformer,
        versions: usize,
    ) -> Result<WeightStore, PipelineError> {
        if versions == 0 {
            return Err(PipelineError::config(
                "weights.versions",
                "the store keeps at least the newest version",
            ));
        }
        let started = Instant::now();
        let model = Arc::new(rollout_copy(initial)?);
        Ok(WeightStore {
            state: Mutex::new(StoreState {
                model,
                version: PolicyVersion(0),
                older: VecDeque::new(),
                kept: versions,
                closed: false,
                publish_seconds: started.elapsed().as_secs_f64(),
                waiting: 0,
            }),
            published: Condvar::new(),
            hook: Mutex::new(None),
        })
    }

    // A panic elsewhere while holding the lock cannot leave the state half-updated (every change
    // is a few assignments after all fallible work), so a poisoned lock is recovered.
    fn lock(&self) -> MutexGuard<'_, StoreState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Snapshots `model` (a deep copy) and makes it the newest weights, version `version`, which
    /// must be the current version + 1. Wakes every `wait_for` that this version satisfies.
    pub fn publish(
        &self,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<(), PipelineError> {
        // Checked before the copy (a wrong call costs nothing) and again after it (another
        // publisher may have won the race in between).
        self.check_publishable(&self.lock(), model, version)?;
        let started = Instant::now();
        let hook = self
            .hook
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        if let Some(hook) = hook {
            hook.publish(model, version)?;
        }
        let snapshot = Arc::new(rollout_copy(model)?);
        let seconds = started.elapsed().as_secs_f64();
        let mut state = self.lock();
        self.check_publishable(&state, model, version)?;
        let previous = (state.version, std::mem::replace(&mut state.model, snapshot));
        if state.kept > 1 {
            state.older.push_back(previous);
            while state.older.len() >= state.kept {
                state.older.pop_front();
            }
        }
        state.version = version;
        state.publish_seconds += seconds;
        drop(state);
        self.published.notify_all();
        Ok(())
    }

    fn check_publishable(
        &self,
        state: &StoreState,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<(), PipelineError> {
        if state.closed {
            return Err(PipelineError::ModuleStopped {
                module: "weights",
                reason: format!("version {} published after the store was closed", version.0),
            });
        }
        if version != state.version.next() {
            return Err(PipelineError::config(
                "weights.version",
                format!(
                    "published version {} is not the successor of the current version {}",
                    version.0, state.version.0
                ),
            ));
        }
        let current = &state.model;
        if model.config() != current.config()
            || model.dtype() != current.dtype()
            || !model.device().same_device(current.device())
        {
            return Err(PipelineError::config(
                "weights.model",
                format!(
                    "version {} has another config, dtype or device than version 0 \
                     (generations in flight could not switch to it)",
                    version.0
                ),
            ));
        }
        Ok(())
    }

    /// Runs `hook` on every later publication (see [`PublishHook`]).
    pub fn set_hook(&self, hook: Arc<dyn PublishHook>) {
        *self.hook.lock().unwrap_or_else(PoisonError::into_inner) = Some(hook);
    }

    /// The newest weights and their version.
    pub fn current(&self) -> (Arc<Transformer>, PolicyVersion) {
        let state = self.lock();
        (Arc::clone(&state.model), state.version)
    }

    pub fn version(&self) -> PolicyVersion {
        self.lock().version
    }

    /// Blocks until a version >= `version` is published and returns the newest weights. `None`
    /// when the store is closed before that (a version already published is returned even after
    /// close).
    pub fn wait_for(&self, version: PolicyVersion) -> Option<(Arc<Transformer>, PolicyVersion)> {
        let mut state = self.lock();
        while state.version < version && !state.closed {
            state.waiting += 1;
            state = self
                .published
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting -= 1;
        }
        (state.version >= version).then(|| (Arc::clone(&state.model), state.version))
    }

    /// Blocks until `version` is published and returns exactly its weights. Errors: the store
    /// closed before that (`ModuleStopped`), or the version is older than the kept history.
    pub fn wait_for_exact(
        &self,
        version: PolicyVersion,
    ) -> Result<Arc<Transformer>, PipelineError> {
        let mut state = self.lock();
        while state.version < version && !state.closed {
            state.waiting += 1;
            state = self
                .published
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.waiting -= 1;
        }
        if state.version < version {
            return Err(PipelineError::ModuleStopped {
                module: "rollout",
                reason: format!(
                    "the weight store closed before version {} was published",
                    version.0
                ),
            });
        }
        if state.version == version {
            return Ok(Arc::clone(&state.model));
        }
        state
            .older
            .iter()
            .find(|(kept, _)| *kept == version)
            .map(|(_, model)| Arc::clone(model))
            .ok_or_else(|| PipelineError::ModuleStopped {
                module: "weights",
                reason: format!(
                    "version {} is no longer kept (newest {}, {} version(s) kept)",
                    version.0, state.version.0, state.kept
                ),
            })
    }

    /// Refuses further publications and releases every `wait_for` still waiting with `None`.
    pub fn close(&self) {
        self.lock().closed = true;
        self.published.notify_all();
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Callers blocked in `wait_for` right now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Total seconds spent copying weights (the initial snapshot and every publication), for
    /// the metrics' per-module time split.
    pub fn publish_seconds(&self) -> f64 {
        self.lock().publish_seconds
    }
}

/// In-flight weight sync: a generation asks before every decode step.
impl LiveWeights for WeightStore {
    fn current(&self) -> (Arc<Transformer>, u64) {
        let (model, version) = WeightStore::current(self);
        (model, version.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use std::path::Path;
    use std::time::Duration;
    use stoke_model::ModelConfig;

    fn tiny_model(seed: u64) -> Transformer {
        let json = r#"{
            "architectures": ["LlamaForCausalLM"], "vocab_size": 41, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "rope_theta": 1000.0,
            "tie_word_embeddings": true
        }"#;
        let config = ModelConfig::from_json_str(json, Path::new("<test>")).expect("config");
        Transformer::init(config, &Device::Cpu, seed).expect("init")
    }

    fn first_values(model: &Transformer) -> Vec<f32> {
        model.parameters()[0]
            .1
            .as_tensor()
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("values")
    }

    /// Adds 1 to every parameter in place, as an optimizer step would change them.
    fn step_in_place(model: &Transformer) {
        for (_, var) in model.parameters() {
            let shifted = (var.as_tensor() + 1.0).expect("add");
            var.set(&shifted).expect("set");
        }
    }

    #[test]
    fn published_weights_are_a_copy_taken_at_publication() {
        let trainer = tiny_model(1);
        let store = WeightStore::new(&trainer).expect("store");
        let initial = first_values(&trainer);
        step_in_place(&trainer);
        let (version_zero, version) = store.current();
        assert_eq!(version, PolicyVersion(0));
        assert_eq!(first_values(&version_zero), initial);

        store.publish(&trainer, PolicyVersion(1)).expect("publish");
        let after_one = first_values(&trainer);
        step_in_place(&trainer);
        let (version_one, version) = store.current();
        assert_eq!(version, PolicyVersion(1));
        assert_eq!(first_values(&version_one), after_one);
        // A reader that still holds version 0 keeps it.
        assert_eq!(first_values(&version_zero), initial);
        assert!(store.publish_seconds() > 0.0);
    }

    #[test]
    fn versions_must_go_up_by_one() {
        let trainer = tiny_model(1);
        let store = WeightStore::new(&trainer).expect("store");
        let error = store.publish(&trainer, PolicyVersion(2)).unwrap_err();
        assert!(error.to_string().contains("not the successor"), "{error}");
        let error = store.publish(&trainer, PolicyVersion(0)).unwrap_err();
        assert!(error.to_string().contains("current version 0"), "{error}");
        store
            .publish(&trainer, PolicyVersion(1))
            .expect("publish 1");
        assert_eq!(store.version(), PolicyVersion(1));
    }

    #[test]
    fn weights_of_another_shape_are_refused() {
        let trainer = tiny_model(1);
        let store = WeightStore::new(&trainer).expect("store");
        let mut config = trainer.config().clone();
        config.num_hidden_layers = 2;
        let other = Transformer::init(config, &Device::Cpu, 1).expect("init");
        let error = store.publish(&other, PolicyVersion(1)).unwrap_err();
        assert!(error.to_string().contains("another config"), "{error}");
        assert_eq!(store.version(), PolicyVersion(0));
    }

    #[test]
    fn wait_for_is_released_by_a_publish_from_another_thread() {
        let trainer = tiny_model(1);
        let store = Arc::new(WeightStore::new(&trainer).expect("store"));
        let waiter = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || store.wait_for(PolicyVersion(2)).map(|(_, v)| v))
        };
        // Observe the waiter blocked before publishing, rather than sleeping and assuming it.
        while store.waiting() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        store
            .publish(&trainer, PolicyVersion(1))
            .expect("publish 1");
        // Version 1 does not satisfy it: still waiting.
        std::thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished());
        store
            .publish(&trainer, PolicyVersion(2))
            .expect("publish 2");
        let got = waiter.join().expect("waiter thread");
        assert_eq!(got, Some(PolicyVersion(2)));
        // An already published version returns at once.
        assert_eq!(
            store.wait_for(PolicyVersion(1)).map(|(_, v)| v),
            Some(PolicyVersion(2))
        );
    }

    #[test]
    fn close_releases_waiters_with_none_and_refuses_publication() {
        let trainer = tiny_model(1);
        let store = Arc::new(WeightStore::new(&trainer).expect("store"));
        let waiter = {
            let store = Arc::clone(&store);
            std::thread::spawn(move || store.wait_for(PolicyVersion(5)).is_none())
        };
        while store.waiting() == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        store.close();
        assert!(waiter.join().expect("waiter thread"));
        assert!(store.is_closed());
        let error = store.publish(&trainer, PolicyVersion(1)).unwrap_err();
        assert!(error.to_string().contains("closed"), "{error}");
        // What was published stays readable.
        assert!(store.wait_for(PolicyVersion(0)).is_some());
    }

    #[test]
    fn a_store_with_history_returns_exact_older_versions() {
        let trainer = tiny_model(1);
        let store = WeightStore::with_history(&trainer, 2).expect("store");
        let zero = first_values(&trainer);
        step_in_place(&trainer);
        store
            .publish(&trainer, PolicyVersion(1))
            .expect("publish 1");
        let one = first_values(&trainer);
        let exact = |v: u64| {
            store
                .wait_for_exact(PolicyVersion(v))
                .map(|m| first_values(&m))
        };
        assert_eq!(exact(0).expect("version 0 kept"), zero);
        assert_eq!(exact(1).expect("version 1"), one);
        step_in_place(&trainer);
        store
            .publish(&trainer, PolicyVersion(2))
            .expect("publish 2");
        assert_eq!(exact(1).expect("version 1 kept"), one);
        let error = exact(0).unwrap_err();
        assert!(error.to_string().contains("no longer kept"), "{error}");
        // The default store keeps the newest only.
        let single = WeightStore::new(&trainer).expect("store");
        single.publish(&trainer, PolicyVersion(1)).expect("publish");
        assert!(single.wait_for_exact(PolicyVersion(0)).is_err());
        assert!(WeightStore::with_history(&trainer, 0).is_err());
    }

    #[test]
    fn live_weights_view_reports_the_newest_version() {
        let trainer = tiny_model(1);
        let store = WeightStore::new(&trainer).expect("store");
        store.publish(&trainer, PolicyVersion(1)).expect("publish");
        let live: &dyn LiveWeights = &store;
        assert_eq!(live.current().1, 1);
    }
}
