//! The fused decode step: one new token for each of a few sequences through a whole decoder-only
//! transformer (Llama / Qwen2 / Qwen3 layouts), on a preallocated KV cache, without building a
//! tensor graph.
//!
//! Why: decoding is bound by the bytes of the weights, and a graph of candle tensors costs far
//! more than that at batch 1-8 (measured on SmolLM2-135M: a 25 ms step, of which streaming the
//! bf16 weights is about 6). Here a step is straight-line code over plain slices:
//! - every linear layer is a `matvec` that reads each weight once for the whole batch;
//! - the threads of one step split every product's output rows (and the attention's
//!   (sequence, key/value head) pairs) and meet at a spin barrier between dependent stages, four
//!   per layer; the cheap row-wise work (norms, residual adds) is repeated by every thread on its
//!   own copy of the hidden state, so it needs no barrier;
//! - the KV cache is one preallocated buffer written in place.
//!
//! Numerics follow the graph path (`Transformer::forward`): f32 throughout, RMSNorm as
//! `kernels::rms_norm_fused`, RoPE in the rotate-half form, softmax in f32; with bf16 weights
//! the inputs of every product are rounded to bf16 and the sums are f32 (the policy of
//! `bf16.rs`). Results equal the graph's up to f32 summation order, and do not depend on the
//! number of threads.
//!
//! What it is not: a prefill (prompts go through the batched graph, then `DecodeCache` takes the
//! keys and values), a sampler, or differentiable.
#![allow(unsafe_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::matvec::{Inputs, Weights, matvec_raw};

/// The model's dimensions and constants a step needs.
#[derive(Debug, Clone)]
pub struct DecodeShape {
    pub hidden: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub intermediate: usize,
    pub vocab: usize,
    pub rms_norm_eps: f64,
    /// RoPE inverse frequencies (`head_dim / 2`) and the attention factor cos/sin are scaled by.
    pub inv_freq: Vec<f32>,
    pub attention_factor: f32,
}

/// One linear layer: its weight and optional bias.
#[derive(Debug, Clone, Copy)]
pub struct LinearRef<'a> {
    pub weight: Weights<'a>,
    pub bias: Option<&'a [f32]>,
}

/// One decoder block's tensors.
#[derive(Debug, Clone, Copy)]
pub struct LayerRef<'a> {
    pub input_norm: &'a [f32],
    pub post_attention_norm: &'a [f32],
    pub q: LinearRef<'a>,
    pub k: LinearRef<'a>,
    pub v: LinearRef<'a>,
    pub o: LinearRef<'a>,
    /// Per-head RMSNorm of queries and keys (Qwen3), before RoPE.
    pub q_norm: Option<&'a [f32]>,
    pub k_norm: Option<&'a [f32]>,
    pub gate: LinearRef<'a>,
    pub up: LinearRef<'a>,
    pub down: LinearRef<'a>,
}

/// The whole model, borrowed for one step.
#[derive(Debug, Clone)]
pub struct ModelRef<'a> {
    pub shape: &'a DecodeShape,
    /// `[vocab, hidden]` f32.
    pub embed: &'a [f32],
    pub layers: Vec<LayerRef<'a>>,
    pub final_norm: &'a [f32],
    pub head: Weights<'a>,
}

/// Keys (after RoPE) and values of every decoded sequence, preallocated for `capacity` slots.
///
/// Layout: row-major `[row][layer][k | v][kv_head][capacity][head_dim]`, so a sequence's whole
/// cache is contiguous (dropping finished rows moves blocks, in place). Every row holds `len`
/// slots; row `r`'s slots before `start[r]` are padding (a left-padded prompt) and never
/// attended to.
#[derive(Debug, Clone)]
pub struct DecodeCache {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
    start: Vec<usize>,
    data: Vec<f32>,
}

impl DecodeCache {
    /// An empty cache of `rows` sequences.
    pub fn new(
        rows: usize,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Self {
        let per_row = layers * 2 * kv_heads * capacity * head_dim;
        DecodeCache {
            layers,
            kv_heads,
            head_dim,
            capacity,
            len: 0,
            start: vec![0; rows],
            data: vec![0.0; rows * per_row],
        }
    }

    fn row_len(&self) -> usize {
        self.view().row_len()
    }

    /// Offset of (row, layer, k or v, head, slot 0).
    fn offset(&self, row: usize, layer: usize, value: bool, head: usize) -> usize {
        self.view().offset(row, layer, value, head)
    }

    /// The shape, borrowed apart from the data (the step shares the data separately).
    fn view(&self) -> CacheView<'_> {
        CacheView {
            layers: self.layers,
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            capacity: self.capacity,
            len: self.len,
            start: &self.start,
        }
    }

    pub fn rows(&self) -> usize {
        self.start.len()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes held (the memory report's KV cache).
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// Fills slots `0..len` of `row`, `layer` from keys and values `[kv_heads, len, head_dim]`
    /// (the graph cache's layout), and sets the row's first real slot. Every row must be filled
    /// to the same `len` before a step (`set_len`).
    pub fn fill(
        &mut self,
        row: usize,
        layer: usize,
        keys: &[f32],
        values: &[f32],
        len: usize,
        start: usize,
    ) {
        let (heads, d) = (self.kv_heads, self.head_dim);
        assert!(row < self.rows() && layer < self.layers && len <= self.capacity && start <= len);
        assert_eq!(keys.len(), heads * len * d, "DecodeCache::fill: keys");
        assert_eq!(values.len(), heads * len * d, "DecodeCache::fill: values");
        for (value, src) in [(false, keys), (true, values)] {
            for head in 0..heads {
                let at = self.offset(row, layer, value, head);
                self.data[at..at + len * d]
                    .copy_from_slice(&src[head * len * d..(head + 1) * len * d]);
            }
        }
        self.start[row] = start;
    }

    /// Room for at least `capacity` slots per row (filled slots are kept; the buffer is
    /// reallocated, so grow geometrically).
    pub fn reserve(&mut self, capacity: usize) {
        if capacity <= self.capacity {
            return;
        }
        let mut grown = DecodeCache::new(
            self.rows(),
            self.layers,
            self.kv_heads,
            self.head_dim,
            capacity,
        );
        let d = self.head_dim;
        for row in 0..self.rows() {
            for layer in 0..self.layers {
                for value in [false, true] {
                    for head in 0..self.kv_heads {
                        let from = self.offset(row, layer, value, head);
                        let to = grown.offset(row, layer, value, head);
                        grown.data[to..to + self.len * d]
                            .copy_from_slice(&self.data[from..from + self.len * d]);
                    }
                }
            }
        }
        grown.len = self.len;
        grown.start = std::mem::take(&mut self.start);
        *self = grown;
    }

    /// The number of filled slots of every row.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.capacity,
            "DecodeCache::set_len: {len} > capacity {}",
            self.capacity
        );
        self.len = len;
    }

    /// Keeps rows `rows` (in that order; a row may repeat). Strictly increasing rows (dropping
    /// finished sequences) move in place; anything else copies.
    pub fn select_rows(&mut self, rows: &[usize]) {
        assert!(
            rows.iter().all(|&r| r < self.rows()),
            "DecodeCache::select_rows: a row out of range for {} rows",
            self.rows()
        );
        let n = self.row_len();
        if rows.windows(2).all(|w| w[0] < w[1]) {
            for (to, &from) in rows.iter().enumerate() {
                if to != from {
                    self.data.copy_within(from * n..(from + 1) * n, to * n);
                }
            }
            self.data.truncate(rows.len() * n);
        } else {
            let mut data = Vec::with_capacity(rows.len() * n);
            for &from in rows {
                data.extend_from_slice(&self.data[from * n..(from + 1) * n]);
            }
            self.data = data;
        }
        self.start = rows.iter().map(|&r| self.start[r]).collect();
    }
}

/// A barrier for the threads of one step: spins (the stages between barriers take
/// microseconds), then yields, so an oversubscribed machine still makes progress.
struct SpinBarrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
}

impl SpinBarrier {
    fn new(threads: usize) -> Self {
        SpinBarrier {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
        }
    }

    fn wait(&self) {
        if self.threads == 1 {
            return;
        }
        let generation = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == generation {
            if spins < 20_000 {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// A buffer the step's threads share. Between two barriers each element has at most one writer
/// and no reader other than that writer, or only readers (see `step_thread` for the stages).
struct Shared {
    ptr: *mut f32,
    len: usize,
}

// SAFETY: access follows the stage discipline documented on the type; the pointer outlives the
// step (it points into buffers owned by `decode_step`'s frame or the cache).
unsafe impl Sync for Shared {}
// SAFETY: as for Sync.
unsafe impl Send for Shared {}

impl Shared {
    fn new(buffer: &mut [f32]) -> Shared {
        Shared {
            ptr: buffer.as_mut_ptr(),
            len: buffer.len(),
        }
    }

    /// # Safety
    /// No thread writes `range` until the next barrier.
    unsafe fn read(&self, range: std::ops::Range<usize>) -> &[f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds; no concurrent writer (the caller's contract).
        unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) }
    }

    /// # Safety
    /// This thread alone accesses `range` until the next barrier.
    #[allow(clippy::mut_from_ref)]
    unsafe fn write(&self, range: std::ops::Range<usize>) -> &mut [f32] {
        assert!(range.start <= range.end && range.end <= self.len);
        // SAFETY: in bounds; exclusive (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(range.start), range.len()) }
    }
}

/// This thread's part of `0..n` when `threads` split it, in multiples of `align`.
fn share(n: usize, thread: usize, threads: usize, align: usize) -> std::ops::Range<usize> {
    let chunk = n.div_ceil(threads).div_ceil(align) * align;
    let start = (thread * chunk).min(n);
    start..(start + chunk).min(n)
}

fn rms_norm_into(x: &[f32], weight: &[f32], eps: f64, out: &mut [f32]) {
    let width = weight.len();
    for (y, row) in out.chunks_exact_mut(width).zip(x.chunks_exact(width)) {
        let r = crate::kernels::inv_rms(row, eps);
        for ((o, &v), &w) in y.iter_mut().zip(row).zip(weight) {
            *o = v * r * w;
        }
    }
}

/// Rotate-half RoPE of one head in place.
fn rope(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let half = x.len() / 2;
    for i in 0..half {
        let (a, b) = (x[i], x[i + half]);
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

/// Runs one decode step: `tokens[r]` at `positions[r]` for every cache row `r`; appends their
/// keys and values to the cache and returns the logits, `[rows, vocab]` row-major. `threads`
/// threads share the work (the calling thread is one of them).
pub fn decode_step(
    model: &ModelRef,
    cache: &mut DecodeCache,
    tokens: &[u32],
    positions: &[u32],
    threads: usize,
) -> Result<Vec<f32>, String> {
    let s = model.shape;
    let rows = cache.rows();
    if tokens.len() != rows || positions.len() != rows {
        return Err(format!(
            "decode step: {} tokens and {} positions for a cache of {rows} rows",
            tokens.len(),
            positions.len()
        ));
    }
    if cache.len >= cache.capacity {
        return Err(format!(
            "decode step: the KV cache is full ({} slots)",
            cache.capacity
        ));
    }
    if (cache.layers, cache.kv_heads, cache.head_dim)
        != (model.layers.len(), s.kv_heads, s.head_dim)
    {
        return Err("decode step: the KV cache was made for another model shape".into());
    }
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= s.vocab) {
        return Err(format!(
            "decode step: token id {bad} is outside the vocabulary ({})",
            s.vocab
        ));
    }
    if !s.q_heads.is_multiple_of(s.kv_heads) || s.inv_freq.len() * 2 != s.head_dim {
        return Err("decode step: inconsistent head counts or RoPE table".into());
    }
    // Every product of a step reads inputs prepared once for one layout.
    let bf16 = model.head.is_bf16();
    let same_layout = model.layers.iter().all(|l| {
        [l.q, l.k, l.v, l.o, l.gate, l.up, l.down]
            .iter()
            .all(|x| x.weight.is_bf16() == bf16)
    });
    if !same_layout {
        return Err("decode step: the weights mix f32 and bf16 layouts".into());
    }
    let d = s.head_dim;
    // cos/sin per row, as `RotaryTable::cos_sin` computes them ([cos | cos], [sin | sin]).
    let mut cos = vec![0f32; rows * d];
    let mut sin = vec![0f32; rows * d];
    for (r, &p) in positions.iter().enumerate() {
        for (k, inv) in s.inv_freq.iter().enumerate() {
            let angle = p as f32 * inv;
            let (c, si) = (
                angle.cos() * s.attention_factor,
                angle.sin() * s.attention_factor,
            );
            cos[r * d + k] = c;
            cos[r * d + k + d / 2] = c;
            sin[r * d + k] = si;
            sin[r * d + k + d / 2] = si;
        }
    }
    let q_out = s.q_heads * d;
    let kv_out = s.kv_heads * d;
    let qkv_width = q_out + 2 * kv_out;
    let mut qkv = vec![0f32; rows * qkv_width];
    let mut attn = vec![0f32; rows * q_out];
    let mut proj = vec![0f32; rows * s.hidden];
    let mut act = vec![0f32; rows * s.intermediate];
    let mut logits = vec![0f32; rows * s.vocab];
    let buffers = Buffers {
        qkv: Shared::new(&mut qkv),
        attn: Shared::new(&mut attn),
        proj: Shared::new(&mut proj),
        act: Shared::new(&mut act),
        logits: Shared::new(&mut logits),
        cache: Shared::new(&mut cache.data),
    };
    let threads = threads.clamp(1, 64);
    let barrier = SpinBarrier::new(threads);
    let job = Step {
        model,
        cache: cache.view(),
        tokens,
        cos: &cos,
        sin: &sin,
        buffers: &buffers,
        barrier: &barrier,
        threads,
    };
    if threads == 1 {
        job.run(0);
    } else {
        std::thread::scope(|scope| {
            for thread in 1..threads {
                let job = &job;
                scope.spawn(move || {
                    crate::numerics::set_ftz_daz_on_this_thread();
                    job.run(thread)
                });
            }
            job.run(0);
        });
    }
    cache.len += 1;
    Ok(logits)
}

struct Buffers {
    qkv: Shared,
    attn: Shared,
    proj: Shared,
    act: Shared,
    logits: Shared,
    cache: Shared,
}

/// The cache's shape, copied so the data can be shared separately.
struct CacheView<'a> {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    len: usize,
    start: &'a [usize],
}

impl CacheView<'_> {
    fn row_len(&self) -> usize {
        self.layers * 2 * self.kv_heads * self.capacity * self.head_dim
    }

    fn offset(&self, row: usize, layer: usize, value: bool, head: usize) -> usize {
        row * self.row_len()
            + ((layer * 2 + value as usize) * self.kv_heads + head) * self.capacity * self.head_dim
    }
}

struct Step<'a> {
    model: &'a ModelRef<'a>,
    cache: CacheView<'a>,
    tokens: &'a [u32],
    cos: &'a [f32],
    sin: &'a [f32],
    buffers: &'a Buffers,
    barrier: &'a SpinBarrier,
    threads: usize,
}

/// Output rows of a product per unit of work split between threads.
const ROW_ALIGN: usize = 16;

impl Step<'_> {
    /// `out[b, cols]` = rows `range` of `linear` (plus its bias) for every input row; `out` is a
    /// shared `[rows, width]` buffer and this thread owns columns `offset + range`.
    ///
    /// Safety contract (of the stage): no other thread touches those columns until the barrier.
    fn product(
        &self,
        linear: &LinearRef,
        x: &Inputs,
        range: std::ops::Range<usize>,
        out: &Shared,
        width: usize,
        offset: usize,
    ) {
        if range.is_empty() {
            return;
        }
        let rows = x.batch();
        assert!(rows == 0 || (rows - 1) * width + offset + range.end <= out.len);
        // SAFETY: the columns `offset + range` of every row are this thread's until the barrier
        // (the split in the callers is disjoint) and lie inside `out` (asserted).
        unsafe {
            matvec_raw(
                &linear.weight,
                x,
                range.clone(),
                out.ptr.add(offset + range.start),
                width,
            )
        };
        if let Some(bias) = linear.bias {
            for b in 0..rows {
                let at = b * width + offset + range.start;
                // SAFETY: as above.
                let y = unsafe { out.write(at..at + range.len()) };
                for (v, &add) in y.iter_mut().zip(&bias[range.clone()]) {
                    *v += add;
                }
            }
        }
    }

    fn run(&self, thread: usize) {
        let m = self.model;
        let s = m.shape;
        let rows = self.tokens.len();
        let (d, hidden, inter) = (s.head_dim, s.hidden, s.intermediate);
        let (q_out, kv_out) = (s.q_heads * d, s.kv_heads * d);
        let qkv_width = q_out + 2 * kv_out;
        let b = self.buffers;
        let t = self.threads;
        // This thread's copy of the residual stream.
        let mut h = vec![0f32; rows * hidden];
        for (r, &token) in self.tokens.iter().enumerate() {
            let at = token as usize * hidden;
            h[r * hidden..(r + 1) * hidden].copy_from_slice(&m.embed[at..at + hidden]);
        }
        let mut normed = vec![0f32; rows * hidden];
        let mut x = Inputs::new();
        let mut gate = Vec::new();
        let mut up = Vec::new();
        for (l, layer) in m.layers.iter().enumerate() {
            // Stage 1: q, k, v (one row range over the three, concatenated).
            rms_norm_into(&h, layer.input_norm, s.rms_norm_eps, &mut normed);
            x.prepare(&normed, rows, hidden, layer.q.weight.is_bf16());
            let mine = share(qkv_width, thread, t, ROW_ALIGN);
            for (linear, first, width) in [
                (&layer.q, 0, q_out),
                (&layer.k, q_out, kv_out),
                (&layer.v, q_out + kv_out, kv_out),
            ] {
                let lo = mine.start.max(first);
                let hi = mine.end.min(first + width);
                if lo < hi {
                    self.product(linear, &x, lo - first..hi - first, &b.qkv, qkv_width, first);
                }
            }
            self.barrier.wait();
            // Stage 2: RoPE, cache append and attention, split by (row, kv head).
            for task in share(rows * s.kv_heads, thread, t, 1) {
                self.attention(layer, l, task / s.kv_heads, task % s.kv_heads);
            }
            self.barrier.wait();
            // Stage 3: o_proj.
            // SAFETY: stage 2 wrote `attn`; until the next barrier only reads happen.
            let attn = unsafe { b.attn.read(0..rows * q_out) };
            x.prepare(attn, rows, q_out, layer.o.weight.is_bf16());
            self.product(
                &layer.o,
                &x,
                share(hidden, thread, t, ROW_ALIGN),
                &b.proj,
                hidden,
                0,
            );
            self.barrier.wait();
            // Stage 4: residual, norm, gate and up for this thread's intermediate rows, SwiGLU.
            // SAFETY: stage 3 wrote `proj`; its next write (stage 5) comes after the barrier
            // below.
            let o = unsafe { b.proj.read(0..rows * hidden) };
            for (v, &add) in h.iter_mut().zip(o) {
                *v += add;
            }
            rms_norm_into(&h, layer.post_attention_norm, s.rms_norm_eps, &mut normed);
            x.prepare(&normed, rows, hidden, layer.gate.weight.is_bf16());
            let mine = share(inter, thread, t, ROW_ALIGN);
            let n = mine.len();
            if n > 0 {
                gate.resize(rows * n, 0.0);
                up.resize(rows * n, 0.0);
                // SAFETY: `gate` and `up` are this thread's own, [rows, n].
                unsafe {
                    matvec_raw(&layer.gate.weight, &x, mine.clone(), gate.as_mut_ptr(), n);
                    matvec_raw(&layer.up.weight, &x, mine.clone(), up.as_mut_ptr(), n);
                }
                for r in 0..rows {
                    // SAFETY: columns `mine` of `act` are this thread's until the barrier.
                    let out = unsafe { b.act.write(r * inter + mine.start..r * inter + mine.end) };
                    for (i, o) in out.iter_mut().enumerate() {
                        let mut g = gate[r * n + i];
                        let mut u = up[r * n + i];
                        if let Some(bias) = layer.gate.bias {
                            g += bias[mine.start + i];
                        }
                        if let Some(bias) = layer.up.bias {
                            u += bias[mine.start + i];
                        }
                        *o = g / (1.0 + (-g).exp()) * u;
                    }
                }
            }
            self.barrier.wait();
            // Stage 5: down_proj.
            // SAFETY: stage 4 wrote `act`; only reads until the barrier.
            let a = unsafe { b.act.read(0..rows * inter) };
            x.prepare(a, rows, inter, layer.down.weight.is_bf16());
            self.product(
                &layer.down,
                &x,
                share(hidden, thread, t, ROW_ALIGN),
                &b.proj,
                hidden,
                0,
            );
            self.barrier.wait();
            // SAFETY: stage 5 wrote `proj`; the next write is stage 3 of the next layer, two
            // barriers later.
            let down = unsafe { b.proj.read(0..rows * hidden) };
            for (v, &add) in h.iter_mut().zip(down) {
                *v += add;
            }
        }
        rms_norm_into(&h, m.final_norm, s.rms_norm_eps, &mut normed);
        x.prepare(&normed, rows, hidden, m.head.is_bf16());
        let head = LinearRef {
            weight: m.head,
            bias: None,
        };
        self.product(
            &head,
            &x,
            share(s.vocab, thread, t, ROW_ALIGN),
            &b.logits,
            s.vocab,
            0,
        );
    }

    /// RoPE on the new query heads of group `g` and its key head, the key and value written to
    /// the cache's newest slot, then softmax attention of each query head over the row's slots.
    fn attention(&self, layer: &LayerRef, l: usize, row: usize, g: usize) {
        let s = self.model.shape;
        let d = s.head_dim;
        let (q_out, kv_out) = (s.q_heads * d, s.kv_heads * d);
        let qkv_width = q_out + 2 * kv_out;
        let c = &self.cache;
        let b = self.buffers;
        let (cos, sin) = (
            &self.cos[row * d..(row + 1) * d],
            &self.sin[row * d..(row + 1) * d],
        );
        let eps = s.rms_norm_eps;
        // SAFETY: stage 1 wrote `qkv`; only reads until the barrier after this stage.
        let qkv = unsafe { b.qkv.read(row * qkv_width..(row + 1) * qkv_width) };
        let slot = c.len;
        let k_at = c.offset(row, l, false, g);
        let v_at = c.offset(row, l, true, g);
        {
            // SAFETY: (row, layer, head g) of the cache belongs to this task alone.
            let key = unsafe { b.cache.write(k_at + slot * d..k_at + (slot + 1) * d) };
            key.copy_from_slice(&qkv[q_out + g * d..q_out + (g + 1) * d]);
            if let Some(norm) = layer.k_norm {
                let raw = key.to_vec();
                rms_norm_into(&raw, norm, eps, key);
            }
            rope(key, cos, sin);
            // SAFETY: as above.
            let value = unsafe { b.cache.write(v_at + slot * d..v_at + (slot + 1) * d) };
            value.copy_from_slice(&qkv[q_out + kv_out + g * d..q_out + kv_out + (g + 1) * d]);
        }
        let first = c.start[row];
        let slots = slot + 1 - first;
        // SAFETY: this task's own cache region; written above, read now by this task only.
        let keys = unsafe { b.cache.read(k_at + first * d..k_at + (slot + 1) * d) };
        // SAFETY: as above.
        let values = unsafe { b.cache.read(v_at + first * d..v_at + (slot + 1) * d) };
        let scale = (1.0 / (d as f64).sqrt()) as f32;
        let group = s.q_heads / s.kv_heads;
        let mut q = vec![0f32; d];
        let mut scores = vec![0f32; slots];
        let mut out = vec![0f32; d];
        for head in g * group..(g + 1) * group {
            q.copy_from_slice(&qkv[head * d..(head + 1) * d]);
            if let Some(norm) = layer.q_norm {
                let raw = q.clone();
                rms_norm_into(&raw, norm, eps, &mut q);
            }
            rope(&mut q, cos, sin);
            let mut max = f32::NEG_INFINITY;
            for (score, key) in scores.iter_mut().zip(keys.chunks_exact(d)) {
                *score = crate::matvec::dot(&q, key) * scale;
                max = max.max(*score);
            }
            let mut total = 0f32;
            for score in &mut scores {
                *score = (*score - max).exp();
                total += *score;
            }
            out.fill(0.0);
            for (&p, value) in scores.iter().zip(values.chunks_exact(d)) {
                crate::matvec::axpy(&mut out, p / total, value);
            }
            // SAFETY: head `head` of row `row` in `attn` belongs to this task alone.
            let dst = unsafe {
                b.attn
                    .write(row * q_out + head * d..row * q_out + (head + 1) * d)
            };
            dst.copy_from_slice(&out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_cover_every_row_once_in_aligned_blocks() {
        for n in [0, 1, 15, 16, 17, 576, 49_152, 1_000] {
            for threads in 1..=5 {
                let mut seen = vec![0u8; n];
                for t in 0..threads {
                    let r = share(n, t, threads, 16);
                    assert!(r.start.is_multiple_of(16) || r.is_empty());
                    for i in r {
                        seen[i] += 1;
                    }
                }
                assert!(seen.iter().all(|&c| c == 1), "n {n} threads {threads}");
            }
        }
    }

    #[test]
    fn select_rows_drops_in_place_and_fans_out_by_copy() {
        let mut cache = DecodeCache::new(3, 1, 1, 2, 2);
        for row in 0..3 {
            let k: Vec<f32> = vec![row as f32; 4];
            let v: Vec<f32> = vec![10.0 + row as f32; 4];
            cache.fill(row, 0, &k, &v, 2, row.min(1));
        }
        cache.set_len(2);
        cache.select_rows(&[0, 2]);
        assert_eq!(cache.rows(), 2);
        assert_eq!(cache.data[cache.offset(1, 0, false, 0)], 2.0);
        assert_eq!(cache.data[cache.offset(1, 0, true, 0)], 12.0);
        assert_eq!(cache.start, vec![0, 1]);
        cache.select_rows(&[1, 1, 0]);
        assert_eq!(cache.rows(), 3);
        assert_eq!(cache.data[cache.offset(0, 0, false, 0)], 2.0);
        assert_eq!(cache.data[cache.offset(1, 0, false, 0)], 2.0);
        assert_eq!(cache.data[cache.offset(2, 0, true, 0)], 10.0);
        assert_eq!(cache.start, vec![1, 1, 0]);
    }

    #[test]
    fn reserve_keeps_the_filled_slots() {
        let mut cache = DecodeCache::new(2, 2, 2, 3, 2);
        for row in 0..2 {
            for layer in 0..2 {
                let k: Vec<f32> = (0..12)
                    .map(|i| (row * 100 + layer * 10 + i) as f32)
                    .collect();
                let v: Vec<f32> = k.iter().map(|x| -x).collect();
                cache.fill(row, layer, &k, &v, 2, row);
            }
        }
        cache.set_len(2);
        let before = cache.clone();
        cache.reserve(5);
        assert_eq!(
            (cache.capacity(), cache.len(), cache.start.clone()),
            (5, 2, vec![0, 1])
        );
        for row in 0..2 {
            for layer in 0..2 {
                for value in [false, true] {
                    for head in 0..2 {
                        let a = before.offset(row, layer, value, head);
                        let b = cache.offset(row, layer, value, head);
                        assert_eq!(before.data[a..a + 6], cache.data[b..b + 6]);
                    }
                }
            }
        }
    }

    #[test]
    fn the_spin_barrier_orders_stages() {
        let threads = 3;
        let barrier = SpinBarrier::new(threads);
        let counter = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    for stage in 0..200 {
                        counter.fetch_add(1, Ordering::SeqCst);
                        barrier.wait();
                        assert!(counter.load(Ordering::SeqCst) >= (stage + 1) * threads);
                        barrier.wait();
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::SeqCst), 200 * threads);
    }
}
