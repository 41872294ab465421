//! On-policy distillation's advantage (Thinking Machines' `incorporate_kl_penalty`, prime-rl's
//! `opd`): the student samples, the teacher scores exactly those token ids, and each sampled
//! token's advantage is the negative per-token reverse-KL estimate
//! `kl_coef * (log p_teacher - log p_student)`, with no discount, plus optionally a verifiable
//! reward's per-completion advantage times `reward_weight`. The student's log-probs are the
//! sampling (behaviour) ones, detached, as the references do; the policy loss then applies its
//! importance ratio and clipping to these per-token advantages unchanged (`PolicyLoss::per_token`
//! takes `[B, T]` advantages).
//!
//! What this is not: the teacher's scoring (the inference module's job) or a full-vocabulary
//! divergence (that is `stoke_ops::distill`, for logit distillation).

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::GrpoError;

fn default_kl_coef() -> f64 {
    1.0
}

/// `[grpo.loss.distill]`: the weight of the teacher's per-token signal and of the verifiable
/// reward's advantage (0: distillation alone).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpdConfig {
    #[serde(default = "default_kl_coef")]
    pub kl_coef: f64,
    #[serde(default)]
    pub reward_weight: f64,
}

impl Default for OpdConfig {
    fn default() -> Self {
        OpdConfig {
            kl_coef: default_kl_coef(),
            reward_weight: 0.0,
        }
    }
}

impl OpdConfig {
    pub fn validate(&self) -> Result<(), GrpoError> {
        if !(self.kl_coef.is_finite() && self.kl_coef > 0.0) {
            return Err(GrpoError::config(
                "distill.kl_coef",
                format!("must be positive, got {}", self.kl_coef),
            ));
        }
        if !(self.reward_weight.is_finite() && self.reward_weight >= 0.0) {
            return Err(GrpoError::config(
                "distill.reward_weight",
                format!("must be >= 0, got {}", self.reward_weight),
            ));
        }
        Ok(())
    }
}

/// `[B, T]` advantages: `kl_coef * (teacher - student)` on masked tokens (0 elsewhere), plus
/// `reward_weight * reward_advantages[b]` on the masked tokens of completion `b` when given.
/// `student`, `teacher`, `mask`: `[B, T]`; `reward_advantages`: `[B]`.
pub fn token_advantages(
    student: &Tensor,
    teacher: &Tensor,
    mask: &Tensor,
    kl_coef: f64,
    reward: Option<(&Tensor, f64)>,
) -> Result<Tensor, GrpoError> {
    let dims = student.dims2()?;
    if teacher.dims2()? != dims || mask.dims2()? != dims {
        return Err(GrpoError::Shape(format!(
            "on-policy distillation: student {:?}, teacher {:?} and mask {:?} log-probs differ",
            student.dims(),
            teacher.dims(),
            mask.dims()
        )));
    }
    let mask = mask.to_dtype(student.dtype())?;
    let gap = (teacher.detach().to_dtype(student.dtype())? - student.detach())?;
    let mut advantages = ((gap * kl_coef)? * &mask)?;
    if let Some((reward_advantages, weight)) = reward {
        let per_completion =
            (reward_advantages.to_dtype(student.dtype())? * weight)?.unsqueeze(1)?;
        advantages = (advantages + mask.broadcast_mul(&per_completion)?)?;
    }
    Ok(advantages)
}
