//! Host access to f32 tensor data: read a tensor as one `&[f32]`, and update a parameter's storage
//! in place from a second tensor with a closure over plain slices.
//!
//! Why this exists: an optimizer step written as candle tensor ops allocates a fresh tensor for
//! every intermediate (AdamW needs about ten element-wise passes) and runs each pass on its own;
//! one fused pass over the slices, split across rayon's pool, reads and writes each array once.
//! `examples/step_bench.rs` measures both (figures in its doc: about 100x apart).
//! What it is not: a general kernel library. Parameters must be contiguous f32 tensors on the
//! CPU (checked when the optimizer is built); any other source tensor (a gradient on another
//! device or dtype, a strided view) is first copied into that form.
//! Invariant: the closure sees exactly `elem_count` elements of each side, in row-major order.

use std::cell::RefCell;

use candle_core::{CpuStorage, DType, Device, InplaceOp2, Layout, Storage, Tensor};

/// Elements per rayon task in the fused loops: large enough that task overhead is negligible,
/// small enough that a 256x256 matrix still spreads over a few threads.
pub(crate) const CHUNK: usize = 16 * 1024;

/// Runs `f` on `tensor`'s elements as one f32 slice; borrows the storage when the tensor already
/// is a contiguous CPU f32 tensor, otherwise converts a copy.
pub(crate) fn with_f32_slice<R>(
    tensor: &Tensor,
    f: impl FnOnce(&[f32]) -> R,
) -> candle_core::Result<R> {
    {
        let (storage, layout) = tensor.storage_and_layout();
        if let (Storage::Cpu(CpuStorage::F32(data)), Some((start, end))) =
            (&*storage, layout.contiguous_offsets())
        {
            return Ok(f(&data[start..end]));
        }
    }
    let host = host_f32(tensor)?;
    let (storage, layout) = host.storage_and_layout();
    match (&*storage, layout.contiguous_offsets()) {
        (Storage::Cpu(CpuStorage::F32(data)), Some((start, end))) => Ok(f(&data[start..end])),
        _ => candle_core::bail!("could not bring a tensor to contiguous f32 host memory"),
    }
}

/// A contiguous f32 CPU copy of `tensor` (or the tensor itself when it already is one).
fn host_f32(tensor: &Tensor) -> candle_core::Result<Tensor> {
    tensor
        .to_device(&Device::Cpu)?
        .to_dtype(DType::F32)?
        .contiguous()
}

/// Whether `tensor` is something `update_in_place` can write: a contiguous f32 CPU tensor.
pub(crate) fn is_writable_f32(tensor: &Tensor) -> bool {
    tensor.dtype() == DType::F32 && tensor.device().is_cpu() && tensor.is_contiguous()
}

/// Calls `f(dst, src)` with `dst` the (mutable) elements of `dst_tensor` and `src` those of
/// `src_tensor` (same element count). `dst_tensor` must satisfy `is_writable_f32`.
pub(crate) fn update_in_place(
    dst_tensor: &Tensor,
    src_tensor: &Tensor,
    f: impl FnMut(&mut [f32], &[f32]),
) -> candle_core::Result<()> {
    if dst_tensor.elem_count() != src_tensor.elem_count() {
        candle_core::bail!(
            "in-place update: {} destination elements, {} source elements",
            dst_tensor.elem_count(),
            src_tensor.elem_count()
        );
    }
    // A source in another form is copied into contiguous f32 host memory first.
    let src = if is_writable_f32(src_tensor) {
        src_tensor.clone()
    } else {
        host_f32(src_tensor)?
    };
    let op = SliceUpdate { f: RefCell::new(f) };
    match dst_tensor.inplace_op2(&src, &op) {
        Ok(()) => Ok(()),
        // candle refuses a source that shares the destination's storage (it cannot lock one
        // storage for reading and writing at once) before it calls the op, so nothing has been
        // written yet: retry once with a private copy of the source.
        Err(_) => dst_tensor.inplace_op2(&src.copy()?, &op),
    }
}

/// The candle in-place op behind `update_in_place`. `RefCell` because candle hands ops out by
/// shared reference while the closure carries mutable optimizer state.
struct SliceUpdate<F> {
    f: RefCell<F>,
}

impl<F: FnMut(&mut [f32], &[f32])> InplaceOp2 for SliceUpdate<F> {
    fn name(&self) -> &'static str {
        "stoke-optim-slice-update"
    }

    fn cpu_fwd(
        &self,
        dst: &mut CpuStorage,
        dst_layout: &Layout,
        src: &CpuStorage,
        src_layout: &Layout,
    ) -> candle_core::Result<()> {
        let (CpuStorage::F32(dst), CpuStorage::F32(src)) = (dst, src) else {
            candle_core::bail!("stoke-optim in-place update needs f32 storage on both sides")
        };
        let (Some((d0, d1)), Some((s0, s1))) = (
            dst_layout.contiguous_offsets(),
            src_layout.contiguous_offsets(),
        ) else {
            candle_core::bail!("stoke-optim in-place update needs contiguous tensors")
        };
        let mut f = self.f.borrow_mut();
        (*f)(&mut dst[d0..d1], &src[s0..s1]);
        Ok(())
    }
}
