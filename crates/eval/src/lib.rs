//! stoke-eval: evaluation tasks and metrics: built-in generated tasks with exact answers,
//! accuracy, pass@k and bits-per-byte over held-out sets, run through the rollout engine and the
//! reward crate's verifiers.
