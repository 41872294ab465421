//! Fused decoding (`stoke_ops::decode`) with a [`Transformer`]: the model's tensors handed to the
//! straight-line decode step, and the step's KV cache built from a prefill's graph cache.
//!
//! What it is: `Transformer::decode_step`, one token for every sequence of a `DecodeCache`,
//! reading f32 weights in place from the model's tensors (precision f32) or the bf16 copies
//! `pack_weights` made (precision bf16). Same results as `forward` with a `KvCache` up to f32
//! summation order (tests: `crates/model/tests/decode.rs`).
//!
//! What it is not: for models with unmerged LoRA adapters (fold them with `merged` first), on
//! other devices, or in bf16 precision without packed weights; `supports_fused_decode` says
//! which, and callers keep the graph path for the rest.

use candle_core::{CpuStorage, DType, IndexOp, Storage, Tensor};
use stoke_ops::Precision;
use stoke_ops::decode::{DecodeCache, DecodeShape, LayerRef, LinearRef, ModelRef};
use stoke_ops::matvec::Weights;

use crate::error::ModelError;
use crate::kv_cache::KvCache;
use crate::transformer::Transformer;
use crate::transformer::linear::Linear;

fn f32_slice<'g>(
    guard: &'g (candle_core::StorageRef<'_>, &candle_core::Layout),
    (what, layer): &(&str, Option<usize>),
) -> Result<&'g [f32], ModelError> {
    let (storage, layout) = guard;
    match (&**storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(values)), Some((start, end))) => Ok(&values[start..end]),
        _ => Err(ModelError::InvalidArgument(format!(
            "fused decoding reads contiguous f32 CPU tensors; {what}{} is not one",
            layer.map_or(String::new(), |l| format!(" of layer {l}"))
        ))),
    }
}

/// A linear layer's weight (its packed bf16 copy in bf16, else the next f32 slice) and bias.
fn linear_ref<'a>(
    linear: &'a Linear,
    bf16: bool,
    take: &mut impl FnMut() -> &'a [f32],
) -> LinearRef<'a> {
    let (rows, cols) = linear.weight.dims2().unwrap_or((0, 0));
    let weight = match &linear.packed {
        Some(packed) if bf16 => packed.weights(),
        _ => Weights::F32 {
            data: take(),
            rows,
            cols,
        },
    };
    let bias = linear.bias.as_ref().map(|_| take());
    LinearRef { weight, bias }
}

impl Transformer {
    /// Whether `decode_step` runs this model: f32 parameters on the CPU, no LoRA adapters, and
    /// precision f32, or bf16 with packed weights (`pack_weights`).
    pub fn supports_fused_decode(&self) -> bool {
        let packed = self.packed_head.is_some()
            && self
                .layers
                .iter()
                .all(|l| l.linears().iter().all(|x| x.packed.is_some()));
        self.device().is_cpu()
            && self.dtype() == DType::F32
            && self.lora.is_none()
            && self.config().is_plain()
            && match self.precision() {
                Precision::F32 => true,
                Precision::Bf16 => packed,
            }
    }

    fn decode_shape(&self) -> DecodeShape {
        let c = self.config();
        DecodeShape {
            hidden: c.hidden_size,
            q_heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            intermediate: c.intermediate_size,
            vocab: c.vocab_size,
            rms_norm_eps: c.rms_norm_eps,
            inv_freq: self.rotary().inv_freq().to_vec(),
            attention_factor: self.rotary().attention_factor() as f32,
        }
    }

    /// An empty decode cache for `rows` sequences of up to `capacity` slots each.
    pub fn new_decode_cache(&self, rows: usize, capacity: usize) -> DecodeCache {
        let c = self.config();
        DecodeCache::new(
            rows,
            c.num_hidden_layers,
            c.num_key_value_heads,
            c.head_dim,
            capacity,
        )
    }

    /// A decode cache whose row `i` holds row `rows[i]` of a prefill's graph cache (rows may
    /// repeat: n samples sharing a prompt), whose first real slot is `starts[i]` (left padding
    /// before it), with room for `capacity` slots.
    pub fn decode_cache_from(
        &self,
        cache: &KvCache,
        rows: &[usize],
        starts: &[usize],
        capacity: usize,
    ) -> Result<DecodeCache, ModelError> {
        let layers = self.config().num_hidden_layers;
        if cache.num_layers() != layers || rows.len() != starts.len() {
            return Err(ModelError::InvalidArgument(format!(
                "decode_cache_from: a cache of {} layers for a model of {layers}, {} rows and {} starts",
                cache.num_layers(),
                rows.len(),
                starts.len()
            )));
        }
        if cache.is_windowed() || !self.config().is_plain() {
            return Err(ModelError::InvalidArgument(
                "decode_cache_from: the fused decode step runs the plain Llama/Qwen block only \
                 (this model has block variants: see ModelConfig::is_plain)"
                    .into(),
            ));
        }
        let len = cache.len();
        if len > capacity {
            return Err(ModelError::InvalidArgument(format!(
                "decode_cache_from: {len} cached slots exceed the capacity {capacity}"
            )));
        }
        let batch = cache.batch_size().unwrap_or(0);
        let mut out = self.new_decode_cache(rows.len(), capacity);
        for layer in 0..layers {
            let Some((k, v)) = cache.layer(layer) else {
                return Err(ModelError::InvalidArgument(format!(
                    "decode_cache_from: layer {layer} of the cache is empty"
                )));
            };
            let mut per_row: Vec<Option<(Vec<f32>, Vec<f32>)>> = vec![None; batch];
            for (i, (&row, &start)) in rows.iter().zip(starts).enumerate() {
                if row >= batch || start > len {
                    return Err(ModelError::InvalidArgument(format!(
                        "decode_cache_from: row {row} (of {batch}) starting at slot {start} (of {len})"
                    )));
                }
                if per_row[row].is_none() {
                    let keys = k
                        .i(row)?
                        .to_dtype(DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?;
                    let values = v
                        .i(row)?
                        .to_dtype(DType::F32)?
                        .flatten_all()?
                        .to_vec1::<f32>()?;
                    per_row[row] = Some((keys, values));
                }
                if let Some((keys, values)) = &per_row[row] {
                    out.fill(i, layer, keys, values, len, start);
                }
            }
        }
        out.set_len(len);
        Ok(out)
    }

    /// One decode step (see `stoke_ops::decode`): `tokens[r]` at `positions[r]` for each row of
    /// `cache`; returns the logits `[rows, vocab]` row-major. Uses rayon's thread count.
    pub fn decode_step(
        &self,
        cache: &mut DecodeCache,
        tokens: &[u32],
        positions: &[u32],
    ) -> Result<Vec<f32>, ModelError> {
        self.check_positions(positions)?;
        let threads = rayon::current_num_threads();
        self.with_model_ref(|model| {
            stoke_ops::decode::decode_step(model, cache, tokens, positions, threads)
        })
    }

    /// A prompt's next tokens into cache row `row` in one pass (see
    /// `stoke_ops::decode::prefill_step`): the logits of the tokens `logits_for` (indices into
    /// `tokens`), `[len, vocab]` row-major. Same kernels as `decode_step`, so a prefill costs no
    /// weight packing and a prompt's tokens are scored as decoding would score them.
    pub fn prefill_step(
        &self,
        cache: &mut DecodeCache,
        row: usize,
        tokens: &[u32],
        positions: &[u32],
        logits_for: &[usize],
    ) -> Result<Vec<f32>, ModelError> {
        self.check_positions(positions)?;
        let threads = rayon::current_num_threads();
        self.with_model_ref(|model| {
            stoke_ops::decode::prefill_step(
                model, cache, row, tokens, positions, logits_for, threads,
            )
        })
    }

    fn check_positions(&self, positions: &[u32]) -> Result<(), ModelError> {
        let max = self.config().max_position_embeddings;
        if let Some(&p) = positions.iter().find(|&&p| p as usize >= max) {
            return Err(ModelError::InvalidArgument(format!(
                "decode step: position {p} is past max_position_embeddings = {max}"
            )));
        }
        Ok(())
    }

    /// Runs `f` on the model's tensors as the fused step reads them.
    fn with_model_ref<R>(
        &self,
        f: impl FnOnce(&ModelRef) -> Result<R, String>,
    ) -> Result<R, ModelError> {
        if !self.supports_fused_decode() {
            return Err(ModelError::InvalidArgument(
                "fused decoding needs f32 CPU weights without LoRA adapters, and packed weights \
                 in bf16 precision (Transformer::pack_weights)"
                    .into(),
            ));
        }
        let bf16 = self.precision() == Precision::Bf16;
        // Read guards on every f32 tensor the step reads, in one fixed order.
        // (tensor, (what, layer)) in the order the slices are taken below; names are only
        // formatted for an error.
        type Named<'t> = (&'t Tensor, (&'static str, Option<usize>));
        let mut tensors: Vec<Named> = vec![
            (&self.embed_tokens, ("the embedding", None)),
            (&self.norm, ("the final norm", None)),
        ];
        if !bf16 {
            tensors.push((self.lm_head_weight(), ("the LM head", None)));
        }
        let mut standard = Vec::with_capacity(self.layers.len());
        for layer in &self.layers {
            standard.push(layer.self_attn.standard().ok_or_else(|| {
                ModelError::InvalidArgument(
                    "fused decoding runs grouped-query attention only (latent attention runs \
                     the graph)"
                        .into(),
                )
            })?);
        }
        for (l, layer) in self.layers.iter().enumerate() {
            tensors.push((&layer.input_layernorm, ("the input norm", Some(l))));
            tensors.push((
                &layer.post_attention_layernorm,
                ("the post-attention norm", Some(l)),
            ));
            for norm in [&standard[l].q_norm, &standard[l].k_norm]
                .into_iter()
                .flatten()
            {
                tensors.push((norm, ("a q/k norm", Some(l))));
            }
            for linear in layer.linears() {
                if !bf16 {
                    tensors.push((&linear.weight, ("a linear weight", Some(l))));
                }
                if let Some(bias) = &linear.bias {
                    tensors.push((bias, ("a bias", Some(l))));
                }
            }
        }
        let guards: Vec<_> = tensors
            .iter()
            .map(|(t, _)| t.storage_and_layout())
            .collect();
        let slices = guards
            .iter()
            .zip(&tensors)
            .map(|(g, (_, what))| f32_slice(g, what))
            .collect::<Result<Vec<&[f32]>, ModelError>>()?;
        let mut next = slices.into_iter();
        let mut take = || next.next().expect("one slice per listed tensor");
        let shape = self.decode_shape();
        let embed = take();
        let final_norm = take();
        let head = match &self.packed_head {
            Some(packed) if bf16 => packed.weights(),
            _ => {
                let (rows, cols) = (shape.vocab, shape.hidden);
                Weights::F32 {
                    data: take(),
                    rows,
                    cols,
                }
            }
        };
        let mut layers = Vec::with_capacity(self.layers.len());
        for (layer, a) in self.layers.iter().zip(&standard) {
            let input_norm = take();
            let post_attention_norm = take();
            let q_norm = a.q_norm.as_ref().map(|_| take());
            let k_norm = a.k_norm.as_ref().map(|_| take());
            let Some((gate_proj, up_proj, down_proj)) = layer.mlp.dense() else {
                return Err(ModelError::InvalidArgument(
                    "fused decoding runs dense MLPs only (a mixture of experts runs the graph)"
                        .into(),
                ));
            };
            let mut linear = |l| linear_ref(l, bf16, &mut take);
            let (q, k, v, o) = (
                linear(&a.q_proj),
                linear(&a.k_proj),
                linear(&a.v_proj),
                linear(&a.o_proj),
            );
            let (gate, up, down) = (linear(gate_proj), linear(up_proj), linear(down_proj));
            layers.push(LayerRef {
                input_norm,
                post_attention_norm,
                q,
                k,
                v,
                o,
                q_norm,
                k_norm,
                gate,
                up,
                down,
            });
        }
        let model = ModelRef {
            shape: &shape,
            embed,
            layers,
            final_norm,
            head,
        };
        f(&model).map_err(ModelError::InvalidArgument)
    }
}
