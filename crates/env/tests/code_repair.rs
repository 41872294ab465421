//! The code-repair environment end to end: generated repositories are broken as generated and
//! fixed by their solution (visible and hidden tests), scripted episodes score as their files
//! deserve, and writes into the tests are refused and reported.
//!
//! The sandbox tests need a sandbox at the confined level with python3; on a machine that
//! cannot give one they say "skipped" with the reason and pass (as `sandboxed_tools.rs` does).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use stoke_env::code_repair::tasks::{templates, variant};
use stoke_env::code_repair::{RunTests, expert_turns, gap_closed, repository};
use stoke_env::monitor::is_protected_path;
use stoke_env::{
    CodeRepair, CodeRepairSpec, EnvTask, Environment, ModelTurn, StopReason, Tool, ToolLimits,
    Workspace, code_repair_tasks,
};
use stoke_sandbox::{Program, Sandbox, SandboxConfig};
use stoke_tokenizer::tool_calls::{ToolCall, ToolCallParser};

fn sandbox() -> Option<Arc<Sandbox>> {
    let sandbox = match Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(5),
        cpu_seconds: 5,
        memory_bytes: 256 << 20,
        max_processes: 16,
        max_output_bytes: 64 << 10,
        workers: 2,
        ..SandboxConfig::default()
    }) {
        Ok(sandbox) => sandbox,
        Err(error) => {
            eprintln!("skipped: no sandbox on this machine: {error}");
            return None;
        }
    };
    let probe = sandbox.run_blocking(Program::python("print(6 * 7)"));
    if !probe.status.success() {
        eprintln!(
            "skipped: the sandbox cannot run python3 here: {:?} {}",
            probe.status,
            probe.stderr_text()
        );
        return None;
    }
    Some(Arc::new(sandbox))
}

fn tasks(count: usize) -> Vec<EnvTask> {
    code_repair_tasks(&CodeRepairSpec::default(), count).unwrap()
}

fn text(task: &EnvTask, key: &str) -> String {
    task.data[key].as_str().unwrap().to_string()
}

/// The repository with the known fix applied.
fn fixed(task: &EnvTask) -> Workspace {
    let mut workspace = repository(task).unwrap();
    workspace
        .files
        .insert(text(task, "module"), text(task, "solution").into_bytes());
    workspace
}

fn call(id: usize, name: &str, arguments: serde_json::Value) -> ToolCall {
    ToolCall {
        id: format!("call-{id}"),
        name: name.into(),
        arguments: arguments.to_string(),
    }
}

fn turn(index: usize, calls: &[ToolCall]) -> ModelTurn<'_> {
    ModelTurn {
        index,
        text: "",
        content: None,
        tool_calls: calls,
    }
}

fn message_text(step: &stoke_env::EnvStep, index: usize) -> String {
    step.messages[index].content.as_ref().unwrap().joined_text()
}

#[test]
fn tasks_are_deterministic_and_keep_the_grader_out_of_the_repository() {
    let spec = CodeRepairSpec {
        seed: 11,
        max_bugs: 2,
        ..CodeRepairSpec::default()
    };
    let first = code_repair_tasks(&spec, 30).unwrap();
    assert_eq!(first, code_repair_tasks(&spec, 30).unwrap());
    assert_eq!(first[..5], code_repair_tasks(&spec, 5).unwrap()[..]);
    let other = code_repair_tasks(
        &CodeRepairSpec {
            seed: 12,
            ..spec.clone()
        },
        30,
    )
    .unwrap();
    assert_ne!(first, other);
    let mut templates = std::collections::BTreeSet::new();
    for task in &first {
        let module = text(task, "module");
        let workspace = repository(task).unwrap();
        let paths: Vec<&str> = workspace.files.keys().map(String::as_str).collect();
        let test_path = format!("tests/test_{}", module);
        assert_eq!(paths.len(), 3, "{paths:?}");
        assert!(paths.contains(&module.as_str()) && paths.contains(&"run_tests.py"));
        assert!(paths.contains(&test_path.as_str()), "{paths:?}");
        let hidden = text(task, "hidden_tests");
        let solution = text(task, "solution");
        for file in workspace.files.values() {
            let file = String::from_utf8_lossy(file);
            assert!(!file.contains(&hidden) && !file.contains("def check("));
            assert!(!file.contains(solution.trim()), "the fix leaked: {file}");
        }
        assert!(task.prompt.contains(&module), "{}", task.prompt);
        assert!(!task.prompt.contains("check("));
        templates.insert(text(task, "entry_point"));
    }
    assert!(templates.len() >= 5, "{templates:?}");
}

#[test]
fn a_template_filter_draws_only_those_templates_and_unknown_names_are_refused() {
    let spec = CodeRepairSpec {
        seed: 3,
        max_bugs: 1,
        templates: vec!["sum_to".into(), "clamp".into()],
    };
    let drawn = code_repair_tasks(&spec, 20).unwrap();
    let modules: std::collections::BTreeSet<String> =
        drawn.iter().map(|task| text(task, "module")).collect();
    assert_eq!(
        modules,
        ["clamp.py".to_string(), "sum_to.py".to_string()].into()
    );
    assert!(
        drawn
            .iter()
            .all(|task| task.data["bugs"].as_array().unwrap().len() == 1)
    );
    let unknown = CodeRepairSpec {
        templates: vec!["sum_to".into(), "nope".into()],
        ..CodeRepairSpec::default()
    };
    let error = code_repair_tasks(&unknown, 1).unwrap_err().to_string();
    assert!(
        error.contains("templates") && error.contains("nope"),
        "{error}"
    );
    let error = code_repair_tasks(
        &CodeRepairSpec {
            max_bugs: 3,
            ..CodeRepairSpec::default()
        },
        1,
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("max_bugs"), "{error}");
}

#[test]
fn every_repository_fails_its_tests_and_the_fix_passes_visible_and_hidden() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(Arc::clone(&sandbox), false, ToolLimits::default()).unwrap();
    let run_tests = RunTests::new(sandbox);
    let started = Instant::now();
    for task in tasks(30) {
        let bugs = &task.data["bugs"];
        let mut broken = repository(&task).unwrap();
        let report = run_tests.call(&json!({}), &mut broken);
        assert!(report.failed, "{} {bugs}: {}", task.id, report.content);
        assert!(
            report.content.contains("FAIL ") && !report.content.contains(" 0 failed"),
            "{} {bugs}: {}",
            task.id,
            report.content
        );
        // The run leaves no bytecode caches or other files behind.
        assert!(report.touched.is_empty(), "{:?}", report.touched);
        let before = env.hidden_fraction(&task, &broken).unwrap();
        assert!(
            before < 1.0,
            "{} {bugs}: hidden tests pass as generated",
            task.id
        );

        let mut repaired = fixed(&task);
        let report = run_tests.call(&json!({}), &mut repaired);
        assert!(!report.failed, "{}: {}", task.id, report.content);
        assert!(
            report.content.ends_with(" passed, 0 failed\n"),
            "{}",
            report.content
        );
        let after = env.hidden_fraction(&task, &repaired).unwrap();
        assert_eq!(after, 1.0, "{}: hidden tests fail on the fix", task.id);
    }
    eprintln!("30 tasks checked in {:?}", started.elapsed());
}

#[test]
fn every_bug_and_pair_of_bugs_the_generator_can_draw_fails_visible_and_hidden_tests() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(Arc::clone(&sandbox), false, ToolLimits::default()).unwrap();
    let run_tests = RunTests::new(sandbox);
    let mut variants = 0;
    for template in templates() {
        let bugs = template.bugs;
        let mut sets: Vec<Vec<usize>> = (0..bugs.len()).map(|bug| vec![bug]).collect();
        for first in 0..bugs.len() {
            for second in first + 1..bugs.len() {
                let apart = bugs[first]
                    .lines
                    .iter()
                    .all(|(line, _)| bugs[second].lines.iter().all(|(other, _)| other != line));
                if apart {
                    sets.push(vec![first, second]);
                }
            }
        }
        for planted in sets {
            let task = variant(template, &planted, 5);
            let mut broken = repository(&task).unwrap();
            let report = run_tests.call(&json!({}), &mut broken);
            assert!(report.failed, "{}: {}", task.id, report.content);
            let before = env.hidden_fraction(&task, &broken).unwrap();
            assert!(before < 1.0, "{}: hidden tests pass as generated", task.id);
            variants += 1;
        }
    }
    assert!(variants >= 30, "{variants}");
}

#[test]
fn a_scripted_repair_scores_1() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(sandbox, true, ToolLimits::default()).unwrap();
    let task = &tasks(1)[0];
    let module = text(task, "module");
    let opening = env.opening(task).unwrap();
    let system = opening.messages[0].content.as_ref().unwrap().joined_text();
    assert!(system.contains("\"run_tests\"") && system.contains("<tool_call>"));
    assert_eq!(
        opening.messages[1].content.as_ref().unwrap().joined_text(),
        task.prompt
    );
    let names: Vec<&str> = opening.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        ["list_files", "read_file", "write_file", "run_tests"]
    );
    assert!(env.requires_tool());

    let mut episode = env.start(task).unwrap();
    let calls = [
        call(0, "list_files", json!({})),
        call(1, "read_file", json!({"path": module})),
    ];
    let step = episode.step(&turn(0, &calls)).unwrap();
    assert!(!step.done);
    assert!(message_text(&step, 0).contains(&module));
    let buggy = message_text(&step, 1);
    assert!(buggy.starts_with("def "), "{buggy}");
    assert_ne!(buggy, text(task, "solution"));

    let calls = [
        call(
            2,
            "write_file",
            json!({"path": module, "content": text(task, "solution")}),
        ),
        call(3, "run_tests", json!({})),
    ];
    let step = episode.step(&turn(1, &calls)).unwrap();
    assert!(
        step.tool_calls.iter().all(|record| !record.failed),
        "{step:?}"
    );
    assert_eq!(step.tool_calls[0].touched, [module.as_str()]);
    assert!(
        message_text(&step, 1).contains(" passed, 0 failed"),
        "{step:?}"
    );

    let done = episode.step(&turn(2, &[])).unwrap();
    assert!(done.done);
    assert_eq!(episode.finish(&StopReason::Done).unwrap(), 1.0);
}

#[test]
fn the_scripted_expert_repairs_every_variant_through_its_own_tool_calls() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(sandbox, true, ToolLimits::default()).unwrap();
    let mut variants = 0;
    for template in templates() {
        for bug in 0..template.bugs.len() {
            let task = variant(template, &[bug], 9);
            let turns = expert_turns(&task).unwrap();
            assert_eq!(turns.len(), 4, "{}", task.id);
            let mut episode = env.start(&task).unwrap();
            for (index, text) in turns.iter().enumerate() {
                // The texts go through the parser a run uses, as a sampled turn would.
                let parsed = ToolCallParser::Hermes.parse(text, &format!("call-{index}"));
                let last = index + 1 == turns.len();
                assert_eq!(
                    parsed.calls.len(),
                    usize::from(!last),
                    "{}: {text}",
                    task.id
                );
                let step = episode
                    .step(&ModelTurn {
                        index,
                        text,
                        content: parsed.content.as_deref(),
                        tool_calls: &parsed.calls,
                    })
                    .unwrap();
                assert!(step.tool_calls.iter().all(|c| !c.failed), "{step:?}");
                assert_eq!(step.done, last, "{}: turn {index}", task.id);
                if index == 2 {
                    assert!(
                        message_text(&step, 0).contains(" passed, 0 failed"),
                        "{step:?}"
                    );
                }
            }
            assert_eq!(
                episode.finish(&StopReason::Done).unwrap(),
                1.0,
                "{}",
                task.id
            );
            variants += 1;
        }
    }
    assert!(variants >= 20, "{variants}");
    // A task without its solution has no expert, and the error names the field.
    let mut task = tasks(1).remove(0);
    task.data.remove("solution");
    assert!(
        expert_turns(&task)
            .unwrap_err()
            .to_string()
            .contains("solution")
    );
}

#[test]
fn writing_into_the_tests_is_refused_and_reported() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(sandbox, false, ToolLimits::default()).unwrap();
    let task = &tasks(1)[0];
    let test_path = format!("tests/test_{}", text(task, "module"));
    let mut episode = env.start(task).unwrap();
    let calls = [
        call(
            0,
            "write_file",
            json!({"path": test_path, "content": "def test_ok():\n    pass\n"}),
        ),
        call(1, "run_tests", json!({})),
    ];
    let step = episode.step(&turn(0, &calls)).unwrap();
    let refusal = &step.tool_calls[0];
    assert!(refusal.failed);
    assert_eq!(refusal.touched, [test_path.as_str()]);
    assert!(refusal.touched.iter().all(|path| is_protected_path(path)));
    // The tests are as generated: they still fail.
    assert!(step.tool_calls[1].failed);
    assert!(message_text(&step, 1).contains("FAIL "), "{step:?}");
    assert_eq!(episode.finish(&StopReason::Done).unwrap(), 0.0);
}

#[test]
fn an_episode_that_does_nothing_scores_0() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(sandbox, false, ToolLimits::default()).unwrap();
    for task in tasks(3) {
        let mut episode = env.start(&task).unwrap();
        let step = episode.step(&turn(0, &[])).unwrap();
        assert!(step.done && step.tool_calls.is_empty());
        assert_eq!(
            episode.finish(&StopReason::Done).unwrap(),
            0.0,
            "{}",
            task.id
        );
    }
}

#[test]
fn deleting_or_worsening_the_module_scores_0_and_a_partial_fix_scores_between() {
    let Some(sandbox) = sandbox() else { return };
    let env = CodeRepair::new(sandbox, false, ToolLimits::default()).unwrap();
    let task = &tasks(1)[0];
    let module = text(task, "module");
    let entry_point = text(task, "entry_point");
    let broken = format!("def {entry_point}(*args):\n    raise ValueError('no')\n");
    for (name, arguments) in [
        ("write_file", json!({"path": module, "content": broken})),
        (
            "write_file",
            json!({"path": module, "content": "import sys\nsys.exit(0)\n"}),
        ),
    ] {
        let mut episode = env.start(task).unwrap();
        let calls = [call(0, name, arguments)];
        episode.step(&turn(0, &calls)).unwrap();
        assert_eq!(episode.finish(&StopReason::Done).unwrap(), 0.0);
    }
    assert_eq!(gap_closed(0.5, 0.75), 0.5);
    assert_eq!(gap_closed(0.5, 0.25), 0.0);
    assert_eq!(gap_closed(0.5, 1.0), 1.0);
}
