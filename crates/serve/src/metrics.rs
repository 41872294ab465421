//! The server's Prometheus metrics (`GET /metrics`, OpenMetrics text), named after vLLM's with a
//! `stoke:` prefix so dashboards carry over: request counts by finish reason, prompt and
//! generated tokens, running and waiting requests, KV cache use, the decode batch size per step,
//! and histograms of time to first token, inter-token latency and end-to-end latency.
//!
//! What it is: one registry shared by the routes (request-level figures) and the worker
//! (step-level figures). What it is not: logging.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Latency buckets (seconds) for time to first token and end-to-end latency.
const LATENCY_BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
];
/// Inter-token latency buckets (seconds).
const TOKEN_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0,
];
/// Decode batch sizes.
const BATCH_BUCKETS: [f64; 10] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

type Labels = Vec<(String, String)>;

/// Every metric of the server.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pub requests: Family<Labels, Counter>,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    pub running: Gauge,
    pub waiting: Gauge,
    pub kv_cache_usage: Gauge<f64, AtomicU64>,
    pub weight_version: Gauge,
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub e2e_latency: Histogram,
    pub batch_size: Histogram,
    pub prefill_tokens: Counter,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let requests = Family::<Labels, Counter>::default();
        let prompt_tokens = Counter::default();
        let generation_tokens = Counter::default();
        let running = Gauge::default();
        let waiting = Gauge::default();
        let kv_cache_usage = Gauge::<f64, AtomicU64>::default();
        let weight_version = Gauge::default();
        let time_to_first_token = Histogram::new(LATENCY_BUCKETS);
        let inter_token_latency = Histogram::new(TOKEN_BUCKETS);
        let e2e_latency = Histogram::new(LATENCY_BUCKETS);
        let batch_size = Histogram::new(BATCH_BUCKETS);
        let prefill_tokens = Counter::default();
        registry.register(
            "stoke:request_success",
            "Finished requests by endpoint and finish reason",
            requests.clone(),
        );
        registry.register(
            "stoke:prompt_tokens",
            "Prompt tokens of accepted requests",
            prompt_tokens.clone(),
        );
        registry.register(
            "stoke:generation_tokens",
            "Generated tokens",
            generation_tokens.clone(),
        );
        registry.register(
            "stoke:num_requests_running",
            "Sequences in the decode batch",
            running.clone(),
        );
        registry.register(
            "stoke:num_requests_waiting",
            "Requests waiting for admission",
            waiting.clone(),
        );
        registry.register(
            "stoke:kv_cache_usage_perc",
            "Fraction of the KV cache budget reserved by admitted requests",
            kv_cache_usage.clone(),
        );
        registry.register(
            "stoke:weight_version",
            "Version of the weights in use",
            weight_version.clone(),
        );
        registry.register(
            "stoke:time_to_first_token_seconds",
            "Time from a request's arrival to its first token",
            time_to_first_token.clone(),
        );
        registry.register(
            "stoke:inter_token_latency_seconds",
            "Time between two tokens of one sample",
            inter_token_latency.clone(),
        );
        registry.register(
            "stoke:e2e_request_latency_seconds",
            "Time from a request's arrival to its last token",
            e2e_latency.clone(),
        );
        registry.register(
            "stoke:batch_size",
            "Sequences per decode step",
            batch_size.clone(),
        );
        registry.register(
            "stoke:prefill_tokens",
            "Prompt tokens run through prefill",
            prefill_tokens.clone(),
        );
        Metrics {
            registry,
            requests,
            prompt_tokens,
            generation_tokens,
            running,
            waiting,
            kv_cache_usage,
            weight_version,
            time_to_first_token,
            inter_token_latency,
            e2e_latency,
            batch_size,
            prefill_tokens,
        }
    }

    /// Counts a finished request of `endpoint` that ended with `reason`.
    pub fn count_request(&self, endpoint: &str, reason: &str) {
        self.requests
            .get_or_create(&vec![
                ("endpoint".to_string(), endpoint.to_string()),
                ("finished_reason".to_string(), reason.to_string()),
            ])
            .inc();
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if encode(&mut text, &self.registry).is_err() {
            text.clear();
        }
        text
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
