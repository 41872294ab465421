//! What runs: a [`Program`] in a [`Language`], and how each language turns into a command line
//! ([`Toolchains`], resolved once per sandbox from the trusted `/usr/bin:/bin`, never from the
//! caller's `PATH`, which may hold shims such as pyenv's that need the caller's home directory).
//!
//! This module does not run anything; it only names the interpreter, its arguments and the file
//! the source is written to.

use std::ffi::OsString;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::collected_files::FileCollection;

/// A language the sandbox can run. Each needs its interpreter or compiler on the machine; see
/// [`Toolchains::available`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    /// Python 3 (`python3 -S -E -B main.py`; `-S` dropped with `python_site_packages`; `-I`
    /// instead of `-E` for [`Program::isolated`]).
    #[default]
    Python,
    /// Bash (`bash main.sh`).
    Bash,
    /// Perl 5 (`perl main.pl`).
    Perl,
    /// C, compiled with `cc -O1 -lm` inside the jail (compile time counts against the limits),
    /// then run.
    C,
}

impl Language {
    pub const ALL: [Language; 4] = [
        Language::Python,
        Language::Bash,
        Language::Perl,
        Language::C,
    ];

    /// The file the source is written to, inside the work dir.
    pub fn source_file(self) -> &'static str {
        match self {
            Language::Python => "main.py",
            Language::Bash => "main.sh",
            Language::Perl => "main.pl",
            Language::C => "main.c",
        }
    }

    /// The lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Bash => "bash",
            Language::Perl => "perl",
            Language::C => "c",
        }
    }
}

/// One program to run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Program {
    pub language: Language,
    /// The source text, written to [`Language::source_file`] in the work dir.
    pub source: String,
    /// Bytes fed to the program's stdin (then closed).
    pub stdin: Vec<u8>,
    /// Extra files placed in the work dir: relative paths (subdirectories allowed, no `..`).
    pub files: Vec<(String, Vec<u8>)>,
    /// Command-line arguments after the source file.
    pub args: Vec<String>,
    /// Python only: run in isolated mode (`-I`): neither the work dir nor the environment
    /// reaches `sys.path`, so a module imported at any time (by the program, lazily by the
    /// stdlib, by the warnings machinery) comes from the interpreter's own read-only library and
    /// never from a file a process of the run wrote. For trusted harness code that runs beside
    /// untrusted code in one work dir (the unit-test judge); ordinary programs keep the work dir
    /// on `sys.path` so they can import their extra files.
    pub isolated: bool,
    /// Read the work dir's regular files back after the run, within these bounds, into
    /// [`crate::ExecResult::files`] (the source file excluded). `None`: nothing is read back.
    pub collect_files: Option<FileCollection>,
}

impl Program {
    /// A Python program with no stdin, files or arguments.
    pub fn python(source: impl Into<String>) -> Program {
        Program {
            language: Language::Python,
            source: source.into(),
            ..Program::default()
        }
    }

    /// A Bash script with no stdin, files or arguments.
    pub fn bash(source: impl Into<String>) -> Program {
        Program {
            language: Language::Bash,
            source: source.into(),
            ..Program::default()
        }
    }

    /// The same program, with the work dir's files read back after the run within `bounds`.
    pub fn collecting_files(mut self, bounds: FileCollection) -> Program {
        self.collect_files = Some(bounds);
        self
    }

    /// The same program with `stdin`.
    pub fn with_stdin(mut self, stdin: impl Into<Vec<u8>>) -> Program {
        self.stdin = stdin.into();
        self
    }
}

/// Checks an extra file's name: relative, normal components only, not the source file.
pub(crate) fn validate_file_name(name: &str, language: Language) -> Result<PathBuf, String> {
    let path = Path::new(name);
    if name.is_empty() || name.contains('\0') {
        return Err(format!(
            "extra file name {name:?} is empty or holds a NUL byte"
        ));
    }
    if !path
        .components()
        .all(|component| matches!(component, Component::Normal(_)))
    {
        return Err(format!(
            "extra file name {name:?} must be a relative path without `..` or `.`"
        ));
    }
    if path == Path::new(language.source_file()) {
        return Err(format!(
            "extra file name {name:?} collides with the program's source file"
        ));
    }
    Ok(path.to_path_buf())
}

/// Interpreter and compiler paths found on this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchains {
    python: Option<PathBuf>,
    bash: Option<PathBuf>,
    perl: Option<PathBuf>,
    cc: Option<PathBuf>,
    sh: Option<PathBuf>,
}

/// The only directories searched for interpreters (and the jail's `PATH`).
pub(crate) const TRUSTED_BIN_DIRS: [&str; 2] = ["/usr/bin", "/bin"];

fn find_executable(name: &str) -> Option<PathBuf> {
    TRUSTED_BIN_DIRS
        .iter()
        .map(|dir| Path::new(dir).join(name))
        .find(|path| path.is_file())
}

impl Toolchains {
    /// Looks for each toolchain in `/usr/bin` and `/bin`.
    pub fn discover() -> Toolchains {
        Toolchains {
            python: find_executable("python3"),
            bash: find_executable("bash"),
            perl: find_executable("perl"),
            cc: find_executable("cc").or_else(|| find_executable("gcc")),
            sh: find_executable("sh"),
        }
    }

    /// The languages whose toolchain is present.
    pub fn available(&self) -> Vec<Language> {
        Language::ALL
            .into_iter()
            .filter(|language| self.command(*language, &[], false, false).is_ok())
            .collect()
    }

    /// The executable and its arguments for running `language` from the work dir (`isolated`:
    /// see [`Program::isolated`]; other languages ignore it).
    pub(crate) fn command(
        &self,
        language: Language,
        args: &[String],
        python_site_packages: bool,
        isolated: bool,
    ) -> Result<(PathBuf, Vec<OsString>), String> {
        let missing = |tool: &str| {
            format!(
                "{} programs need `{tool}` in /usr/bin or /bin, and this machine has none",
                language.name()
            )
        };
        let mut argv: Vec<OsString> = Vec::new();
        let program = match language {
            Language::Python => {
                let python = self.python.clone().ok_or_else(|| missing("python3"))?;
                // -E: ignore PYTHON* variables; -B: write no .pyc; -S: skip site (fast start-up);
                // -I: -E, no script dir and no user site on sys.path.
                if !python_site_packages {
                    argv.push("-S".into());
                }
                argv.push(if isolated { "-I" } else { "-E" }.into());
                argv.push("-B".into());
                argv.push(language.source_file().into());
                python
            }
            Language::Bash => {
                argv.push(language.source_file().into());
                self.bash.clone().ok_or_else(|| missing("bash"))?
            }
            Language::Perl => {
                argv.push(language.source_file().into());
                self.perl.clone().ok_or_else(|| missing("perl"))?
            }
            Language::C => {
                let cc = self.cc.as_ref().ok_or_else(|| missing("cc"))?;
                let sh = self.sh.clone().ok_or_else(|| missing("sh"))?;
                argv.push("-c".into());
                argv.push(
                    format!(
                        "{} -O1 -o main {} -lm && exec ./main \"$@\"",
                        cc.display(),
                        language.source_file()
                    )
                    .into(),
                );
                argv.push("main".into());
                sh
            }
        };
        argv.extend(args.iter().map(OsString::from));
        Ok((program, argv))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parent_components_are_rejected() {
        assert!(validate_file_name("../escape.txt", Language::Python).is_err());
        assert!(validate_file_name("/etc/passwd", Language::Python).is_err());
        assert!(validate_file_name("a/../../b", Language::Python).is_err());
    }

    #[test]
    fn nested_relative_names_are_accepted() {
        assert_eq!(
            validate_file_name("data/input.txt", Language::Python).unwrap(),
            PathBuf::from("data/input.txt")
        );
    }

    #[test]
    fn source_file_name_is_reserved() {
        assert!(validate_file_name("main.py", Language::Python).is_err());
        assert!(validate_file_name("main.py", Language::Bash).is_ok());
    }

    #[test]
    fn python_command_runs_the_source_file_without_site() {
        let toolchains = Toolchains {
            python: Some(PathBuf::from("/usr/bin/python3")),
            bash: None,
            perl: None,
            cc: None,
            sh: None,
        };
        let (program, argv) = toolchains
            .command(Language::Python, &["x".to_string()], false, false)
            .unwrap();
        assert_eq!(program, PathBuf::from("/usr/bin/python3"));
        assert_eq!(argv, ["-S", "-E", "-B", "main.py", "x"].map(OsString::from));
        let (_, isolated) = toolchains
            .command(Language::Python, &[], false, true)
            .unwrap();
        assert_eq!(isolated, ["-S", "-I", "-B", "main.py"].map(OsString::from));
        assert!(
            toolchains
                .command(Language::Bash, &[], false, false)
                .is_err()
        );
    }
}
