//! OpenEnv environments against `openenv-core`'s own server, on loopback:
//! `tests/fixtures/openenv_server.py` is guess-the-number written on the package's `Environment`
//! base class and served by the package's `create_app` with uvicorn. The tests drive episodes end
//! to end over the session protocol (`/ws`): reset arguments, actions, observations, rewards and
//! `done` flow both ways; a server killed mid-episode fails that episode only.
//!
//! Set-up is the test's own and idempotent: a venv under the cargo target dir with a pinned
//! `openenv-core` (installed once, reused across runs; nothing global is needed). Where python3,
//! venv or pip (PyPI) is unavailable, each test prints "skipped: <reason>" and returns.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;
use stoke_env::openenv::OpenEnvOpening;
use stoke_env::{
    EnvStep, EnvTask, Environment, Episode, ModelTurn, OpenEnvEnvironment, OpenEnvSpec, StopReason,
};

/// The `openenv-core` release the fixture is written for (its `create_app` and `/ws` sessions).
const OPENENV_VERSION: &str = "0.3.0";
/// Starting the server imports FastAPI, pydantic and the package: seconds, more on a busy machine.
const START_TIMEOUT: Duration = Duration::from_secs(120);
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

fn fixture() -> String {
    concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/openenv_server.py"
    )
    .to_string()
}

/// The venv's python with `openenv-core` installed, or why there is none. Installed once per
/// target dir: built under a temporary name and renamed into place, so a run that was cut off or
/// a second `cargo test` running at the same time never sees half a venv. The tests of this
/// binary share one attempt.
fn venv_python() -> Result<PathBuf, String> {
    static VENV: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    VENV.get_or_init(install_venv).clone()
}

fn install_venv() -> Result<PathBuf, String> {
    let venv =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("openenv-venv-{OPENENV_VERSION}"));
    let python = venv.join("bin").join("python");
    if python.exists() {
        return Ok(python);
    }
    let started = Instant::now();
    let system = Command::new("python3")
        .args(["-c", "import venv, ensurepip"])
        .output()
        .map_err(|error| format!("no python3 ({error})"))?;
    if !system.status.success() {
        return Err(format!(
            "python3 lacks venv/ensurepip: {}",
            String::from_utf8_lossy(&system.stderr).trim()
        ));
    }
    let partial = venv.with_extension(format!("partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    let installed = run(
        "python3 -m venv",
        Command::new("python3").arg("-m").arg("venv").arg(&partial),
    )
    .and_then(|()| {
        run(
            "pip install",
            Command::new(partial.join("bin").join("python")).args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--retries",
                "1",
                "--timeout",
                "30",
                &format!("openenv-core=={OPENENV_VERSION}"),
            ]),
        )
    });
    if let Err(reason) = installed {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(reason);
    }
    if std::fs::rename(&partial, &venv).is_err() {
        // Another run put its venv in place first; use that one.
        let _ = std::fs::remove_dir_all(&partial);
    }
    if !python.exists() {
        return Err(format!("{} has no bin/python after set-up", venv.display()));
    }
    eprintln!(
        "set up {} with openenv-core=={OPENENV_VERSION} in {:.1} s",
        venv.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(python)
}

fn run(what: &str, command: &mut Command) -> Result<(), String> {
    let output = command
        .output()
        .map_err(|error| format!("{what}: {error}"))?;
    if output.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(5).collect();
    Err(format!(
        "{what} failed ({}): {}",
        output.status,
        tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
    ))
}

/// The venv's python, or `None` after printing why the test is skipped.
fn python_or_skip(test: &str) -> Option<PathBuf> {
    match venv_python() {
        Ok(python) => Some(python),
        Err(reason) => {
            eprintln!("skipped: {test}: {reason}");
            None
        }
    }
}

/// The server process; killed and reaped on drop, whatever the test did.
struct Server {
    child: Child,
    url: String,
}

impl Server {
    /// Starts the fixture on a free loopback port and waits until `/health` answers healthy.
    fn start(python: &Path) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free loopback port")
            .port();
        let child = Command::new(python)
            .arg(fixture())
            .arg(port.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the OpenEnv server");
        let mut server = Server {
            child,
            url: format!("http://127.0.0.1:{port}"),
        };
        let deadline = Instant::now() + START_TIMEOUT;
        // `connect` asks /health and /schema; it fails until the server listens.
        while let Err(error) = OpenEnvEnvironment::connect(server.spec(), CALL_TIMEOUT) {
            if let Ok(Some(status)) = server.child.try_wait() {
                panic!("the OpenEnv server exited before answering: {status}");
            }
            assert!(
                Instant::now() < deadline,
                "the OpenEnv server was not healthy within {START_TIMEOUT:?}: {error}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }

    fn spec(&self) -> OpenEnvSpec {
        OpenEnvSpec {
            observation_field: Some("prompt".into()),
            ..OpenEnvSpec::new(self.url.clone())
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

fn turn(text: &str) -> ModelTurn<'_> {
    ModelTurn {
        index: 0,
        text,
        content: Some(text),
        tool_calls: &[],
    }
}

fn text(step: &EnvStep) -> String {
    step.messages[0].content.as_ref().unwrap().joined_text()
}

/// A task whose reset arguments ask for a secret in 1..=`high` (the seed comes from the id).
fn guess_task(id: &str, high: u64) -> EnvTask {
    EnvTask {
        id: id.into(),
        prompt: format!("Guess my number from 1 to {high}."),
        data: BTreeMap::from([("high".to_string(), json!(high))]),
        ..EnvTask::default()
    }
}

/// Plays `episode` by bisection on the server's "higher"/"lower" answers: the guesses and every
/// step's reward, up to the step that is done.
fn bisect(episode: &mut dyn Episode, high: u64) -> (Vec<u64>, Vec<f64>) {
    let (mut low, mut high) = (1, high);
    let (mut guesses, mut rewards) = (Vec::new(), Vec::new());
    for _ in 0..16 {
        let guess = (low + high) / 2;
        let step = episode
            .step(&turn(&format!("My guess is {guess}.")))
            .unwrap();
        guesses.push(guess);
        rewards.push(step.reward);
        if step.done {
            assert!(step.messages.is_empty(), "{step:?}");
            return (guesses, rewards);
        }
        assert_eq!(step.messages.len(), 1);
        assert_eq!(step.messages[0].role.as_str(), "user");
        let answer = text(&step);
        if answer.contains("higher") {
            low = guess + 1;
        } else {
            assert!(answer.contains("lower"), "{answer}");
            high = guess - 1;
        }
    }
    panic!("bisection did not end within 16 guesses: {guesses:?}");
}

#[test]
fn an_episode_is_played_end_to_end_over_openenv_sessions() {
    let Some(python) = python_or_skip("an_episode_is_played_end_to_end_over_openenv_sessions")
    else {
        return;
    };
    let server = Server::start(&python);
    let env = OpenEnvEnvironment::connect(server.spec(), CALL_TIMEOUT).unwrap();
    assert_eq!(env.name(), "openenv");
    assert_eq!(
        env.session_url(),
        format!("{}/ws", server.url.replacen("http", "ws", 1))
    );

    // The opening is the task's prompt; with opening = "reset", the reset observation's field.
    let task = guess_task("guess-7", 64);
    let opening = env.opening(&task).unwrap();
    assert_eq!(opening.messages.len(), 1);
    assert_eq!(opening.messages[0].role.as_str(), "user");
    assert_eq!(
        opening.messages[0].content.as_ref().unwrap().joined_text(),
        "Guess my number from 1 to 64."
    );
    assert!(opening.tools.is_empty());
    let from_reset = OpenEnvEnvironment::connect(
        OpenEnvSpec {
            opening: OpenEnvOpening::Reset,
            ..server.spec()
        },
        CALL_TIMEOUT,
    )
    .unwrap();
    let opening = from_reset.opening(&task).unwrap();
    // The task's `high` reached the server's reset.
    assert_eq!(
        opening.messages[0].content.as_ref().unwrap().joined_text(),
        "I am thinking of a whole number from 1 to 64. Guess it."
    );

    // Two episodes of one task, interleaved on two sessions: each keeps its own state, and both
    // have the same secret (the seed comes from the task id).
    let mut first = env.start(&task).unwrap();
    let mut second = env.start(&task).unwrap();
    let no_number = first.step(&turn("I do not know.")).unwrap();
    assert!(!no_number.done);
    assert_eq!(no_number.reward, -0.5);
    assert_eq!(text(&no_number), "Answer with one whole number.");
    assert_eq!(no_number.metadata["openenv_reward"], json!(-0.5));
    let (guesses, rewards) = bisect(first.as_mut(), 64);
    assert!(guesses.len() >= 2, "a multi-turn episode: {guesses:?}");
    assert_eq!(*rewards.last().unwrap(), 1.0);
    assert!(rewards[..rewards.len() - 1].iter().all(|&r| r == 0.0));
    assert_eq!(first.finish(&StopReason::Done).unwrap(), 0.0);
    let (again, _) = bisect(second.as_mut(), 64);
    assert_eq!(again, guesses, "one task, one seed, one secret");
    assert_eq!(second.finish(&StopReason::Done).unwrap(), 0.0);
    // A step after finish is an error, not a panic.
    assert!(second.step(&turn("1")).is_err());

    // Another task id draws another seed; a `seed` in the task's data is used as given.
    let seeded = |seed: u64| EnvTask {
        data: BTreeMap::from([("high".into(), json!(1000)), ("seed".into(), json!(seed))]),
        ..guess_task("other", 1000)
    };
    let play = |task: &EnvTask| {
        let mut episode = env.start(task).unwrap();
        let (guesses, _) = bisect(episode.as_mut(), 1000);
        episode.finish(&StopReason::Done).unwrap();
        guesses
    };
    assert_eq!(play(&seeded(5)), play(&seeded(5)));
    assert_ne!(play(&seeded(5)), play(&seeded(6)));
}

#[test]
fn wrong_settings_and_refused_actions_are_errors_naming_the_field() {
    let Some(python) =
        python_or_skip("wrong_settings_and_refused_actions_are_errors_naming_the_field")
    else {
        return;
    };
    let server = Server::start(&python);
    // The action schema has `message`, not `text`.
    let error = OpenEnvEnvironment::connect(
        OpenEnvSpec {
            action_field: "text".into(),
            ..server.spec()
        },
        CALL_TIMEOUT,
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("action_field") && error.contains("message"),
        "{error}"
    );
    // Without the check, the server refuses the action: the step fails with its message.
    let env = OpenEnvEnvironment::new(
        OpenEnvSpec {
            action_field: "text".into(),
            ..server.spec()
        },
        CALL_TIMEOUT,
    )
    .unwrap();
    let mut episode = env.start(&guess_task("t", 8)).unwrap();
    let error = episode.step(&turn("3")).unwrap_err().to_string();
    assert!(
        error.contains("VALIDATION_ERROR") && error.contains(env.session_url()),
        "{error}"
    );
    // A missing observation field names it and the fields there are.
    let env = OpenEnvEnvironment::new(
        OpenEnvSpec {
            observation_field: Some("board".into()),
            ..server.spec()
        },
        CALL_TIMEOUT,
    )
    .unwrap();
    let mut episode = env.start(&guess_task("t", 8)).unwrap();
    let error = episode.step(&turn("no number")).unwrap_err().to_string();
    assert!(
        error.contains("\"board\"") && error.contains("high, prompt"),
        "{error}"
    );
    // No observation field: the whole observation, as JSON.
    let env = OpenEnvEnvironment::new(OpenEnvSpec::new(server.url.clone()), CALL_TIMEOUT).unwrap();
    let mut episode = env.start(&guess_task("t", 8)).unwrap();
    let step = episode.step(&turn("no number")).unwrap();
    let shown: serde_json::Value = serde_json::from_str(&text(&step)).unwrap();
    assert_eq!(
        shown,
        json!({"prompt": "Answer with one whole number.", "high": 8})
    );
}

#[test]
fn a_server_killed_mid_episode_fails_that_episode_only() {
    let Some(python) = python_or_skip("a_server_killed_mid_episode_fails_that_episode_only") else {
        return;
    };
    let mut doomed = Server::start(&python);
    let survivor = Server::start(&python);
    let env_doomed = OpenEnvEnvironment::connect(doomed.spec(), CALL_TIMEOUT).unwrap();
    let env_survivor = OpenEnvEnvironment::connect(survivor.spec(), CALL_TIMEOUT).unwrap();
    let task = guess_task("kill", 64);
    let mut lost = env_doomed.start(&task).unwrap();
    let mut kept = env_survivor.start(&task).unwrap();
    assert!(!lost.step(&turn("none")).unwrap().done);
    assert!(!kept.step(&turn("none")).unwrap().done);

    doomed.kill();
    let started = Instant::now();
    let error = lost.step(&turn("32")).unwrap_err().to_string();
    assert!(error.contains(env_doomed.session_url()), "{error}");
    assert!(started.elapsed() < CALL_TIMEOUT, "the error came at once");
    // The episode is over: later calls fail fast, finishing does not hang or panic.
    assert!(lost.step(&turn("32")).is_err());
    assert_eq!(
        lost.finish(&StopReason::EnvFailed { message: error })
            .unwrap(),
        0.0
    );
    // New episodes on the dead server fail to start, naming it.
    let error = env_doomed.start(&task).err().unwrap().to_string();
    assert!(error.contains(env_doomed.session_url()), "{error}");

    // The other server's episode goes on to its end.
    let (_, rewards) = bisect(kept.as_mut(), 64);
    assert_eq!(*rewards.last().unwrap(), 1.0);
    kept.finish(&StopReason::Done).unwrap();
}
