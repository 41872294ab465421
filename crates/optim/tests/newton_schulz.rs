//! Newton-Schulz output is close to orthogonal: singular values of the quintic iteration land
//! in a band around 1 (measured here; Keller Jordan reports roughly 0.7..1.2).

use candle_core::{DType, Device, Tensor};
use stoke_optim::newton_schulz5;

/// Eigenvalues of a small symmetric matrix by cyclic Jacobi rotations (f64).
// Index loops mirror the textbook rotation formulas (rows p, q and columns p, q of `a`).
#[allow(clippy::needless_range_loop)]
fn symmetric_eigenvalues(mut a: Vec<Vec<f64>>) -> Vec<f64> {
    let n = a.len();
    for _ in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|i| (0..n).map(move |j| (i, j)))
            .filter(|(i, j)| i != j)
            .map(|(i, j)| a[i][j] * a[i][j])
            .sum();
        if off < 1e-22 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                if a[p][q].abs() < 1e-300 {
                    continue;
                }
                let theta = (a[q][q] - a[p][p]) / (2.0 * a[p][q]);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let t = if theta == 0.0 { 1.0 } else { t };
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k][p], a[k][q]);
                    a[k][p] = c * akp - s * akq;
                    a[k][q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p][k], a[q][k]);
                    a[p][k] = c * apk - s * aqk;
                    a[q][k] = s * apk + c * aqk;
                }
            }
        }
    }
    (0..n).map(|i| a[i][i]).collect()
}

/// Singular values of `x` ([m, n]) as sqrt of the eigenvalues of the smaller Gram matrix.
fn singular_values(x: &Tensor) -> Vec<f64> {
    let (m, n) = x.dims2().unwrap();
    let x = x.to_dtype(DType::F64).unwrap();
    let gram = if m <= n {
        x.matmul(&x.t().unwrap()).unwrap()
    } else {
        x.t().unwrap().matmul(&x).unwrap()
    };
    let rows = gram.to_vec2::<f64>().unwrap();
    let mut s: Vec<f64> = symmetric_eigenvalues(rows)
        .into_iter()
        .map(|e| e.max(0.0).sqrt())
        .collect();
    s.sort_by(f64::total_cmp);
    s
}

fn random(rows: usize, cols: usize, seed: u64) -> Tensor {
    // Deterministic pseudo-random values (SplitMix64), so the test needs no RNG crate.
    let mut state = seed;
    let values: Vec<f32> = (0..rows * cols)
        .map(|_| {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            (z >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap()
}

fn check_band(rows: usize, cols: usize, seed: u64) -> (f64, f64) {
    let g = random(rows, cols, seed);
    let o = newton_schulz5(&g, 5).unwrap();
    assert_eq!(o.dims(), &[rows, cols]);
    let s = singular_values(&o);
    let (lo, hi) = (s[0], s[s.len() - 1]);
    assert!(
        lo > 0.6 && hi < 1.25,
        "{rows}x{cols}: singular values in [{lo}, {hi}]"
    );
    (lo, hi)
}

#[test]
fn square_matrix_is_nearly_orthogonal() {
    let (lo, hi) = check_band(64, 64, 1);
    eprintln!("64x64 singular values in [{lo:.3}, {hi:.3}]");
}

#[test]
fn wide_matrix_is_nearly_orthogonal() {
    let (lo, hi) = check_band(32, 96, 2);
    eprintln!("32x96 singular values in [{lo:.3}, {hi:.3}]");
}

#[test]
fn tall_matrix_is_nearly_orthogonal() {
    let (lo, hi) = check_band(96, 32, 3);
    eprintln!("96x32 singular values in [{lo:.3}, {hi:.3}]");
}

#[test]
fn input_scale_does_not_matter() {
    let g = random(16, 24, 4);
    let a = newton_schulz5(&g, 5).unwrap();
    let b = newton_schulz5(&(g * 1000.0).unwrap(), 5).unwrap();
    let diff = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(diff < 1e-4, "{diff}");
}

#[test]
fn zero_input_stays_zero() {
    let z = Tensor::zeros((4, 6), DType::F32, &Device::Cpu).unwrap();
    let o = newton_schulz5(&z, 5).unwrap();
    let max = o
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert_eq!(max, 0.0);
}

#[test]
fn non_matrix_is_an_error() {
    let v = Tensor::zeros(5, DType::F32, &Device::Cpu).unwrap();
    assert!(newton_schulz5(&v, 5).is_err());
}
