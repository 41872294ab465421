//! The reward config file format: every kind parses from its tagged table, unknown keys are
//! rejected, kinds parse from their names, and defaults build.

use stoke_reward::{RewardConfig, RewardKind};

#[test]
fn every_kind_name_round_trips() {
    for kind in RewardKind::ALL {
        assert_eq!(kind.name().parse::<RewardKind>().unwrap(), kind);
    }
    assert_eq!(
        "exact-match".parse::<RewardKind>().unwrap(),
        RewardKind::ExactMatch
    );
    let error = "maths".parse::<RewardKind>().unwrap_err().to_string();
    assert!(error.contains("maths") && error.contains("math"), "{error}");
}

#[test]
fn toml_tables_parse_into_each_kind() {
    let examples = [
        "kind = \"math\"\nrelative_tolerance = 1e-6",
        "kind = \"exact_match\"\nmode = \"gsm8k\"",
        "kind = \"unit_tests\"\nscoring = \"fraction\"",
        "kind = \"stdio_tests\"\nmax_cases = 5\ncomparison = \"lines\"",
        "kind = \"format_regex\"\npattern = \"<answer>.*</answer>\"",
        "kind = \"tag_structure\"\ntags = [\"think\", \"answer\"]",
        "kind = \"json_schema\"\nscoring = \"fraction\"\nschema = { type = \"object\" }",
        "kind = \"overlong\"\nmax_tokens = 4096\ncache_tokens = 512\nhard_cap_tokens = 8192",
        "kind = \"group_length\"\nlength_unit = \"chars\"",
        "kind = \"cosine_length\"\nmax_tokens = 4096\nwrong_at_zero = -5.0",
        "kind = \"repetition\"\nngram_size = 4\nmax_penalty = -0.5",
        "kind = \"instructions\"\nscoring = \"all\"\nconstraints = [{ type = \"lowercase\" }, { type = \"word_count\", relation = \"at_most\", value = 100 }]",
        "kind = \"composite\"\n[[components]]\ncorrectness = true\nreward = { kind = \"math\" }",
        "kind = \"reward_model\"\nmodel = \"runs/rm/model\"\nnormalize = \"group\"\nclip = 5.0",
        "kind = \"process_reward\"\nmodel = \"runs/prm/model\"\naggregation = \"last\"\nstep_separator = \"\\n\\n\"\ndense = true",
        "kind = \"judge\"\nurls = [\"http://127.0.0.1:8000\"]\nmode = \"pairwise\"\nrubric = \"Be helpful.\"\nscale = [1, 10]\nswap = true",
    ];
    let kinds: Vec<RewardKind> = examples
        .iter()
        .map(|text| {
            let config: RewardConfig =
                toml::from_str(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            config.kind()
        })
        .collect();
    assert_eq!(kinds, RewardKind::ALL);
}

#[test]
fn unknown_keys_are_rejected_in_every_kind() {
    for kind in RewardKind::ALL {
        let text = format!(
            "kind = \"{}\"\nmax_tokens = 10\nno_such_option = 1\ncomponents = []",
            kind.name()
        );
        let error = toml::from_str::<RewardConfig>(&text)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("unknown field"), "{kind}: {error}");
    }
}

#[test]
fn defaults_build_without_a_sandbox_for_pure_kinds() {
    for kind in RewardKind::ALL {
        let Ok(config) = RewardConfig::default_for(kind) else {
            continue;
        };
        let built = config.build(None);
        if kind.runs_code() {
            assert!(built.unwrap_err().to_string().contains("sandbox"), "{kind}");
        } else {
            assert_eq!(built.unwrap().kind(), kind);
        }
    }
    assert!(
        RewardConfig::default_for(RewardKind::Overlong)
            .unwrap_err()
            .to_string()
            .contains("max_tokens")
    );
}
