//! The rollout module on the tiny qwen2 fixture (model + tokenizer): output shapes and order,
//! batching that does not change samples, waiting for the tickets' weight version, rejected
//! prompts, a closed store, and the two weight-sync modes while weights are being published.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use candle_core::Device;
use stoke_model::Transformer;
use stoke_pipeline::rollout::{RolloutModule, RolloutSettings};
use stoke_pipeline::weights::WeightStore;
use stoke_pipeline::{
    GenerationPermit, GroupTicket, PipelineError, PolicyVersion, RolloutGroup, Task, WeightSync,
};
use stoke_reward::Reference;
use stoke_rollout::{Detokenizer, Engine, FinishReason, GenerationRequest, SamplingParams};
use stoke_tokenizer::hf::Tokenizer;

const EOS: u32 = 294;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn model() -> Transformer {
    Transformer::load(&fixture_dir(), &Device::Cpu).expect("fixture model loads")
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads"))
}

fn settings(weight_sync: WeightSync) -> RolloutSettings {
    RolloutSettings {
        group_size: 3,
        max_new_tokens: 12,
        top_p: 0.95,
        top_k: None,
        seed: 17,
        stop_token_ids: vec![EOS],
        weight_sync,
        fixed_lag: false,
    }
}

fn module(store: &Arc<WeightStore>, settings: RolloutSettings) -> RolloutModule {
    RolloutModule::new(Arc::clone(store), tokenizer(), settings).expect("module")
}

const QUESTIONS: [&str; 4] = ["What is 2+3?", "Hello there", "abc", "Count: one two"];

fn ticket(group_id: u64, temperature: f32, version: u64) -> GroupTicket {
    let tokenizer = tokenizer();
    let prompt = QUESTIONS[group_id as usize % QUESTIONS.len()];
    let mut prompt_ids = vec![292];
    prompt_ids.extend(tokenizer.encode(prompt, false).expect("encodes"));
    GroupTicket {
        group_id,
        task: Arc::new(Task {
            id: format!("task-{group_id}"),
            prompt: prompt.to_string(),
            prompt_ids,
            reference: Reference::default(),
            reward: 0,
            data: Default::default(),
        }),
        permit: GenerationPermit {
            policy_version: PolicyVersion(version),
            update_slot: 0,
            permit_index: group_id,
        },
        temperature,
    }
}

/// Adds `delta` to every parameter in place, as an optimizer step changes the trainer's model.
fn step_in_place(model: &Transformer, delta: f64) {
    for (_, var) in model.parameters() {
        let shifted = (var.as_tensor() + delta).expect("add");
        var.set(&shifted).expect("set");
    }
}

fn ids(groups: &[RolloutGroup]) -> Vec<Vec<Vec<u32>>> {
    groups
        .iter()
        .map(|g| g.samples.iter().map(|s| s.completion_ids.clone()).collect())
        .collect()
}

#[test]
fn one_group_per_ticket_in_ticket_order_with_consistent_samples() {
    let store = Arc::new(WeightStore::new(&model()).unwrap());
    let rollout = module(&store, settings(WeightSync::BetweenBatches));
    let tickets = vec![
        ticket(5, 1.0, 0),
        ticket(3, 1.0, 0),
        ticket(4, 1.0, 0),
        ticket(9, 0.7, 0),
    ];
    let groups = rollout.generate(tickets.clone()).unwrap();
    assert_eq!(groups.len(), 4);
    let tokenizer = tokenizer();
    for (group, ticket) in groups.iter().zip(&tickets) {
        assert_eq!(group.ticket.group_id, ticket.group_id);
        assert_eq!(group.samples.len(), 3);
        assert!(group.generate_seconds > 0.0);
        for sample in &group.samples {
            let len = sample.completion_ids.len();
            assert!((1..=12).contains(&len));
            assert_eq!(sample.rollout_logprobs.len(), len);
            assert_eq!(sample.token_versions, vec![PolicyVersion(0); len]);
            let text_ids = match sample.finish {
                FinishReason::Eos { .. } => &sample.completion_ids[..len - 1],
                _ => &sample.completion_ids[..],
            };
            let text = Detokenizer::decode(&*tokenizer, text_ids).unwrap();
            assert_eq!(sample.text, text);
        }
    }
    // Temperature 1.0 holds ids 3, 4, 5 (one run, one call); 0.7 holds id 9 (another call).
    let stats = rollout.stats();
    assert_eq!(stats.engine_calls, 2);
    assert_eq!((stats.groups, stats.samples), (4, 12));
    assert_eq!(
        stats.generated_tokens,
        groups
            .iter()
            .flat_map(|g| &g.samples)
            .map(|s| s.completion_ids.len() as u64)
            .sum::<u64>()
    );
}

#[test]
fn batching_tickets_together_gives_the_same_samples_as_one_at_a_time() {
    let store = Arc::new(WeightStore::new(&model()).unwrap());
    let rollout = module(&store, settings(WeightSync::BetweenBatches));
    let tickets: Vec<GroupTicket> = (10..14).map(|id| ticket(id, 1.0, 0)).collect();
    let together = rollout.generate(tickets.clone()).unwrap();
    let alone: Vec<RolloutGroup> = tickets
        .iter()
        .map(|t| rollout.generate(vec![t.clone()]).unwrap().remove(0))
        .collect();
    assert_eq!(ids(&together), ids(&alone));
    for (a, b) in together.iter().zip(&alone) {
        for (x, y) in a.samples.iter().zip(&b.samples) {
            for (p, q) in x.rollout_logprobs.iter().zip(&y.rollout_logprobs) {
                assert!((p - q).abs() < 1e-5, "{p} vs {q}");
            }
        }
    }
    // Reversed order: the same samples per ticket, returned in the new ticket order.
    let mut reversed = tickets.clone();
    reversed.reverse();
    let mut again = rollout.generate(reversed).unwrap();
    again.reverse();
    assert_eq!(ids(&again), ids(&together));
    // Another seed changes them (the comparison above could not pass by accident).
    let other_seed = RolloutSettings {
        seed: 18,
        ..settings(WeightSync::BetweenBatches)
    };
    let other = module(&store, other_seed).generate(tickets).unwrap();
    assert_ne!(ids(&other), ids(&together));
}

#[test]
fn generation_waits_for_the_tickets_version_and_uses_it() {
    let trainer = model();
    let store = Arc::new(WeightStore::new(&trainer).unwrap());
    let rollout = Arc::new(module(&store, settings(WeightSync::BetweenBatches)));
    let waiting = {
        let rollout = Arc::clone(&rollout);
        std::thread::spawn(move || {
            rollout
                .generate(vec![ticket(2, 1.0, 1), ticket(3, 1.0, 0)])
                .map_err(|error| error.to_string())
        })
    };
    while store.waiting() == 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    step_in_place(&trainer, 0.05);
    store.publish(&trainer, PolicyVersion(1)).unwrap();
    let groups = waiting.join().unwrap().unwrap();
    assert!(
        groups
            .iter()
            .flat_map(|g| &g.samples)
            .all(|s| s.token_versions.iter().all(|&v| v == PolicyVersion(1)))
    );
    // The samples are those of the published weights (engine prompt numbers = group ids).
    let request = GenerationRequest {
        prompts: vec![
            groups[0].ticket.task.prompt_ids.clone(),
            groups[1].ticket.task.prompt_ids.clone(),
        ],
        params: SamplingParams {
            max_new_tokens: 12,
            top_p: 0.95,
            seed: 17,
            n: 3,
            stop_token_ids: vec![EOS],
            ..SamplingParams::default()
        },
        first_prompt_number: 2,
        streams: None,
    };
    let expected = Engine::new(&trainer).generate(&request, None).unwrap();
    let expected_ids: Vec<Vec<Vec<u32>>> = expected
        .completions
        .iter()
        .map(|c| c.iter().map(|c| c.token_ids.clone()).collect())
        .collect();
    assert_eq!(ids(&groups), expected_ids);
    assert!(rollout.stats().wait_seconds > 0.0);
}

#[test]
fn a_closed_store_stops_a_waiting_generation() {
    let store = Arc::new(WeightStore::new(&model()).unwrap());
    let rollout = module(&store, settings(WeightSync::InFlight));
    store.close();
    let error = rollout.generate(vec![ticket(0, 1.0, 3)]).unwrap_err();
    assert!(
        matches!(
            error,
            PipelineError::ModuleStopped {
                module: "rollout",
                ..
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("version 3"), "{error}");
}

#[test]
fn a_prompt_the_model_cannot_take_gives_an_empty_group_and_the_rest_proceed() {
    let store = Arc::new(WeightStore::new(&model()).unwrap());
    let rollout = module(&store, settings(WeightSync::BetweenBatches));
    let mut bad = ticket(1, 1.0, 0);
    let mut task = (*bad.task).clone();
    task.prompt_ids = vec![292, 5000];
    bad.task = Arc::new(task);
    let groups = rollout
        .generate(vec![ticket(0, 1.0, 0), bad, ticket(2, 1.0, 0)])
        .unwrap();
    let sizes: Vec<usize> = groups.iter().map(|g| g.samples.len()).collect();
    assert_eq!(sizes, vec![3, 0, 3]);
    let stats = rollout.stats();
    assert_eq!(stats.rejected_tickets, 1);
    let reason = stats.last_rejection.unwrap();
    assert!(
        reason.contains("task-1") && reason.contains("5000"),
        "{reason}"
    );
    // Ids 0 and 2 are no longer consecutive once 1 is out: two calls.
    assert_eq!(stats.engine_calls, 2);
}

#[test]
fn bad_settings_are_errors_naming_the_field() {
    let store = Arc::new(WeightStore::new(&model()).unwrap());
    let cases = [
        (
            RolloutSettings {
                group_size: 0,
                ..settings(WeightSync::InFlight)
            },
            "group_size",
        ),
        (
            RolloutSettings {
                top_p: 0.0,
                ..settings(WeightSync::InFlight)
            },
            "top_p",
        ),
        (
            RolloutSettings {
                stop_token_ids: vec![300],
                ..settings(WeightSync::InFlight)
            },
            "stop_token_ids",
        ),
    ];
    for (settings, field) in cases {
        let error = RolloutModule::new(Arc::clone(&store), tokenizer(), settings).unwrap_err();
        assert!(error.to_string().contains(field), "{error}");
    }
}

/// Generates while another thread publishes new weights as fast as it can. Returns the groups.
fn generate_while_publishing(weight_sync: WeightSync) -> Vec<RolloutGroup> {
    let trainer = model();
    let store = Arc::new(WeightStore::new(&trainer).unwrap());
    let rollout = module(
        &store,
        RolloutSettings {
            group_size: 2,
            max_new_tokens: 100,
            // Never stop early: every sample decodes all 100 steps.
            stop_token_ids: Vec::new(),
            ..settings(weight_sync)
        },
    );
    let done = Arc::new(AtomicBool::new(false));
    let publisher = {
        let (store, done) = (Arc::clone(&store), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut version = 0;
            while !done.load(Ordering::SeqCst) {
                version += 1;
                step_in_place(&trainer, 0.001);
                store.publish(&trainer, PolicyVersion(version)).unwrap();
                std::thread::yield_now();
            }
        })
    };
    // Start decoding only once weights are moving.
    while store.version() == PolicyVersion(0) {
        std::thread::yield_now();
    }
    let groups = rollout
        .generate(vec![ticket(0, 1.0, 1), ticket(1, 1.0, 1)])
        .unwrap();
    done.store(true, Ordering::SeqCst);
    publisher.join().unwrap();
    groups
}

#[test]
fn in_flight_sync_switches_weights_between_tokens() {
    // Scheduling decides when publications land, so try a few times until a switch happens
    // inside a generation (100 decode steps against a publisher that never rests).
    let mut switched = false;
    for _ in 0..5 {
        let groups = generate_while_publishing(WeightSync::InFlight);
        let samples: Vec<_> = groups.iter().flat_map(|g| &g.samples).collect();
        for sample in &samples {
            assert_eq!(sample.token_versions.len(), 100);
            assert!(sample.token_versions[0] >= PolicyVersion(1));
            assert!(sample.token_versions.windows(2).all(|w| w[0] <= w[1]));
        }
        // All rows of one engine call decode each step with the same weights.
        for t in 0..100 {
            assert!(
                samples
                    .iter()
                    .all(|s| s.token_versions[t] == samples[0].token_versions[t])
            );
        }
        if samples[0].token_versions[0] != samples[0].token_versions[99] {
            switched = true;
            break;
        }
    }
    assert!(
        switched,
        "no in-flight switch in 5 generations of 100 steps"
    );
}

#[test]
fn between_batches_sync_keeps_one_version_while_weights_are_published() {
    let groups = generate_while_publishing(WeightSync::BetweenBatches);
    let first = groups[0].samples[0].token_versions[0];
    assert!(first >= PolicyVersion(1));
    assert!(
        groups
            .iter()
            .flat_map(|g| &g.samples)
            .all(|s| s.token_versions.iter().all(|&v| v == first))
    );
}
