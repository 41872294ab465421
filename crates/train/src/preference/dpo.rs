//! DPO and its relatives: every `loss_type` of TRL 1.16's `DPOTrainer`, alone or as a weighted
//! combination (MPO is `["sigmoid", "bco_pair", "sft"]` with weights `[0.8, 0.2, 1.0]`).
//!
//! With `r_w = log pi(y_w) - log ref(y_w)` and `r_l` likewise (per-sequence sums, or LD-DPO's
//! `shared + ld_alpha * tail`), the scores `s = f(r)` of the f-divergence (`reverse_kl`: `s = r`;
//! `forward_kl`: `1 - exp(-r)`; `js_divergence`: `ln 2 + log sigmoid(r)`; `alpha_divergence`:
//! `(exp(min((a - 1) r, 80)) - 1) / (a - 1)`) and `d = s_w - s_l`, per pair:
//!
//! ```text
//! sigmoid       -log s(b d)                         (cDPO when label_smoothing e > 0, below)
//! hinge         relu(1 - b d)
//! ipo           (s_w / n_w - s_l / n_l - 1 / (2 b))^2          n = completion tokens
//! exo_pair      q_w (log q_w - log(1 - e)) + q_l (log q_l - log e),  q_w = s(b d), q_l = s(-b d)
//! nca_pair      -log s(b r_w) - 1/2 log s(-b r_w) - 1/2 log s(-b r_l)
//! robust        (-(1 - e) log s(b d) + e log s(-b d)) / (1 - 2 e)
//! bco_pair      -log s(b r_w) - log s(-b r_l)
//! sppo_hard     (r_w - 1 / (2 b))^2 + (r_l + 1 / (2 b))^2
//! aot           smoothed sigmoid on sort(log pi_w - log pi_l) - sort(ref_w - ref_l) (batch-wide)
//! aot_unpaired  smoothed sigmoid on sort(r_w) - sort(r_l)
//! apo_zero      (1 - s(b r_w)) + s(b r_l)
//! apo_down      s(b r_w) + (1 - s(b (r_w - r_l)))
//! discopop      -log s(b d) (1 - m) + exp(-b d) m,  m = s(b d / tau)
//! sft           -mean of the chosen tokens' log-probs (the micro-batch's token mean)
//! sigmoid_norm  -log s(b (s_w / n_w - s_l / n_l))
//! ```
//!
//! where `s` is the logistic function. The loss is `sum_k weight_k * mean_pairs(loss_k)`.
//!
//! One deliberate difference from TRL 1.16: its `sigmoid` ignores `label_smoothing`; here a
//! non-zero `label_smoothing` with `sigmoid` gives conservative DPO (cDPO, Mitchell 2023;
//! TRL before 1.0), `-(1 - e) log s(b d) - e log s(-b d)`, rather than silently dropping the
//! setting. With `label_smoothing = 0` (the default) the two agree exactly.
//!
//! Metrics (TRL's names): `rewards/chosen` = mean `b r_w`, `rewards/rejected`,
//! `rewards/accuracies` (fraction with `b r_w > b r_l`), `rewards/margins`, `logps/chosen` and
//! `logps/rejected` (mean policy log-probs: falling chosen log-probs are likelihood
//! displacement).

use candle_core::Tensor;
use serde::{Deserialize, Deserializer, Serialize};
use stoke_ops::logistic::{log_sigmoid, sigmoid};

use super::{PreferenceOutput, SequenceLogps, check_beta, halves, invalid, pair_metrics, shape};
use crate::error::TrainError;

/// One of TRL's `DPOConfig.loss_type` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DpoLossType {
    Sigmoid,
    Hinge,
    Ipo,
    ExoPair,
    NcaPair,
    Robust,
    BcoPair,
    SppoHard,
    Aot,
    AotUnpaired,
    ApoZero,
    ApoDown,
    Discopop,
    Sft,
    SigmoidNorm,
}

/// TRL's `f_divergence_type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FDivergence {
    #[default]
    ReverseKl,
    ForwardKl,
    JsDivergence,
    AlphaDivergence,
}

/// The DPO-family loss (TRL's `DPOConfig` loss fields and defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DpoLoss {
    /// `beta` (0.1): the strength of the implicit KL regularization to the reference.
    #[serde(default = "default_beta")]
    pub beta: f64,
    /// One loss type or a list of them (`["sigmoid"]`).
    #[serde(
        default = "default_loss_type",
        deserialize_with = "one_or_many",
        alias = "loss_types"
    )]
    pub loss_type: Vec<DpoLossType>,
    /// One weight per loss type; None: all 1.
    #[serde(default)]
    pub loss_weights: Option<Vec<f64>>,
    /// `e` (0): robust, exo_pair, aot, aot_unpaired, and cDPO with sigmoid.
    #[serde(default)]
    pub label_smoothing: f64,
    #[serde(default)]
    pub f_divergence_type: FDivergence,
    /// `a` of the alpha divergence (0.5).
    #[serde(default = "default_alpha_coef")]
    pub f_alpha_divergence_coef: f64,
    /// LD-DPO: weight of the tokens past the shorter response of the pair; None: plain sums.
    #[serde(default)]
    pub ld_alpha: Option<f64>,
    /// DiscoPOP's temperature (0.05).
    #[serde(default = "default_discopop_tau")]
    pub discopop_tau: f64,
}

fn default_beta() -> f64 {
    0.1
}

fn default_loss_type() -> Vec<DpoLossType> {
    vec![DpoLossType::Sigmoid]
}

fn default_alpha_coef() -> f64 {
    0.5
}

fn default_discopop_tau() -> f64 {
    0.05
}

/// Every loss type's name, for error messages.
const LOSS_TYPE_NAMES: &str = "sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, \
    sppo_hard, aot, aot_unpaired, apo_zero, apo_down, discopop, sft, sigmoid_norm";

/// A loss type name or a list of them; an unknown name is an error that lists the known ones.
fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<DpoLossType>, D::Error> {
    use serde::de::Error;
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Names {
        One(String),
        Many(Vec<String>),
    }
    let names = match Names::deserialize(d)
        .map_err(|_| D::Error::custom("expected a loss type name or a list of them"))?
    {
        Names::One(one) => vec![one],
        Names::Many(many) => many,
    };
    names
        .iter()
        .map(|name| {
            serde_json::from_value(serde_json::Value::String(name.clone())).map_err(|_| {
                D::Error::custom(format!(
                    "unknown loss type `{name}`; TRL 1.16's are {LOSS_TYPE_NAMES} (kto_pair \
                     became KTO: [objective] kind = \"kto\")"
                ))
            })
        })
        .collect()
}

impl Default for DpoLoss {
    fn default() -> Self {
        DpoLoss {
            beta: default_beta(),
            loss_type: default_loss_type(),
            loss_weights: None,
            label_smoothing: 0.0,
            f_divergence_type: FDivergence::ReverseKl,
            f_alpha_divergence_coef: default_alpha_coef(),
            ld_alpha: None,
            discopop_tau: default_discopop_tau(),
        }
    }
}

impl DpoLoss {
    /// Checks every field (TRL's own checks plus ranges); the error names the key.
    pub fn validate(&self) -> Result<(), TrainError> {
        check_beta("dpo.beta", self.beta)?;
        if self.loss_type.is_empty() {
            return Err(invalid(
                "dpo.loss_type",
                "needs at least one loss type".into(),
            ));
        }
        if let Some(weights) = &self.loss_weights {
            if weights.len() != self.loss_type.len() {
                return Err(invalid(
                    "dpo.loss_weights",
                    format!(
                        "{} weights for {} loss types",
                        weights.len(),
                        self.loss_type.len()
                    ),
                ));
            }
            if let Some(w) = weights.iter().find(|w| !w.is_finite()) {
                return Err(invalid("dpo.loss_weights", format!("not finite: {w}")));
            }
        }
        let e = self.label_smoothing;
        if !(0.0..0.5).contains(&e) {
            return Err(invalid(
                "dpo.label_smoothing",
                format!("must be in [0, 0.5), got {e}"),
            ));
        }
        if self.loss_type.contains(&DpoLossType::ExoPair) && e == 0.0 {
            return Err(invalid(
                "dpo.label_smoothing",
                "exo_pair needs label_smoothing > 0 (its target distribution is [1 - e, e]); \
                 1e-3 is the EXO paper's value"
                    .into(),
            ));
        }
        if self.f_divergence_type != FDivergence::ReverseKl {
            use DpoLossType::*;
            if let Some(t) = self.loss_type.iter().find(|t| {
                !matches!(
                    t,
                    Sigmoid | SigmoidNorm | Hinge | Ipo | ExoPair | Robust | Discopop | Sft
                )
            }) {
                return Err(invalid(
                    "dpo.f_divergence_type",
                    format!(
                        "{:?} is only supported with sigmoid, sigmoid_norm, hinge, ipo, exo_pair, \
                         robust, discopop and sft; {t:?} uses the log-ratios directly",
                        self.f_divergence_type
                    ),
                ));
            }
        }
        if !(self.f_alpha_divergence_coef.is_finite()) {
            return Err(invalid(
                "dpo.f_alpha_divergence_coef",
                format!("must be finite, got {}", self.f_alpha_divergence_coef),
            ));
        }
        if let Some(alpha) = self.ld_alpha
            && !(0.0..=1.0).contains(&alpha)
        {
            return Err(invalid(
                "dpo.ld_alpha",
                format!("must be in [0, 1], got {alpha}"),
            ));
        }
        if !(self.discopop_tau.is_finite() && self.discopop_tau > 0.0) {
            return Err(invalid(
                "dpo.discopop_tau",
                format!("must be finite and > 0, got {}", self.discopop_tau),
            ));
        }
        Ok(())
    }

    /// Whether the loss needs reference log-probs (every DPO loss but a lone `sft` does).
    pub fn needs_reference(&self) -> bool {
        self.loss_type.iter().any(|t| *t != DpoLossType::Sft)
    }

    /// The loss over one micro-batch of pairs: `policy` with the graph, `reference` plain
    /// values, both laid out `[chosen; rejected]`.
    pub fn loss(
        &self,
        policy: &SequenceLogps,
        reference: &SequenceLogps,
    ) -> Result<PreferenceOutput, TrainError> {
        if policy.rows() != reference.rows()
            || !policy.rows().is_multiple_of(2)
            || policy.rows() == 0
        {
            return Err(shape(format!(
                "{} policy rows and {} reference rows (a non-empty [chosen; rejected] batch each)",
                policy.rows(),
                reference.rows()
            )));
        }
        let beta = self.beta;
        let e = self.label_smoothing;
        let logps = policy.weighted(self.ld_alpha)?;
        let ref_logps = reference.weighted(self.ld_alpha)?.detach();
        let (chosen_logps, rejected_logps) = halves(&logps)?;
        let (ref_chosen, ref_rejected) = halves(&ref_logps)?;
        let chosen_ratio = (&chosen_logps - &ref_chosen)?;
        let rejected_ratio = (&rejected_logps - &ref_rejected)?;
        let chosen_score = self.score(&chosen_ratio)?;
        let rejected_score = self.score(&rejected_ratio)?;
        let delta = (&chosen_score - &rejected_score)?;
        let pairs = policy.rows() / 2;
        let (chosen_tokens, rejected_tokens) = policy.tokens.split_at(pairs);
        let per_token = |score: &Tensor, tokens: &[usize]| -> Result<Tensor, TrainError> {
            let n: Vec<f64> = tokens.iter().map(|&n| n.max(1) as f64).collect();
            Ok((score / Tensor::from_vec(n, tokens.len(), score.device())?)?)
        };
        // Smoothed sigmoid: -(1 - e) log s(x) - e log s(-x).
        let smoothed = |x: &Tensor| -> Result<Tensor, TrainError> {
            let clean = (log_sigmoid(x)? * -(1.0 - e))?;
            if e == 0.0 {
                return Ok(clean);
            }
            Ok((clean - (log_sigmoid(&x.neg()?)? * e)?)?)
        };

        let mut total: Option<Tensor> = None;
        for (k, loss_type) in self.loss_type.iter().enumerate() {
            let weight = self.loss_weights.as_ref().map_or(1.0, |w| w[k]);
            let bd = (&delta * beta)?;
            let per_pair = match loss_type {
                DpoLossType::Sigmoid => smoothed(&bd)?,
                DpoLossType::Hinge => (1.0 - bd)?.relu()?,
                DpoLossType::Ipo => {
                    let d = (per_token(&chosen_score, chosen_tokens)?
                        - per_token(&rejected_score, rejected_tokens)?)?;
                    (d - 1.0 / (2.0 * beta))?.sqr()?
                }
                DpoLossType::ExoPair => {
                    let qw = sigmoid(&bd)?;
                    let ql = sigmoid(&bd.neg()?)?;
                    let win = (qw * (log_sigmoid(&bd)? - (-e).ln_1p())?)?;
                    let lose = (ql * (log_sigmoid(&bd.neg()?)? - e.ln())?)?;
                    (win + lose)?
                }
                DpoLossType::NcaPair => {
                    let cw = (&chosen_ratio * beta)?;
                    let cl = (&rejected_ratio * beta)?;
                    let a = log_sigmoid(&cw)?.neg()?;
                    let b = (log_sigmoid(&cw.neg()?)? * 0.5)?;
                    let c = (log_sigmoid(&cl.neg()?)? * 0.5)?;
                    ((a - b)? - c)?
                }
                DpoLossType::Robust => {
                    let clean = (log_sigmoid(&bd)? * -(1.0 - e))?;
                    let flipped = (log_sigmoid(&bd.neg()?)? * -e)?;
                    ((clean - flipped)? / (1.0 - 2.0 * e))?
                }
                DpoLossType::BcoPair => {
                    let cw = (&chosen_ratio * beta)?;
                    let cl = (&rejected_ratio * beta)?;
                    (log_sigmoid(&cw)?.neg()? - log_sigmoid(&cl.neg()?)?)?
                }
                DpoLossType::SppoHard => {
                    let win = (&chosen_ratio - 0.5 / beta)?.sqr()?;
                    let lose = (&rejected_ratio + 0.5 / beta)?.sqr()?;
                    (win + lose)?
                }
                DpoLossType::Aot => {
                    let ratios = sorted(&(&chosen_logps - &rejected_logps)?)?;
                    let ref_ratios = sorted(&(&ref_chosen - &ref_rejected)?)?;
                    smoothed(&((ratios - ref_ratios)? * beta)?)?
                }
                DpoLossType::AotUnpaired => {
                    let d = (sorted(&chosen_ratio)? - sorted(&rejected_ratio)?)?;
                    smoothed(&(d * beta)?)?
                }
                DpoLossType::ApoZero => {
                    let win = (1.0 - sigmoid(&(&chosen_ratio * beta)?)?)?;
                    let lose = sigmoid(&(&rejected_ratio * beta)?)?;
                    (win + lose)?
                }
                DpoLossType::ApoDown => {
                    let win = sigmoid(&(&chosen_ratio * beta)?)?;
                    let margin = ((&chosen_ratio - &rejected_ratio)? * beta)?;
                    let lose = (1.0 - sigmoid(&margin)?)?;
                    (win + lose)?
                }
                DpoLossType::Discopop => {
                    let modulation = sigmoid(&(&bd / self.discopop_tau)?)?;
                    let logistic = log_sigmoid(&bd)?.neg()?;
                    let exponential = bd.neg()?.exp()?;
                    ((logistic * (1.0 - &modulation)?)? + (exponential * modulation)?)?
                }
                DpoLossType::Sft => {
                    // TRL: -mean over the micro-batch's chosen tokens, the plain (not LD) sums.
                    let (chosen_sum, _) = halves(&(&policy.shared + &policy.tail)?)?;
                    let tokens: usize = chosen_tokens.iter().sum();
                    (chosen_sum.sum_all()? / -(tokens.max(1) as f64))?
                }
                DpoLossType::SigmoidNorm => {
                    let d = (per_token(&chosen_score, chosen_tokens)?
                        - per_token(&rejected_score, rejected_tokens)?)?;
                    log_sigmoid(&(d * beta)?)?.neg()?
                }
            };
            // (sft's value is already the scalar token mean.)
            let term = (per_pair.mean_all()? * weight)?;
            total = Some(match total {
                None => term,
                Some(sum) => (sum + term)?,
            });
        }
        let loss = total.expect("validate() requires at least one loss type");
        let metrics = pair_metrics(
            &(&chosen_ratio * beta)?,
            &(&rejected_ratio * beta)?,
            &chosen_logps,
            &rejected_logps,
        )?;
        Ok(PreferenceOutput { loss, metrics })
    }

    /// The f-divergence's score of a log-ratio.
    fn score(&self, ratio: &Tensor) -> Result<Tensor, TrainError> {
        Ok(match self.f_divergence_type {
            FDivergence::ReverseKl => ratio.clone(),
            FDivergence::ForwardKl => (1.0 - ratio.neg()?.exp()?)?,
            FDivergence::JsDivergence => (log_sigmoid(ratio)? + std::f64::consts::LN_2)?,
            FDivergence::AlphaDivergence => {
                let a = self.f_alpha_divergence_coef;
                if (a - 1.0).abs() < 1e-6 {
                    ratio.clone()
                } else {
                    let t = (ratio * (a - 1.0))?.minimum(80.0)?;
                    ((t.exp()? - 1.0)? * (1.0 / (a - 1.0)))?
                }
            }
        })
    }
}

/// `t` sorted ascending, differentiably (a host-side argsort, then a gather).
pub(crate) fn sorted(t: &Tensor) -> Result<Tensor, TrainError> {
    let values = t.detach().to_vec1::<f64>()?;
    let mut order: Vec<u32> = (0..values.len() as u32).collect();
    order.sort_by(|&a, &b| values[a as usize].total_cmp(&values[b as usize]));
    let index = Tensor::from_vec(order, values.len(), t.device())?;
    Ok(t.index_select(&index, 0)?)
}
