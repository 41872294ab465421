//! Validation of the mixture of experts (`MoeConfig`) of the MoE families, with transformers'
//! config defaults per family: the expert count and its spellings, the sparse layers, top-k,
//! the expert and shared-expert sizes, the router's score, DeepSeek-V3's group limit, the
//! auxiliary loss weight.
//!
//! What it is not: the MoE layer (`transformer::moe_block`) or its statistics (`crate::moe`).
//!
//! Invariants: `None` for the dense families, whose expert fields are refused by name; for the
//! MoE families every sparse layer can choose `num_experts_per_tok` distinct experts (within the
//! allowed groups under a group limit).

use super::Validator;
use crate::config::architecture::Architecture;
use crate::config::hf_json::HfConfigFile;
use crate::config::model_config::{ExpertNaming, GroupLimit, MoeConfig, RouterScore};
use crate::error::ModelError;

impl Validator<'_> {
    /// The mixture of experts of the MoE families (`None` elsewhere), with transformers' config
    /// defaults. Qwen3-MoE's expert count is read from `num_experts` (hub checkpoints) or
    /// `num_local_experts` (what transformers 5.x may write); both given must agree.
    pub(super) fn moe(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        layers: usize,
        intermediate_size: usize,
    ) -> Result<Option<MoeConfig>, ModelError> {
        let Some((experts_default, top_k_default, aux_default)) =
            self.moe_defaults(file, architecture)?
        else {
            return Ok(None);
        };
        // DeepseekV3Config names its experts `n_routed_experts` (`num_local_experts` is an alias).
        let named_experts = match architecture {
            Architecture::DeepseekV3 => file.n_routed_experts,
            _ => file.num_experts,
        };
        let num_experts = match (named_experts, file.num_local_experts) {
            (Some(a), Some(b)) if a != b => {
                return Err(self.invalid(
                    "num_local_experts",
                    format!("{b} contradicts the expert count {a}"),
                ));
            }
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => experts_default,
        };
        let expert_field =
            if file.num_local_experts.is_some() || architecture == Architecture::Mixtral {
                "num_local_experts"
            } else if architecture == Architecture::DeepseekV3 {
                "n_routed_experts"
            } else {
                "num_experts"
            };
        let sparse_layers = self.sparse_layers(file, architecture, layers, num_experts)?;
        let top_k = file.num_experts_per_tok.unwrap_or(top_k_default);
        if sparse_layers.contains(&true) {
            if num_experts == 0 {
                return Err(self.invalid(expert_field, "must be positive, found 0"));
            }
            if top_k == 0 || top_k > num_experts {
                return Err(self.invalid(
                    "num_experts_per_tok",
                    format!("{top_k} must be between 1 and {expert_field} ({num_experts})"),
                ));
            }
        }
        let (expert_intermediate_size, shared_expert_intermediate_size) =
            self.expert_sizes(file, architecture, intermediate_size)?;
        let router_score = self.router_score(file, architecture)?;
        let group_limit = self.group_limit(file, architecture, num_experts, top_k, expert_field)?;
        let router_aux_loss_coef = file.router_aux_loss_coef.unwrap_or(aux_default);
        if !(router_aux_loss_coef >= 0.0 && router_aux_loss_coef.is_finite()) {
            return Err(self.invalid(
                "router_aux_loss_coef",
                format!("must be >= 0, found {router_aux_loss_coef}"),
            ));
        }
        Ok(Some(MoeConfig {
            num_experts,
            num_experts_per_tok: top_k,
            expert_intermediate_size,
            // Mixtral always renormalizes the top-k weights.
            norm_topk_prob: matches!(architecture, Architecture::Mixtral | Architecture::Afmoe)
                || file
                    .norm_topk_prob
                    .unwrap_or(architecture == Architecture::DeepseekV3),
            shared_expert_intermediate_size,
            router_score,
            sparse_layers,
            router_aux_loss_coef,
            naming: match architecture {
                Architecture::Mixtral => ExpertNaming::Mixtral,
                Architecture::Afmoe => ExpertNaming::Afmoe,
                Architecture::DeepseekV3 => ExpertNaming::Deepseek,
                _ => ExpertNaming::Qwen,
            },
            group_limit,
        }))
    }

    /// The family's defaults `(experts, top_k, router_aux_loss_coef)`; `None` for a dense family,
    /// which must not name experts.
    fn moe_defaults(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
    ) -> Result<Option<(usize, usize, f64)>, ModelError> {
        Ok(Some(match architecture {
            Architecture::Mixtral => (8, 2, 0.001),
            Architecture::Qwen2Moe => (60, 4, 0.001),
            Architecture::Qwen3Moe => (128, 8, 0.001),
            Architecture::Olmoe => (64, 8, 0.01),
            Architecture::Afmoe => (64, 6, 0.001),
            Architecture::DeepseekV3 => (256, 8, 0.001),
            _ => {
                for (field, present) in [
                    ("num_experts", file.num_experts.is_some()),
                    ("num_local_experts", file.num_local_experts.is_some()),
                ] {
                    if present {
                        return Err(self.unsupported(
                            field,
                            "experts",
                            "mixtral, qwen2_moe, qwen3_moe, olmoe, afmoe",
                        ));
                    }
                }
                return Ok(None);
            }
        }))
    }

    /// Per layer, whether its MLP is sparse: Qwen2/3-MoE's `decoder_sparse_step` and
    /// `mlp_only_layers`, AFMoE's and DeepSeek-V3's dense first layers, every layer elsewhere.
    fn sparse_layers(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        layers: usize,
        num_experts: usize,
    ) -> Result<Vec<bool>, ModelError> {
        let step = file.decoder_sparse_step.unwrap_or(1);
        if step == 0 {
            return Err(self.invalid("decoder_sparse_step", "must be positive, found 0"));
        }
        let dense_only = file.mlp_only_layers.clone().unwrap_or_default();
        if let Some(bad) = dense_only.iter().find(|&&l| l >= layers) {
            return Err(self.invalid(
                "mlp_only_layers",
                format!("layer {bad} is past the model's {layers} layers"),
            ));
        }
        Ok((0..layers)
            .map(|i| match architecture {
                Architecture::Qwen2Moe | Architecture::Qwen3Moe => {
                    !dense_only.contains(&i) && num_experts > 0 && (i + 1) % step == 0
                }
                // AfmoeDecoderLayer: the first `num_dense_layers` are dense.
                Architecture::Afmoe => i >= file.num_dense_layers.unwrap_or(1),
                // DeepseekV3DecoderLayer: the first `first_k_dense_replace` are dense.
                Architecture::DeepseekV3 => i >= file.first_k_dense_replace.unwrap_or(3),
                _ => true,
            })
            .collect())
    }

    /// `(expert_intermediate_size, shared_expert_intermediate_size)`: the experts' width
    /// (`moe_intermediate_size`, or Mixtral's `intermediate_size`) and the shared expert's, if any.
    fn expert_sizes(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        intermediate_size: usize,
    ) -> Result<(usize, Option<usize>), ModelError> {
        let expert_intermediate_size = match architecture {
            Architecture::Qwen2Moe
            | Architecture::Qwen3Moe
            | Architecture::Afmoe
            | Architecture::DeepseekV3 => {
                let default = match architecture {
                    Architecture::Qwen3Moe => 768,
                    Architecture::DeepseekV3 => 2048,
                    _ => 1408,
                };
                self.required(
                    Some(file.moe_intermediate_size.unwrap_or(default)),
                    "moe_intermediate_size",
                )?
            }
            _ => intermediate_size,
        };
        let shared_expert_intermediate_size = match architecture {
            Architecture::Qwen2Moe => Some(self.required(
                Some(file.shared_expert_intermediate_size.unwrap_or(5632)),
                "shared_expert_intermediate_size",
            )?),
            Architecture::Afmoe => match file.num_shared_experts.unwrap_or(2) {
                0 => None,
                n => Some(expert_intermediate_size * n),
            },
            Architecture::DeepseekV3 => match file.n_shared_experts.unwrap_or(1) {
                0 => None,
                n => Some(expert_intermediate_size * n),
            },
            _ => None,
        };
        Ok((expert_intermediate_size, shared_expert_intermediate_size))
    }

    /// How the router scores the experts: a softmax, or AFMoE's and DeepSeek-V3's sigmoid with a
    /// positive route scale.
    fn router_score(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
    ) -> Result<RouterScore, ModelError> {
        Ok(match architecture {
            Architecture::Afmoe => {
                let route_scale = file.route_scale.unwrap_or(1.0);
                if !(route_scale.is_finite() && route_scale > 0.0) {
                    return Err(self.invalid(
                        "route_scale",
                        format!("must be positive, found {route_scale}"),
                    ));
                }
                RouterScore::Sigmoid { route_scale }
            }
            Architecture::DeepseekV3 => {
                let route_scale = file.routed_scaling_factor.unwrap_or(2.5);
                if !(route_scale.is_finite() && route_scale > 0.0) {
                    return Err(self.invalid(
                        "routed_scaling_factor",
                        format!("must be positive, found {route_scale}"),
                    ));
                }
                RouterScore::Sigmoid { route_scale }
            }
            _ => RouterScore::Softmax,
        })
    }

    /// DeepSeek-V3's group limit (`n_group`, `topk_group`), checked against the expert count and
    /// top-k; `None` elsewhere.
    fn group_limit(
        &self,
        file: &HfConfigFile,
        architecture: Architecture,
        num_experts: usize,
        top_k: usize,
        expert_field: &str,
    ) -> Result<Option<GroupLimit>, ModelError> {
        Ok(match architecture {
            Architecture::DeepseekV3 => {
                let groups = file.n_group.unwrap_or(8);
                let topk_groups = file.topk_group.unwrap_or(4);
                if groups == 0 || !num_experts.is_multiple_of(groups) {
                    return Err(self.invalid(
                        "n_group",
                        format!("{groups} does not divide {expert_field} ({num_experts})"),
                    ));
                }
                if topk_groups == 0 || topk_groups > groups {
                    return Err(self.invalid(
                        "topk_group",
                        format!("{topk_groups} must be between 1 and n_group ({groups})"),
                    ));
                }
                // Each group is scored by its best two experts (DeepseekV3TopkRouter).
                if num_experts / groups < 2 && groups > 1 {
                    return Err(self.invalid(
                        "n_group",
                        format!(
                            "{groups} groups of {} expert(s): each group needs 2 (its score is \
                             the sum of its best two)",
                            num_experts / groups
                        ),
                    ));
                }
                if top_k > topk_groups * (num_experts / groups) {
                    return Err(self.invalid(
                        "num_experts_per_tok",
                        format!(
                            "{top_k} is more than the {} experts of topk_group ({topk_groups}) \
                             groups",
                            topk_groups * (num_experts / groups)
                        ),
                    ));
                }
                Some(GroupLimit {
                    groups,
                    topk_groups,
                })
            }
            _ => None,
        })
    }
}
