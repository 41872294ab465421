//! The one CPU dispatch point: which kernels run on this machine, and the `STOKE_*` variables
//! that force a choice.
//!
//! [`VARS`] is the table of every variable (name, accepted values, default, what it chooses);
//! `docs/src/kernels.md` shows the same table and a test holds the two together. Each variable is
//! read once per process, here and nowhere else (a test greps the workspace's sources for other
//! reads). What the kernels ask for is typed: [`level`] (the vector level of the hand-written f32
//! kernels), [`bf16_kernel`] and [`bf16_route`] (the bf16 GEMM), [`matvec_kernel`] (decoding's
//! small-batch products), [`decode_stream`], [`block_path`] and [`decode_path`]. [`chosen`]
//! describes the choices actually made on this CPU, for a run to record in its metadata.
//!
//! Refusal: a value outside a variable's accepted list is an error. [`check_env`] returns every
//! such error (naming the variable and listing the accepted values); binaries call it first
//! thing in `main` and stop on an error. A library user that never calls it still runs: the
//! first read of a refused variable prints the same message once to stderr and falls back to
//! the variable's default, the automatic choice, which is always safe. No kernel panics over
//! the environment. An empty value counts as unset.
//!
//! A forced choice never runs an instruction the CPU lacks: a kernel the CPU cannot run falls
//! back to the automatic choice (each variable's row says how).
//!
//! What it is not: the kernels, nor their tuning (tile shapes, prefetch distances stay with each
//! kernel); `cpu`, `bf16`, `gemm` and `matvec` re-export the choice types under their old paths.
//! Nothing here uses another module of the crate, so every kernel module may use this one.

use std::sync::OnceLock;

/// One `STOKE_*` variable: what it chooses and what it accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Var {
    pub name: &'static str,
    /// Every value it accepts (unset and empty mean the default).
    pub values: &'static [&'static str],
    /// What runs when it is unset.
    pub default: &'static str,
    /// What it chooses.
    pub chooses: &'static str,
}

/// Every kernel-choice variable stoke reads (the rows of `docs/src/kernels.md`).
pub const VARS: &[Var] = &[
    Var {
        name: "STOKE_SIMD",
        values: &["avx512", "avx2", "baseline", "portable"],
        default: "the widest level the CPU has",
        chooses: "the vector level of the hand-written f32 kernels (softmax, SwiGLU, attention \
                  rows, pack conversion); it only lowers the level, and lowers the automatic \
                  bf16 and matvec choices with it (`portable` = `baseline`)",
    },
    Var {
        name: "STOKE_BF16_KERNEL",
        values: &[
            "amx",
            "avx512",
            "avx512-bf16",
            "avx2",
            "portable",
            "f32",
            "rounded-f32",
        ],
        default: "AMX, else AVX512-BF16, else AVX2, else portable; route: packed on AMX or on AMD \
                  with AVX512-BF16, rounded-f32 elsewhere",
        chooses: "the bf16 GEMM kernel (`bf16::backend`) and the route of bf16 products \
                  (`gemm::bf16_route`): a kernel name forces the packed route on that kernel \
                  (if the CPU has it), `f32`/`rounded-f32` the f32 kernel on bf16-rounded values",
    },
    Var {
        name: "STOKE_MATVEC_KERNEL",
        values: &["avx512-bf16", "avx512", "avx2", "portable"],
        default: "the widest the vector level allows (AVX-512 with vdpbf16ps where the CPU has \
                  AVX512-BF16)",
        chooses: "the decode kernel for few-row products (`matvec::kernel`), and the attention's \
                  dot/axpy; a kernel the CPU lacks falls back to the default",
    },
    Var {
        name: "STOKE_DECODE_STREAM",
        values: &["1", "0"],
        default: "1",
        chooses: "whether `linear` streams the weight for decode-sized inputs (`0`: candle's GEMM, \
                  for A/B runs)",
    },
    Var {
        name: "STOKE_DECODE_PREFETCH",
        values: &[
            "nta-256", "nta-1024", "t0-256", "t0-1024", "t0-4096", "t1-1024", "t1-2048", "t1-4096",
            "t1-6144", "t2-4096", "none",
        ],
        default: "by CPU vendor: AMD `nta` at the kernel's own distance (256 bytes at batch 1 \
                  with vdpbf16ps, 1 KiB otherwise); Intel and others `t1-4096`",
        chooses: "the software prefetch of the decode kernels' weight streams when the weights \
                  stream from memory (`HINT-BYTES`: the hint and how far ahead in each stream); \
                  cached weights always prefetch into L1 at the kernel's distance",
    },
    Var {
        name: "STOKE_BLOCK",
        values: &["fused", "graph"],
        default: "fused",
        chooses: "whether a decoder layer trains as one fused node (`fused`, where the layer \
                  allows) or as the per-op tensor graph (`graph`)",
    },
    Var {
        name: "STOKE_DECODE",
        values: &["fused", "graph"],
        default: "fused",
        chooses: "whether decoding runs the fused decode step (`fused`, where the model supports \
                  it) or the tensor graph (`graph`)",
    },
];

/// `name=value` checked against the table: the accepted value, or an error naming the variable
/// and its accepted values. An unknown name is an error too.
pub fn parse(name: &str, value: &str) -> Result<&'static str, String> {
    let Some(var) = VARS.iter().find(|v| v.name == name) else {
        return Err(format!("{name} is not a kernel-choice variable"));
    };
    var.values
        .iter()
        .find(|&&accepted| accepted == value)
        .copied()
        .ok_or_else(|| {
            format!(
                "{name}={value:?} is not an accepted value; {name} accepts {} (unset: {})",
                var.values.join(", "),
                var.default
            )
        })
}

/// The process's value of `name`: None when unset or empty.
fn raw(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Every variable of [`VARS`] whose value in this process's environment is refused, with the
/// accepted values; `Ok` when all are unset or accepted. Binaries call this at start-up.
pub fn check_env() -> Result<(), String> {
    let errors: Vec<String> = VARS
        .iter()
        .filter_map(|var| raw(var.name).and_then(|value| parse(var.name, &value).err()))
        .collect();
    if errors.is_empty() {
        Ok(())
    } else {
        Err(errors.join("\n"))
    }
}

/// The accepted value of each variable (None: unset, empty or refused), read once: a refused
/// value is reported on stderr here, once, and then counts as unset.
fn requested(name: &'static str) -> Option<&'static str> {
    static READ: OnceLock<Vec<Option<&'static str>>> = OnceLock::new();
    let read = READ.get_or_init(|| {
        VARS.iter()
            .map(|var| {
                let value = raw(var.name)?;
                parse(var.name, &value)
                    .map_err(|error| eprintln!("warning: {error}; using the default"))
                    .ok()
            })
            .collect()
    });
    let index = VARS
        .iter()
        .position(|v| v.name == name)
        .unwrap_or_else(|| unreachable!("{name} is not in dispatch::VARS"));
    read[index]
}

/// The vector instruction level the hand-written CPU kernels run at.
///
/// Three levels, from the widest down:
/// - `Avx512`: AVX-512F (+ FMA): 16 f32 lanes, 32 vector registers (Intel Skylake-SP and later
///   servers, AMD Zen 4/5);
/// - `Avx2`: AVX2 + FMA: 8 f32 lanes, 16 vector registers (AMD Zen 1-3, Intel Haswell and later
///   client cores: most laptops and many cloud machines);
/// - `Baseline`: what the compilation target guarantees (SSE2 on x86-64), plain loops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Baseline,
    Avx2,
    Avx512,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Avx512 => "avx512",
            Level::Avx2 => "avx2",
            Level::Baseline => "baseline",
        }
    }
}

/// The widest level this CPU supports, ignoring `STOKE_SIMD`.
pub fn detected() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        let fma = is_x86_feature_detected!("fma");
        if fma && is_x86_feature_detected!("avx512f") {
            return Level::Avx512;
        }
        if fma && is_x86_feature_detected!("avx2") {
            return Level::Avx2;
        }
    }
    Level::Baseline
}

/// The level in use: `detected()`, lowered by `STOKE_SIMD` when set.
pub fn level() -> Level {
    static CHOSEN: OnceLock<Level> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let wanted = match requested("STOKE_SIMD") {
            Some("avx2") => Level::Avx2,
            Some("baseline") | Some("portable") => Level::Baseline,
            _ => Level::Avx512,
        };
        wanted.min(detected())
    })
}

/// Which kernel runs the bf16 matmuls (`bf16::Backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Kernel {
    Amx,
    Avx512Bf16,
    Avx2,
    Portable,
}

impl Bf16Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernel::Amx => "amx",
            Bf16Kernel::Avx512Bf16 => "avx512-bf16",
            Bf16Kernel::Avx2 => "avx2",
            Bf16Kernel::Portable => "portable",
        }
    }

    /// Whether this CPU (and kernel) can run the backend.
    pub fn available(self) -> bool {
        match self {
            Bf16Kernel::Portable => true,
            Bf16Kernel::Avx512Bf16 => avx512_bf16_supported(),
            Bf16Kernel::Avx2 => detected() >= Level::Avx2,
            Bf16Kernel::Amx => amx_supported(),
        }
    }
}

fn avx512_bf16_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AMX-TILE and AMX-BF16 in CPUID, and Linux granted this process the tile data state.
#[allow(unsafe_code)]
fn amx_supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        {
            // CPUID.(EAX=7, ECX=0):EDX bit 22 = AMX-BF16, bit 24 = AMX-TILE.
            let leaf = std::arch::x86_64::__cpuid_count(7, 0);
            let cpu = leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0;
            // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): without it the first
            // tile instruction raises SIGILL. The permission is per process.
            // SAFETY: arch_prctl with these arguments only changes this process's xstate
            // permissions; it reads and writes no memory.
            cpu && unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) } == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
        {
            false
        }
    })
}

/// The bf16 GEMM kernel in use: `STOKE_BF16_KERNEL` if it names one the CPU has, else the
/// fastest available at the vector level (`STOKE_SIMD` lowers it).
pub fn bf16_kernel() -> Bf16Kernel {
    static CHOSEN: OnceLock<Bf16Kernel> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let wanted = match requested("STOKE_BF16_KERNEL") {
            Some("amx") => Some(Bf16Kernel::Amx),
            Some("avx512") | Some("avx512-bf16") => Some(Bf16Kernel::Avx512Bf16),
            Some("avx2") => Some(Bf16Kernel::Avx2),
            Some("portable") => Some(Bf16Kernel::Portable),
            _ => None,
        };
        let level = level();
        match wanted {
            Some(b) if b.available() => b,
            _ if level >= Level::Avx512 && Bf16Kernel::Amx.available() => Bf16Kernel::Amx,
            _ if level >= Level::Avx512 && Bf16Kernel::Avx512Bf16.available() => {
                Bf16Kernel::Avx512Bf16
            }
            _ if level >= Level::Avx2 && Bf16Kernel::Avx2.available() => Bf16Kernel::Avx2,
            _ => Bf16Kernel::Portable,
        }
    })
}

/// How bf16 products run on this CPU (`gemm::Bf16Route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Route {
    /// `crate::bf16`'s packed kernels (AMX, or AVX512-BF16 where it outruns f32 FMA).
    Packed(Bf16Kernel),
    /// Operands rounded to bf16, multiplied by the f32 kernel.
    RoundedF32,
}

/// The route for bf16 products: `STOKE_BF16_KERNEL=f32` forces the rounded-f32 form, another
/// value of it the packed kernel it names; otherwise AMX if present, AVX512-BF16 on AMD, and
/// the rounded-f32 form everywhere else.
pub fn bf16_route() -> Bf16Route {
    static ROUTE: OnceLock<Bf16Route> = OnceLock::new();
    *ROUTE.get_or_init(|| {
        match requested("STOKE_BF16_KERNEL") {
            Some("f32") | Some("rounded-f32") => return Bf16Route::RoundedF32,
            Some(_) => return Bf16Route::Packed(bf16_kernel()),
            None => {}
        }
        match bf16_kernel() {
            Bf16Kernel::Amx => Bf16Route::Packed(Bf16Kernel::Amx),
            Bf16Kernel::Avx512Bf16 if cpu_is_amd() => Bf16Route::Packed(Bf16Kernel::Avx512Bf16),
            _ => Bf16Route::RoundedF32,
        }
    })
}

fn cpu_is_amd() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let leaf = std::arch::x86_64::__cpuid(0);
        // "AuthenticAMD": ebx "Auth", edx "enti", ecx "cAMD".
        leaf.ebx == u32::from_le_bytes(*b"Auth")
            && leaf.edx == u32::from_le_bytes(*b"enti")
            && leaf.ecx == u32::from_le_bytes(*b"cAMD")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Which kernel runs `matvec` (`matvec::Kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatvecKernel {
    /// AVX-512F with `vdpbf16ps` for bf16 weights (AVX512-BF16: AMD Zen 4 and later, Intel
    /// Cooper Lake and Sapphire Rapids and later); f32 weights as `Avx512`.
    Avx512Bf16,
    Avx512,
    Avx2,
    Portable,
}

impl MatvecKernel {
    pub fn name(self) -> &'static str {
        match self {
            MatvecKernel::Avx512Bf16 => "avx512-bf16",
            MatvecKernel::Avx512 => "avx512",
            MatvecKernel::Avx2 => "avx2",
            MatvecKernel::Portable => "portable",
        }
    }

    /// Whether this CPU can run the kernel.
    pub fn available(self) -> bool {
        match self {
            MatvecKernel::Avx512Bf16 => detected() >= Level::Avx512 && avx512_bf16_supported(),
            MatvecKernel::Avx512 => detected() >= Level::Avx512,
            MatvecKernel::Avx2 => detected() >= Level::Avx2,
            MatvecKernel::Portable => true,
        }
    }
}

/// The matvec kernel in use: the widest the vector level allows (AVX-512 with `vdpbf16ps` where
/// the CPU has AVX512-BF16), unless `STOKE_MATVEC_KERNEL` names one the CPU has.
pub fn matvec_kernel() -> MatvecKernel {
    static CHOSEN: OnceLock<MatvecKernel> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let wanted = match requested("STOKE_MATVEC_KERNEL") {
            Some("avx512-bf16") => Some(MatvecKernel::Avx512Bf16),
            Some("avx512") => Some(MatvecKernel::Avx512),
            Some("avx2") => Some(MatvecKernel::Avx2),
            Some("portable") => Some(MatvecKernel::Portable),
            _ => None,
        };
        if let Some(kernel) = wanted.filter(|k| k.available()) {
            return kernel;
        }
        match level() {
            Level::Avx512 if MatvecKernel::Avx512Bf16.available() => MatvecKernel::Avx512Bf16,
            Level::Avx512 => MatvecKernel::Avx512,
            Level::Avx2 => MatvecKernel::Avx2,
            Level::Baseline => MatvecKernel::Portable,
        }
    })
}

/// Whether `linear::Decoding` scopes stream the weight for few rows (`STOKE_DECODE_STREAM=0`
/// turns it off).
pub fn decode_stream() -> bool {
    requested("STOKE_DECODE_STREAM") != Some("0")
}

/// The software prefetch hint of a decode kernel's weight stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefetchHint {
    /// No software prefetch: the hardware prefetchers alone.
    None,
    /// `prefetcht0`: into every cache level.
    T0,
    /// `prefetcht1`: into L2 and the last-level cache, not L1.
    T1,
    /// `prefetcht2`.
    T2,
    /// `prefetchnta`: non-temporal, close to the core, bypassing what it can.
    Nta,
}

impl PrefetchHint {
    pub fn name(self) -> &'static str {
        match self {
            PrefetchHint::None => "none",
            PrefetchHint::T0 => "t0",
            PrefetchHint::T1 => "t1",
            PrefetchHint::T2 => "t2",
            PrefetchHint::Nta => "nta",
        }
    }
}

/// How the decode kernels read weights that stream from memory (a model larger than the
/// caches), chosen per CPU: from `STOKE_DECODE_PREFETCH`, else from a table keyed by the CPU's
/// vendor. Results never depend on it (a prefetch is a hint, a tile's shape does not change
/// any output's sum).
///
/// Why per vendor, measured on SmolLM2-135M's 269 MB of bf16 weights, 2 threads, batch 1 as a
/// share of the read rate measured beside it (`bench_decode_share`, bench/README.md "Decoding
/// across CPU families"):
/// - AMD (Zen 4, AVX2 Zen): `prefetchnta` a short distance ahead was the fastest, 90-97%;
/// - Intel Xeon (Sapphire Rapids class, AVX512-BF16 + AMX): the same `prefetchnta` reached
///   31-34%. An NTA prefetch there fills L1 without L2, so the L2 streamer never sees the
///   stream and only the software prefetches are in flight (4 lines a thread at 256 bytes).
///   No software prefetch at all gave 67-69% (the hardware prefetchers alone); `prefetcht1`
///   (into L2) 4-6 KiB ahead 87-93%.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePrefetch {
    /// The hint for streaming weights.
    pub hint: PrefetchHint,
    /// Bytes ahead in each row's stream; `None`: the kernel's own distance per batch size.
    pub ahead: Option<usize>,
    /// Weight rows per `vdpbf16ps` tile at 8 inputs: 3 (24 accumulators, the AMD choice) or 2
    /// (16: on Intel the compiler's spills of the 3-row tile cost about a fifth at batch 8).
    pub dp_rows_at_8: usize,
    /// Where the choice came from: `STOKE_DECODE_PREFETCH` or the vendor's row of the table.
    pub source: &'static str,
}

impl DecodePrefetch {
    /// One line for run metadata.
    pub fn describe(&self) -> String {
        let ahead = self.ahead.map_or("the kernel's distance".to_string(), |b| {
            format!("{b} bytes ahead")
        });
        format!(
            "{} {ahead}, {}-row vdpbf16ps tiles at batch 8 ({})",
            self.hint.name(),
            self.dp_rows_at_8,
            self.source
        )
    }
}

/// The decode kernels' prefetch for streaming weights on this CPU (see [`DecodePrefetch`]).
pub fn decode_prefetch() -> DecodePrefetch {
    static CHOSEN: OnceLock<DecodePrefetch> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let amd = cpu_is_amd();
        let table = if amd {
            DecodePrefetch {
                hint: PrefetchHint::Nta,
                ahead: None,
                dp_rows_at_8: 3,
                source: "table: AMD",
            }
        } else {
            DecodePrefetch {
                hint: PrefetchHint::T1,
                ahead: Some(4096),
                dp_rows_at_8: 2,
                source: "table: Intel and others",
            }
        };
        let Some(value) = requested("STOKE_DECODE_PREFETCH") else {
            return table;
        };
        let (hint, ahead) = value.split_once('-').unwrap_or((value, "0"));
        let hint = match hint {
            "nta" => PrefetchHint::Nta,
            "t0" => PrefetchHint::T0,
            "t1" => PrefetchHint::T1,
            "t2" => PrefetchHint::T2,
            _ => PrefetchHint::None,
        };
        DecodePrefetch {
            hint,
            ahead: ahead.parse().ok().filter(|&b| b > 0),
            source: "STOKE_DECODE_PREFETCH",
            ..table
        }
    })
}

/// How a decoder layer runs in training (`STOKE_BLOCK`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockPath {
    /// One fused graph node per layer where the layer allows it (`block`).
    Fused,
    /// The per-op tensor graph.
    Graph,
}

/// The block path in use (`STOKE_BLOCK=graph` forces the tensor graph).
pub fn block_path() -> BlockPath {
    match requested("STOKE_BLOCK") {
        Some("graph") => BlockPath::Graph,
        _ => BlockPath::Fused,
    }
}

/// How decoding runs (`STOKE_DECODE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePath {
    /// The fused decode step, for models that support it.
    Fused,
    /// The tensor graph.
    Graph,
}

/// The decode path in use (`STOKE_DECODE=graph` forces the tensor graph).
pub fn decode_path() -> DecodePath {
    match requested("STOKE_DECODE") {
        Some("graph") => DecodePath::Graph,
        _ => DecodePath::Fused,
    }
}

/// The kernels chosen on this CPU, as `(key, value)` pairs for a run's metadata: the vector
/// level in use and detected, the bf16 kernel and route, the matvec kernel, decode streaming,
/// the block and decode paths, then each `STOKE_*` variable that is set (as given). Callers
/// record it beside their results (the benchmark examples put it under `"kernels"`).
pub fn chosen() -> Vec<(&'static str, String)> {
    let route = match bf16_route() {
        Bf16Route::Packed(kernel) => format!("packed {}", kernel.name()),
        Bf16Route::RoundedF32 => "rounded-f32".to_string(),
    };
    let mut out = vec![
        ("simd", level().name().to_string()),
        ("simd_detected", detected().name().to_string()),
        ("bf16_kernel", bf16_kernel().name().to_string()),
        ("bf16_route", route),
        ("matvec_kernel", matvec_kernel().name().to_string()),
        ("decode_stream", decode_stream().to_string()),
        ("decode_prefetch", decode_prefetch().describe()),
        (
            "block",
            match block_path() {
                BlockPath::Fused => "fused",
                BlockPath::Graph => "graph",
            }
            .to_string(),
        ),
        (
            "decode",
            match decode_path() {
                DecodePath::Fused => "fused",
                DecodePath::Graph => "graph",
            }
            .to_string(),
        ),
    ];
    out.extend(
        VARS.iter()
            .filter_map(|var| Some((var.name, raw(var.name)?))),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_value_is_refused_by_name_with_the_accepted_values() {
        let error = parse("STOKE_SIMD", "avx9000").unwrap_err();
        assert!(error.contains("STOKE_SIMD"), "{error}");
        assert!(error.contains("avx9000"), "{error}");
        for value in ["avx512", "avx2", "baseline", "portable"] {
            assert!(error.contains(value), "{error} lacks {value}");
        }
        let error = parse("STOKE_DECODE", "Graph").unwrap_err();
        assert!(
            error.contains("STOKE_DECODE") && error.contains("fused, graph"),
            "{error}"
        );
    }

    #[test]
    fn every_accepted_value_parses_and_names_outside_the_table_are_refused() {
        for var in VARS {
            for value in var.values {
                assert_eq!(parse(var.name, value), Ok(*value));
            }
            assert!(parse(var.name, "").is_err(), "{}", var.name);
        }
        assert!(parse("STOKE_NOT_A_KERNEL", "x").is_err());
    }

    #[test]
    fn the_table_has_one_row_per_variable_and_a_default_for_each() {
        for (i, var) in VARS.iter().enumerate() {
            assert!(var.name.starts_with("STOKE_"), "{}", var.name);
            assert!(!var.values.is_empty() && !var.default.is_empty() && !var.chooses.is_empty());
            assert!(
                VARS[i + 1..].iter().all(|other| other.name != var.name),
                "{} twice",
                var.name
            );
        }
    }

    #[test]
    fn chosen_names_the_instruction_set_and_every_choice() {
        let chosen = chosen();
        let get = |key: &str| {
            chosen
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
                .unwrap_or_else(|| panic!("chosen() lacks {key}: {chosen:?}"))
        };
        assert_eq!(get("simd"), level().name());
        assert_eq!(get("simd_detected"), detected().name());
        assert_eq!(get("bf16_kernel"), bf16_kernel().name());
        assert_eq!(get("matvec_kernel"), matvec_kernel().name());
        for key in ["bf16_route", "decode_stream", "block", "decode"] {
            assert!(!get(key).is_empty());
        }
        eprintln!("kernels on this CPU: {chosen:?}");
    }

    #[test]
    fn forced_choices_never_exceed_the_cpu() {
        assert!(level() <= detected());
        assert!(bf16_kernel().available());
        assert!(matvec_kernel().available());
        if let Bf16Route::Packed(kernel) = bf16_route() {
            assert!(kernel.available());
        }
    }

    /// The workspace's sources (`crates/*/{src,examples,benches}`) read no `STOKE_*` kernel
    /// variable outside this module: the table is every such variable. Test-only and bench-only
    /// variables (fixtures, bench directories, the sandbox helper's descriptor) are not kernel
    /// choices and stay where they are used.
    #[test]
    fn no_source_outside_dispatch_reads_a_stoke_variable_itself() {
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let this = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/dispatch.rs");
        let mut files = Vec::new();
        for krate in std::fs::read_dir(&crates).unwrap() {
            let krate = krate.unwrap().path();
            for dir in ["src", "examples", "benches"] {
                collect_rs(&krate.join(dir), &mut files);
            }
        }
        assert!(files.len() > 20, "found only {} source files", files.len());
        let allowed = |name: &str| name.starts_with("STOKE_BENCH_");
        let mut offenders = Vec::new();
        for file in &files {
            if file.canonicalize().ok() == this.canonicalize().ok() {
                continue;
            }
            let text = std::fs::read_to_string(file).unwrap();
            for pattern in ["env::var(\"STOKE_", "env::var_os(\"STOKE_"] {
                for (at, _) in text.match_indices(pattern) {
                    let rest = &text[at + pattern.len() - "STOKE_".len()..];
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || *c == '_' || c.is_ascii_digit())
                        .collect();
                    if !allowed(&name) {
                        offenders.push(format!("{}: {name}", file.display()));
                    }
                }
            }
        }
        assert!(offenders.is_empty(), "read outside dispatch: {offenders:?}");
    }

    fn collect_rs(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_dir() {
                collect_rs(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    #[test]
    fn the_kernels_doc_lists_every_variable_and_its_values() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/src/kernels.md");
        let doc =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for var in VARS {
            let row = doc
                .lines()
                .find(|line| line.starts_with('|') && line.contains(&format!("`{}`", var.name)))
                .unwrap_or_else(|| panic!("docs/src/kernels.md has no table row for {}", var.name));
            for value in var.values {
                assert!(
                    row.contains(&format!("`{value}`")),
                    "docs/src/kernels.md: the {} row lacks `{value}`",
                    var.name
                );
            }
        }
    }
}
