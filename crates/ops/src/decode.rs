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
//!   per layer (five in a prefill); the cheap row-wise work (norms, residual adds) is repeated by
//!   every thread on its own copy of the hidden state, so it needs no barrier;
//! - each sequence's KV cache is one preallocated buffer written in place; sequences of
//!   different lengths share a step, and join or leave between steps (continuous batching).
//!
//! Numerics follow the graph path (`Transformer::forward`): f32 throughout, RMSNorm as
//! `kernels::rms_norm_fused`, RoPE in the rotate-half form, softmax in f32; with bf16 weights
//! the inputs of every product are rounded to bf16 and the sums are f32 (the policy of
//! `bf16.rs`). Results equal the graph's up to f32 summation order, and do not depend on the
//! number of threads.
//!
//! `prefill_step` runs the same code for several tokens of one sequence (a prompt): their keys
//! and values are written first, then each attends causally to its row.
//!
//! What it is not: a sampler, or differentiable.
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

impl ModelRef<'_> {
    /// Bytes of weight matrices one decode step reads (the embedding rows it reads are few).
    pub fn weight_bytes(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flat_map(|l| [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down])
            .map(|linear| linear.weight.bytes())
            .sum();
        layers + self.head.bytes()
    }
}

/// Above this many bytes of weights a decode step's products treat them as streaming from
/// memory (`Inputs::stream_weights`): past the last-level cache of common CPUs (16-32 MiB), a
/// step's weights are gone from cache by the time the next step reads them again.
const STREAM_WEIGHT_BYTES: usize = 32 << 20;

/// Keys (after RoPE) and values of every decoded sequence.
///
/// Each row (sequence) owns its buffer, laid out `[layer][k | v][kv_head][capacity][head_dim]`,
/// with its own capacity, its own number of filled slots (`len`) and its own first real slot
/// (`start`: slots before it are left padding of a batched prompt and never attended to). Rows
/// are ragged: a step appends one slot to every row, wherever that row is, so sequences of
/// different lengths share a step, and rows join (`append`) and leave (`select_rows`) between
/// steps without moving the others (continuous batching).
#[derive(Debug, Clone)]
pub struct DecodeCache {
    layers: usize,
    kv_heads: usize,
    head_dim: usize,
    rows: Vec<CacheRow>,
}

/// One sequence's keys and values.
#[derive(Debug, Clone)]
struct CacheRow {
    capacity: usize,
    start: usize,
    len: usize,
    data: Vec<f32>,
}

impl CacheRow {
    fn new(layers: usize, kv_heads: usize, head_dim: usize, capacity: usize) -> CacheRow {
        CacheRow {
            capacity,
            start: 0,
            len: 0,
            data: vec![0.0; layers * 2 * kv_heads * capacity * head_dim],
        }
    }
}

/// Offset of (layer, k or v, head, slot 0) in a row buffer of `capacity` slots.
fn row_offset(
    kv_heads: usize,
    head_dim: usize,
    capacity: usize,
    layer: usize,
    value: bool,
    head: usize,
) -> usize {
    ((layer * 2 + value as usize) * kv_heads + head) * capacity * head_dim
}

impl DecodeCache {
    /// An empty cache of `rows` sequences of `capacity` slots each.
    pub fn new(
        rows: usize,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        capacity: usize,
    ) -> Self {
        DecodeCache {
            layers,
            kv_heads,
            head_dim,
            rows: (0..rows)
                .map(|_| CacheRow::new(layers, kv_heads, head_dim, capacity))
                .collect(),
        }
    }

    /// Offset of (layer, k or v, head, slot 0) inside `row`'s buffer.
    fn offset(&self, row: usize, layer: usize, value: bool, head: usize) -> usize {
        row_offset(
            self.kv_heads,
            self.head_dim,
            self.rows[row].capacity,
            layer,
            value,
            head,
        )
    }

    pub fn rows(&self) -> usize {
        self.rows.len()
    }

    /// The largest number of filled slots of any row (all rows have the same when they were
    /// filled and stepped together).
    pub fn len(&self) -> usize {
        self.rows.iter().map(|r| r.len).max().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The smallest capacity of any row (slots per row).
    pub fn capacity(&self) -> usize {
        self.rows.iter().map(|r| r.capacity).min().unwrap_or(0)
    }

    /// Filled slots of `row`.
    pub fn row_len(&self, row: usize) -> usize {
        self.rows[row].len
    }

    /// Slots `row` has room for.
    pub fn row_capacity(&self, row: usize) -> usize {
        self.rows[row].capacity
    }

    /// Bytes held (the memory report's KV cache).
    pub fn bytes(&self) -> usize {
        self.rows.iter().map(|r| r.data.len() * 4).sum()
    }

    /// Fills slots `0..len` of `row`, `layer` from keys and values `[kv_heads, len, head_dim]`
    /// (the graph cache's layout), and sets the row's first real slot. The row's filled length
    /// is set with `set_len` (every row) or `set_row_len`.
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
        assert!(
            row < self.rows()
                && layer < self.layers
                && len <= self.rows[row].capacity
                && start <= len
        );
        assert_eq!(keys.len(), heads * len * d, "DecodeCache::fill: keys");
        assert_eq!(values.len(), heads * len * d, "DecodeCache::fill: values");
        for (value, src) in [(false, keys), (true, values)] {
            for head in 0..heads {
                let at = self.offset(row, layer, value, head);
                self.rows[row].data[at..at + len * d]
                    .copy_from_slice(&src[head * len * d..(head + 1) * len * d]);
            }
        }
        self.rows[row].start = start;
    }

    /// Room for at least `capacity` slots in every row (filled slots are kept; buffers are
    /// reallocated, so grow geometrically).
    pub fn reserve(&mut self, capacity: usize) {
        for row in 0..self.rows() {
            self.reserve_row(row, capacity);
        }
    }

    /// Room for at least `capacity` slots in `row`.
    pub fn reserve_row(&mut self, row: usize, capacity: usize) {
        let old = &self.rows[row];
        if capacity <= old.capacity {
            return;
        }
        let mut grown = CacheRow::new(self.layers, self.kv_heads, self.head_dim, capacity);
        let d = self.head_dim;
        for layer in 0..self.layers {
            for value in [false, true] {
                for head in 0..self.kv_heads {
                    let from = row_offset(self.kv_heads, d, old.capacity, layer, value, head);
                    let to = row_offset(self.kv_heads, d, capacity, layer, value, head);
                    grown.data[to..to + old.len * d]
                        .copy_from_slice(&old.data[from..from + old.len * d]);
                }
            }
        }
        grown.len = old.len;
        grown.start = old.start;
        self.rows[row] = grown;
    }

    /// The number of filled slots of every row.
    pub fn set_len(&mut self, len: usize) {
        for row in 0..self.rows() {
            self.set_row_len(row, len);
        }
    }

    /// The number of filled slots of `row`.
    pub fn set_row_len(&mut self, row: usize, len: usize) {
        let r = &mut self.rows[row];
        assert!(
            len <= r.capacity && r.start <= len,
            "DecodeCache::set_row_len: {len} outside {}..={}",
            r.start,
            r.capacity
        );
        r.len = len;
    }

    /// Keeps rows `rows` (in that order; a row may repeat, which copies it).
    pub fn select_rows(&mut self, rows: &[usize]) {
        assert!(
            rows.iter().all(|&r| r < self.rows()),
            "DecodeCache::select_rows: a row out of range for {} rows",
            self.rows()
        );
        let mut taken: Vec<Option<CacheRow>> = std::mem::take(&mut self.rows)
            .into_iter()
            .map(Some)
            .collect();
        let mut kept = Vec::with_capacity(rows.len());
        for (i, &from) in rows.iter().enumerate() {
            // The last use of a row moves it; earlier uses copy it.
            let again = rows[i + 1..].contains(&from);
            let row = if again {
                taken[from].clone()
            } else {
                taken[from].take()
            };
            kept.push(row.expect("a row is moved only at its last use"));
        }
        self.rows = kept;
    }

    /// Moves every row of `other` (a cache of the same model shape) after this cache's rows.
    pub fn append(&mut self, other: DecodeCache) -> Result<(), String> {
        if (self.layers, self.kv_heads, self.head_dim)
            != (other.layers, other.kv_heads, other.head_dim)
        {
            return Err(format!(
                "DecodeCache::append: a cache of {} layers x {} kv heads x {} onto one of {} x {} x {}",
                other.layers,
                other.kv_heads,
                other.head_dim,
                self.layers,
                self.kv_heads,
                self.head_dim
            ));
        }
        self.rows.extend(other.rows);
        Ok(())
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
fn add_into(x: &mut [f32], add: &[f32]) {
    for (v, &a) in x.iter_mut().zip(add) {
        *v += a;
    }
}

/// `out = silu(gate) * up`, with the vectorized `exp` (the fused training block's SwiGLU uses
/// the same one).
fn swiglu_into(gate: &[f32], up: &[f32], out: &mut [f32]) {
    crate::vexp::dispatch(
        #[inline(always)]
        || {
            for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
                *o = g * crate::vexp::sigmoid(g) * u;
            }
        },
    )
}

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
    let rows = cache.rows();
    if tokens.len() != rows || positions.len() != rows {
        return Err(format!(
            "decode step: {} tokens and {} positions for a cache of {rows} rows",
            tokens.len(),
            positions.len()
        ));
    }
    if let Some((row, full)) = cache
        .rows
        .iter()
        .enumerate()
        .find(|(_, r)| r.len >= r.capacity)
    {
        return Err(format!(
            "decode step: row {row} of the KV cache is full ({} slots)",
            full.capacity
        ));
    }
    let targets: Vec<(usize, usize)> = cache.rows.iter().map(|r| r.len).enumerate().collect();
    let all: Vec<usize> = (0..rows).collect();
    let logits = run_step(model, cache, tokens, positions, &targets, &all, threads)?;
    for row in &mut cache.rows {
        row.len += 1;
    }
    Ok(logits)
}

/// Prefills `tokens` (the next tokens of the sequence in cache row `row`, at `positions`) in one
/// pass: their keys and values are appended to the row, each token attends to the row's earlier
/// slots and to the tokens before it (causal). Returns the logits of the tokens listed in
/// `logits_for` (indices into `tokens`, e.g. only the last: what sampling needs), `[len,
/// vocab]` row-major. Up to `GEMM_MIN_ROWS` tokens the products stream each weight once per
/// block of rows for all tokens (`matvec`): no per-call packing, so a short prompt costs little
/// more than its arithmetic, and every value is the one the decode step computes for that token
/// (same kernels, same summation order per output), so such chunks give the same bits in any
/// chunking. A longer chunk multiplies f32 weights with a GEMM (faster there; its values equal
/// the streaming ones to f32 rounding, and repeat bit for bit for the same chunk).
pub fn prefill_step(
    model: &ModelRef,
    cache: &mut DecodeCache,
    row: usize,
    tokens: &[u32],
    positions: &[u32],
    logits_for: &[usize],
    threads: usize,
) -> Result<Vec<f32>, String> {
    let m = tokens.len();
    if row >= cache.rows() {
        return Err(format!(
            "prefill: row {row} of a cache of {} rows",
            cache.rows()
        ));
    }
    if positions.len() != m || m == 0 {
        return Err(format!(
            "prefill: {m} tokens and {} positions",
            positions.len()
        ));
    }
    let target = &cache.rows[row];
    if target.len + m > target.capacity {
        return Err(format!(
            "prefill: {m} tokens after {} do not fit row {row}'s {} slots",
            target.len, target.capacity
        ));
    }
    if let Some(&bad) = logits_for.iter().find(|&&i| i >= m) {
        return Err(format!("prefill: logits asked for token {bad} of {m}"));
    }
    let targets: Vec<(usize, usize)> = (0..m).map(|i| (row, target.len + i)).collect();
    let logits = run_step(
        model, cache, tokens, positions, &targets, logits_for, threads,
    )?;
    cache.rows[row].len += m;
    Ok(logits)
}

/// One pass of input rows through the model: input row `r` (`tokens[r]` at `positions[r]`)
/// writes its keys and values to slot `targets[r].1` of cache row `targets[r].0` and attends to
/// that row's slots from its first real one through its own. Returns the logits of input rows
/// `head_rows`. The caller checked that the slots exist and advances the rows' lengths.
fn run_step(
    model: &ModelRef,
    cache: &mut DecodeCache,
    tokens: &[u32],
    positions: &[u32],
    targets: &[(usize, usize)],
    head_rows: &[usize],
    threads: usize,
) -> Result<Vec<f32>, String> {
    let s = model.shape;
    let rows = tokens.len();
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
    let mut logits = vec![0f32; head_rows.len() * s.vocab];
    let cache_rows: Vec<RowView> = cache
        .rows
        .iter_mut()
        .map(|r| RowView {
            capacity: r.capacity,
            start: r.start,
            data: Shared::new(&mut r.data),
        })
        .collect();
    let buffers = Buffers {
        qkv: Shared::new(&mut qkv),
        attn: Shared::new(&mut attn),
        proj: Shared::new(&mut proj),
        act: Shared::new(&mut act),
        logits: Shared::new(&mut logits),
    };
    let threads = threads.clamp(1, 64);
    let barrier = SpinBarrier::new(threads);
    let job = Step {
        model,
        cache: CacheView {
            kv_heads: s.kv_heads,
            head_dim: d,
            rows: &cache_rows,
        },
        targets,
        head_rows,
        prefill: targets.windows(2).any(|w| w[0].0 == w[1].0),
        tokens,
        cos: &cos,
        sin: &sin,
        buffers: &buffers,
        barrier: &barrier,
        threads,
    };
    crate::step_threads::run(threads, &|thread| job.run(thread));
    Ok(logits)
}

struct Buffers {
    qkv: Shared,
    attn: Shared,
    proj: Shared,
    act: Shared,
    logits: Shared,
}

/// One cache row's shape, copied so its data can be shared separately.
struct RowView {
    capacity: usize,
    start: usize,
    data: Shared,
}

/// The cache's shape and its rows' data, for one step.
struct CacheView<'a> {
    kv_heads: usize,
    head_dim: usize,
    rows: &'a [RowView],
}

impl CacheView<'_> {
    /// Offset of (layer, k or v, head, slot 0) inside `row`'s buffer.
    fn offset(&self, row: usize, layer: usize, value: bool, head: usize) -> usize {
        row_offset(
            self.kv_heads,
            self.head_dim,
            self.rows[row].capacity,
            layer,
            value,
            head,
        )
    }
}

struct Step<'a> {
    model: &'a ModelRef<'a>,
    cache: CacheView<'a>,
    /// (cache row, slot) of each input row.
    targets: &'a [(usize, usize)],
    /// The input rows whose logits are computed.
    head_rows: &'a [usize],
    /// Several input rows write one cache row (a prefill).
    prefill: bool,
    tokens: &'a [u32],
    cos: &'a [f32],
    sin: &'a [f32],
    buffers: &'a Buffers,
    barrier: &'a SpinBarrier,
    threads: usize,
}

/// Output rows of a product per unit of work split between threads.
const ROW_ALIGN: usize = 16;

/// Tokens of a prefill chunk from which products run as a GEMM (f32 weights).
const GEMM_MIN_ROWS: usize = 48;

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
            self.multiply(
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

    /// `out[b, j - range.start] = sum_k W[j, k] x[b, k]` for `j` in `range`: the streaming
    /// kernel, or for a large prefill chunk with f32 weights a GEMM on this thread (past
    /// `GEMM_MIN_ROWS` tokens it is faster than streaming the weights per 8 tokens). Decode
    /// steps always stream, so a sequence's values never depend on how many share its step.
    ///
    /// # Safety
    /// As `matvec_raw`.
    unsafe fn multiply(
        &self,
        weights: &Weights,
        x: &Inputs,
        range: std::ops::Range<usize>,
        out: *mut f32,
        out_stride: usize,
    ) {
        if let (true, Weights::F32 { data, cols, .. }, Some(xs)) = (
            self.prefill && x.batch() >= GEMM_MIN_ROWS,
            weights,
            x.f32_rows(),
        ) {
            // SAFETY: forwarded (the caller's contract); the weight rows exist.
            unsafe {
                crate::gemm::product_rows_t_on_this_thread(
                    x.batch(),
                    range.len(),
                    *cols,
                    xs,
                    &data[range.start * cols..range.end * cols],
                    out,
                    out_stride,
                )
            };
            return;
        }
        // SAFETY: forwarded.
        unsafe { matvec_raw(weights, x, range, out, out_stride) };
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
        x.stream_weights(m.weight_bytes() > STREAM_WEIGHT_BYTES);
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
            // Stage 2: keys (normed, rotated) and values into the cache, then attention, by
            // (row, kv head). When rows share a cache row (a prefill), a row reads the keys
            // other tasks write, so all are written first, behind a barrier; and its later rows
            // attend to more slots, so the tasks are dealt out in turn rather than in ranges.
            if self.prefill {
                for task in share(rows * s.kv_heads, thread, t, 1) {
                    self.write_kv(layer, l, task / s.kv_heads, task % s.kv_heads);
                }
                self.barrier.wait();
                for task in (thread..rows * s.kv_heads).step_by(t) {
                    self.attention(layer, l, task / s.kv_heads, task % s.kv_heads);
                }
            } else {
                for task in share(rows * s.kv_heads, thread, t, 1) {
                    self.write_kv(layer, l, task / s.kv_heads, task % s.kv_heads);
                    self.attention(layer, l, task / s.kv_heads, task % s.kv_heads);
                }
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
                    self.multiply(&layer.gate.weight, &x, mine.clone(), gate.as_mut_ptr(), n);
                    self.multiply(&layer.up.weight, &x, mine.clone(), up.as_mut_ptr(), n);
                }
                for r in 0..rows {
                    let (g, u) = (&mut gate[r * n..(r + 1) * n], &mut up[r * n..(r + 1) * n]);
                    if let Some(bias) = layer.gate.bias {
                        add_into(g, &bias[mine.clone()]);
                    }
                    if let Some(bias) = layer.up.bias {
                        add_into(u, &bias[mine.clone()]);
                    }
                    // SAFETY: columns `mine` of `act` are this thread's until the barrier.
                    let out = unsafe { b.act.write(r * inter + mine.start..r * inter + mine.end) };
                    swiglu_into(g, u, out);
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
        let wanted: Vec<f32> = self
            .head_rows
            .iter()
            .flat_map(|&r| h[r * hidden..(r + 1) * hidden].iter().copied())
            .collect();
        let mut normed = vec![0f32; wanted.len()];
        rms_norm_into(&wanted, m.final_norm, s.rms_norm_eps, &mut normed);
        x.prepare(&normed, self.head_rows.len(), hidden, m.head.is_bf16());
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

    /// Input row `row`'s key and value of key/value head `g` (key normed, rotated) into its slot
    /// of the cache.
    fn write_kv(&self, layer: &LayerRef, l: usize, row: usize, g: usize) {
        let s = self.model.shape;
        let d = s.head_dim;
        let (q_out, kv_out) = (s.q_heads * d, s.kv_heads * d);
        let qkv_width = q_out + 2 * kv_out;
        let (cache_row, slot) = self.targets[row];
        let c = &self.cache;
        let cache = &c.rows[cache_row].data;
        let (cos, sin) = (
            &self.cos[row * d..(row + 1) * d],
            &self.sin[row * d..(row + 1) * d],
        );
        // SAFETY: stage 1 wrote `qkv`; only reads until the barrier after this stage.
        let qkv = unsafe {
            self.buffers
                .qkv
                .read(row * qkv_width..(row + 1) * qkv_width)
        };
        let k_at = c.offset(cache_row, l, false, g);
        let v_at = c.offset(cache_row, l, true, g);
        // SAFETY: (cache row, layer, head g, slot) belongs to this task alone: input rows have
        // distinct (cache row, slot) targets.
        let key = unsafe { cache.write(k_at + slot * d..k_at + (slot + 1) * d) };
        key.copy_from_slice(&qkv[q_out + g * d..q_out + (g + 1) * d]);
        if let Some(norm) = layer.k_norm {
            let raw = key.to_vec();
            rms_norm_into(&raw, norm, s.rms_norm_eps, key);
        }
        rope(key, cos, sin);
        // SAFETY: as above.
        let value = unsafe { cache.write(v_at + slot * d..v_at + (slot + 1) * d) };
        value.copy_from_slice(&qkv[q_out + kv_out + g * d..q_out + kv_out + (g + 1) * d]);
    }

    /// RoPE on input row `row`'s query heads of group `g`, then softmax attention of each over
    /// its cache row's slots from the first real one through its own.
    fn attention(&self, layer: &LayerRef, l: usize, row: usize, g: usize) {
        let s = self.model.shape;
        let d = s.head_dim;
        let (q_out, kv_out) = (s.q_heads * d, s.kv_heads * d);
        let qkv_width = q_out + 2 * kv_out;
        let (cache_row, slot) = self.targets[row];
        let c = &self.cache;
        let cache = &c.rows[cache_row].data;
        let b = self.buffers;
        let (cos, sin) = (
            &self.cos[row * d..(row + 1) * d],
            &self.sin[row * d..(row + 1) * d],
        );
        let eps = s.rms_norm_eps;
        // SAFETY: stage 1 wrote `qkv`; only reads until the barrier after this stage.
        let qkv = unsafe { b.qkv.read(row * qkv_width..(row + 1) * qkv_width) };
        let k_at = c.offset(cache_row, l, false, g);
        let v_at = c.offset(cache_row, l, true, g);
        let first = c.rows[cache_row].start;
        let slots = slot + 1 - first;
        // SAFETY: stage 2a wrote these slots (or earlier steps did); no task writes the cache
        // in this stage.
        let keys = unsafe { cache.read(k_at + first * d..k_at + (slot + 1) * d) };
        // SAFETY: as above.
        let values = unsafe { cache.read(v_at + first * d..v_at + (slot + 1) * d) };
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
            for score in &mut scores {
                *score -= max;
            }
            let total = crate::vexp::exp_in_place_sum(&mut scores);
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

    /// Element 0 of (row, layer 0, k or v, head 0, slot 0).
    fn first(cache: &DecodeCache, row: usize, value: bool) -> f32 {
        cache.rows[row].data[cache.offset(row, 0, value, 0)]
    }

    fn starts(cache: &DecodeCache) -> Vec<usize> {
        cache.rows.iter().map(|r| r.start).collect()
    }

    #[test]
    fn select_rows_drops_rows_and_fans_out_by_copy() {
        let mut cache = DecodeCache::new(3, 1, 1, 2, 2);
        for row in 0..3 {
            let k: Vec<f32> = vec![row as f32; 4];
            let v: Vec<f32> = vec![10.0 + row as f32; 4];
            cache.fill(row, 0, &k, &v, 2, row.min(1));
        }
        cache.set_len(2);
        cache.select_rows(&[0, 2]);
        assert_eq!(cache.rows(), 2);
        assert_eq!(first(&cache, 1, false), 2.0);
        assert_eq!(first(&cache, 1, true), 12.0);
        assert_eq!(starts(&cache), vec![0, 1]);
        cache.select_rows(&[1, 1, 0]);
        assert_eq!(cache.rows(), 3);
        assert_eq!(first(&cache, 0, false), 2.0);
        assert_eq!(first(&cache, 1, false), 2.0);
        assert_eq!(first(&cache, 2, true), 10.0);
        assert_eq!(starts(&cache), vec![1, 1, 0]);
    }

    #[test]
    fn rows_of_other_lengths_and_capacities_join_and_leave() {
        let mut cache = DecodeCache::new(1, 1, 1, 2, 4);
        cache.fill(0, 0, &[1.0; 6], &[2.0; 6], 3, 0);
        cache.set_len(3);
        let mut joining = DecodeCache::new(2, 1, 1, 2, 9);
        joining.fill(1, 0, &[5.0; 2], &[6.0; 2], 1, 0);
        joining.set_row_len(1, 1);
        cache.append(joining).unwrap();
        assert_eq!(cache.rows(), 3);
        assert_eq!(
            (0..3)
                .map(|r| (cache.row_len(r), cache.row_capacity(r)))
                .collect::<Vec<_>>(),
            vec![(3, 4), (0, 9), (1, 9)]
        );
        assert_eq!((cache.len(), cache.capacity()), (3, 4));
        assert_eq!(first(&cache, 2, true), 6.0);
        cache.select_rows(&[2]);
        assert_eq!((cache.len(), cache.capacity()), (1, 9));
        assert!(DecodeCache::new(0, 2, 1, 2, 4).append(cache).is_err());
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
            (cache.capacity(), cache.len(), starts(&cache)),
            (5, 2, vec![0, 1])
        );
        for row in 0..2 {
            for layer in 0..2 {
                for value in [false, true] {
                    for head in 0..2 {
                        let a = before.offset(row, layer, value, head);
                        let b = cache.offset(row, layer, value, head);
                        assert_eq!(
                            before.rows[row].data[a..a + 6],
                            cache.rows[row].data[b..b + 6]
                        );
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
