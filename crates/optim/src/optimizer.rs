//! `Optimizer`: the one optimizer object the trainer holds, combining AdamW and Muon by
//! parameter kind (which one is chosen by `OptimizerConfig`, in `config.rs`).
//!
//! What it is: the owner of every parameter's f32 optimizer state and of the step count. Groups
//! are implicit in `ParamKind` (`param.rs`):
//! - `OptimizerConfig::AdamW`: AdamW everywhere; weight decay on `Matrix` and `OutputHead` only.
//! - `OptimizerConfig::Muon`: Muon for `Matrix`; AdamW (`muon.adamw`) for `Embedding`,
//!   `OutputHead` and `NormOrBias`, again without weight decay on `Embedding`/`NormOrBias`.
//!
//! What it is not: a gradient producer (the trainer passes gradients in `params()` order), a
//! clipper (`clip.rs`) or a schedule (`schedule.rs`: the trainer passes its `lr_factor`).
//! Invariants: `params()` order is fixed at construction; a failed check (gradient count,
//! shape, lr factor) leaves parameters, state and step count untouched; parameters are
//! contiguous f32 CPU tensors, updated in place (their `Var`s stay the model's).

use std::collections::HashSet;
use std::path::Path;

use candle_core::{Device, Tensor, Var};

use crate::adamw::{AdamWScalars, AdamWState, MomentFormat, adamw_update};
use crate::config::OptimizerConfig;
use crate::error::OptimError;
use crate::inplace::{CHUNK, is_writable_f32, update_in_place, with_f32_slice};
use crate::muon::{MuonState, match_rms_factor, matrix_dims, momentum_update, newton_schulz5};
use crate::param::{ParamKind, classify};
use crate::quantized::{Int8Moments, adamw_update_int8};
use crate::state::{StateData, StateFile, StateHeader, StateTensorRef};

/// The rule one parameter follows, with its state.
#[derive(Clone, Debug)]
enum Rule {
    AdamW {
        weight_decay: f64,
        state: AdamWState,
    },
    /// AdamW with 8-bit moments (`moments = "int8"`).
    AdamWInt8 {
        weight_decay: f64,
        state: Int8Moments,
    },
    Muon {
        rows: usize,
        cols: usize,
        state: MuonState,
    },
}

/// Names of a parameter's state tensors in the state file (PyTorch's state keys).
const EXP_AVG: &str = "exp_avg";
const EXP_AVG_SQ: &str = "exp_avg_sq";
const MOMENTUM_BUFFER: &str = "momentum_buffer";
/// 8-bit moments: codes (u8, the parameter's shape) and block scales (f32, one per block).
const EXP_AVG_INT8: &str = "exp_avg.int8";
const EXP_AVG_SCALE: &str = "exp_avg.scale";
const EXP_AVG_SQ_INT8: &str = "exp_avg_sq.int8";
const EXP_AVG_SQ_SCALE: &str = "exp_avg_sq.scale";

pub struct Optimizer {
    config: OptimizerConfig,
    params: Vec<(String, Var)>,
    kinds: Vec<ParamKind>,
    rules: Vec<Rule>,
    steps: u64,
}

impl std::fmt::Debug for Optimizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Optimizer")
            .field("config", &self.config)
            .field("params", &self.params.len())
            .field("steps", &self.steps)
            .finish()
    }
}

impl Optimizer {
    /// Checks the config and the parameters (contiguous f32 on the CPU, unique names) and
    /// creates zeroed state for each.
    pub fn new(
        config: OptimizerConfig,
        params: Vec<(String, Var)>,
    ) -> Result<Optimizer, OptimError> {
        config.validate()?;
        let mut seen = HashSet::new();
        let mut kinds = Vec::with_capacity(params.len());
        let mut rules = Vec::with_capacity(params.len());
        for (name, var) in &params {
            if !seen.insert(name.as_str()) {
                return Err(param_error(name, "appears twice in the parameter list"));
            }
            if !is_writable_f32(var.as_tensor()) {
                return Err(param_error(
                    name,
                    &format!(
                        "must be a contiguous f32 tensor on the CPU (got {:?} on {:?})",
                        var.dtype(),
                        var.device().location()
                    ),
                ));
            }
            let kind = classify(name, var.dims());
            let len = var.elem_count();
            let rule = match (&config, kind) {
                (OptimizerConfig::Muon(_), ParamKind::Matrix) => {
                    let (rows, cols) = matrix_dims(var.dims());
                    Rule::Muon {
                        rows,
                        cols,
                        state: MuonState::zeros(len),
                    }
                }
                _ => {
                    let weight_decay = if kind.takes_weight_decay() {
                        config.adamw().weight_decay
                    } else {
                        0.0
                    };
                    match config.adamw().moments {
                        MomentFormat::F32 => Rule::AdamW {
                            weight_decay,
                            state: AdamWState::zeros(len),
                        },
                        MomentFormat::Int8 => Rule::AdamWInt8 {
                            weight_decay,
                            state: Int8Moments::zeros(len),
                        },
                    }
                }
            };
            kinds.push(kind);
            rules.push(rule);
        }
        Ok(Optimizer {
            config,
            params,
            kinds,
            rules,
            steps: 0,
        })
    }

    pub fn params(&self) -> &[(String, Var)] {
        &self.params
    }

    /// The kind of each parameter, in `params()` order.
    pub fn param_kinds(&self) -> &[ParamKind] {
        &self.kinds
    }

    pub fn config(&self) -> &OptimizerConfig {
        &self.config
    }

    pub fn steps_taken(&self) -> u64 {
        self.steps
    }

    /// Bytes of optimizer state held (moments, momentum buffers, 8-bit codes and scales).
    pub fn state_bytes(&self) -> usize {
        self.rules
            .iter()
            .map(|rule| match rule {
                Rule::AdamW { state, .. } => 4 * (state.exp_avg.len() + state.exp_avg_sq.len()),
                Rule::AdamWInt8 { state, .. } => state.bytes(),
                Rule::Muon { state, .. } => 4 * state.momentum_buffer.len(),
            })
            .sum()
    }

    /// One update. `grads[i]` is the gradient of `params()[i]` (same shape, f32). `lr_factor`
    /// multiplies every group's configured lr (the schedule's value; 1.0 = peak). Steps counted
    /// internally (bias correction).
    pub fn step(&mut self, grads: &[Tensor], lr_factor: f64) -> Result<(), OptimError> {
        if grads.len() != self.params.len() {
            return Err(OptimError::GradCount {
                expected: self.params.len(),
                got: grads.len(),
            });
        }
        if !(lr_factor.is_finite() && lr_factor >= 0.0) {
            return Err(OptimError::InvalidLrFactor(lr_factor));
        }
        for ((name, var), grad) in self.params.iter().zip(grads) {
            if var.dims() != grad.dims() {
                return Err(OptimError::GradShape {
                    name: name.clone(),
                    expected: var.dims().to_vec(),
                    got: grad.dims().to_vec(),
                });
            }
        }
        self.steps += 1;
        let step = self.steps;
        let adamw = self.config.adamw().clone();
        let muon = match &self.config {
            OptimizerConfig::Muon(muon) => Some(muon.clone()),
            OptimizerConfig::AdamW(_) => None,
        };
        for (index, (((name, var), grad), rule)) in self
            .params
            .iter()
            .zip(grads)
            .zip(self.rules.iter_mut())
            .enumerate()
        {
            match rule {
                Rule::AdamWInt8 {
                    weight_decay,
                    state,
                } => {
                    let scalars =
                        AdamWScalars::new(&adamw, adamw.lr * lr_factor, *weight_decay, step);
                    // Rounding bits differ per step and parameter, and repeat on resume.
                    let seed = step.wrapping_mul(0x2545_F491_4F6C_DD1D) ^ index as u64;
                    update_in_place(var.as_tensor(), grad, |param, grad| {
                        adamw_update_int8(param, grad, state, &scalars, seed)
                    })?;
                }
                Rule::AdamW {
                    weight_decay,
                    state,
                } => {
                    let scalars =
                        AdamWScalars::new(&adamw, adamw.lr * lr_factor, *weight_decay, step);
                    update_in_place(var.as_tensor(), grad, |param, grad| {
                        adamw_update(param, grad, state, &scalars)
                    })?;
                }
                Rule::Muon { rows, cols, state } => {
                    // Muon rules are only built under a Muon config (`new`); checked, not assumed.
                    let Some(muon) = &muon else {
                        return Err(param_error(name, "has a Muon rule under an AdamW config"));
                    };
                    let update = with_f32_slice(grad, |grad| {
                        momentum_update(grad, state, muon.momentum, muon.nesterov)
                    })?;
                    let update = Tensor::from_vec(update, (*rows, *cols), &Device::Cpu)?;
                    let orthogonal = newton_schulz5(&update, muon.ns_steps)?;
                    let lr = muon.lr * lr_factor;
                    let decay = (1.0 - lr * muon.weight_decay) as f32;
                    let scale = (lr * match_rms_factor(*rows, *cols)) as f32;
                    update_in_place(var.as_tensor(), &orthogonal, |param, orthogonal| {
                        apply_scaled(param, orthogonal, decay, scale)
                    })?;
                }
            }
        }
        Ok(())
    }

    /// Exact state: every moment/momentum buffer bit-for-bit plus step counts and the config.
    /// One safetensors file (written to a temporary sibling, then renamed), metadata in its header.
    pub fn save_state(&self, path: &Path) -> Result<(), OptimError> {
        let mut tensors = Vec::new();
        for ((name, var), rule) in self.params.iter().zip(&self.rules) {
            let shape = var.dims();
            match rule {
                Rule::AdamW { state, .. } => {
                    tensors.push(StateTensorRef::new(name, EXP_AVG, shape, &state.exp_avg));
                    tensors.push(StateTensorRef::new(
                        name,
                        EXP_AVG_SQ,
                        shape,
                        &state.exp_avg_sq,
                    ));
                }
                Rule::AdamWInt8 { state, .. } => {
                    let blocks = [state.exp_avg_scale.len()];
                    for (key, codes) in [
                        (EXP_AVG_INT8, &state.exp_avg),
                        (EXP_AVG_SQ_INT8, &state.exp_avg_sq),
                    ] {
                        tensors.push(StateTensorRef::with_data(
                            name,
                            key,
                            shape,
                            StateData::U8(codes),
                        ));
                    }
                    for (key, scales) in [
                        (EXP_AVG_SCALE, &state.exp_avg_scale),
                        (EXP_AVG_SQ_SCALE, &state.exp_avg_sq_scale),
                    ] {
                        tensors.push(StateTensorRef::new(name, key, &blocks, scales));
                    }
                }
                Rule::Muon { state, .. } => {
                    tensors.push(StateTensorRef::new(
                        name,
                        MOMENTUM_BUFFER,
                        shape,
                        &state.momentum_buffer,
                    ));
                }
            }
        }
        let header = StateHeader::new(self.steps, self.config.clone());
        crate::state::write_state(path, header, tensors)
    }

    /// Restores state written by `save_state` for the same parameters (names, shapes, optimizer
    /// kind). The hyperparameters of this optimizer's config stay in force (a resumed run may
    /// change them); the saved config is only checked for the optimizer kind. On any error the
    /// optimizer is unchanged; errors name the file and, where one is involved, the tensor.
    pub fn load_state(&mut self, path: &Path) -> Result<(), OptimError> {
        let mut file = StateFile::read(path)?;
        let saved_kind = file.header().config.kind_name();
        if saved_kind != self.config.kind_name() {
            return Err(file.format_error(format!(
                "written by a {saved_kind} optimizer, this run uses {}",
                self.config.kind_name()
            )));
        }
        let (saved_moments, moments) = (
            file.header().config.adamw().moments,
            self.config.adamw().moments,
        );
        if saved_moments != moments {
            let name = |m: MomentFormat| match m {
                MomentFormat::F32 => "f32",
                MomentFormat::Int8 => "int8 (8-bit)",
            };
            return Err(file.format_error(format!(
                "written with {} moments, this run keeps {} moments (optimizer.moments)",
                name(saved_moments),
                name(moments)
            )));
        }
        let mut restored = Vec::with_capacity(self.rules.len());
        for ((name, var), rule) in self.params.iter().zip(&self.rules) {
            let shape = var.dims();
            let rule = match rule {
                Rule::AdamW { weight_decay, .. } => Rule::AdamW {
                    weight_decay: *weight_decay,
                    state: AdamWState {
                        exp_avg: file.take(name, EXP_AVG, shape)?,
                        exp_avg_sq: file.take(name, EXP_AVG_SQ, shape)?,
                    },
                },
                Rule::AdamWInt8 {
                    weight_decay,
                    state,
                } => {
                    let blocks = [state.exp_avg_scale.len()];
                    Rule::AdamWInt8 {
                        weight_decay: *weight_decay,
                        state: Int8Moments {
                            exp_avg: file.take_u8(name, EXP_AVG_INT8, shape)?,
                            exp_avg_scale: file.take(name, EXP_AVG_SCALE, &blocks)?,
                            exp_avg_sq: file.take_u8(name, EXP_AVG_SQ_INT8, shape)?,
                            exp_avg_sq_scale: file.take(name, EXP_AVG_SQ_SCALE, &blocks)?,
                        },
                    }
                }
                Rule::Muon { rows, cols, .. } => Rule::Muon {
                    rows: *rows,
                    cols: *cols,
                    state: MuonState {
                        momentum_buffer: file.take(name, MOMENTUM_BUFFER, shape)?,
                    },
                },
            };
            restored.push(rule);
        }
        file.expect_all_taken()?;
        self.steps = file.header().steps;
        self.rules = restored;
        Ok(())
    }
}

/// `p <- p * decay - scale * o`, fused and parallel (Muon's decoupled decay and update).
fn apply_scaled(param: &mut [f32], update: &[f32], decay: f32, scale: f32) {
    use rayon::prelude::*;
    param
        .par_chunks_mut(CHUNK)
        .zip(update.par_chunks(CHUNK))
        .for_each(|(p, o)| {
            for (p, &o) in p.iter_mut().zip(o) {
                *p = *p * decay - scale * o;
            }
        });
}

fn param_error(name: &str, reason: &str) -> OptimError {
    OptimError::InvalidParam {
        name: name.to_string(),
        reason: reason.to_string(),
    }
}
