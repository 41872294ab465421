//! Ordinary programs run and report exactly what they did.

use std::time::{Duration, Instant};

use stoke_sandbox::{
    ExitStatusKind, IsolationLevel, Language, Program, Sandbox, SandboxConfig, SandboxError,
};

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(5),
        cpu_seconds: 5,
        memory_bytes: 512 << 20,
        workers: 4,
        ..SandboxConfig::default()
    })
    .expect("the sandbox needs at least the confined level on the test machine")
}

#[test]
fn hello_world_prints() {
    let result = sandbox().run_blocking(Program::python("print('hello world')"));
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    assert_eq!(result.stdout, b"hello world\n");
    assert!(result.cpu_time.is_some());
}

#[test]
fn stdin_is_fed_to_the_program() {
    let program =
        Program::python("import sys\nprint(sum(int(x) for x in sys.stdin.read().split()))")
            .with_stdin("1 2 3\n4\n");
    let result = sandbox().run_blocking(program);
    assert_eq!(result.stdout, b"10\n", "{}", result.stderr_text());
}

#[test]
fn standard_modules_import() {
    let source = "import math, json, collections, itertools, re, functools, heapq, bisect, fractions, decimal, random, string, typing, dataclasses\n\
        print(json.dumps({'pi': round(math.pi, 3), 'c': collections.Counter('aab')['a'], \
        'p': len(list(itertools.permutations(range(4)))), 'r': re.findall(r'\\d+', 'a1b22')}))\n";
    let result = sandbox().run_blocking(Program::python(source));
    assert_eq!(
        result.stdout_text(),
        "{\"pi\": 3.142, \"c\": 2, \"p\": 24, \"r\": [\"1\", \"22\"]}\n",
        "{}",
        result.stderr_text()
    );
}

#[test]
fn extra_files_and_arguments_are_visible() {
    let program = Program {
        files: vec![
            (
                "helper.py".to_string(),
                b"def double(x):\n    return 2 * x\n".to_vec(),
            ),
            ("data/n.txt".to_string(), b"21".to_vec()),
        ],
        args: vec!["suffix".to_string()],
        ..Program::python(
            "import sys, helper\nprint(helper.double(int(open('data/n.txt').read())), sys.argv[1])",
        )
    };
    let result = sandbox().run_blocking(program);
    assert_eq!(
        result.stdout_text(),
        "42 suffix\n",
        "{}",
        result.stderr_text()
    );
}

#[test]
fn bash_runs() {
    let result = sandbox().run_blocking(
        Program::bash("read line\necho \"got $line\"; echo err >&2; exit 3").with_stdin("x\n"),
    );
    assert_eq!(result.status, ExitStatusKind::Exited(3));
    assert_eq!(result.stdout, b"got x\n");
    assert_eq!(result.stderr, b"err\n");
}

#[test]
fn every_available_language_says_hello() {
    let sandbox = sandbox();
    for language in sandbox.languages() {
        let source = match language {
            Language::Python => "print('hello')",
            Language::Bash => "echo hello",
            Language::Perl => "print \"hello\\n\";",
            Language::C => "#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
        };
        let result = sandbox.run_blocking(Program {
            language,
            source: source.to_string(),
            ..Program::default()
        });
        assert_eq!(
            result.stdout,
            b"hello\n",
            "{language:?}: {:?} {}",
            result.status,
            result.stderr_text()
        );
    }
}

#[test]
fn runs_report_the_sandbox_isolation() {
    let sandbox = sandbox();
    let result = sandbox.run_blocking(Program::python("pass"));
    assert_eq!(&result.isolation, sandbox.isolation());
    assert!(result.isolation.level >= IsolationLevel::Confined);
}

#[test]
fn many_programs_run_concurrently_through_the_pool() {
    let sandbox = sandbox();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let started = Instant::now();
    let results = runtime.block_on(async {
        let runs = (0..16).map(|index| {
            let sandbox = sandbox.clone();
            async move {
                sandbox
                    .run(Program::python(format!(
                        "import time\ntime.sleep(0.3)\nprint({index})"
                    )))
                    .await
            }
        });
        futures_join_all(runs).await
    });
    for (index, result) in results.iter().enumerate() {
        assert_eq!(
            result.stdout_text(),
            format!("{index}\n"),
            "{:?}",
            result.status
        );
    }
    // 16 runs of 0.3 s on 4 workers: about 4 rounds (~1.3 s); one at a time would take over
    // 5 s. The bound leaves room for a loaded 2-core CI machine.
    assert!(
        started.elapsed() < Duration::from_millis(4500),
        "{:?}",
        started.elapsed()
    );
}

/// Awaits every future concurrently (a small stand-in for `futures::future::join_all`).
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    futures: impl Iterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut outputs = Vec::new();
    for handle in handles {
        outputs.push(handle.await.unwrap());
    }
    outputs
}

#[test]
fn a_hanging_program_does_not_block_others() {
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(3),
        workers: 2,
        ..SandboxConfig::default()
    })
    .unwrap();
    let hanging = {
        let sandbox = sandbox.clone();
        std::thread::spawn(move || {
            sandbox.run_blocking(Program::python("import time\ntime.sleep(60)"))
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let started = Instant::now();
    let quick = sandbox.run_blocking(Program::python("print(1)"));
    assert_eq!(quick.stdout, b"1\n");
    assert!(started.elapsed() < Duration::from_secs(2));
    let hanging = hanging.join().unwrap();
    assert_eq!(
        hanging.status,
        ExitStatusKind::TimedOut,
        "{}",
        hanging.stderr_text()
    );
}

#[test]
fn an_unreachable_minimum_level_is_refused() {
    // Allowing the network removes the network namespace, so `full` cannot be reached.
    let refused = Sandbox::new(SandboxConfig {
        network: true,
        min_isolation: IsolationLevel::Full,
        ..SandboxConfig::default()
    });
    match refused {
        Err(SandboxError::InsufficientIsolation { missing, .. }) => {
            assert!(missing.contains("network_namespace"), "{missing}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn bad_file_names_fail_the_run_not_the_caller() {
    let result = sandbox().run_blocking(Program {
        files: vec![("../outside".to_string(), Vec::new())],
        ..Program::python("print(1)")
    });
    assert!(matches!(result.status, ExitStatusKind::SandboxError(_)));
}

#[test]
fn runs_start_from_the_helper_process() {
    // The constructor that turns a re-executed copy of this test binary into the jail's helper
    // must be linked in; without it every run would fork the (possibly large) caller.
    assert!(sandbox().spawns_via_helper());
}

#[test]
fn forking_path_works_too() {
    let sandbox = Sandbox::new(SandboxConfig {
        spawn_via_helper: false,
        ..SandboxConfig::default()
    })
    .unwrap();
    assert!(!sandbox.spawns_via_helper());
    let result = sandbox
        .run_blocking(Program::python("import sys\nprint(sys.stdin.read())").with_stdin("in"));
    assert_eq!(result.stdout, b"in\n", "{}", result.stderr_text());
}
