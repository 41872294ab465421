//! The speedrun's report card: one self-contained `<out>/report.html` with a section per stage:
//! the data (an example document), the tokenizer (vocabulary, compression, a document split into
//! tokens), the shards, pretraining and SFT (loss and learning-rate charts from their metrics),
//! GRPO (training reward and in-run held-out pass@1 charts), and the evaluation (accuracy of each model as bars, sample completions side by side).
//!
//! The page is the shared report shell every run report uses (`stoke_train::report::
//! render_report`: the page, the headings, the style); this module writes each section's body.
//! Charts are stoke-train's report charts (`ChartSpec`, plotters SVG); the accuracy bars are a
//! few SVG rectangles written here (a line chart of two points says less). Every text from the
//! run is HTML-escaped. What it is not: a metrics reader (it takes the summary records).

use std::fmt::Write as _;

use anyhow::Context;
use stoke_train::report::{
    ChartSpec, ReportSection, SectionBody, Series, YScale, escape, render_report,
};

use super::agent::AgentStageSummary;
use super::distill::DistillStageSummary;
use super::preference::PreferenceStageSummary;
use super::recipe::Recipe;
use super::rl::GrpoStageSummary;
use super::summary::{ModelEvaluation, SpeedrunSummary};
use super::training::TrainingStageSummary;

/// Writes `summary.report`.
pub fn write(summary: &SpeedrunSummary, recipe: &Recipe) -> anyhow::Result<()> {
    let html = render(summary, recipe)?;
    std::fs::write(&summary.report, html)
        .with_context(|| format!("writing {}", summary.report.display()))
}

fn render(s: &SpeedrunSummary, recipe: &Recipe) -> anyhow::Result<String> {
    let title = format!(
        "stoke speedrun report card ({} recipe, seed {})",
        s.recipe, s.seed
    );
    let mut card = Card::default();
    let h = card.section("Summary");
    let mut rows = vec![
        (
            "total time".to_string(),
            format!("{:.1} s", s.total_seconds),
        ),
        (
            "pretraining loss".into(),
            format!(
                "{:.3} -> {:.3}",
                s.pretrain.initial_loss, s.pretrain.final_loss
            ),
        ),
        (
            "SFT loss".into(),
            format!("{:.3} -> {:.3}", s.sft.initial_loss, s.sft.final_loss),
        ),
        (
            "GRPO training reward".into(),
            format!(
                "{:.3} -> {:.3} ({} updates)",
                s.grpo.initial_reward, s.grpo.final_reward, s.grpo.steps
            ),
        ),
    ];
    for e in &s.agent.evaluations {
        rows.push((
            format!("agent held-out accuracy, {}", e.label),
            format!(
                "{:.1}% +/- {:.1} ({} calculator problems, {:.2} turns per episode)",
                100.0 * e.accuracy,
                100.0 * e.standard_error,
                e.problems,
                e.mean_turns
            ),
        ));
    }
    for e in &s.evaluations {
        rows.push((
            format!("held-out accuracy, {} model", e.label),
            format!("{:.1}% ({} problems)", 100.0 * e.accuracy, e.samples),
        ));
    }
    rows.push(("final model".into(), s.final_model.display().to_string()));
    table(h, &rows);
    let timing_rows: Vec<(String, String)> = s
        .stages
        .iter()
        .map(|t| (t.stage.to_string(), format!("{:.1} s", t.seconds)))
        .collect();
    h.push_str("<h3>Stage times</h3>\n");
    table(h, &timing_rows);

    let h = card.section("1. Data");
    h.push_str("<p>Arithmetic word problems generated from the seed: stories with names and objects, a worked solution with one equation per step, an exact integer answer. Held-out questions are chosen by a hash of their text and never appear in training data.</p>\n");
    table(
        h,
        &[
            ("levels".into(), s.data.levels.join(", ")),
            (
                "pretraining corpus".into(),
                format!(
                    "{} documents, {} problems, {:.2} MB",
                    s.data.corpus_documents,
                    s.data.corpus_problems,
                    s.data.corpus_bytes as f64 / 1e6
                ),
            ),
            (
                "SFT conversations".into(),
                s.data.sft_conversations.to_string(),
            ),
            (
                "held-out problems".into(),
                s.data.held_out_problems.to_string(),
            ),
        ],
    );
    let _ = writeln!(
        h,
        "<p>An example pretraining document:</p>\n<pre>{}</pre>",
        escape(&s.data.example_document)
    );

    let h = card.section("2. Tokenizer");
    h.push_str("<p>Byte-level BPE (GPT-4 pre-split pattern) trained on the generated text, with ChatML special tokens and a chat template whose assistant turns are marked for the SFT loss mask.</p>\n");
    let t = &s.tokenizer;
    table(
        h,
        &[
            (
                "vocabulary".into(),
                format!("{} ids ({} merges)", t.vocab_size, t.merges),
            ),
            ("special tokens".into(), t.special_tokens.join(" ")),
            (
                "training text".into(),
                format!(
                    "{} texts, {:.2} MB",
                    t.training_texts,
                    t.training_bytes as f64 / 1e6
                ),
            ),
            (
                "bytes per token".into(),
                format!("{:.2}", t.bytes_per_token),
            ),
            ("time".into(), format!("{:.1} s", t.seconds)),
        ],
    );
    h.push_str("<p>The example document as tokens:</p>\n<p>");
    for token in &t.example_tokens {
        let _ = write!(h, "<span class=\"tok\">{}</span>", escape(token));
    }
    h.push_str("</p>\n");

    let h = card.section("3. Token shards");
    table(
        h,
        &[
            (
                "training".into(),
                format!(
                    "{} tokens, {} documents, {} shard(s)",
                    s.shards.train.tokens, s.shards.train.documents, s.shards.train.shards
                ),
            ),
            (
                "evaluation".into(),
                format!(
                    "{} tokens, {} documents",
                    s.shards.eval.tokens, s.shards.eval.documents
                ),
            ),
            (
                "mean document".into(),
                format!("{:.1} tokens", s.shards.mean_document_tokens),
            ),
        ],
    );

    let m = recipe.model;
    let model_line = format!(
        "Llama-style: hidden {}, {} layers, {} heads ({} KV), MLP {}, sequence length {}",
        m.hidden, m.layers, m.heads, m.kv_heads, m.intermediate, recipe.seq_len
    );
    training_section(&mut card, "4. Pretraining", &model_line, &s.pretrain)?;
    training_section(
        &mut card,
        "5. Supervised fine-tuning",
        "The pretrained model on chat conversations; loss on the assistant's tokens only.",
        &s.sft,
    )?;

    preference_section(card.section("6. Preference optimization"), &s.preference)?;
    grpo_section(card.section("7. GRPO"), &s.grpo)?;
    agent_section(
        card.section("8. Agent: tool use"),
        &s.agent,
        recipe.agent.max_turns,
    )?;
    distill_section(card.section("9. Distillation"), &s.distill, &s.evaluations)?;

    let h = card.section("10. Held-out accuracy");
    h.push_str("<p>Greedy completions of the same held-out questions, rendered with the chat template. <b>Accuracy</b> counts a completion right when its final <code>#### N</code> line holds the answer (the reward crate's exact-match verifier, gsm8k mode); <b>flexible</b> also accepts the last number of a completion without that line.</p>\n");
    accuracy_bars(h, &s.evaluations);
    let eval_rows: Vec<(String, String)> = s
        .evaluations
        .iter()
        .map(|e| {
            (
                e.label.clone(),
                format!(
                    "accuracy {:.1}%, flexible {:.1}%, answer line present {:.1}%, {} problems, {:.1} s",
                    100.0 * e.accuracy,
                    100.0 * e.flexible_accuracy,
                    100.0 * e.format_rate,
                    e.samples,
                    e.seconds
                ),
            )
        })
        .collect();
    table(h, &eval_rows);
    h.push_str("<h3>Accuracy by level</h3>\n");
    let level_rows: Vec<(String, String)> = s
        .evaluations
        .iter()
        .flat_map(|e| {
            e.by_level.iter().map(move |l| {
                (
                    format!("{}, {}", e.label, l.level.name()),
                    format!("{:.1}% of {}", 100.0 * l.accuracy, l.samples),
                )
            })
        })
        .collect();
    table(h, &level_rows);
    samples_table(h, &s.evaluations, recipe.report_samples);

    let h = card.section("11. The final model");
    let _ = writeln!(
        h,
        "<p>Hugging Face layout with tokenizer files in <code>{}</code>. Chat with it:</p>\n<pre>stoke generate --model {} --chat --temperature 0 --max-tokens 64 --format text --prompt \"...\"</pre>",
        escape(&s.final_model.display().to_string()),
        escape(&s.final_model.display().to_string())
    );
    Ok(render_report(&title, &[], &card.into_sections())?)
}

/// The card's sections in order, each a title and its HTML body (the shared report shell,
/// `stoke_train::report::render_report`, writes the page, the headings and the style).
#[derive(Default)]
struct Card {
    sections: Vec<(String, String)>,
}

impl Card {
    /// Starts the section `title`; what is written to the returned string is its body.
    fn section(&mut self, title: &str) -> &mut String {
        self.sections.push((title.to_string(), String::new()));
        let last = self.sections.len() - 1;
        &mut self.sections[last].1
    }

    fn into_sections(self) -> Vec<ReportSection> {
        self.sections
            .into_iter()
            .map(|(title, body)| ReportSection {
                title,
                body: SectionBody::Html(body),
                charts: Vec::new(),
            })
            .collect()
    }
}

fn training_section(
    card: &mut Card,
    title: &str,
    intro: &str,
    stage: &TrainingStageSummary,
) -> anyhow::Result<()> {
    let h = card.section(title);
    let _ = writeln!(h, "<p>{}</p>", escape(intro));
    let mut rows = vec![
        ("parameters".to_string(), stage.parameters.to_string()),
        ("steps".into(), stage.steps.to_string()),
        ("tokens".into(), stage.tokens_seen.to_string()),
        (
            "throughput".into(),
            format!("{:.0} tokens/s", stage.tokens_per_s),
        ),
        ("time".into(), format!("{:.1} s", stage.seconds)),
        (
            "train loss".into(),
            format!(
                "{:.3} (first step) -> {:.3} (mean of the last 10%)",
                stage.initial_loss, stage.final_loss
            ),
        ),
    ];
    if let Some(&(step, loss)) = stage.eval_losses.last() {
        rows.push(("held-out loss".into(), format!("{loss:.3} (step {step})")));
    }
    if let Some(report) = &stage.report {
        rows.push(("trainer's report".into(), report.display().to_string()));
    }
    table(h, &rows);
    let points = |v: &[(u64, f64)]| v.iter().map(|&(s, y)| (s as f64, y)).collect::<Vec<_>>();
    let mut loss_series = vec![Series::new("train loss", points(&stage.train_losses))];
    if !stage.eval_losses.is_empty() {
        loss_series.push(Series::new("held-out loss", points(&stage.eval_losses)));
    }
    for chart in [
        ChartSpec::new(
            &format!("{title}: loss"),
            "step",
            "loss",
            loss_series,
            YScale::Linear,
        ),
        ChartSpec::new(
            &format!("{title}: learning rate"),
            "step",
            "lr",
            vec![Series::new("lr", points(&stage.learning_rates))],
            YScale::Linear,
        ),
    ] {
        h.push_str("<figure>\n");
        h.push_str(&chart.render().context("drawing a chart")?);
        h.push_str("\n</figure>\n");
    }
    Ok(())
}

fn preference_section(h: &mut String, p: &PreferenceStageSummary) -> anyhow::Result<()> {
    h.push_str("<p>The SFT model samples answers to training-split questions; the exact-match verifier scores them; each question's correct answers are paired against its wrong ones. Each loss then trains a copy of the SFT model on the pairs against the SFT model as reference (its log-probs computed once and cached, so one model is in memory). <b>logps/chosen</b> falling with <b>logps/rejected</b> is likelihood displacement; section 8 shows what each run did to held-out accuracy.</p>\n");
    let metric = |m: &[(String, f64)], name: &str| {
        m.iter()
            .find(|(k, _)| k == name)
            .map_or(f64::NAN, |(_, v)| *v)
    };
    let mut rows = vec![
        (
            "pairs".to_string(),
            format!(
                "{} from {} questions x {} samples ({:.1}% of samples correct, {:.1} s)",
                p.pairs,
                p.prompts,
                p.samples_per_prompt,
                100.0 * p.correct as f64 / p.sampled.max(1) as f64,
                p.sampling_seconds
            ),
        ),
        ("pairs file".into(), p.pairs_file.display().to_string()),
    ];
    for run in &p.runs {
        rows.push((
            run.label.clone(),
            format!(
                "{} steps, {:.1} s; logps/chosen {:.2} -> {:.2}, logps/rejected {:.2} -> {:.2}, reward accuracy {:.2} -> {:.2} ({})",
                run.steps,
                run.seconds,
                metric(&run.first, "logps/chosen"),
                metric(&run.last, "logps/chosen"),
                metric(&run.first, "logps/rejected"),
                metric(&run.last, "logps/rejected"),
                metric(&run.first, "rewards/accuracies"),
                metric(&run.last, "rewards/accuracies"),
                run.config.display()
            ),
        ));
    }
    table(h, &rows);
    let series = |pick: fn(&(u64, f64, f64, f64)) -> f64, suffix: &str| {
        p.runs
            .iter()
            .map(|run| {
                Series::new(
                    format!("{} {suffix}", run.label),
                    run.curve.iter().map(|c| (c.0 as f64, pick(c))).collect(),
                )
            })
            .collect::<Vec<_>>()
    };
    let mut logps = series(|c| c.1, "chosen");
    logps.extend(series(|c| c.2, "rejected"));
    for chart in [
        ChartSpec::new(
            "Preference: summed log-probs of the chosen and rejected answers",
            "step",
            "log-prob",
            logps,
            YScale::Linear,
        ),
        ChartSpec::new(
            "Preference: reward margin (chosen - rejected)",
            "step",
            "margin",
            series(|c| c.3, "margin"),
            YScale::Linear,
        ),
    ] {
        h.push_str("<figure>\n");
        h.push_str(&chart.render().context("drawing a chart")?);
        h.push_str("\n</figure>\n");
    }
    Ok(())
}

fn grpo_section(h: &mut String, g: &GrpoStageSummary) -> anyhow::Result<()> {
    h.push_str("<p>Reinforcement learning with verifiable rewards on the SFT model: groups of sampled replies to training-split questions, the exact-match reward, group-relative advantages, the clipped policy loss; rollout, reward and trainer run as separate modules joined by bounded buffers; each update trains on samples generated one policy version earlier (a fixed lag, so the seeded run repeats exactly while generation overlaps training).</p>\n");
    let mut rows = vec![
        (
            "updates".to_string(),
            format!(
                "{} x {} prompts x {} samples",
                g.steps, g.prompts_per_step, g.group_size
            ),
        ),
        (
            "training reward".into(),
            format!(
                "{:.3} (first 10% of updates) -> {:.3} (last 10%)",
                g.initial_reward, g.final_reward
            ),
        ),
        (
            "throughput".into(),
            format!(
                "{:.2} s per update, {:.0} samples/s",
                g.seconds_per_step, g.samples_per_second
            ),
        ),
        ("time".into(), format!("{:.1} s", g.seconds)),
        ("GRPO run report".into(), g.report.display().to_string()),
    ];
    if let (Some(first), Some(last)) = (g.held_out.first(), g.held_out.last()) {
        rows.push((
            "in-run held-out greedy pass@1".into(),
            format!("{:.1}% -> {:.1}%", 100.0 * first.1, 100.0 * last.1),
        ));
        rows.push((
            "in-run held-out sampled pass@1".into(),
            format!("{:.1}% -> {:.1}%", 100.0 * first.2, 100.0 * last.2),
        ));
    }
    if g.reward_failures > 0 {
        rows.push((
            "reward failures (scored 0)".into(),
            g.reward_failures.to_string(),
        ));
    }
    table(h, &rows);
    let points = |v: &[(u64, f64)]| v.iter().map(|&(s, y)| (s as f64, y)).collect::<Vec<_>>();
    let greedy: Vec<(u64, f64)> = g
        .held_out
        .iter()
        .map(|&(s, greedy, _)| (s, greedy))
        .collect();
    let sampled: Vec<(u64, f64)> = g
        .held_out
        .iter()
        .map(|&(s, _, sampled)| (s, sampled))
        .collect();
    for chart in [
        ChartSpec::new(
            "GRPO: mean training reward",
            "update",
            "reward",
            vec![Series::new("reward", points(&g.rewards))],
            YScale::Linear,
        ),
        ChartSpec::new(
            "GRPO: held-out pass@1",
            "update",
            "pass@1",
            vec![
                Series::new("greedy", points(&greedy)),
                Series::new("sampled", points(&sampled)),
            ],
            YScale::Linear,
        ),
    ] {
        h.push_str("<figure>\n");
        h.push_str(&chart.render().context("drawing a chart")?);
        h.push_str("\n</figure>\n");
    }
    Ok(())
}

fn agent_section(h: &mut String, a: &AgentStageSummary, max_turns: usize) -> anyhow::Result<()> {
    let _ = writeln!(
        h,
        "<p>The SFT model learns to use a calculator tool on problems it cannot work out in its head ({}-digit operands): SFT on {} ideal tool-use conversations (call the tool in a Hermes <code>&lt;tool_call&gt;</code> block, read its result, answer), then multi-turn GRPO in the calculator environment (at most {} model turns; the tool's result is rendered through the chat template and appended as ids, the loss covers only the model's tokens). The same {} held-out problems are then played with the tool and without it (one turn: a tool call gets no result). +/- is the standard error over the problems.</p>",
        a.digits, a.traces, max_turns, a.held_out_problems
    );
    let mut rows = vec![
        (
            "agent SFT".to_string(),
            format!(
                "{} steps, loss {:.3} -> {:.3}",
                a.sft.steps, a.sft.initial_loss, a.sft.final_loss
            ),
        ),
        (
            "agent GRPO".into(),
            format!(
                "{} updates x {} prompts x {} episodes, reward {:.3} -> {:.3}, {:.2} s per update",
                a.grpo.steps,
                a.grpo.prompts_per_step,
                a.grpo.group_size,
                a.grpo.initial_reward,
                a.grpo.final_reward,
                a.grpo.seconds_per_step
            ),
        ),
        (
            "agent GRPO run report".into(),
            a.grpo.report.display().to_string(),
        ),
    ];
    for e in &a.evaluations {
        rows.push((
            e.label.clone(),
            format!(
                "{:.1}% +/- {:.1}; {:.2} turns and {:.2} tool calls per episode; {:.1} s",
                100.0 * e.accuracy,
                100.0 * e.standard_error,
                e.mean_turns,
                e.mean_tool_calls,
                e.seconds
            ),
        ));
    }
    table(h, &rows);
    let points = |v: &[(u64, f64)]| v.iter().map(|&(s, y)| (s as f64, y)).collect::<Vec<_>>();
    let greedy: Vec<(u64, f64)> = a
        .grpo
        .held_out
        .iter()
        .map(|&(s, greedy, _)| (s, greedy))
        .collect();
    for chart in [
        ChartSpec::new(
            "agent GRPO: mean training reward",
            "update",
            "reward",
            vec![Series::new("reward", points(&a.grpo.rewards))],
            YScale::Linear,
        ),
        ChartSpec::new(
            "agent GRPO: in-run held-out greedy pass@1 (with the tool)",
            "update",
            "pass@1",
            vec![Series::new("greedy", points(&greedy))],
            YScale::Linear,
        ),
    ] {
        h.push_str("<figure>\n");
        h.push_str(&chart.render().context("drawing a chart")?);
        h.push_str("\n</figure>\n");
    }
    h.push_str("<h3>Sample episodes</h3>\n<table>\n<tr><th>model</th><th>episode</th></tr>\n");
    for e in &a.evaluations {
        if let Some((_, transcript, correct)) = e.examples.first() {
            let (class, mark) = if *correct {
                ("ok", "right")
            } else {
                ("bad", "wrong")
            };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td><pre>{}</pre><span class=\"{class}\">{mark}</span></td></tr>",
                escape(&e.label),
                escape(transcript)
            );
        }
    }
    h.push_str("</table>\n");
    Ok(())
}

fn distill_section(
    h: &mut String,
    d: &DistillStageSummary,
    evaluations: &[ModelEvaluation],
) -> anyhow::Result<()> {
    let _ = writeln!(
        h,
        "<p>A student with layers {:?} of the pretrained model ({} parameters; the teacher, the GRPO model, has {}) learns from the teacher, beside the same student trained by SFT alone on the same number of optimizer steps. The student owns {} labelled conversations (the first of the SFT data), not the teacher's training data: the regime distillation is for. <b>Distilled</b>: {} SFT steps on those labels plus the teacher's replies to the {} GRPO questions (one each at temperature {}, unverified: {} of {} right), then {} updates of on-policy distillation (the student samples, the teacher scores the same tokens, each token's advantage is log p_teacher - log p_student). <b>SFT only</b>: {} SFT steps on the labels.</p>",
        d.student_layers,
        d.student_parameters,
        d.teacher_parameters,
        d.labels,
        d.offline.steps,
        d.teacher_prompts,
        d.teacher_temperature,
        d.teacher_samples_correct,
        d.teacher_samples,
        d.on_policy.steps,
        d.sft_only.steps,
    );
    let accuracy = |label: &str| {
        evaluations
            .iter()
            .find(|e| e.label == label)
            .map_or("-".to_string(), |e| {
                format!("{:.1}% of {}", 100.0 * e.accuracy, e.samples)
            })
    };
    h.push_str("<table>\n<tr><th>model</th><th>layers</th><th>parameters</th><th>held-out accuracy</th><th>decode, batch 1</th></tr>\n");
    for speed in &d.decode {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0} tokens/s</td></tr>",
            escape(&speed.label),
            speed.layers,
            speed.parameters,
            escape(&accuracy(&speed.label)),
            speed.tokens_per_s
        );
    }
    h.push_str("</table>\n");
    table(
        h,
        &[
            (
                "after the offline phase".to_string(),
                accuracy(super::distill::OFFLINE),
            ),
            (
                "SFT-only student loss".into(),
                format!(
                    "{:.3} -> {:.3} ({} steps)",
                    d.sft_only.initial_loss, d.sft_only.final_loss, d.sft_only.steps
                ),
            ),
            (
                "offline phase loss".into(),
                format!(
                    "{:.3} -> {:.3} ({} steps)",
                    d.offline.initial_loss, d.offline.final_loss, d.offline.steps
                ),
            ),
            (
                "on-policy phase".into(),
                format!(
                    "{} updates, {:.2} s each; run report {}",
                    d.on_policy.steps,
                    d.on_policy.seconds_per_step,
                    d.on_policy.report.display()
                ),
            ),
            (
                "teacher sampling".into(),
                format!("{:.1} s", d.sampling_seconds),
            ),
        ],
    );
    let points = |v: &[(u64, f64)]| v.iter().map(|&(s, y)| (s as f64, y)).collect::<Vec<_>>();
    let chart = ChartSpec::new(
        "Distillation: training loss of the two students",
        "step",
        "loss",
        vec![
            Series::new("SFT only (labels)", points(&d.sft_only.train_losses)),
            Series::new(
                "distilled, offline phase (labels + teacher replies)",
                points(&d.offline.train_losses),
            ),
        ],
        YScale::Auto,
    );
    h.push_str("<figure>\n");
    h.push_str(&chart.render().context("drawing a chart")?);
    h.push_str("\n</figure>\n");
    Ok(())
}

/// Horizontal bars: strict and flexible accuracy per model.
fn accuracy_bars(h: &mut String, evaluations: &[ModelEvaluation]) {
    let (width, label_width, bar_height) = (760.0, 170.0, 22.0);
    let rows = evaluations.len() * 2;
    let height = 20.0 + rows as f64 * (bar_height + 6.0);
    let _ = writeln!(
        h,
        "<figure><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"13\">"
    );
    let scale = width - label_width - 70.0;
    let mut y = 10.0;
    for e in evaluations {
        for (kind, value, color) in [
            ("accuracy", e.accuracy, "#1f77b4"),
            ("flexible", e.flexible_accuracy, "#9ecae1"),
        ] {
            let bar = (value.clamp(0.0, 1.0) * scale).max(1.0);
            let _ = writeln!(
                h,
                "<text x=\"0\" y=\"{ty}\">{} ({kind})</text><rect x=\"{label_width}\" y=\"{y}\" width=\"{bar:.1}\" height=\"{bar_height}\" fill=\"{color}\"/><text x=\"{tx:.1}\" y=\"{ty}\">{:.1}%</text>",
                escape(&e.label),
                100.0 * value,
                ty = y + 16.0,
                tx = label_width + bar + 6.0,
            );
            y += bar_height + 6.0;
        }
    }
    h.push_str("</svg></figure>\n");
}

/// The first `count` held-out questions with every model's completion.
fn samples_table(h: &mut String, evaluations: &[ModelEvaluation], count: usize) {
    let Some(first) = evaluations.first() else {
        return;
    };
    h.push_str("<h3>Sample completions</h3>\n<table>\n<tr><th>question</th>");
    for e in evaluations {
        let _ = write!(h, "<th>{}</th>", escape(&e.label));
    }
    h.push_str("</tr>\n");
    for (i, sample) in first.examples.iter().take(count).enumerate() {
        let _ = write!(
            h,
            "<tr><td>{}<br><i>answer: {}</i></td>",
            escape(&sample.question),
            sample.answer
        );
        for e in evaluations {
            match e.examples.get(i) {
                Some(r) => {
                    let (class, mark) = if r.correct {
                        ("ok", "right")
                    } else {
                        ("bad", "wrong")
                    };
                    let _ = write!(
                        h,
                        "<td><pre>{}</pre><span class=\"{class}\">{mark}</span></td>",
                        escape(&r.completion)
                    );
                }
                None => h.push_str("<td></td>"),
            }
        }
        h.push_str("</tr>\n");
    }
    h.push_str("</table>\n");
}

fn table(h: &mut String, rows: &[(String, String)]) {
    h.push_str("<table>\n");
    for (key, value) in rows {
        let _ = writeln!(
            h,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(key),
            escape(value)
        );
    }
    h.push_str("</table>\n");
}
