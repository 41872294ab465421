//! AdamW with 8-bit moments (`moments = "int8"`) against f32 AdamW: the same optimization
//! problem ends at nearly the same parameters and loss, the state is a quarter of the size, and
//! save -> load resumes bit for bit.

use candle_core::{Device, Tensor, Var};
use stoke_optim::{AdamWConfig, MomentFormat, Optimizer, OptimizerConfig};

/// Least squares `|A x - b|^2 / n`, overdetermined (one solution), A's columns scaled over one
/// order of magnitude (so the per-coordinate second moments differ), x of 1000 entries
/// (four 8-bit blocks) as one matrix parameter.
/// A deterministic value in [-1, 1) per index (splitmix64): a full-rank random matrix.
fn uniform(i: u64) -> f32 {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 23) as f32 - 1.0
}

struct Problem {
    a: Tensor,
    b: Tensor,
}

const ROWS: usize = 1500;
const COLS: usize = 1000;

impl Problem {
    fn new() -> Problem {
        let dev = Device::Cpu;
        let a: Vec<f32> = (0..ROWS * COLS)
            .map(|i| {
                let c = i % COLS;
                uniform(i as u64) * 10f32.powf(-(c as f32) / COLS as f32)
            })
            .collect();
        let a = Tensor::from_vec(a, (ROWS, COLS), &dev).unwrap();
        // b = A x* for a known x*, so the loss can reach 0 and x approach x*.
        let solution: Vec<f32> = (0..COLS).map(|c| (c as f32 * 0.3).cos()).collect();
        let solution = Tensor::from_vec(solution, (COLS, 1), &dev).unwrap();
        let b = a.matmul(&solution).unwrap();
        Problem { a, b }
    }

    /// Loss and gradient at `x` [COLS, 1].
    fn loss_and_grad(&self, x: &Tensor) -> (f32, Tensor) {
        let residual = (self.a.matmul(x).unwrap() - &self.b).unwrap();
        let loss = residual
            .sqr()
            .unwrap()
            .mean_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        let grad = (self.a.t().unwrap().matmul(&residual).unwrap() * (2.0 / ROWS as f64)).unwrap();
        (loss, grad)
    }
}

fn optimizer(moments: MomentFormat) -> (Optimizer, Var) {
    let x = Var::from_vec(vec![0.0f32; COLS], (COLS, 1), &Device::Cpu).unwrap();
    let config = OptimizerConfig::AdamW(AdamWConfig {
        lr: 1e-2,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        moments,
    });
    // "model.layers.0.mlp.up_proj.weight": a matrix (takes weight decay, here 0).
    let params = vec![("model.layers.0.mlp.up_proj.weight".to_string(), x.clone())];
    (Optimizer::new(config, params).unwrap(), x)
}

fn run(opt: &mut Optimizer, x: &Var, problem: &Problem, steps: usize) -> Vec<f32> {
    (0..steps)
        .map(|_| {
            let (loss, grad) = problem.loss_and_grad(x.as_tensor());
            opt.step(&[grad], 1.0).unwrap();
            loss
        })
        .collect()
}

fn values(x: &Var) -> Vec<f32> {
    x.as_tensor().flatten_all().unwrap().to_vec1().unwrap()
}

#[test]
fn int8_moments_track_f32_adamw() {
    let problem = Problem::new();
    let (mut exact, x_exact) = optimizer(MomentFormat::F32);
    let (mut int8, x_int8) = optimizer(MomentFormat::Int8);
    let steps = 300;
    let exact_losses = run(&mut exact, &x_exact, &problem, steps);
    let int8_losses = run(&mut int8, &x_int8, &problem, steps);
    let (first, last) = (exact_losses[0], exact_losses[steps - 1]);
    assert!(
        last < 0.05 * first,
        "f32 AdamW did not converge: {first} -> {last}"
    );
    let int8_last = int8_losses[steps - 1];
    eprintln!("loss after {steps} steps: f32 {last:.3e}, int8 {int8_last:.3e} (start {first:.3e})");
    assert!(
        (int8_last - last).abs() <= 0.25 * last + 1e-3 * first,
        "int8 loss {int8_last} vs f32 {last}"
    );
    let (a, b) = (values(&x_exact), values(&x_int8));
    let norm: f64 = a.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>().sqrt();
    let dist: f64 = a
        .iter()
        .zip(&b)
        .map(|(&p, &q)| f64::from(p - q).powi(2))
        .sum::<f64>()
        .sqrt();
    eprintln!("relative parameter distance {:.3e}", dist / norm);
    assert!(
        dist / norm < 0.05,
        "parameters differ by {} relative",
        dist / norm
    );
    assert!(dist > 0.0, "int8 moments changed nothing: are they in use?");
    // A quarter of the state, plus one f32 scale per 256 elements.
    assert_eq!(exact.state_bytes(), 8 * COLS);
    assert_eq!(int8.state_bytes(), 2 * COLS + 8 * COLS.div_ceil(256));
}

#[test]
fn int8_state_resumes_bit_for_bit_and_refuses_an_f32_file() {
    let problem = Problem::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("optimizer.safetensors");

    let (mut straight, x_straight) = optimizer(MomentFormat::Int8);
    run(&mut straight, &x_straight, &problem, 40);

    let (mut first, x_first) = optimizer(MomentFormat::Int8);
    run(&mut first, &x_first, &problem, 25);
    first.save_state(&path).unwrap();
    let (mut resumed, x_resumed) = optimizer(MomentFormat::Int8);
    x_resumed.set(x_first.as_tensor()).unwrap();
    resumed.load_state(&path).unwrap();
    assert_eq!(resumed.steps_taken(), 25);
    run(&mut resumed, &x_resumed, &problem, 15);
    assert_eq!(values(&x_straight), values(&x_resumed));

    let (mut f32_opt, _) = optimizer(MomentFormat::F32);
    let error = f32_opt.load_state(&path).unwrap_err().to_string();
    assert!(
        error.contains("int8") && error.contains("optimizer.moments"),
        "{error}"
    );
}
