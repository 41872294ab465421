//! bf16 weights for inference: `pack_weights` / `unpack_weights` on a model, and
//! `inference_copy`, a generation-only copy that holds its linear layers only packed.
//!
//! What it is not: the bf16 kernels (`stoke_ops::bf16`, `stoke_ops::linear`) or the huge-page
//! allocator (`stoke_ops::pages`); `linear::pack` and `linear::packing_region` do the packing.
//!
//! Invariants: a model's packed matrices share one region of 2 MiB huge pages sized for exactly
//! them (an inference copy gets its own); the packed copies are not updated by later changes of
//! the variables; only f32 CPU weights are packed; an inference copy refuses everything but bf16
//! forward passes and fused decode steps (`Transformer::refuse_inference_only`).

use super::layer::DecoderLayer;
use super::linear::{pack, packing_region};
use super::model::Transformer;
use crate::error::ModelError;
use crate::hf_names::{LM_HEAD, parameter_shapes};
use candle_core::{DType, Tensor, Var};
use std::collections::BTreeMap;
use stoke_ops::Precision;

impl Transformer {
    /// A copy for generation in bf16 (the GRPO rollout's weights): every linear weight and the LM
    /// head only as packed bf16 (`pack_weights`), the embedding, norms and biases as new f32
    /// copies, and no f32 copy of the linear layers. At Llama-3.2-1B's shapes 3.6 GB, where a
    /// `snapshot` plus `pack_weights` holds 7.4 GB.
    ///
    /// Invariant: the copy runs bf16 forward passes (prefill) and fused decode steps only. Its
    /// linear layers read zero-size placeholders where the f32 weights were, so everything else
    /// is refused by name: a forward pass in f32 precision, `snapshot`, `to_dtype`, `save`.
    /// `parameters()` lists the tensors it holds. A model with LoRA adapters (whose base a
    /// snapshot already shares) or off the CPU gets `snapshot` + `pack_weights` instead.
    pub fn inference_copy(&self) -> Result<Transformer, ModelError> {
        if self.lora.is_some()
            || !self.device().is_cpu()
            || self.dtype() != DType::F32
            || !self.config.is_plain()
        {
            let mut copy = self.snapshot()?;
            copy.pack_weights()?;
            return Ok(copy);
        }
        let is_linear = |name: &str| name.ends_with("_proj.weight") || name == LM_HEAD;
        let mut parameters = BTreeMap::new();
        let mut placeholders = BTreeMap::new();
        for (name, shape) in parameter_shapes(&self.config) {
            if is_linear(&name) {
                let zero = Tensor::zeros((), DType::F32, self.device())?;
                placeholders.insert(name, zero.broadcast_as(shape)?);
            } else {
                let var = Var::from_tensor(&self.parameters[&name].as_tensor().detach())?;
                parameters.insert(name, var);
            }
        }
        let mut copy = Transformer::assemble(self.config.clone(), parameters, &placeholders);
        let sources = || self.layers.iter().flat_map(DecoderLayer::linears);
        let region = packing_region(
            sources()
                .map(|source| &source.weight)
                .chain([self.lm_head_weight()]),
        )?;
        for (linear, source) in copy.linears_mut().zip(sources()) {
            linear.packed = Some(pack(&source.weight, region.as_ref())?);
        }
        copy.packed_head = Some(pack(self.lm_head_weight(), region.as_ref())?);
        copy.precision = Precision::Bf16;
        copy.inference_only = true;
        Ok(copy)
    }

    /// For inference: switches to `Precision::Bf16` and packs every linear weight and the LM head
    /// into bf16 once (about half the f32 weights' bytes, held next to them), so decoding reads
    /// each weight as bf16 once per step instead of packing it per call. The layout is
    /// `PackedA`'s row-major bf16 pairs: the fused decode step (`decode_step`) streams those rows
    /// directly, and a prefill uses them as the GEMM's left operand (`bf16::matmul_weight_rows`).
    ///
    /// The packed matrices share one region of 2 MiB huge pages (`stoke_ops::pages`): decoding
    /// sweeps them all every step, and on 4 KiB pages that sweep ran about a quarter slower.
    ///
    /// Invariant: the packed copies are not updated by later changes of the `Var`s (an optimizer
    /// step); call `unpack_weights` (or `pack_weights` again) after changing weights. A backward
    /// pass through packed weights is an error, never a silent wrong gradient. `snapshot` and
    /// `to_dtype` copies start unpacked. Only f32 CPU weights are packed.
    pub fn pack_weights(&mut self) -> Result<(), ModelError> {
        self.precision = Precision::Bf16;
        if self.inference_only {
            // Already packed, and its f32 linear weights are placeholders.
            return Ok(());
        }
        if self.device().is_cpu() && self.dtype() == DType::F32 {
            // The old copies go first: a region lives until its last matrix is dropped, so
            // replacing them one by one would hold both regions at once.
            self.unpack_weights();
            let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens).clone();
            let weights: Vec<Tensor> = self.linears_mut().map(|l| l.weight.clone()).collect();
            let region = packing_region(weights.iter().chain([&head]))?;
            for linear in self.linears_mut() {
                linear.packed = Some(pack(&linear.weight, region.as_ref())?);
            }
            self.packed_head = Some(pack(&head, region.as_ref())?);
        }
        Ok(())
    }

    /// Drops the packed bf16 copies (`pack_weights`); the precision stays as it is. Does nothing
    /// to an `inference_copy`.
    pub fn unpack_weights(&mut self) {
        if self.inference_only {
            // The packed weights are an inference copy's only linear weights.
            return;
        }
        for linear in self.linears_mut() {
            linear.packed = None;
        }
        self.packed_head = None;
    }

    /// Bytes held by packed bf16 weights (0 unless `pack_weights` ran).
    pub fn packed_weight_bytes(&self) -> usize {
        let head = self.packed_head.as_ref().map_or(0, |p| p.bytes());
        self.layers
            .iter()
            .chain(self.mtp.iter().map(|m| &m.block))
            .flat_map(DecoderLayer::linears)
            .chain(self.mtp.iter().map(|m| &m.eh_proj))
            .filter_map(|linear| linear.packed.as_ref())
            .map(|p| p.bytes())
            .sum::<usize>()
            + head
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;
    use candle_core::Device;
    use std::path::Path;
    use std::sync::Arc;
    use stoke_ops::bf16::PackedA;
    use stoke_ops::pages::PageRegion;

    fn tiny_model() -> Transformer {
        let json = r#"{
            "architectures": ["LlamaForCausalLM"], "vocab_size": 37, "hidden_size": 16,
            "intermediate_size": 24, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 1, "rms_norm_eps": 1e-5, "rope_theta": 1000.0,
            "tie_word_embeddings": false
        }"#;
        let config = ModelConfig::from_json_str(json, Path::new("<test>")).expect("config");
        Transformer::init(config, &Device::Cpu, 3).expect("init")
    }

    /// Every packed weight of a model sits in one huge-page region (decoding streams them all
    /// each step), which holds exactly them; an inference copy gets its own. Linux/glibc only.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn packed_weights_share_one_region_sized_for_them() {
        let mut model = tiny_model();
        model.pack_weights().expect("pack");
        let copy = model.inference_copy().expect("copy");
        for m in [&model, &copy] {
            let packed: Vec<&Arc<PackedA>> = m
                .layers
                .iter()
                .flat_map(DecoderLayer::linears)
                .filter_map(|l| l.packed.as_ref())
                .chain(m.packed_head.as_ref())
                .collect();
            assert_eq!(packed.len(), 7 + 1);
            let region = packed[0].region().expect("in a region");
            assert!(
                packed
                    .iter()
                    .all(|p| p.region().is_some_and(|r| Arc::ptr_eq(r, region)))
            );
            let words: usize = packed
                .iter()
                .map(|p| PageRegion::words_for(p.bytes() / 4))
                .sum();
            assert_eq!(region.used(), words, "the region holds the packed weights");
        }
        let region = |m: &Transformer| {
            Arc::clone(
                m.packed_head
                    .as_ref()
                    .and_then(|p| p.region())
                    .expect("region"),
            )
        };
        assert!(!Arc::ptr_eq(&region(&model), &region(&copy)));
    }
}
