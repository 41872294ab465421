//! Additive attention biases: 0 where a query may attend a key, `-inf` where not.
//!
//! Shapes are [B, 1, q_len, k_len] so one bias serves every head. `causal_bias` handles
//! padding (left for generation, right for scoring) through `key_valid`; a query whose row
//! would be entirely masked (a padding query) may attend to itself, so softmax never sees an
//! all `-inf` row (no NaN; such positions' outputs are meaningless and must be ignored by
//! the caller). `document_causal_bias` keeps packed documents apart.

use crate::error::ModelError;
use candle_core::{Device, Tensor};

/// Query i of row b (absolute slot `past + i`, `past = k_len - q_len`) may attend key slot j
/// iff `j <= past + i` and `key_valid[b][j]`. All rows of `key_valid` have length k_len.
pub fn causal_bias(
    key_valid: &[Vec<bool>],
    q_len: usize,
    device: &Device,
) -> Result<Tensor, ModelError> {
    let batch = key_valid.len();
    let k_len = key_valid.first().map_or(0, Vec::len);
    if batch == 0 || q_len == 0 {
        return Err(ModelError::InvalidArgument(format!(
            "causal_bias: empty batch ({batch}) or q_len ({q_len})"
        )));
    }
    if let Some((b, row)) = key_valid.iter().enumerate().find(|(_, r)| r.len() != k_len) {
        return Err(ModelError::InvalidArgument(format!(
            "causal_bias: key_valid row {b} has length {}, row 0 has {k_len}",
            row.len()
        )));
    }
    if q_len > k_len {
        return Err(ModelError::InvalidArgument(format!(
            "causal_bias: q_len {q_len} exceeds key length {k_len}"
        )));
    }
    let past = k_len - q_len;
    let mut data = vec![f32::NEG_INFINITY; batch * q_len * k_len];
    for (b, valid) in key_valid.iter().enumerate() {
        for i in 0..q_len {
            let row = &mut data[(b * q_len + i) * k_len..(b * q_len + i + 1) * k_len];
            let mut any = false;
            for j in 0..=past + i {
                if valid[j] {
                    row[j] = 0.0;
                    any = true;
                }
            }
            if !any {
                row[past + i] = 0.0;
            }
        }
    }
    Ok(Tensor::from_vec(data, (batch, 1, q_len, k_len), device)?)
}

/// `bias` [B or 1, 1, q_len, k_len] with a sliding window added: query i of row b also loses
/// every key whose position is `window` or more before its own (`q_positions` [B, q_len],
/// `k_positions` [B, k_len], u32). Positions, not slots, so packed and shared-prefix rows get
/// the window of each sequence; for plain rows (positions one per slot) this is transformers'
/// slot rule `kv_idx > q_idx - sliding_window`. A query left with no key (a padding query) may
/// attend its own slot, `past + i`, as in `causal_bias`, so no softmax row is all `-inf`.
pub fn sliding_window_bias(
    bias: &Tensor,
    q_positions: &Tensor,
    k_positions: &Tensor,
    window: usize,
) -> Result<Tensor, ModelError> {
    let (batch, q_len) = q_positions.dims2()?;
    let (k_batch, k_len) = k_positions.dims2()?;
    let dims = bias.dims();
    if k_batch != batch
        || dims.len() != 4
        || (dims[0] != batch && dims[0] != 1)
        || dims[2] != q_len
        || dims[3] != k_len
        || q_len > k_len
    {
        return Err(ModelError::InvalidArgument(format!(
            "sliding_window_bias: bias {dims:?}, query positions {:?}, key positions {:?}",
            q_positions.dims(),
            k_positions.dims()
        )));
    }
    let device = bias.device().clone();
    let base: Vec<f32> = bias
        .to_dtype(candle_core::DType::F32)?
        .broadcast_as((batch, 1, q_len, k_len))?
        .flatten_all()?
        .to_vec1()?;
    let q_pos: Vec<u32> = q_positions
        .to_dtype(candle_core::DType::U32)?
        .flatten_all()?
        .to_vec1()?;
    let k_pos: Vec<u32> = k_positions
        .to_dtype(candle_core::DType::U32)?
        .flatten_all()?
        .to_vec1()?;
    let past = k_len - q_len;
    let mut data = base;
    for b in 0..batch {
        for i in 0..q_len {
            let q = i64::from(q_pos[b * q_len + i]);
            let row = &mut data[(b * q_len + i) * k_len..(b * q_len + i + 1) * k_len];
            for (j, value) in row.iter_mut().enumerate() {
                if q - i64::from(k_pos[b * k_len + j]) >= window as i64 {
                    *value = f32::NEG_INFINITY;
                }
            }
            if row.iter().all(|v| *v == f32::NEG_INFINITY) {
                row[past + i] = 0.0;
            }
        }
    }
    Ok(Tensor::from_vec(data, (batch, 1, q_len, k_len), &device)?)
}

/// Block-diagonal causal bias for packed sequences: token i of row b may attend token j iff
/// `j <= i` and `doc_ids[b][j] == doc_ids[b][i]`. Every token attends at least itself.
pub fn document_causal_bias(doc_ids: &[Vec<u32>], device: &Device) -> Result<Tensor, ModelError> {
    let batch = doc_ids.len();
    let len = doc_ids.first().map_or(0, Vec::len);
    if batch == 0 || len == 0 {
        return Err(ModelError::InvalidArgument(
            "document_causal_bias: empty batch or sequence".into(),
        ));
    }
    if let Some((b, row)) = doc_ids.iter().enumerate().find(|(_, r)| r.len() != len) {
        return Err(ModelError::InvalidArgument(format!(
            "document_causal_bias: row {b} has length {}, row 0 has {len}",
            row.len()
        )));
    }
    let mut data = vec![f32::NEG_INFINITY; batch * len * len];
    for (b, docs) in doc_ids.iter().enumerate() {
        for i in 0..len {
            for j in 0..=i {
                if docs[j] == docs[i] {
                    data[(b * len + i) * len + j] = 0.0;
                }
            }
        }
    }
    Ok(Tensor::from_vec(data, (batch, 1, len, len), device)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allowed(bias: &Tensor) -> Vec<Vec<Vec<bool>>> {
        let (b, _, q, k) = bias.dims4().expect("rank 4");
        let v: Vec<f32> = bias.flatten_all().and_then(|t| t.to_vec1()).expect("f32");
        (0..b)
            .map(|bb| {
                (0..q)
                    .map(|i| (0..k).map(|j| v[(bb * q + i) * k + j] == 0.0).collect())
                    .collect()
            })
            .collect()
    }

    #[test]
    fn causal_bias_masks_future_and_invalid_keys_and_keeps_padding_rows_finite()
    -> Result<(), ModelError> {
        // Row 0 left-padded by one slot; two queries at the end of a 4-slot window.
        let bias = causal_bias(
            &[vec![false, true, true, true], vec![true; 4]],
            2,
            &Device::Cpu,
        )?;
        let a = allowed(&bias);
        assert_eq!(
            a[0],
            vec![
                vec![false, true, true, false],
                vec![false, true, true, true]
            ]
        );
        assert_eq!(a[1], vec![vec![true, true, true, false], vec![true; 4]]);
        // A padding query (all visible keys invalid) attends to itself only.
        let pad = allowed(&causal_bias(&[vec![false, true]], 2, &Device::Cpu)?);
        assert_eq!(pad[0], vec![vec![true, false], vec![false, true]]);
        Ok(())
    }

    #[test]
    fn document_bias_is_block_diagonal_and_causal() -> Result<(), ModelError> {
        let a = allowed(&document_causal_bias(&[vec![0, 0, 1, 1, 1]], &Device::Cpu)?);
        assert_eq!(a[0][1], vec![true, true, false, false, false]);
        assert_eq!(a[0][2], vec![false, false, true, false, false]);
        assert_eq!(a[0][4], vec![false, false, true, true, true]);
        Ok(())
    }

    #[test]
    fn ragged_rows_are_rejected() {
        assert!(causal_bias(&[vec![true; 3], vec![true; 2]], 1, &Device::Cpu).is_err());
        assert!(causal_bias(&[vec![true; 2]], 3, &Device::Cpu).is_err());
    }
}
