//! One Llama/Qwen decoder block, forward and backward, on plain slices: the training path's
//! kernel for a whole transformer layer.
//!
//! ```text
//! r1 = rmsnorm(x) * w_in;   q, k, v = r1 Wq^T (+ bq), r1 Wk^T (+ bk), r1 Wv^T (+ bv)
//! q, k = per-head rmsnorm (Qwen3's q_norm / k_norm, if present), then RoPE
//! a = attention(q, k, v; mask);   h = x + a Wo^T
//! r2 = rmsnorm(h) * w_post;  g, u = r2 Wg^T, r2 Wu^T;  s = silu(g) * u;  y = h + s Wd^T
//! ```
//!
//! Why: as a candle graph a block is about twenty nodes, and candle's backward gives every node
//! a zero-filled gradient buffer plus an add, transposes operands into fresh copies for the
//! weight gradients, and keeps each node's output alive. Measured on SmolLM2-135M's shapes
//! (batch 8 x 256, f32) those memsets, adds and copies were about 15% of a training step. Here
//! the backward is written out: the twelve products go to [`crate::gemm`] with transposed
//! operands read in place, residual gradients are added where they are produced, and only the
//! activations the backward reads are kept (`r1`, `r2` and the RoPE inputs are recomputed, an
//! elementwise pass each).
//!
//! Numerics: the products follow the precision policy (`product`: f32 exact, or bf16 operands
//! with f32 sums); norms, RoPE, softmax and SwiGLU run in the element type. Every reduction has
//! a fixed order (the norm-weight and bias gradients sum fixed blocks of rows in block order),
//! so the results do not depend on the thread count and a resumed run repeats bit for bit. The
//! values equal the graph composition's up to summation order (tests in the model crate check
//! them on every fixture against transformers' block, through the graph path).
//!
//! What it is not: a generation kernel (no KV cache: `decode.rs` is that), LoRA-aware (adapted
//! layers take the graph path), or differentiable in the mask, RoPE tables or eps.
//! Layouts: x, y `[N = B * T, hidden]`; weights as Hugging Face stores them (`[out, in]`);
//! cos/sin `[N, head_dim]` (the model's tables, one row per token); the mask as
//! `fused_attention` takes it (`[Bb, Hb, T, T]` with Bb in {1, B}, Hb in {1, q_heads}).

use rayon::prelude::*;
use stoke_types::Precision;

pub use crate::attention_rows::KeyRuns;
use crate::attention_rows::{self, Dims, Saved, Tiles};
use crate::gemm::{Operand, Scalar};
use crate::kernels::{Real, rms_norm_grad, rms_norm_rows};

/// The element types a block runs in: f32 (training) and f64 (gradient checks).
pub trait BlockReal: Real + Tiles + Scalar {
    /// `x` as a product operand under `precision`: rounded to bf16 values where the products
    /// run on the f32 kernel (`gemm::Bf16Route::RoundedF32`), else unchanged. Every operand of
    /// [`BlockReal::product`] goes through it once, however many products read it.
    fn prepared(precision: Precision, x: Vec<Self>) -> Vec<Self>;

    /// [`BlockReal::prepared`] for a borrowed operand (copied only when it must change).
    fn prepared_ref(precision: Precision, x: &[Self]) -> std::borrow::Cow<'_, [Self]>;

    /// `C (+)= op(A) op(B)` under `precision` on prepared operands (f64 ignores it: the exact
    /// mode).
    #[allow(clippy::too_many_arguments)]
    fn product(
        precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, Self>,
        b: Operand<'_, Self>,
        c: &mut [Self],
        accumulate: bool,
    );

    /// `op(A) op(B)` into a new `[m, n]` buffer (not zero-filled first where the kernel writes
    /// every element).
    fn product_new(
        precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, Self>,
        b: Operand<'_, Self>,
    ) -> Vec<Self> {
        let mut c = vec![Self::zero(); m * n];
        Self::product(precision, m, n, k, a, b, &mut c, false);
        c
    }
}

/// Whether bf16 products here run on the f32 kernel over operands rounded in advance.
fn rounds_operands(precision: Precision) -> bool {
    precision == Precision::Bf16 && crate::gemm::bf16_route() == crate::gemm::Bf16Route::RoundedF32
}

impl BlockReal for f32 {
    fn prepared(precision: Precision, mut x: Vec<f32>) -> Vec<f32> {
        if rounds_operands(precision) {
            x.par_chunks_mut(1 << 14).for_each(|chunk| {
                chunk
                    .iter_mut()
                    .for_each(|v| *v = crate::bf16::round_bf16(*v));
            });
        }
        x
    }

    fn prepared_ref(precision: Precision, x: &[f32]) -> std::borrow::Cow<'_, [f32]> {
        if rounds_operands(precision) {
            std::borrow::Cow::Owned(crate::gemm::rounded(x))
        } else {
            std::borrow::Cow::Borrowed(x)
        }
    }

    fn product(
        precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, f32>,
        b: Operand<'_, f32>,
        c: &mut [f32],
        accumulate: bool,
    ) {
        if rounds_operands(precision) {
            // Prepared operands are bf16 values already: their f32 product is the bf16 one.
            crate::gemm::product_exact(m, n, k, a, b, c, accumulate)
        } else {
            crate::gemm::product(precision, m, n, k, a, b, c, accumulate)
        }
    }

    fn product_new(
        precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, f32>,
        b: Operand<'_, f32>,
    ) -> Vec<f32> {
        if precision != Precision::Bf16 || rounds_operands(precision) {
            crate::gemm::product_exact_new(m, n, k, a, b)
        } else {
            crate::gemm::product_new(precision, m, n, k, a, b)
        }
    }
}

impl BlockReal for f64 {
    fn prepared(_precision: Precision, x: Vec<f64>) -> Vec<f64> {
        x
    }

    fn prepared_ref(_precision: Precision, x: &[f64]) -> std::borrow::Cow<'_, [f64]> {
        std::borrow::Cow::Borrowed(x)
    }

    fn product(
        _precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, f64>,
        b: Operand<'_, f64>,
        c: &mut [f64],
        accumulate: bool,
    ) {
        crate::gemm::product_exact(m, n, k, a, b, c, accumulate)
    }

    fn product_new(
        _precision: Precision,
        m: usize,
        n: usize,
        k: usize,
        a: Operand<'_, f64>,
        b: Operand<'_, f64>,
    ) -> Vec<f64> {
        crate::gemm::product_exact_new(m, n, k, a, b)
    }
}

/// The sizes of one block call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockShape {
    pub batch: usize,
    pub len: usize,
    pub hidden: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub rms_norm_eps: f64,
}

impl BlockShape {
    fn rows(&self) -> usize {
        self.batch * self.len
    }
    fn q_width(&self) -> usize {
        self.q_heads * self.head_dim
    }
    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// The block's parameters, as Hugging Face names them.
#[derive(Clone, Copy, Debug)]
pub struct BlockWeights<'a, T> {
    pub input_layernorm: &'a [T],
    pub q_proj: &'a [T],
    pub k_proj: &'a [T],
    pub v_proj: &'a [T],
    pub q_bias: Option<&'a [T]>,
    pub k_bias: Option<&'a [T]>,
    pub v_bias: Option<&'a [T]>,
    pub q_norm: Option<&'a [T]>,
    pub k_norm: Option<&'a [T]>,
    pub o_proj: &'a [T],
    pub post_attention_layernorm: &'a [T],
    pub gate_proj: &'a [T],
    pub up_proj: &'a [T],
    pub down_proj: &'a [T],
}

/// The gradients of [`BlockWeights`], in the same layouts.
#[derive(Clone, Debug)]
pub struct BlockGrads<T> {
    pub input_layernorm: Vec<T>,
    pub q_proj: Vec<T>,
    pub k_proj: Vec<T>,
    pub v_proj: Vec<T>,
    pub q_bias: Option<Vec<T>>,
    pub k_bias: Option<Vec<T>>,
    pub v_bias: Option<Vec<T>>,
    pub q_norm: Option<Vec<T>>,
    pub k_norm: Option<Vec<T>>,
    pub o_proj: Vec<T>,
    pub post_attention_layernorm: Vec<T>,
    pub gate_proj: Vec<T>,
    pub up_proj: Vec<T>,
    pub down_proj: Vec<T>,
}

/// What stays fixed across the blocks of one forward pass: RoPE tables and the mask.
pub struct BlockInputs<'a, T> {
    /// `[N, head_dim]` each.
    pub cos: &'a [T],
    pub sin: &'a [T],
    /// The additive mask, `[bias_batch, bias_heads, T, T]`.
    pub bias: &'a [T],
    pub bias_batch: usize,
    pub bias_heads: usize,
    /// The mask's allowed keys (`mask_runs`), computed once for all blocks.
    pub runs: &'a KeyRuns,
}

/// The allowed keys of a mask, for [`BlockInputs::runs`].
pub fn mask_runs<T: Real>(bias: &[T], k_len: usize) -> KeyRuns {
    KeyRuns::from_bias(bias, k_len)
}

/// Activations the backward pass reads.
pub struct BlockActivations<T> {
    /// q/k after the projections (and biases), before the per-head norms; only with q/k norms.
    q_lin: Option<Vec<T>>,
    k_lin: Option<Vec<T>>,
    /// Rotated q, k and v in the attention layout (`[B, H, T, D]`).
    qh: Vec<T>,
    kh: Vec<T>,
    vh: Vec<T>,
    probs: Saved<T>,
    /// The attention output as rows `[N, q_heads * head_dim]` (o_proj's input).
    attn: Vec<T>,
    /// The residual stream after attention.
    h: Vec<T>,
    gate: Vec<T>,
    up: Vec<T>,
    /// `silu(gate) * up` (down_proj's input).
    act: Vec<T>,
}

impl<T> BlockActivations<T> {
    /// Bytes held (for the memory report).
    pub fn bytes(&self) -> usize {
        let lens = [
            self.q_lin.as_ref().map_or(0, Vec::len),
            self.k_lin.as_ref().map_or(0, Vec::len),
            self.qh.len(),
            self.kh.len(),
            self.vh.len(),
            self.attn.len(),
            self.h.len(),
            self.gate.len(),
            self.up.len(),
            self.act.len(),
        ];
        (lens.iter().sum::<usize>() + self.probs.kept_values()) * std::mem::size_of::<T>()
    }
}

/// Rows per block of the fixed-order column sums (norm weights, biases).
const SUM_ROWS: usize = 64;

/// `y = x W^T (+ b)` for rows x `[rows, k]`, W `[n, k]`.
fn linear<T: BlockReal>(
    p: Precision,
    x: &[T],
    rows: usize,
    k: usize,
    weight: &[T],
    n: usize,
    bias: Option<&[T]>,
) -> Vec<T> {
    let mut y = T::product_new(p, rows, n, k, Operand::plain(x), Operand::t(weight));
    if let Some(b) = bias {
        y.par_chunks_mut(n).for_each(|row| {
            row.iter_mut().zip(b).for_each(|(v, &bv)| *v += bv);
        });
    }
    y
}

/// Sums of `x`'s columns (`[rows, width]`) in a fixed order.
fn column_sums<T: Real>(x: &[T], width: usize) -> Vec<T> {
    let parts: Vec<Vec<T>> = x
        .par_chunks(width * SUM_ROWS)
        .map(|block| {
            let mut sum = vec![T::zero(); width];
            for row in block.chunks(width) {
                sum.iter_mut().zip(row).for_each(|(s, &v)| *s += v);
            }
            sum
        })
        .collect();
    let mut total = vec![T::zero(); width];
    for part in parts {
        total.iter_mut().zip(part).for_each(|(t, v)| *t += v);
    }
    total
}

/// RoPE (HF's rotate-half layout) of one head row.
#[inline]
fn rotate<T: Real>(x: &[T], cos: &[T], sin: &[T], out: &mut [T]) {
    let half = x.len() / 2;
    for d in 0..half {
        out[d] = x[d] * cos[d] - x[d + half] * sin[d];
        out[d + half] = x[d + half] * cos[d + half] + x[d] * sin[d + half];
    }
}

/// The transposed rotation (the backward of `rotate`).
#[inline]
fn rotate_back<T: Real>(dy: &[T], cos: &[T], sin: &[T], out: &mut [T]) {
    let half = dy.len() / 2;
    for d in 0..half {
        out[d] = dy[d] * cos[d] + dy[d + half] * sin[d + half];
        out[d + half] = dy[d + half] * cos[d + half] - dy[d] * sin[d];
    }
}

/// Rows `[N, heads * D]` -> rotated heads `[B, heads, T, D]`.
fn to_heads_rotated<T: Real>(
    rows: &[T],
    shape: &BlockShape,
    heads: usize,
    inputs: &BlockInputs<'_, T>,
    rotate_it: bool,
) -> Vec<T> {
    let (t_len, d) = (shape.len, shape.head_dim);
    let width = heads * d;
    let mut out = vec![T::zero(); rows.len()];
    out.par_chunks_mut(t_len * d)
        .enumerate()
        .for_each(|(bh, block)| {
            let (b, h) = (bh / heads, bh % heads);
            for t in 0..t_len {
                let n = b * t_len + t;
                let src = &rows[n * width + h * d..n * width + (h + 1) * d];
                let dst = &mut block[t * d..(t + 1) * d];
                if rotate_it {
                    rotate(
                        src,
                        &inputs.cos[n * d..][..d],
                        &inputs.sin[n * d..][..d],
                        dst,
                    );
                } else {
                    dst.copy_from_slice(src);
                }
            }
        });
    out
}

/// Heads `[B, heads, T, D]` -> rows `[N, heads * D]`, through the transposed rotation when
/// `rotate_it` (the gradient of `to_heads_rotated`).
fn from_heads<T: Real>(
    heads_data: &[T],
    shape: &BlockShape,
    heads: usize,
    inputs: &BlockInputs<'_, T>,
    rotate_it: bool,
) -> Vec<T> {
    let (t_len, d) = (shape.len, shape.head_dim);
    let width = heads * d;
    let mut out = vec![T::zero(); heads_data.len()];
    out.par_chunks_mut(width).enumerate().for_each(|(n, row)| {
        let (b, t) = (n / t_len, n % t_len);
        for h in 0..heads {
            let src = &heads_data[((b * heads + h) * t_len + t) * d..][..d];
            let dst = &mut row[h * d..(h + 1) * d];
            if rotate_it {
                rotate_back(
                    src,
                    &inputs.cos[n * d..][..d],
                    &inputs.sin[n * d..][..d],
                    dst,
                );
            } else {
                dst.copy_from_slice(src);
            }
        }
    });
    out
}

fn attention_dims<T>(shape: &BlockShape, inputs: &BlockInputs<'_, T>) -> Dims {
    Dims {
        batch: shape.batch,
        kv_heads: shape.kv_heads,
        group: shape.q_heads / shape.kv_heads,
        q_len: shape.len,
        k_len: shape.len,
        head_dim: shape.head_dim,
        bias_batch: inputs.bias_batch,
        bias_heads: inputs.bias_heads,
    }
}

/// Checks every slice against the shape (a mismatch is a caller bug: it panics, naming it).
fn check_sizes<T>(
    shape: &BlockShape,
    w: &BlockWeights<'_, T>,
    inputs: &BlockInputs<'_, T>,
    x: &[T],
) {
    let (d, q, kv, i) = (
        shape.hidden,
        shape.q_width(),
        shape.kv_width(),
        shape.intermediate,
    );
    let n = shape.rows();
    let expect = |name: &str, got: usize, want: usize| {
        assert_eq!(
            got, want,
            "decoder block: {name} has {got} values, expected {want}"
        );
    };
    expect("x", x.len(), n * d);
    expect("input_layernorm", w.input_layernorm.len(), d);
    expect("q_proj", w.q_proj.len(), q * d);
    expect("k_proj", w.k_proj.len(), kv * d);
    expect("v_proj", w.v_proj.len(), kv * d);
    expect("o_proj", w.o_proj.len(), d * q);
    expect(
        "post_attention_layernorm",
        w.post_attention_layernorm.len(),
        d,
    );
    expect("gate_proj", w.gate_proj.len(), i * d);
    expect("up_proj", w.up_proj.len(), i * d);
    expect("down_proj", w.down_proj.len(), d * i);
    for (name, bias, want) in [
        ("q_bias", w.q_bias, q),
        ("k_bias", w.k_bias, kv),
        ("v_bias", w.v_bias, kv),
    ] {
        if let Some(b) = bias {
            expect(name, b.len(), want);
        }
    }
    for (name, norm) in [("q_norm", w.q_norm), ("k_norm", w.k_norm)] {
        if let Some(nw) = norm {
            expect(name, nw.len(), shape.head_dim);
        }
    }
    expect("cos", inputs.cos.len(), n * shape.head_dim);
    expect("sin", inputs.sin.len(), n * shape.head_dim);
    expect(
        "bias",
        inputs.bias.len(),
        inputs.bias_batch * inputs.bias_heads * shape.len * shape.len,
    );
    assert!(
        shape.kv_heads > 0
            && shape.q_heads.is_multiple_of(shape.kv_heads)
            && shape.head_dim.is_multiple_of(2),
        "decoder block: {} query heads, {} key/value heads, head_dim {}",
        shape.q_heads,
        shape.kv_heads,
        shape.head_dim
    );
}

/// The block's output `y` `[N, hidden]`, and with `keep` the activations its backward reads.
pub fn forward<T: BlockReal>(
    shape: &BlockShape,
    w: &BlockWeights<'_, T>,
    inputs: &BlockInputs<'_, T>,
    precision: Precision,
    x: &[T],
    keep: bool,
) -> (Vec<T>, Option<BlockActivations<T>>) {
    let (y, saved, _) = forward_impl(shape, w, inputs, precision, x, keep, false);
    (y, saved)
}

/// Inference with a KV cache to fill (a prompt's prefill): the block's output `y` `[N, hidden]`
/// and its keys (after RoPE) and values in the attention layout `[B, kv_heads, T, head_dim]`,
/// the layout of a KV cache. The same arithmetic as `forward`, so `y` is bit-identical to it.
pub fn forward_with_kv<T: BlockReal>(
    shape: &BlockShape,
    w: &BlockWeights<'_, T>,
    inputs: &BlockInputs<'_, T>,
    precision: Precision,
    x: &[T],
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let (y, _, kv) = forward_impl(shape, w, inputs, precision, x, false, true);
    let (k, v) = kv.expect("keys and values were asked for");
    (y, k, v)
}

type KeysValues<T> = Option<(Vec<T>, Vec<T>)>;

#[allow(clippy::too_many_arguments)]
fn forward_impl<T: BlockReal>(
    shape: &BlockShape,
    w: &BlockWeights<'_, T>,
    inputs: &BlockInputs<'_, T>,
    precision: Precision,
    x: &[T],
    keep: bool,
    want_kv: bool,
) -> (Vec<T>, Option<BlockActivations<T>>, KeysValues<T>) {
    check_sizes(shape, w, inputs, x);
    let (n, d, i) = (shape.rows(), shape.hidden, shape.intermediate);
    let (qw, kvw, hd) = (shape.q_width(), shape.kv_width(), shape.head_dim);
    let eps = shape.rms_norm_eps;
    let p = precision;

    // Product operands (see `BlockReal::prepared`): the weights and the inputs of products.
    let [wq, wk, wv, wo, wg, wu, wd] = [
        w.q_proj,
        w.k_proj,
        w.v_proj,
        w.o_proj,
        w.gate_proj,
        w.up_proj,
        w.down_proj,
    ]
    .map(|weight| T::prepared_ref(p, weight));
    let r1 = T::prepared(p, rms_norm_rows(x, w.input_layernorm, eps));
    let q_lin = linear(p, &r1, n, d, &wq, qw, w.q_bias);
    let k_lin = linear(p, &r1, n, d, &wk, kvw, w.k_bias);
    let v = linear(p, &r1, n, d, &wv, kvw, w.v_bias);
    drop(r1);
    let q_normed = w.q_norm.map(|qn| rms_norm_rows(&q_lin, qn, eps));
    let k_normed = w.k_norm.map(|kn| rms_norm_rows(&k_lin, kn, eps));
    let qh = to_heads_rotated(
        q_normed.as_ref().unwrap_or(&q_lin),
        shape,
        shape.q_heads,
        inputs,
        true,
    );
    let kh = to_heads_rotated(
        k_normed.as_ref().unwrap_or(&k_lin),
        shape,
        shape.kv_heads,
        inputs,
        true,
    );
    let vh = to_heads_rotated(&v, shape, shape.kv_heads, inputs, false);
    drop((q_normed, k_normed, v));

    let dims = attention_dims(shape, inputs);
    let scale = 1.0 / (hd as f64).sqrt();
    // bf16 products in bf16 mode (where the CPU and the mask suit them: `attention_rows`).
    let (out_heads, probs) = attention_rows::forward(
        &qh,
        &kh,
        &vh,
        inputs.bias,
        inputs.runs,
        dims,
        scale,
        keep,
        p == Precision::Bf16,
    );
    let attn = T::prepared(
        p,
        from_heads(&out_heads, shape, shape.q_heads, inputs, false),
    );
    drop(out_heads);

    // h = x + attn Wo^T: the residual is the accumulator.
    let mut h = x.to_vec();
    T::product(
        p,
        n,
        d,
        qw,
        Operand::plain(&attn),
        Operand::t(&wo),
        &mut h,
        true,
    );

    let r2 = T::prepared(p, rms_norm_rows(&h, w.post_attention_layernorm, eps));
    let gate = linear(p, &r2, n, d, &wg, i, None);
    let up = linear(p, &r2, n, d, &wu, i, None);
    drop(r2);
    let act = T::prepared(p, crate::activation::forward(&gate, &up));
    let mut y = h.clone();
    T::product(
        p,
        n,
        d,
        i,
        Operand::plain(&act),
        Operand::t(&wd),
        &mut y,
        true,
    );

    let (kv, kept) = match (keep, want_kv) {
        (true, _) => (None, Some((kh, vh))),
        (false, true) => (Some((kh, vh)), None),
        (false, false) => (None, None),
    };
    let saved = kept.map(|(kh, vh)| BlockActivations {
        q_lin: w.q_norm.map(|_| q_lin),
        k_lin: w.k_norm.map(|_| k_lin),
        qh,
        kh,
        vh,
        probs: probs.expect("kept probabilities"),
        attn,
        h,
        gate,
        up,
        act,
    });
    (y, saved, kv)
}

/// `(dx, parameter gradients)` from `dy` `[N, hidden]`; `saved` from `forward(.., keep: true)`
/// on the same `x` (or `None`: the forward is recomputed, as activation checkpointing does).
pub fn backward<T: BlockReal>(
    shape: &BlockShape,
    w: &BlockWeights<'_, T>,
    inputs: &BlockInputs<'_, T>,
    precision: Precision,
    x: &[T],
    saved: Option<BlockActivations<T>>,
    dy: &[T],
) -> (Vec<T>, BlockGrads<T>) {
    check_sizes(shape, w, inputs, x);
    let s = match saved {
        Some(saved) => saved,
        None => forward(shape, w, inputs, precision, x, true)
            .1
            .expect("kept activations"),
    };
    let (n, d, i) = (shape.rows(), shape.hidden, shape.intermediate);
    let (qw, kvw) = (shape.q_width(), shape.kv_width());
    let eps = shape.rms_norm_eps;
    let p = precision;
    assert_eq!(
        dy.len(),
        n * d,
        "decoder block: dy has {} values, expected {}",
        dy.len(),
        n * d
    );

    let [wq, wk, wv, wo, wg, wu, wd] = [
        w.q_proj,
        w.k_proj,
        w.v_proj,
        w.o_proj,
        w.gate_proj,
        w.up_proj,
        w.down_proj,
    ]
    .map(|weight| T::prepared_ref(p, weight));
    let dy_p = T::prepared_ref(p, dy);

    // MLP: y = h + act Wd^T (`act` was kept prepared).
    let down_proj = T::product_new(p, d, i, n, Operand::t(&dy_p), Operand::plain(&s.act));
    let dact = T::product_new(p, n, i, d, Operand::plain(&dy_p), Operand::plain(&wd));
    drop(s.act);
    let dgu = T::prepared(p, crate::activation::backward(&s.gate, &s.up, &dact));
    drop(dact);
    let (dgate, dup) = dgu.split_at(n * i);
    let r2 = T::prepared(p, rms_norm_rows(&s.h, w.post_attention_layernorm, eps));
    let gate_proj = T::product_new(p, i, d, n, Operand::t(dgate), Operand::plain(&r2));
    let up_proj = T::product_new(p, i, d, n, Operand::t(dup), Operand::plain(&r2));
    drop(r2);
    let mut dr2 = T::product_new(p, n, d, i, Operand::plain(dgate), Operand::plain(&wg));
    T::product(
        p,
        n,
        d,
        i,
        Operand::plain(dup),
        Operand::plain(&wu),
        &mut dr2,
        true,
    );
    drop(dgu);
    let (dh_norm, post_attention_layernorm) =
        rms_norm_grad(&s.h, w.post_attention_layernorm, &dr2, eps);
    drop(dr2);
    // dh = dy (residual) + the norm's gradient.
    let mut dh = dh_norm;
    dh.par_iter_mut()
        .zip(dy.par_iter())
        .for_each(|(a, &b)| *a += b);

    // Attention: h = x + attn Wo^T.
    let dh_p = T::prepared_ref(p, &dh);
    let o_proj = T::product_new(p, d, qw, n, Operand::t(&dh_p), Operand::plain(&s.attn));
    let dattn = T::product_new(p, n, qw, d, Operand::plain(&dh_p), Operand::plain(&wo));
    let dout_heads = to_heads_rotated(&dattn, shape, shape.q_heads, inputs, false);
    drop(dattn);
    let dims = attention_dims(shape, inputs);
    let scale = 1.0 / (shape.head_dim as f64).sqrt();
    let (dqh, dkh, dvh) = attention_rows::backward(
        &s.qh,
        &s.kh,
        &s.vh,
        inputs.bias,
        inputs.runs,
        dims,
        scale,
        Some(s.probs),
        &dout_heads,
    );
    drop(dout_heads);
    let dq_normed = from_heads(&dqh, shape, shape.q_heads, inputs, true);
    let dk_normed = from_heads(&dkh, shape, shape.kv_heads, inputs, true);
    let dv = from_heads(&dvh, shape, shape.kv_heads, inputs, false);
    drop((dqh, dkh, dvh));
    let (dq, q_norm) = match (w.q_norm, &s.q_lin) {
        (Some(qn), Some(q_lin)) => {
            let (dq, dqn) = rms_norm_grad(q_lin, qn, &dq_normed, eps);
            (dq, Some(dqn))
        }
        _ => (dq_normed, None),
    };
    let (dk, k_norm) = match (w.k_norm, &s.k_lin) {
        (Some(kn), Some(k_lin)) => {
            let (dk, dkn) = rms_norm_grad(k_lin, kn, &dk_normed, eps);
            (dk, Some(dkn))
        }
        _ => (dk_normed, None),
    };

    let r1 = T::prepared(p, rms_norm_rows(x, w.input_layernorm, eps));
    let (dq_p, dk_p, dv_p) = (
        T::prepared_ref(p, &dq),
        T::prepared_ref(p, &dk),
        T::prepared_ref(p, &dv),
    );
    let q_proj = T::product_new(p, qw, d, n, Operand::t(&dq_p), Operand::plain(&r1));
    let k_proj = T::product_new(p, kvw, d, n, Operand::t(&dk_p), Operand::plain(&r1));
    let v_proj = T::product_new(p, kvw, d, n, Operand::t(&dv_p), Operand::plain(&r1));
    drop(r1);
    let mut dr1 = T::product_new(p, n, d, qw, Operand::plain(&dq_p), Operand::plain(&wq));
    T::product(
        p,
        n,
        d,
        kvw,
        Operand::plain(&dk_p),
        Operand::plain(&wk),
        &mut dr1,
        true,
    );
    T::product(
        p,
        n,
        d,
        kvw,
        Operand::plain(&dv_p),
        Operand::plain(&wv),
        &mut dr1,
        true,
    );
    let q_bias = w.q_bias.map(|_| column_sums(&dq, qw));
    let k_bias = w.k_bias.map(|_| column_sums(&dk, kvw));
    let v_bias = w.v_bias.map(|_| column_sums(&dv, kvw));
    drop((dq_p, dk_p, dv_p));
    drop((dq, dk, dv));
    let (dx_norm, input_layernorm) = rms_norm_grad(x, w.input_layernorm, &dr1, eps);
    let mut dx = dx_norm;
    dx.par_iter_mut()
        .zip(dh.par_iter())
        .for_each(|(a, &b)| *a += b);

    let grads = BlockGrads {
        input_layernorm,
        q_proj,
        k_proj,
        v_proj,
        q_bias,
        k_bias,
        v_bias,
        q_norm,
        k_norm,
        o_proj,
        post_attention_layernorm,
        gate_proj,
        up_proj,
        down_proj,
    };
    (dx, grads)
}
