//! A micro-batch of pairs computed as shards at once, one per thread, each shard's kernels
//! running serially on its thread.
//!
//! Why: on a small model every product and element-wise pass of one micro-batch is too small to
//! split across threads well; the fork-join and barrier costs of thousands of tiny operations
//! per step eat the second core (measured on the speedrun's 1.5M-parameter model: one thread
//! 119 ms a step, two threads sharing each operation 67 ms, two shards 57-60 ms). Splitting the
//! pairs instead gives each thread whole operations.
//!
//! How, exactly: each shard scores its pairs under the policy with the graph ([`pair_logps`]).
//! The loss then reads the shards' per-sequence values through leaf variables
//! ([`ShardLeaf`]), so its backward pass ends at `d loss / d values`. Each shard then
//! backpropagates `sum(values * d loss / d values)` through its own graph, which by the chain
//! rule gives the shard's part of the loss's gradient, for any loss (the batch-coupled ones,
//! KTO's KL point and the AOT sorts included, since the loss still sees the whole micro-batch).
//! The gradients are the unsharded ones up to float rounding: the shards' sums over tokens are
//! added shard by shard instead of in one product (tested).
//!
//! Cost: until the shards' gradients are added, each shard past the first holds a full f32
//! gradient of the trainable parameters. `batch_shards = "auto"` therefore shards only while
//! those extra copies stay under [`AUTO_EXTRA_GRADIENT_BYTES`] (models up to about 16M
//! parameters on two threads). At SmolLM2-135M two shards were 2% faster and took 370 MB more,
//! so auto leaves such models unsharded.
//!
//! Determinism: a run is deterministic for a given shard count; results differ from another
//! shard count (so, under "auto", another thread count) by float rounding.

use std::sync::OnceLock;

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use stoke_model::Transformer;

use super::SequenceLogps;
use super::data::PreferencePair;
use super::scoring::pair_logps;
use crate::error::TrainError;
use crate::grpo::ScoringLayout;

/// The most memory "auto" spends on the extra shards' gradients.
pub const AUTO_EXTRA_GRADIENT_BYTES: usize = 64 << 20;

/// The shard count `batch_shards = "auto"` picks for a model with `trainable` parameters on
/// `threads` threads (then capped by the pairs of each micro-batch).
pub fn auto_shards(trainable: usize, threads: usize) -> usize {
    if threads <= 1 {
        return 1;
    }
    let per_shard = trainable.saturating_mul(4).max(1);
    threads.min(1 + AUTO_EXTRA_GRADIENT_BYTES / per_shard)
}

/// One single-thread rayon pool per thread of the current pool, built once.
fn pools() -> &'static [rayon::ThreadPool] {
    static POOLS: OnceLock<Vec<rayon::ThreadPool>> = OnceLock::new();
    POOLS.get_or_init(|| {
        (0..rayon::current_num_threads().max(1))
            .map(|_| {
                rayon::ThreadPoolBuilder::new()
                    .num_threads(1)
                    .thread_name(|i| format!("stoke-shard-{i}"))
                    .start_handler(|_| stoke_ops::numerics::set_ftz_daz_on_this_thread())
                    .build()
                    .expect("building a one-thread pool")
            })
            .collect()
    })
}

/// Runs the jobs, as many at once as there are pools, each inside a one-thread pool (so the
/// kernels it calls see one thread and run serially), and returns their results in order.
pub fn run_at_once<T: Send, F: FnOnce() -> T + Send>(jobs: Vec<F>) -> Vec<T> {
    let pools = pools();
    let mut out = Vec::with_capacity(jobs.len());
    let mut jobs = jobs.into_iter().peekable();
    while jobs.peek().is_some() {
        let wave: Vec<F> = jobs.by_ref().take(pools.len()).collect();
        let results = std::thread::scope(|scope| {
            let mut wave = wave.into_iter();
            let first = wave.next().expect("a wave has a job");
            let handles: Vec<_> = wave
                .zip(&pools[1..])
                .map(|(job, pool)| scope.spawn(move || pool.install(job)))
                .collect();
            let mut results = vec![pools[0].install(first)];
            for handle in handles {
                match handle.join() {
                    Ok(result) => results.push(result),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            results
        });
        out.extend(results);
    }
    out
}

/// The policy's log-probs of a micro-batch scored in `shards` shards, ready for the loss.
pub struct ShardedLogps {
    /// Each shard's values, with its graph.
    scored: Vec<SequenceLogps>,
    shared: Var,
    tail: Var,
    /// Pairs of each shard.
    sizes: Vec<usize>,
}

impl ShardedLogps {
    /// Scores `pairs` in `min(shards, pairs)` contiguous shards at once (rows of the result:
    /// every chosen response in pair order, then every rejected one, as [`pair_logps`] orders
    /// them).
    pub fn score(
        model: &Transformer,
        pairs: &[&PreferencePair],
        layout: ScoringLayout,
        shards: usize,
    ) -> Result<ShardedLogps, TrainError> {
        // min(shards, pairs) parts whose sizes differ by at most one pair.
        let count = shards.clamp(1, pairs.len().max(1));
        let (base, extra) = (pairs.len() / count, pairs.len() % count);
        let mut parts = Vec::with_capacity(count);
        let mut start = 0;
        for k in 0..count {
            let len = base + usize::from(k < extra);
            parts.push(&pairs[start..start + len]);
            start += len;
        }
        let scored = run_at_once(
            parts
                .into_iter()
                .map(|part| move || pair_logps(model, part, layout))
                .collect(),
        )
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
        let sizes: Vec<usize> = scored.iter().map(|s| s.rows() / 2).collect();
        let join = |pick: fn(&SequenceLogps) -> &Tensor| -> Result<Var, TrainError> {
            let mut parts = Vec::with_capacity(2 * scored.len());
            for half in 0..2 {
                for (s, &b) in scored.iter().zip(&sizes) {
                    parts.push(pick(s).detach().narrow(0, half * b, b)?);
                }
            }
            Ok(Var::from_tensor(&Tensor::cat(&parts, 0)?)?)
        };
        let shared = join(|s| &s.shared)?;
        let tail = join(|s| &s.tail)?;
        Ok(ShardedLogps {
            scored,
            shared,
            tail,
            sizes,
        })
    }

    /// The values as the losses take them; a loss built on them backpropagates into the leaf
    /// variables only ([`ShardedLogps::backward`] carries it on into the model).
    pub fn policy(&self) -> SequenceLogps {
        let mut tokens = Vec::with_capacity(2 * self.sizes.iter().sum::<usize>());
        for half in 0..2 {
            for (s, &b) in self.scored.iter().zip(&self.sizes) {
                tokens.extend_from_slice(&s.tokens[half * b..(half + 1) * b]);
            }
        }
        SequenceLogps {
            shared: self.shared.as_tensor().clone(),
            tail: self.tail.as_tensor().clone(),
            tokens,
        }
    }

    /// The model's gradients, one store per shard, from `store`: the backward pass of a loss
    /// built on [`ShardedLogps::policy`]. The shards backpropagate at once.
    pub fn backward(self, store: &GradStore) -> Result<Vec<GradStore>, TrainError> {
        let total: usize = self.sizes.iter().sum();
        let grads = [
            store.get(self.shared.as_tensor()),
            store.get(self.tail.as_tensor()),
        ];
        let mut surrogates = Vec::with_capacity(self.scored.len());
        let mut offset = 0;
        for (s, &b) in self.scored.iter().zip(&self.sizes) {
            let mut sum: Option<Tensor> = None;
            for (values, grad) in [&s.shared, &s.tail].into_iter().zip(grads) {
                let Some(grad) = grad else { continue };
                let part = Tensor::cat(
                    &[
                        grad.narrow(0, offset, b)?,
                        grad.narrow(0, total + offset, b)?,
                    ],
                    0,
                )?;
                let term = (values * part)?.sum_all()?;
                sum = Some(match sum {
                    None => term,
                    Some(acc) => (acc + term)?,
                });
            }
            surrogates.push(sum);
            offset += b;
        }
        let stores = run_at_once(
            surrogates
                .into_iter()
                .map(|s| move || s.map(|s| s.backward()).transpose())
                .collect(),
        );
        let mut out = Vec::with_capacity(stores.len());
        for store in stores {
            if let Some(store) = store? {
                out.push(store);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_shards_follow_threads_until_the_extra_gradients_pass_the_budget() {
        assert_eq!(auto_shards(1_500_000, 1), 1);
        assert_eq!(auto_shards(1_500_000, 2), 2);
        assert_eq!(auto_shards(1_500_000, 8), 8);
        // 135M parameters: one extra f32 gradient is 540 MB, over the budget.
        assert_eq!(auto_shards(135_000_000, 2), 1);
        // 10M: 40 MB each, so one extra shard fits and a second does not.
        assert_eq!(auto_shards(10_000_000, 8), 2);
    }

    #[test]
    fn jobs_run_in_one_thread_pools_and_come_back_in_order() {
        let seen = run_at_once(
            (0..5)
                .map(|i| move || (i, rayon::current_num_threads()))
                .collect(),
        );
        assert_eq!(
            seen.iter().map(|s| s.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        assert!(seen.iter().all(|s| s.1 == 1), "{seen:?}");
    }
}
