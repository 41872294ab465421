//! `classify` on real Hugging Face parameter names.

use stoke_optim::{ParamKind, classify};

#[test]
fn embedding_table_is_embedding() {
    assert_eq!(
        classify("model.embed_tokens.weight", &[4096, 256]),
        ParamKind::Embedding
    );
}

#[test]
fn lm_head_is_output_head() {
    assert_eq!(
        classify("lm_head.weight", &[4096, 256]),
        ParamKind::OutputHead
    );
}

#[test]
fn final_norm_is_norm_or_bias() {
    assert_eq!(classify("model.norm.weight", &[256]), ParamKind::NormOrBias);
}

#[test]
fn layer_norms_are_norm_or_bias() {
    assert_eq!(
        classify("model.layers.3.input_layernorm.weight", &[256]),
        ParamKind::NormOrBias
    );
    assert_eq!(
        classify("model.layers.0.self_attn.q_norm.weight", &[64]),
        ParamKind::NormOrBias
    );
}

#[test]
fn attention_projection_is_matrix() {
    assert_eq!(
        classify("model.layers.0.self_attn.q_proj.weight", &[256, 256]),
        ParamKind::Matrix
    );
    assert_eq!(
        classify("model.layers.1.mlp.down_proj.weight", &[256, 688]),
        ParamKind::Matrix
    );
}

#[test]
fn projection_bias_is_norm_or_bias() {
    assert_eq!(classify("q_proj.bias", &[256]), ParamKind::NormOrBias);
    assert_eq!(
        classify("model.layers.0.self_attn.q_proj.bias", &[256]),
        ParamKind::NormOrBias
    );
}

#[test]
fn weight_decay_only_on_matrices_and_output_head() {
    assert!(ParamKind::Matrix.takes_weight_decay());
    assert!(ParamKind::OutputHead.takes_weight_decay());
    assert!(!ParamKind::Embedding.takes_weight_decay());
    assert!(!ParamKind::NormOrBias.takes_weight_decay());
}
