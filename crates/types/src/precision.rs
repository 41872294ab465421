//! The numeric precision of a model's matrix multiplications.

use serde::{Deserialize, Serialize};

/// How the linear layers (and the LM head) multiply.
///
/// - `F32` (default): everything in f32. The exact mode: bit-identical resume and the
///   trainer/rollout log-prob parity are stated for it.
/// - `Bf16`: mixed precision. Matmul inputs are rounded to bf16 (nearest even), products are
///   summed in f32 and the result is f32; weights, gradients and optimizer state stay f32, and
///   norms, softmax, losses and reductions run in f32 on the f32 results. Backward passes follow
///   the same policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Bf16 => "bf16",
        }
    }
}

impl std::fmt::Display for Precision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Precision {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            other => Err(format!(
                "unknown precision {other:?} (expected \"f32\" or \"bf16\")"
            )),
        }
    }
}
