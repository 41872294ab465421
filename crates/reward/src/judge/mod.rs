//! `judge`: completions graded by a language model (LLM-as-judge) on OpenAI-compatible servers
//! (`stoke serve`, vLLM, a hosted API), the reward of open-ended tasks that no verifier checks
//! and no trained reward model covers.
//!
//! What it is: the verifier that turns a GRPO group into judge requests, sends them (at most
//! `max_concurrency` in flight over all groups, round robin over `urls` with retries and a
//! cooldown for failed servers: `servers.rs`), reads the verdicts (`verdict.rs`) and scores:
//!
//! 1. `pointwise`: one request per completion; the judge ends with `Score: N`, N on `scale =
//!    [lo, hi]`; the score is `(N - lo) / (hi - lo)` in [0, 1].
//! 2. `pairwise` (a critic comparing completions of the same prompt): each scheduled pair
//!    (`schedule.rs`: every pair up to 8 samples, 8 partners each beyond) is asked "which is
//!    better", `Verdict: A|B|tie`; with `swap = true` in both orders, a disagreement being a
//!    tie and counted as inconsistent. A sample's score is its win rate (tie = 0.5) over its
//!    compared pairs. A failed comparison is left out of the win rate; a sample with none left
//!    fails.
//! 3. `listwise`: the group in one request, labelled 1..=G, answered `Ranking: 3 > 1 > 2`;
//!    with `swap = true` a second request in the reversed order. A sample scores its mean
//!    normalized rank (best 1, worst 0). Either request failing fails the group.
//!
//! Failures are never scores: a verdict that cannot be read is `UnparseableVerdict`, a judge
//! that could not be reached (after retries) or refused the request is `ScorerError` with the
//! reason; both leave the sample out of training. Pairwise and listwise need two completions;
//! a group of one fails (`ScorerError`). The prompts quote the graded text between nonce
//! delimiters and neutralize look-alikes (`prompt.rs`); the verdict is read only from the
//! judge's answer. Verdicts are cached (`cache.rs`); each outcome carries the judge's figures
//! (`details.judge`: calls, cache hits, retries, servers skipped, latency, swap consistency),
//! a call that concerns several samples counted once, on the pair's first sample or the
//! group's first.
//!
//! What it is not: a server or a process manager (the judge runs elsewhere), nor async: calls
//! run on scoped threads. The pipeline's reward timeout must allow a group's calls
//! (`reward_timeout_s`).
//!
//! ```toml
//! [rewards.helpful]
//! kind = "judge"
//! urls = ["http://127.0.0.1:8000"]
//! model = "judge"            # optional: the first id of GET /v1/models
//! mode = "pointwise"         # "pointwise" | "pairwise" | "listwise"
//! rubric = "Rate helpfulness and correctness."   # or rubric_file = "rubric.md"
//! scale = [1, 10]
//! swap = true
//! max_concurrency = 8
//! timeout_s = 60
//! retries = 2
//! max_tokens = 256
//! temperature = 0.0
//! api_key_env = "OPENAI_API_KEY"
//! cache_size = 4096
//! ```

pub mod cache;
pub mod config;
pub mod prompt;
pub mod schedule;
pub mod servers;
pub mod transport;
pub mod verdict;

#[cfg(test)]
mod fakes;
#[cfg(test)]
mod injection_tests;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde_json::json;

pub use config::{JudgeConfig, JudgeMode, JudgeSettings};
pub use transport::{HttpTransport, JudgeTransport, TransportError};

use crate::error::ConfigError;
use crate::verifier::{
    Details, JudgeFigures, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail,
};
use cache::VerdictCache;
use prompt::{Messages, Quoting};
use schedule::PairResult;
use servers::{Attempts, ServerPool};
use verdict::PairVerdict;

/// The `judge` verifier (module doc). Clones share the servers' state, the cache, the
/// concurrency limit and the discovered model name.
#[derive(Clone)]
pub struct JudgeVerifier {
    shared: Arc<Shared>,
}

struct Shared {
    settings: JudgeSettings,
    transport: Arc<dyn JudgeTransport>,
    servers: ServerPool,
    cache: VerdictCache<Verdict>,
    /// The configured model, or the first one a server listed (asked once).
    model: Mutex<Option<String>>,
    slots: Slots,
    /// Mode, model, rubric and scale: the part of every cache key that is the verifier's.
    key_prefix: String,
}

impl std::fmt::Debug for JudgeVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JudgeVerifier")
            .field("settings", &self.shared.settings)
            .finish_non_exhaustive()
    }
}

/// A verdict as the cache keeps it.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    Score(f64),
    Pair(PairVerdict),
    Ranking(Vec<usize>),
}

/// What a request's answer must contain.
#[derive(Debug, Clone, Copy)]
enum Expect {
    Score,
    Pair,
    Ranking(usize),
}

struct Request {
    key: u64,
    messages: Messages,
    expect: Expect,
}

/// Why a request gave no verdict.
#[derive(Debug, Clone, PartialEq)]
enum Failure {
    /// No judge answered, or one refused the request.
    Scorer(String),
    /// The judge answered without a readable verdict.
    Unparseable(String),
}

impl Failure {
    fn outcome(&self) -> Outcome {
        match self {
            Failure::Scorer(_) => Outcome::ScorerError,
            Failure::Unparseable(_) => Outcome::UnparseableVerdict,
        }
    }

    fn reason(&self) -> &str {
        match self {
            Failure::Scorer(reason) | Failure::Unparseable(reason) => reason,
        }
    }

    /// The outcome of a sample all of whose requests failed with `failures`: a judge that could
    /// not be reached outranks an unreadable verdict.
    fn outcome_of<'a>(failures: impl IntoIterator<Item = &'a Failure>) -> (Outcome, String) {
        let failures: Vec<&Failure> = failures.into_iter().collect();
        let worst = failures
            .iter()
            .find(|f| matches!(f, Failure::Scorer(_)))
            .or(failures.first());
        match worst {
            Some(failure) => (failure.outcome(), failure.reason().to_string()),
            None => (
                Outcome::ScorerError,
                "no judge request was made".to_string(),
            ),
        }
    }
}

struct Answer {
    verdict: Result<Verdict, Failure>,
    figures: JudgeFigures,
}

/// A counting semaphore: the judge requests in flight.
struct Slots {
    free: Mutex<usize>,
    freed: Condvar,
}

struct Slot<'a>(&'a Slots);

impl Slots {
    fn new(count: usize) -> Slots {
        Slots {
            free: Mutex::new(count),
            freed: Condvar::new(),
        }
    }

    fn acquire(&self) -> Slot<'_> {
        let mut free = lock(&self.free);
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|p| p.into_inner());
        }
        *free -= 1;
        Slot(self)
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        *lock(&self.0.free) += 1;
        self.0.freed.notify_one();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl JudgeVerifier {
    /// Checks the options and talks HTTP to the configured servers.
    pub fn new(config: &JudgeConfig) -> Result<Self, ConfigError> {
        let settings = JudgeSettings::from_config(config)?;
        let transport = Arc::new(HttpTransport::new(settings.api_key.clone()));
        Ok(Self::from_settings(settings, transport, servers::COOLDOWN))
    }

    /// Checks the options and sends requests through `transport` (tests, other clients).
    pub fn with_transport(
        config: &JudgeConfig,
        transport: Arc<dyn JudgeTransport>,
    ) -> Result<Self, ConfigError> {
        let settings = JudgeSettings::from_config(config)?;
        Ok(Self::from_settings(settings, transport, servers::COOLDOWN))
    }

    /// The verifier over validated settings, with a server cooldown.
    pub fn from_settings(
        settings: JudgeSettings,
        transport: Arc<dyn JudgeTransport>,
        cooldown: Duration,
    ) -> Self {
        let key_prefix = format!(
            "{}\u{0}{}\u{0}{}\u{0}{}:{}",
            settings.mode.name(),
            settings.model.as_deref().unwrap_or(""),
            settings.rubric,
            settings.scale.0,
            settings.scale.1
        );
        JudgeVerifier {
            shared: Arc::new(Shared {
                servers: ServerPool::new(settings.servers.clone(), cooldown),
                cache: VerdictCache::new(settings.cache_size),
                model: Mutex::new(settings.model.clone()),
                slots: Slots::new(settings.max_concurrency),
                transport,
                key_prefix,
                settings,
            }),
        }
    }

    pub fn settings(&self) -> &JudgeSettings {
        &self.shared.settings
    }

    /// Verdicts in the cache now.
    pub fn cached_verdicts(&self) -> usize {
        self.shared.cache.len()
    }

    fn key(&self, kind: &str, texts: &[&str]) -> u64 {
        let mut parts = vec![self.shared.key_prefix.as_str(), kind];
        parts.extend_from_slice(texts);
        cache::key(&parts)
    }

    /// The model name to send: configured, or the first a server lists (asked once).
    fn model(&self, attempts: &mut Attempts) -> Result<String, String> {
        let shared = &self.shared;
        let mut model = lock(&shared.model);
        if let Some(name) = model.as_ref() {
            return Ok(name.clone());
        }
        let timeout = shared.settings.timeout;
        let ids = shared
            .servers
            .call(shared.settings.retries, attempts, |server| {
                shared.transport.models(server, timeout)
            })
            .map_err(|e| format!("asking the judge server for its model: {e}"))?;
        let first = ids.into_iter().next().unwrap_or_default();
        *model = Some(first.clone());
        Ok(first)
    }

    /// One request: from the cache, or from a server under the concurrency limit.
    fn ask(&self, request: &Request) -> Answer {
        let shared = &self.shared;
        let mut figures = JudgeFigures::default();
        if let Some(verdict) = shared.cache.get(request.key) {
            figures.cache_hits = 1;
            return Answer {
                verdict: Ok(verdict),
                figures,
            };
        }
        let _slot = shared.slots.acquire();
        let settings = &shared.settings;
        let mut attempts = Attempts::default();
        let reply = self.model(&mut attempts).and_then(|model| {
            let body = json!({
                "model": model,
                "messages": [
                    {"role": "system", "content": request.messages.system},
                    {"role": "user", "content": request.messages.user},
                ],
                "temperature": settings.temperature,
                "max_tokens": settings.max_tokens,
            });
            shared
                .servers
                .call(settings.retries, &mut attempts, |server| {
                    shared.transport.chat(server, &body, settings.timeout)
                })
        });
        figures.calls = 1;
        figures.retries = attempts.retries;
        figures.servers_skipped = attempts.skipped;
        figures.latency_s = attempts.seconds;
        let verdict = match reply {
            Err(reason) => Err(Failure::Scorer(reason)),
            Ok(text) => match parse(&text, request.expect, settings.scale) {
                Ok(verdict) => {
                    shared.cache.insert(request.key, verdict.clone());
                    Ok(verdict)
                }
                Err(reason) => Err(Failure::Unparseable(format!(
                    "{reason}; the judge answered: {}",
                    clip_detail(text.trim())
                ))),
            },
        };
        Answer { verdict, figures }
    }

    /// Every request, at most `max_concurrency` at once, answers in order.
    fn ask_all(&self, requests: &[Request]) -> Vec<Answer> {
        let workers = self.shared.settings.max_concurrency.min(requests.len());
        if workers <= 1 {
            return requests.iter().map(|request| self.ask(request)).collect();
        }
        let next = AtomicUsize::new(0);
        let mut answers: Vec<Option<Answer>> = requests.iter().map(|_| None).collect();
        std::thread::scope(|scope| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    scope.spawn(|| {
                        let mut done = Vec::new();
                        loop {
                            let index = next.fetch_add(1, Ordering::Relaxed);
                            let Some(request) = requests.get(index) else {
                                return done;
                            };
                            done.push((index, self.ask(request)));
                        }
                    })
                })
                .collect();
            for handle in handles {
                // A worker that panicked loses its answers; they become failures below.
                if let Ok(done) = handle.join() {
                    for (index, answer) in done {
                        answers[index] = Some(answer);
                    }
                }
            }
        });
        answers
            .into_iter()
            .map(|answer| {
                answer.unwrap_or_else(|| Answer {
                    verdict: Err(Failure::Scorer("a judge request panicked".to_string())),
                    figures: JudgeFigures::default(),
                })
            })
            .collect()
    }

    fn pointwise(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let settings = &self.shared.settings;
        let requests: Vec<Request> = group
            .iter()
            .map(|input| Request {
                key: self.key("pointwise", &[input.prompt, input.completion]),
                messages: prompt::pointwise(
                    &settings.rubric,
                    settings.scale,
                    input.prompt,
                    input.completion,
                    &Quoting::fresh(),
                ),
                expect: Expect::Score,
            })
            .collect();
        let (lo, hi) = settings.scale;
        self.ask_all(&requests)
            .into_iter()
            .map(|answer| match answer.verdict {
                Ok(Verdict::Score(value)) => RewardOutcome::shaped(
                    (value - lo) / (hi - lo),
                    Details {
                        extracted: Some(format!("judge score {value} on [{lo}, {hi}]")),
                        judge: Some(answer.figures),
                        ..Details::default()
                    },
                ),
                Ok(other) => failed(
                    &Failure::Unparseable(format!("not a score: {other:?}")),
                    answer.figures,
                ),
                Err(failure) => failed(&failure, answer.figures),
            })
            .collect()
    }

    fn pairwise(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let n = group.len();
        if n < 2 {
            return too_small(n, "pairwise");
        }
        let settings = &self.shared.settings;
        let pairs = schedule::pair_schedule(n);
        let orders: &[bool] = if settings.swap {
            &[false, true]
        } else {
            &[false]
        };
        let mut requests = Vec::with_capacity(pairs.len() * orders.len());
        for &(i, j) in &pairs {
            for &swapped in orders {
                let (a, b) = if swapped { (j, i) } else { (i, j) };
                let (first, second) = (group[a].completion, group[b].completion);
                requests.push(Request {
                    key: self.key("pairwise", &[group[i].prompt, first, second]),
                    messages: prompt::pairwise(
                        &settings.rubric,
                        group[i].prompt,
                        first,
                        second,
                        &Quoting::fresh(),
                    ),
                    expect: Expect::Pair,
                });
            }
        }
        let answers = self.ask_all(&requests);
        let mut points = vec![0.0; n];
        let mut compared = vec![0usize; n];
        let mut failures: Vec<Vec<Failure>> = vec![Vec::new(); n];
        let mut figures = vec![JudgeFigures::default(); n];
        for (&(i, j), calls) in pairs.iter().zip(answers.chunks(orders.len())) {
            let mut results = Vec::with_capacity(orders.len());
            for (answer, &swapped) in calls.iter().zip(orders) {
                figures[i] = figures[i].plus(answer.figures);
                results.push(match &answer.verdict {
                    Ok(Verdict::Pair(verdict)) => Ok(PairResult::of(*verdict, swapped)),
                    Ok(other) => Err(Failure::Unparseable(format!("not a verdict: {other:?}"))),
                    Err(failure) => Err(failure.clone()),
                });
            }
            if let Some(Err(failure)) = results.iter().find(|r| r.is_err()) {
                failures[i].push(failure.clone());
                failures[j].push(failure.clone());
                continue;
            }
            let results: Vec<PairResult> = results.into_iter().flatten().collect();
            let result = match results[..] {
                [straight, swapped] => {
                    let (result, consistent) = schedule::combine_orders(straight, swapped);
                    figures[i].compared_pairs += 1;
                    figures[i].consistent_pairs += u64::from(consistent);
                    result
                }
                [only] => only,
                _ => continue,
            };
            let (to_i, to_j) = result.points();
            points[i] += to_i;
            points[j] += to_j;
            compared[i] += 1;
            compared[j] += 1;
        }
        (0..n)
            .map(|sample| {
                if compared[sample] == 0 {
                    let (outcome, reason) = Failure::outcome_of(&failures[sample]);
                    return RewardOutcome::new(
                        0.0,
                        outcome,
                        Details {
                            reason: Some(format!("no comparison succeeded: {reason}")),
                            judge: Some(figures[sample]),
                            ..Details::default()
                        },
                    );
                }
                let rate = points[sample] / compared[sample] as f64;
                RewardOutcome::shaped(
                    rate,
                    Details {
                        extracted: Some(format!(
                            "judge win rate {rate:.3} over {} comparison(s)",
                            compared[sample]
                        )),
                        passed: Some(compared[sample]),
                        total: Some(compared[sample] + failures[sample].len()),
                        reason: failures[sample].first().map(|f| {
                            format!(
                                "{} comparison(s) failed and were left out: {}",
                                failures[sample].len(),
                                f.reason()
                            )
                        }),
                        judge: Some(figures[sample]),
                        ..Details::default()
                    },
                )
            })
            .collect()
    }

    fn listwise(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let n = group.len();
        if n < 2 {
            return too_small(n, "listwise");
        }
        let settings = &self.shared.settings;
        let mut orders: Vec<Vec<usize>> = vec![(0..n).collect()];
        if settings.swap {
            orders.push((0..n).rev().collect());
        }
        let prompt_text = group[0].prompt;
        let requests: Vec<Request> = orders
            .iter()
            .map(|order| {
                let texts: Vec<&str> = order.iter().map(|&s| group[s].completion).collect();
                let mut key_texts = vec![prompt_text];
                key_texts.extend_from_slice(&texts);
                Request {
                    key: self.key("listwise", &key_texts),
                    messages: prompt::listwise(
                        &settings.rubric,
                        prompt_text,
                        &texts,
                        &Quoting::fresh(),
                    ),
                    expect: Expect::Ranking(n),
                }
            })
            .collect();
        let answers = self.ask_all(&requests);
        let mut figures = answers
            .iter()
            .fold(JudgeFigures::default(), |sum, a| sum.plus(a.figures));
        let mut per_order = Vec::with_capacity(orders.len());
        let mut failures = Vec::new();
        for (answer, order) in answers.iter().zip(&orders) {
            match &answer.verdict {
                Ok(Verdict::Ranking(ranking)) => {
                    per_order.push(schedule::rank_scores(ranking, order))
                }
                Ok(other) => {
                    failures.push(Failure::Unparseable(format!("not a ranking: {other:?}")))
                }
                Err(failure) => failures.push(failure.clone()),
            }
        }
        let with_figures = |sample: usize, figures: JudgeFigures| {
            if sample == 0 {
                figures
            } else {
                JudgeFigures::default()
            }
        };
        if !failures.is_empty() {
            let (outcome, reason) = Failure::outcome_of(&failures);
            return (0..n)
                .map(|sample| {
                    RewardOutcome::new(
                        0.0,
                        outcome,
                        Details {
                            reason: Some(format!("the group's ranking failed: {reason}")),
                            judge: Some(with_figures(sample, figures)),
                            ..Details::default()
                        },
                    )
                })
                .collect();
        }
        if let [straight, reversed] = &per_order[..] {
            let (agree, compared) = schedule::agreeing_pairs(straight, reversed);
            figures.consistent_pairs += agree;
            figures.compared_pairs += compared;
        }
        (0..n)
            .map(|sample| {
                let score = per_order.iter().map(|scores| scores[sample]).sum::<f64>()
                    / per_order.len() as f64;
                RewardOutcome::shaped(
                    score,
                    Details {
                        extracted: Some(format!(
                            "judge rank score {score:.3} among {n} (best 1, worst 0)"
                        )),
                        judge: Some(with_figures(sample, figures)),
                        ..Details::default()
                    },
                )
            })
            .collect()
    }
}

/// The verdict a request asked for, read from the judge's answer.
fn parse(text: &str, expect: Expect, (lo, hi): (f64, f64)) -> Result<Verdict, String> {
    match expect {
        Expect::Score => verdict::parse_score(text, lo, hi).map(Verdict::Score),
        Expect::Pair => verdict::parse_pair(text).map(Verdict::Pair),
        Expect::Ranking(n) => verdict::parse_ranking(text, n).map(Verdict::Ranking),
    }
}

fn failed(failure: &Failure, figures: JudgeFigures) -> RewardOutcome {
    RewardOutcome::new(
        0.0,
        failure.outcome(),
        Details {
            reason: Some(failure.reason().to_string()),
            judge: Some(figures),
            ..Details::default()
        },
    )
}

fn too_small(n: usize, mode: &str) -> Vec<RewardOutcome> {
    let failure = Failure::Scorer(format!(
        "{mode} judging compares completions of one prompt: a group of {n} has nothing to \
         compare (use a group size of 2 or more, or mode = \"pointwise\")"
    ));
    (0..n)
        .map(|_| failed(&failure, JudgeFigures::default()))
        .collect()
}

impl Verifier for JudgeVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_group(std::slice::from_ref(input))
            .pop()
            .unwrap_or_else(|| RewardOutcome::failed(Outcome::ScorerError, "no judge verdict"))
    }

    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        if group.is_empty() {
            return Vec::new();
        }
        match self.shared.settings.mode {
            JudgeMode::Pointwise => self.pointwise(group),
            JudgeMode::Pairwise => self.pairwise(group),
            JudgeMode::Listwise => self.listwise(group),
        }
    }
}
