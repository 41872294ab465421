//! Token sampling from one row of logits: greedy, temperature, top-k and top-p (nucleus), with a
//! seeded, reproducible random stream per generated sequence.
//!
//! What it is: pure functions over a `&[f32]` logits row and a [`SampleStream`]; every call
//! returns the chosen id together with its log-probability under the distribution it was drawn
//! from. What it is not: batching, stopping, or anything that knows about tensors or text.
//!
//! Invariants:
//! - The order of operations is fixed: scale by 1/temperature, keep the top-k logits, keep the
//!   smallest prefix (by descending probability) whose mass under the top-k-renormalized
//!   distribution is >= top_p, renormalize, draw. This is the order used by vLLM and Hugging Face.
//! - The returned `logprob` is `log q(id)` where `q` is that final renormalized distribution, which
//!   is what policy-gradient methods need as the behaviour ("old") policy probability.
//! - Greedy decoding (temperature 0) is deterministic and reports `log softmax(logits)[id]`, the
//!   log-probability under the UNMODIFIED model distribution (the "sampling distribution" of
//!   greedy is a point mass whose log-probability, 0, carries no information).
//! - Ties are broken towards the lower token id, everywhere, so results never depend on sort
//!   stability.
//! - Arithmetic on probabilities is done in f64 (the full-vocabulary softmax normalizer sums f32
//!   exponentials in f64 blocks, within about 1e-7 relative: `scaled_log_normalizer`), and each
//!   draw consumes exactly one `u64` from the stream (or none for greedy), so a stream's output
//!   depends only on its key and the logits.
//! - Cost: one vectorized pass over the row for the normalizer, then a walk in descending order
//!   that sorts only as far as it goes (partial selection in doubling blocks), not the whole
//!   vocabulary.

use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};

use crate::error::RolloutError;

/// How to turn one logits row into a token. Validated; build with [`SamplingRule::new`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingRule {
    temperature: f32,
    top_k: Option<usize>,
    top_p: f32,
}

impl SamplingRule {
    /// Greedy decoding: argmax, lowest id on ties.
    pub const GREEDY: SamplingRule = SamplingRule {
        temperature: 0.0,
        top_k: None,
        top_p: 1.0,
    };

    /// `temperature` 0 means greedy (top-k and top-p are then irrelevant); `top_k` None or
    /// `Some(0)` disables top-k; `top_p` 1.0 disables nucleus truncation.
    pub fn new(temperature: f32, top_k: Option<usize>, top_p: f32) -> Result<Self, RolloutError> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(RolloutError::InvalidParam {
                field: "temperature",
                reason: format!("must be a finite number >= 0, got {temperature}"),
            });
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(RolloutError::InvalidParam {
                field: "top_p",
                reason: format!("must be in (0, 1], got {top_p}"),
            });
        }
        let top_k = top_k.filter(|&k| k > 0);
        Ok(SamplingRule {
            temperature,
            top_k,
            top_p,
        })
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }
    pub fn temperature(&self) -> f32 {
        self.temperature
    }
    pub fn top_k(&self) -> Option<usize> {
        self.top_k
    }
    pub fn top_p(&self) -> f32 {
        self.top_p
    }
}

/// One sampled token and its log-probability under the distribution it was drawn from (see the
/// module doc for what that means in the greedy case).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    pub id: u32,
    pub logprob: f32,
}

/// The random stream of one generated sequence. Its key is (seed, prompt number, sample number):
/// the 32-byte ChaCha8 key is those three little-endian u64 words followed by zeros, so distinct
/// keys give independent streams and the same key gives the same stream in any batch.
pub struct SampleStream {
    rng: ChaCha8Rng,
}

impl SampleStream {
    pub fn new(seed: u64, prompt_number: u64, sample_number: u64) -> Self {
        SampleStream::for_turn(seed, prompt_number, sample_number, 0)
    }

    /// The stream of turn `turn` of a multi-turn episode (sample `sample_number` of prompt
    /// `prompt_number`). Turn 0 is [`SampleStream::new`]'s stream, so an episode's first turn
    /// draws exactly what a single-turn sample of the same prompt would.
    pub fn for_turn(seed: u64, prompt_number: u64, sample_number: u64, turn: u64) -> Self {
        let mut key = [0u8; 32];
        key[0..8].copy_from_slice(&seed.to_le_bytes());
        key[8..16].copy_from_slice(&prompt_number.to_le_bytes());
        key[16..24].copy_from_slice(&sample_number.to_le_bytes());
        key[24..32].copy_from_slice(&turn.to_le_bytes());
        SampleStream {
            rng: ChaCha8Rng::from_seed(key),
        }
    }

    /// A uniform draw in [0, 1) with 53 random bits. Written out rather than taken from `rand`'s
    /// distributions so the mapping from stream to numbers cannot change with a `rand` release.
    pub fn next_uniform(&mut self) -> f64 {
        (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

impl std::fmt::Debug for SampleStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SampleStream").finish_non_exhaustive()
    }
}

/// Samples one token from `logits` under `rule`, drawing from `stream` unless the rule is greedy.
pub fn sample(
    logits: &[f32],
    rule: &SamplingRule,
    stream: &mut SampleStream,
) -> Result<SampledToken, RolloutError> {
    check_logits(logits)?;
    if rule.is_greedy() {
        return Ok(greedy(logits));
    }
    let mut truncation = Truncation::new(logits, rule);
    let u = stream.next_uniform();
    // Inverse-CDF draw over the kept candidates, in their (descending probability) order, sorted
    // only as far as the walk goes. Falls back to the last candidate if rounding leaves the
    // cumulative sum just below u.
    let mut cumulative = 0.0f64;
    let last = truncation.kept - 1;
    let mut chosen = None;
    for i in 0..truncation.kept {
        let id = truncation.order.get(i);
        let logprob = truncation.logprob(id);
        cumulative += logprob.exp();
        if u < cumulative || i == last {
            chosen = Some((id, logprob));
            break;
        }
    }
    let (id, logprob) = chosen.unwrap_or((0, f64::NEG_INFINITY));
    Ok(SampledToken {
        id,
        logprob: logprob as f32,
    })
}

/// Argmax (lowest id on ties) and its log-probability under the unmodified softmax.
pub fn greedy(logits: &[f32]) -> SampledToken {
    let mut best = 0usize;
    for (i, &value) in logits.iter().enumerate() {
        if value > logits[best] {
            best = i;
        }
    }
    let log_normalizer = scaled_log_normalizer(logits, 1.0);
    SampledToken {
        id: best as u32,
        logprob: (logits[best] as f64 - log_normalizer) as f32,
    }
}

/// Log-probability of `id` under the plain softmax of `logits` (no temperature, no truncation):
/// what scoring reports.
pub fn log_softmax_at(logits: &[f32], id: u32) -> f32 {
    let log_normalizer = scaled_log_normalizer(logits, 1.0);
    (logits[id as usize] as f64 - log_normalizer) as f32
}

/// Which distribution reported log-probabilities come from (what a server returns beside the
/// sampled tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogprobMode {
    /// The distribution the token was drawn from: after temperature, top-k and top-p,
    /// renormalized (what importance ratios in RL need). Greedy reports the raw distribution, as
    /// [`sample`] does. Tokens outside the kept set have no processed log-probability.
    #[default]
    Processed,
    /// The model's own distribution: `log softmax(logits)`, before any processing.
    Raw,
}

/// The log-probability of `token` (drawn by [`sample`] under `rule`) in `mode`.
pub fn logprob_in_mode(
    logits: &[f32],
    rule: &SamplingRule,
    mode: LogprobMode,
    token: SampledToken,
) -> f32 {
    match mode {
        LogprobMode::Processed => token.logprob,
        LogprobMode::Raw => {
            if rule.is_greedy() {
                token.logprob
            } else {
                log_softmax_at(logits, token.id)
            }
        }
    }
}

/// The `n` most likely tokens in `mode` (descending, lowest id first on ties) with their
/// log-probabilities. In processed mode only tokens the rule keeps are listed, so fewer than `n`
/// may come back.
pub fn top_logprobs(
    logits: &[f32],
    rule: &SamplingRule,
    mode: LogprobMode,
    n: usize,
) -> Vec<(u32, f32)> {
    if n == 0 {
        return Vec::new();
    }
    if mode == LogprobMode::Raw || rule.is_greedy() {
        let log_normalizer = scaled_log_normalizer(logits, 1.0);
        let mut order = Descending::new(logits);
        order.keep_top(n.min(order.len()).max(1));
        return order
            .ids
            .iter()
            .take(n)
            .map(|&id| (id, (logits[id as usize] as f64 - log_normalizer) as f32))
            .collect();
    }
    let mut truncation = Truncation::new(logits, rule);
    (0..truncation.kept.min(n))
        .map(|i| {
            let id = truncation.order.get(i);
            (id, truncation.logprob(id) as f32)
        })
        .collect()
}

/// The 1-based rank of `id` in the model's distribution: how many tokens have a logit at least
/// as large (vLLM's `rank` of a prompt or sampled token).
pub fn rank_of(logits: &[f32], id: u32) -> usize {
    let value = logits[id as usize];
    logits.iter().filter(|&&x| x >= value).count().max(1)
}

/// A token that survived truncation, with its log-probability under the renormalized
/// distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    pub id: u32,
    pub logprob: f64,
}

/// The distribution a non-greedy `rule` samples from: the kept tokens in descending probability
/// order (lowest id first on ties) with renormalized log-probabilities that sum (in probability)
/// to 1. Public so tests and callers can inspect exactly what [`sample`] draws from.
pub fn truncated_distribution(logits: &[f32], rule: &SamplingRule) -> Vec<Candidate> {
    let mut truncation = Truncation::new(logits, rule);
    (0..truncation.kept)
        .map(|i| {
            let id = truncation.order.get(i);
            Candidate {
                id,
                logprob: truncation.logprob(id),
            }
        })
        .collect()
}

/// `ln sum_i exp(scale * logits[i])` for `scale > 0`: the softmax normalizer of one row. The
/// exponentials are f32 (`stoke_ops::vexp`, within 2 ulp) of `scale * (x - max)` summed in 16
/// f32 lanes per block of 1024 and the blocks in f64, so the result is within about 1e-7 relative
/// of the f64 sum, at vector speed (a row is the whole vocabulary, 50-150 K entries, for every
/// row of every decode step). -inf logits add exactly 0.
fn scaled_log_normalizer(logits: &[f32], scale: f64) -> f64 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x));
    if max == f32::NEG_INFINITY {
        return f64::NEG_INFINITY;
    }
    let s = scale as f32;
    let sum: f64 = stoke_ops::vexp::dispatch(
        #[inline(always)]
        || {
            let mut total = 0.0f64;
            for block in logits.chunks(1024) {
                let mut lanes = [0.0f32; 16];
                let mut chunks = block.chunks_exact(16);
                for chunk in &mut chunks {
                    for (lane, &x) in lanes.iter_mut().zip(chunk) {
                        *lane += stoke_ops::vexp::exp((x - max) * s);
                    }
                }
                let rest: f32 = chunks
                    .remainder()
                    .iter()
                    .map(|&x| stoke_ops::vexp::exp((x - max) * s))
                    .sum();
                total += (lanes.iter().sum::<f32>() + rest) as f64;
            }
            total
        },
    );
    max as f64 * scale + sum.ln()
}

/// The candidates of a non-greedy rule (temperature, top-k, top-p applied) and their normalizer.
struct Truncation<'a> {
    logits: &'a [f32],
    inverse_temperature: f64,
    order: Descending<'a>,
    /// The first `kept` tokens of `order` are the candidates.
    kept: usize,
    log_normalizer: f64,
}

impl<'a> Truncation<'a> {
    fn new(logits: &'a [f32], rule: &SamplingRule) -> Self {
        let inverse_temperature = 1.0 / rule.temperature.max(f32::MIN_POSITIVE) as f64;
        let scaled = |id: u32| logits[id as usize] as f64 * inverse_temperature;
        let mut order = Descending::new(logits);
        let log_normalizer = match rule.top_k {
            Some(k) if k < order.len() => {
                order.keep_top(k);
                log_sum_exp((0..k).map(|i| scaled(order.ids[i])))
            }
            _ => scaled_log_normalizer(logits, inverse_temperature),
        };
        let mut kept = order.len();
        let mut log_normalizer = log_normalizer;
        if rule.top_p < 1.0 {
            let mut mass = 0.0f64;
            for i in 0..order.len() {
                mass += (scaled(order.get(i)) - log_normalizer).exp();
                if mass >= rule.top_p as f64 {
                    kept = i + 1;
                    break;
                }
            }
            log_normalizer = log_sum_exp((0..kept).map(|i| scaled(order.ids[i])));
        }
        Truncation {
            logits,
            inverse_temperature,
            order,
            kept,
            log_normalizer,
        }
    }

    fn logprob(&self, id: u32) -> f64 {
        self.logits[id as usize] as f64 * self.inverse_temperature - self.log_normalizer
    }
}

/// Token ids in descending logit order (lowest id first on ties), sorted lazily: a walk that
/// stops after a few hundred tokens (the usual draw) never sorts the whole vocabulary. The order
/// is a total order, so it is the same as a full sort's.
struct Descending<'a> {
    logits: &'a [f32],
    /// Every token with a logit above -inf (masked tokens can never be drawn).
    ids: Vec<u32>,
    /// `ids[..sorted]` are final; the rest are all after them in the order.
    sorted: usize,
}

impl<'a> Descending<'a> {
    fn new(logits: &'a [f32]) -> Self {
        let ids = (0..logits.len() as u32)
            .filter(|&id| logits[id as usize] != f32::NEG_INFINITY)
            .collect();
        Descending {
            logits,
            ids,
            sorted: 0,
        }
    }

    fn len(&self) -> usize {
        self.ids.len()
    }

    fn before(logits: &[f32], a: u32, b: u32) -> std::cmp::Ordering {
        logits[b as usize]
            .total_cmp(&logits[a as usize])
            .then(a.cmp(&b))
    }

    /// Keeps the `k` first tokens only (partial selection: O(V) instead of a full sort).
    fn keep_top(&mut self, k: usize) {
        let logits = self.logits;
        if k < self.ids.len() {
            self.ids
                .select_nth_unstable_by(k - 1, |a, b| Self::before(logits, *a, *b));
            self.ids.truncate(k);
        }
        self.ids
            .sort_unstable_by(|a, b| Self::before(logits, *a, *b));
        self.sorted = self.ids.len();
    }

    /// The `i`-th token of the order.
    fn get(&mut self, i: usize) -> u32 {
        if i >= self.sorted {
            let logits = self.logits;
            // Sort the next block (doubling), found by partial selection of the rest.
            let end = (self.sorted + self.sorted.max(64))
                .max(i + 1)
                .min(self.ids.len());
            let rest = &mut self.ids[self.sorted..];
            let take = end - self.sorted;
            if take < rest.len() {
                rest.select_nth_unstable_by(take - 1, |a, b| Self::before(logits, *a, *b));
            }
            rest[..take].sort_unstable_by(|a, b| Self::before(logits, *a, *b));
            self.sorted = end;
        }
        self.ids[i]
    }
}

fn check_logits(logits: &[f32]) -> Result<(), RolloutError> {
    if logits.is_empty() {
        return Err(RolloutError::BadLogits("empty logits row".into()));
    }
    if let Some(position) = logits
        .iter()
        .position(|x| x.is_nan() || *x == f32::INFINITY)
    {
        return Err(RolloutError::BadLogits(format!(
            "logit of token {position} is {}",
            logits[position]
        )));
    }
    if logits.iter().all(|&x| x == f32::NEG_INFINITY) {
        return Err(RolloutError::BadLogits("every logit is -inf".into()));
    }
    Ok(())
}

fn log_sum_exp(values: impl Iterator<Item = f64> + Clone) -> f64 {
    let max = values.clone().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return max;
    }
    max + values.map(|v| (v - max).exp()).sum::<f64>().ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(temperature: f32, top_k: Option<usize>, top_p: f32) -> SamplingRule {
        SamplingRule::new(temperature, top_k, top_p).unwrap()
    }

    #[test]
    fn the_lazy_descending_order_is_the_full_sort_and_the_normalizer_is_f64_close() {
        // 10 000 logits with many exact ties and some masked tokens.
        let logits: Vec<f32> = (0..10_000u32)
            .map(|i| match i % 97 {
                0 => f32::NEG_INFINITY,
                _ => ((i.wrapping_mul(2_654_435_761) >> 20) % 300) as f32 * 0.05 - 7.0,
            })
            .collect();
        let mut full: Vec<u32> = (0..logits.len() as u32)
            .filter(|&id| logits[id as usize] != f32::NEG_INFINITY)
            .collect();
        full.sort_by(|a, b| Descending::before(&logits, *a, *b));
        let mut lazy = Descending::new(&logits);
        let walked: Vec<u32> = (0..lazy.len()).map(|i| lazy.get(i)).collect();
        assert_eq!(walked, full);
        for scale in [1.0, 1.0 / 0.7, 1.0 / 1.3] {
            let exact = log_sum_exp(full.iter().map(|&id| logits[id as usize] as f64 * scale));
            let fast = scaled_log_normalizer(&logits, scale);
            assert!(
                (fast - exact).abs() <= 1e-7 * exact.abs().max(1.0),
                "{fast} vs {exact}"
            );
        }
    }

    #[test]
    fn hand_computed_top_k_top_p_distribution() {
        // Logits are log-weights, so at T = 1 the probabilities are proportional to
        // [4, 1, 2, 8, 1] (exact up to the f32 rounding of the logits, hence the 1e-6 tolerance).
        let logits: Vec<f32> = [4.0f32, 1.0, 2.0, 8.0, 1.0]
            .iter()
            .map(|p| p.ln())
            .collect();
        // top-k 3 keeps {3: 8, 0: 4, 2: 2} (total 14); top-p 0.8 keeps 8/14 = 0.571 then
        // 12/14 = 0.857 >= 0.8, so {3, 0} renormalized to 8/12 and 4/12.
        let dist = truncated_distribution(&logits, &rule(1.0, Some(3), 0.8));
        let ids: Vec<u32> = dist.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![3, 0]);
        assert!((dist[0].logprob - (8.0f64 / 12.0).ln()).abs() < 1e-6);
        assert!((dist[1].logprob - (4.0f64 / 12.0).ln()).abs() < 1e-6);
        // Temperature 0.5 squares the probabilities: [16, 1, 4, 64, 1]; no truncation.
        let dist = truncated_distribution(&logits, &rule(0.5, None, 1.0));
        let total = 16.0 + 1.0 + 4.0 + 64.0 + 1.0;
        let token_two = dist.iter().find(|c| c.id == 2).unwrap();
        assert!((token_two.logprob - (4.0f64 / total).ln()).abs() < 1e-6);
    }

    #[test]
    fn sampled_logprob_is_the_renormalized_truncated_logprob() {
        let logits: Vec<f32> = [4.0f32, 1.0, 2.0, 8.0, 1.0]
            .iter()
            .map(|p| p.ln())
            .collect();
        let r = rule(1.0, Some(3), 0.8);
        let mut stream = SampleStream::new(7, 0, 0);
        for _ in 0..50 {
            let token = sample(&logits, &r, &mut stream).unwrap();
            let expected = if token.id == 3 {
                8.0f32 / 12.0
            } else {
                4.0 / 12.0
            };
            assert!(
                token.id == 3 || token.id == 0,
                "token {} was truncated away",
                token.id
            );
            assert!((token.logprob - expected.ln()).abs() < 1e-6);
        }
    }

    #[test]
    fn top_p_keeps_the_smallest_set_reaching_the_mass() {
        // Probabilities 0.5, 0.3, 0.2: p = 0.5 keeps one token (mass exactly 0.5 >= p), p = 0.51
        // needs two, p = 0.81 needs all three.
        let logits: Vec<f32> = [0.3f32, 0.5, 0.2].iter().map(|p| p.ln()).collect();
        let kept = |p: f32| {
            truncated_distribution(&logits, &rule(1.0, None, p))
                .iter()
                .map(|c| c.id)
                .collect::<Vec<_>>()
        };
        assert_eq!(kept(0.5), vec![1]);
        assert_eq!(kept(0.51), vec![1, 0]);
        assert_eq!(kept(0.81), vec![1, 0, 2]);
        assert_eq!(kept(1.0), vec![1, 0, 2]);
    }

    #[test]
    fn top_k_one_picks_the_greedy_token() {
        let logits = [0.1f32, 2.5, -1.0, 2.4, 0.0];
        let mut stream = SampleStream::new(1, 2, 3);
        for temperature in [0.3f32, 1.0, 5.0] {
            let token = sample(&logits, &rule(temperature, Some(1), 1.0), &mut stream).unwrap();
            assert_eq!(token.id, greedy(&logits).id);
            assert_eq!(token.logprob, 0.0);
        }
    }

    #[test]
    fn greedy_reports_the_unmodified_log_softmax_and_breaks_ties_low() {
        let logits = [1.0f32, 3.0, 3.0, -2.0];
        let token = greedy(&logits);
        assert_eq!(token.id, 1);
        let normalizer = (1.0f64.exp() + 2.0 * 3.0f64.exp() + (-2.0f64).exp()).ln();
        assert!((token.logprob as f64 - (3.0 - normalizer)).abs() < 1e-6);
        let mut stream = SampleStream::new(0, 0, 0);
        let via_rule = sample(&logits, &SamplingRule::GREEDY, &mut stream).unwrap();
        assert_eq!(via_rule, token);
    }

    #[test]
    fn empirical_frequencies_follow_the_truncated_distribution() {
        // Probabilities [0.4, 0.25, 0.15, 0.1, 0.06, 0.04] at T = 1; with T = 0.8, top-k 5 and
        // top-p 0.9 the drawn frequencies must match truncated_distribution within 4 standard
        // errors over 40,000 draws, and truncated tokens must never appear.
        let logits: Vec<f32> = [0.4f32, 0.25, 0.15, 0.1, 0.06, 0.04]
            .iter()
            .map(|p| p.ln())
            .collect();
        let r = rule(0.8, Some(5), 0.9);
        let dist = truncated_distribution(&logits, &r);
        assert!(
            dist.len() < 5,
            "top-p should have removed something: {dist:?}"
        );
        let draws = 40_000usize;
        let mut counts = vec![0usize; logits.len()];
        let mut stream = SampleStream::new(42, 0, 0);
        for _ in 0..draws {
            counts[sample(&logits, &r, &mut stream).unwrap().id as usize] += 1;
        }
        for (id, &count) in counts.iter().enumerate() {
            let expected = dist
                .iter()
                .find(|c| c.id == id as u32)
                .map_or(0.0, |c| c.logprob.exp());
            let observed = count as f64 / draws as f64;
            let standard_error = (expected * (1.0 - expected) / draws as f64).sqrt();
            assert!(
                (observed - expected).abs() <= 4.0 * standard_error,
                "token {id}: observed {observed}, expected {expected}"
            );
        }
    }

    #[test]
    fn same_stream_key_repeats_and_different_keys_differ() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let r = rule(1.0, None, 1.0);
        let run = |seed, prompt, sample_number| {
            let mut stream = SampleStream::new(seed, prompt, sample_number);
            (0..64)
                .map(|_| sample(&logits, &r, &mut stream).unwrap().id)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(5, 1, 2), run(5, 1, 2));
        assert_ne!(run(5, 1, 2), run(5, 1, 3));
        assert_ne!(run(5, 1, 2), run(5, 2, 2));
        assert_ne!(run(5, 1, 2), run(6, 1, 2));
    }

    #[test]
    fn masked_tokens_are_never_drawn_and_bad_logits_are_errors() {
        let logits = [f32::NEG_INFINITY, 0.0, f32::NEG_INFINITY, 0.0];
        let mut stream = SampleStream::new(3, 0, 0);
        for _ in 0..100 {
            let id = sample(&logits, &rule(1.0, None, 1.0), &mut stream)
                .unwrap()
                .id;
            assert!(id == 1 || id == 3);
        }
        assert!(sample(&[0.0, f32::NAN], &rule(1.0, None, 1.0), &mut stream).is_err());
        assert!(sample(&[f32::NEG_INFINITY; 3], &SamplingRule::GREEDY, &mut stream).is_err());
        assert!(sample(&[], &SamplingRule::GREEDY, &mut stream).is_err());
    }

    #[test]
    fn invalid_rules_are_rejected_with_the_field_name() {
        let message = SamplingRule::new(-1.0, None, 1.0).unwrap_err().to_string();
        assert!(message.contains("temperature"), "{message}");
        let message = SamplingRule::new(1.0, None, 0.0).unwrap_err().to_string();
        assert!(message.contains("top_p"), "{message}");
        assert!(SamplingRule::new(f32::NAN, None, 1.0).is_err());
        assert_eq!(SamplingRule::new(1.0, Some(0), 1.0).unwrap().top_k(), None);
    }
}
