//! `stoke sandbox ...`: inspect the sandbox for untrusted code.
//!
//! `probe` prints which isolation layers this machine allows (a table, or `--json`);
//! `run` executes one source file in the sandbox and prints the result as JSON, for trying
//! programs and limits by hand. Neither changes anything on the machine.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use stoke_sandbox::{IsolationLevel, Language, Program, Sandbox, SandboxConfig};

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Print the isolation layers available on this machine.
    Probe(ProbeArgs),
    /// Run one source file in the sandbox and print the result as JSON.
    Run(RunArgs),
}

#[derive(Args)]
pub struct ProbeArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, ValueEnum)]
enum LanguageArg {
    Python,
    Bash,
    Perl,
    C,
}

#[derive(Clone, Copy, ValueEnum)]
enum LevelArg {
    Basic,
    Confined,
    Full,
}

#[derive(Args)]
pub struct RunArgs {
    /// The source file.
    file: PathBuf,
    /// Its language (default: from the extension: .py, .sh, .pl, .c).
    #[arg(long, value_enum)]
    language: Option<LanguageArg>,
    /// A file whose contents become the program's stdin.
    #[arg(long)]
    stdin: Option<PathBuf>,
    /// Wall-clock limit in seconds.
    #[arg(long, default_value_t = 10.0)]
    timeout: f64,
    /// Address-space limit in MiB.
    #[arg(long, default_value_t = 1024)]
    memory_mib: u64,
    /// Refuse to run below this isolation level.
    #[arg(long, value_enum, default_value = "confined")]
    min_isolation: LevelArg,
    /// Arguments passed to the program.
    #[arg(last = true)]
    args: Vec<String>,
}

pub fn run(command: SandboxCommand) -> anyhow::Result<()> {
    match command {
        SandboxCommand::Probe(args) => probe(args),
        SandboxCommand::Run(args) => run_file(args),
    }
}

fn probe(args: ProbeArgs) -> anyhow::Result<()> {
    let report = stoke_sandbox::probe();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}

fn language_of(args: &RunArgs) -> anyhow::Result<Language> {
    if let Some(language) = args.language {
        return Ok(match language {
            LanguageArg::Python => Language::Python,
            LanguageArg::Bash => Language::Bash,
            LanguageArg::Perl => Language::Perl,
            LanguageArg::C => Language::C,
        });
    }
    let extension = args
        .file
        .extension()
        .and_then(|ext| ext.to_str())
        .unwrap_or("");
    match extension {
        "py" => Ok(Language::Python),
        "sh" | "bash" => Ok(Language::Bash),
        "pl" => Ok(Language::Perl),
        "c" => Ok(Language::C),
        _ => anyhow::bail!(
            "{}: cannot tell the language from the extension {extension:?}; pass --language",
            args.file.display()
        ),
    }
}

fn run_file(args: RunArgs) -> anyhow::Result<()> {
    let language = language_of(&args)?;
    let source = std::fs::read_to_string(&args.file)
        .with_context(|| format!("reading {}", args.file.display()))?;
    let stdin = match &args.stdin {
        Some(path) => std::fs::read(path).with_context(|| format!("reading {}", path.display()))?,
        None => Vec::new(),
    };
    if !(args.timeout.is_finite() && args.timeout > 0.0 && args.timeout < 1e6) {
        anyhow::bail!(
            "--timeout must be a positive number of seconds, got {}",
            args.timeout
        );
    }
    let config = SandboxConfig {
        wall_timeout: Duration::from_secs_f64(args.timeout),
        cpu_seconds: args.timeout.ceil() as u64,
        memory_bytes: args
            .memory_mib
            .checked_mul(1 << 20)
            .context("--memory-mib is too large")?,
        min_isolation: match args.min_isolation {
            LevelArg::Basic => IsolationLevel::Basic,
            LevelArg::Confined => IsolationLevel::Confined,
            LevelArg::Full => IsolationLevel::Full,
        },
        workers: 1,
        ..SandboxConfig::default()
    };
    let sandbox = Sandbox::new(config)?;
    let result = sandbox.run_blocking(Program {
        language,
        source,
        stdin,
        files: Vec::new(),
        args: args.args,
        isolated: false,
        collect_files: None,
    });
    let summary = serde_json::json!({
        "status": result.status,
        "stdout": result.stdout_text(),
        "stderr": result.stderr_text(),
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "wall_time_s": result.wall_time.as_secs_f64(),
        "cpu_time_s": result.cpu_time.map(|time| time.as_secs_f64()),
        "max_rss_kib": result.max_rss_kib,
        "isolation_level": result.isolation.level,
        "via_helper": sandbox.spawns_via_helper(),
    });
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}
