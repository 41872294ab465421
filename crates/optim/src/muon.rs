//! Muon (Keller Jordan, 2024) for hidden weight matrices: momentum, Nesterov, Newton-Schulz
//! orthogonalisation, an update scaled to AdamW's RMS, decoupled weight decay.
//!
//! What it is: `MuonConfig`, the per-parameter momentum buffer, `newton_schulz5`, and the
//! update, following `torch.optim.Muon` (torch 2.15, `_single_tensor_muon`) step by step with
//! `adjust_lr_fn="match_rms_adamw"` (Moonshot's "Muon is Scalable for LLM Training"):
//!
//! ```text
//! B <- B + (1 - mu) * (g - B)                      (torch: buf.lerp_(g, 1 - momentum))
//! U <- g + mu * (B - g) if nesterov, else B         (torch: g.lerp(buf, momentum))
//! O <- NS5(U)                                       (Frobenius-normalised, quintic, 5 iterations)
//! p <- p * (1 - lr * wd) - lr * 0.2 * sqrt(max(rows, cols)) * O
//! ```
//! Differences from torch, on purpose: torch runs Newton-Schulz in bfloat16 (a GPU speed
//! choice); stoke keeps it in f32 (the CPU has no fast bf16 matmul, and f32 is the more exact
//! of the two). The fixture script checks that both agree within bf16 tolerance.
//! What it is not: the optimizer for embeddings, the output head, norms or biases; those get
//! AdamW (`optimizer.rs` routes by `ParamKind`).

use candle_core::Tensor;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::adamw::{AdamWConfig, check_range, invalid};
use crate::clip::sum_of_squares;
use crate::error::OptimError;
use crate::inplace::{CHUNK, with_f32_slice};

/// The quintic Newton-Schulz coefficients (a, b, c), chosen (Keller Jordan) to maximise the
/// slope at zero; singular values land near 1 (roughly 0.7..1.2), not exactly on it.
pub const NS_COEFFICIENTS: (f64, f64, f64) = (3.4445, -4.7750, 2.0315);
/// Floor for the Frobenius norm before dividing by it (torch's `EPS`): a zero update stays zero.
const NS_EPS: f64 = 1e-7;
/// Moonshot's RMS-matching factor: an orthogonal `[A, B]` update has RMS `1/sqrt(max(A, B))`;
/// AdamW's updates have RMS about 0.2.
const MATCH_RMS_ADAMW: f64 = 0.2;

/// Muon hyperparameters, with the AdamW settings for the parameters Muon does not take.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MuonConfig {
    /// Peak learning rate for hidden matrices, before the RMS-matching factor
    /// `0.2 * sqrt(max(rows, cols))`; with that factor AdamW's lr carries over.
    pub lr: f64,
    pub momentum: f64,
    pub nesterov: bool,
    pub ns_steps: usize,
    /// Decoupled weight decay for hidden matrices (`p *= 1 - lr * weight_decay`).
    pub weight_decay: f64,
    /// AdamW settings for embeddings, output head, norms and biases
    pub adamw: AdamWConfig,
    /// MuonClip's threshold `T` on the attention logits (Kimi K2 used 100): after each step the
    /// trainer scales the query and key projections of every head whose largest logit passed
    /// it (`stoke_model::qk_clip`). `None`: plain Muon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_clip: Option<f64>,
}

impl Default for MuonConfig {
    /// torch/Keller defaults (momentum 0.95, Nesterov, 5 steps) with Moonshot's finding that
    /// RMS-matched Muon reuses AdamW's learning rate and weight decay.
    fn default() -> Self {
        let adamw = AdamWConfig::default();
        MuonConfig {
            lr: adamw.lr,
            momentum: 0.95,
            nesterov: true,
            ns_steps: 5,
            weight_decay: adamw.weight_decay,
            adamw,
            qk_clip: None,
        }
    }
}

impl MuonConfig {
    /// Checks every field's range, including the embedded AdamW record.
    pub fn validate(&self) -> Result<(), OptimError> {
        check_range(
            "muon",
            "lr",
            self.lr,
            0.0,
            f64::INFINITY,
            "a finite number >= 0",
        )?;
        check_range("muon", "momentum", self.momentum, 0.0, 1.0, "in [0, 1)")?;
        check_range(
            "muon",
            "weight_decay",
            self.weight_decay,
            0.0,
            f64::INFINITY,
            ">= 0",
        )?;
        if !(1..100).contains(&self.ns_steps) {
            return Err(invalid(
                "muon",
                "ns_steps",
                self.ns_steps as f64,
                "in 1..=99",
            ));
        }
        if let Some(t) = self.qk_clip {
            check_range(
                "muon",
                "qk_clip",
                t,
                f64::MIN_POSITIVE,
                f64::INFINITY,
                "> 0",
            )?;
        }
        self.adamw.validate("muon.adamw")
    }
}

/// One parameter's Muon state: the momentum buffer (f32, zero-initialised).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MuonState {
    pub momentum_buffer: Vec<f32>,
}

impl MuonState {
    pub fn zeros(len: usize) -> Self {
        MuonState {
            momentum_buffer: vec![0.0; len],
        }
    }
}

/// Updates the momentum buffer from `grad` and returns the (Nesterov) update to orthogonalise.
pub(crate) fn momentum_update(
    grad: &[f32],
    state: &mut MuonState,
    momentum: f64,
    nesterov: bool,
) -> Vec<f32> {
    let one_minus_mu = (1.0 - momentum) as f32;
    let mu = momentum as f32;
    let mut update = vec![0.0f32; grad.len()];
    update
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(state.momentum_buffer.par_chunks_mut(CHUNK))
        .for_each(|((u, g), b)| {
            for ((u, &g), b) in u.iter_mut().zip(g).zip(b.iter_mut()) {
                *b += one_minus_mu * (g - *b);
                *u = if nesterov { lerp(g, *b, mu) } else { *b };
            }
        });
    update
}

/// `torch.lerp(start, end, weight)` with torch's two-branch formula (exact at both ends).
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

/// The lr multiplier of `adjust_lr_fn="match_rms_adamw"`: `0.2 * sqrt(max(rows, cols))`.
pub(crate) fn match_rms_factor(rows: usize, cols: usize) -> f64 {
    MATCH_RMS_ADAMW * (rows.max(cols) as f64).sqrt()
}

/// Newton-Schulz orthogonalisation of a 2-D tensor with the quintic coefficients: divides by the
/// Frobenius norm (so the spectral norm is <= 1), works on the wide orientation (transposes a
/// tall matrix, so the Gram matrix is the small one), iterates
/// `A = X X^T; X = (a I + b A + c A A) X` `steps` times (torch writes the same polynomial as
/// `B = b A + c A A; X = a X + B X`). Returns f32 of `g`'s shape.
pub fn newton_schulz5(g: &Tensor, steps: usize) -> Result<Tensor, OptimError> {
    let dims = g.dims();
    if dims.len() != 2 {
        return Err(OptimError::InvalidParam {
            name: "newton_schulz5 input".into(),
            reason: format!("needs a 2-D tensor, got shape {dims:?}"),
        });
    }
    let tall = dims[0] > dims[1];
    let g = g.to_dtype(candle_core::DType::F32)?;
    let x = if tall {
        g.t()?.contiguous()?
    } else {
        g.contiguous()?
    };
    let side = x.dims()[0];
    let sum_sq = with_f32_slice(&x, sum_of_squares)?;
    let mut x = x.affine(1.0 / sum_sq.sqrt().max(NS_EPS), 0.0)?;
    for _ in 0..steps {
        let gram = x.matmul(&x.t()?)?;
        let gram_sq = gram.matmul(&gram)?;
        // The polynomial's m x m matrix in one fused pass: folding `a X` into `P X` keeps every
        // element-wise pass on the small Gram side (candle's separate affine/add passes over the
        // m x n iterate cost as much as the matmuls at these sizes; measured).
        let polynomial = quintic_polynomial(&gram, &gram_sq, side)?;
        x = polynomial.matmul(&x)?;
    }
    let x = if tall { x.t()?.contiguous()? } else { x };
    Ok(x)
}

/// `a I + b A + c A2` for the `side x side` matrices `A` and `A2`.
fn quintic_polynomial(gram: &Tensor, gram_sq: &Tensor, side: usize) -> Result<Tensor, OptimError> {
    let (a, b, c) = NS_COEFFICIENTS;
    let (a, b, c) = (a as f32, b as f32, c as f32);
    let values = with_f32_slice(gram, |gram| {
        with_f32_slice(gram_sq, |gram_sq| {
            let mut out: Vec<f32> = gram
                .iter()
                .zip(gram_sq)
                .map(|(&g1, &g2)| b * g1 + c * g2)
                .collect();
            for i in 0..side {
                out[i * side + i] += a;
            }
            out
        })
    })??;
    Ok(Tensor::from_vec(
        values,
        (side, side),
        &candle_core::Device::Cpu,
    )?)
}

/// `[dim0, product of the rest]`: how Muon sees a parameter of rank >= 2.
pub(crate) fn matrix_dims(shape: &[usize]) -> (usize, usize) {
    let rows = shape.first().copied().unwrap_or(1);
    let cols = shape.iter().skip(1).product::<usize>().max(1);
    (rows, cols)
}
