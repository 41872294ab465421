//! Reference log-probs from a `stoke serve` process's prompt log-probs equal the in-process
//! inference module's (temperature 1), group by group, empty completions included; a group
//! sampled at another temperature is refused, not scored differently; a reset is refused.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;
use stoke_model::Transformer;
use stoke_pipeline::inference::InferenceModule;
use stoke_pipeline::remote::{
    Engine, PoolSettings, RemoteReference, RemoteReferenceSettings, Routing,
};
use stoke_pipeline::service::ReferenceScoring;
use stoke_pipeline::{
    GenerationPermit, GroupTicket, PolicyVersion, RolloutGroup, Sample, ScoredGroup, Task,
};
use stoke_reward::Reference;
use stoke_rollout::FinishReason;
use stoke_serve::{RunningServer, ServeConfig};
use stoke_tokenizer::hf::Tokenizer;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn ids(seed: u64, len: usize, vocab: usize) -> Vec<u32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % vocab as u64) as u32
        })
        .collect()
}

fn group(group_id: u64, prompt_len: usize, lens: &[usize], vocab: usize, t: f32) -> ScoredGroup {
    let task = Task {
        id: format!("task-{group_id}"),
        prompt: String::new(),
        prompt_ids: ids(group_id * 100, prompt_len, vocab),
        reference: Reference::default(),
        reward: 0,
        data: Default::default(),
    };
    let samples = lens
        .iter()
        .enumerate()
        .map(|(i, &len)| Sample {
            completion_ids: ids(group_id * 100 + i as u64 + 1, len, vocab),
            rollout_logprobs: vec![-1.0; len],
            token_versions: vec![PolicyVersion(0); len],
            loss_mask: None,
            episode: None,
            text: String::new(),
            finish: FinishReason::Length,
        })
        .collect();
    ScoredGroup::new(
        RolloutGroup {
            ticket: GroupTicket {
                group_id,
                task: Arc::new(task),
                permit: GenerationPermit {
                    policy_version: PolicyVersion(0),
                    update_slot: 0,
                    permit_index: group_id,
                },
                temperature: t,
            },
            samples,
            generate_seconds: 0.0,
        },
        vec![],
        0.0,
    )
}

#[test]
fn server_prompt_logprobs_are_the_in_process_reference_logprobs() {
    let model = Transformer::load(&fixture(), &Device::Cpu).unwrap();
    let vocab = model.config().vocab_size;
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    let mut config = ServeConfig::new(fixture());
    config.port = 0;
    config.kv_cache_bytes = 64 << 20;
    let server = RunningServer::start(config).unwrap();
    let settings = RemoteReferenceSettings {
        pool: PoolSettings {
            servers: vec![server.url()],
            routing: Routing::LeastLoaded,
            max_in_flight: 2,
            timeout: Duration::from_secs(60),
            revive_after: Duration::from_secs(3600),
            startup_wait: Duration::ZERO,
        },
        engine: Engine::Stoke,
        model: None,
    };
    let mut remote = RemoteReference::connect(&settings, &tokenizer, vocab).unwrap();
    let local = InferenceModule::new(Some(model.snapshot().unwrap()), 4096);
    let make = || {
        vec![
            group(1, 7, &[5, 12, 1], vocab, 1.0),
            group(2, 3, &[9, 0], vocab, 1.0),
            group(3, 20, &[30], vocab, 1.0),
        ]
    };
    let (mut here, mut there) = (make(), make());
    local.add_reference_logprobs(&mut here).unwrap();
    remote.add_reference_logprobs(&mut there).unwrap();
    let mut worst = 0.0f32;
    for (a, b) in here.iter().zip(&there) {
        let (a, b) = (
            a.ref_logprobs.as_ref().unwrap(),
            b.ref_logprobs.as_ref().unwrap(),
        );
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len());
            for (p, q) in x.iter().zip(y) {
                worst = worst.max((p - q).abs());
            }
        }
    }
    eprintln!("largest difference between server and in-process reference log-probs: {worst:e}");
    assert!(worst <= 1e-4, "largest difference {worst}");
    assert_eq!(
        there[1].ref_logprobs.as_ref().unwrap()[1],
        Vec::<f32>::new()
    );

    let mut hot = vec![group(4, 5, &[3], vocab, 0.7)];
    let error = remote
        .add_reference_logprobs(&mut hot)
        .unwrap_err()
        .to_string();
    assert!(error.contains("grpo.temperature"), "{error}");
    assert!(hot[0].ref_logprobs.is_none());
    assert!(remote.reset_reference(&model).is_err());
    server.stop();
}
