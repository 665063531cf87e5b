"""docs/sft_then_rl_study.md, rendered from the study's results: its prose is `sft_then_rl_study.template.md` (next to
this module), each result in it a field filled from `figures(results)` (`benchmarks/study_prose.py`). Written by
`benchmarks/sft_then_rl_study.py --write_docs` (and `--from_results ... --write_docs`) beside the generated results,
so the report's figures are the JSON's, and regenerated with it (new arms, seeds, a re-scored reader)."""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks import study_prose, study_stats

TEMPLATE = Path(__file__).with_name("sft_then_rl_study.template.md")
CLAIM_KEYS = {"ends higher": "after", "RL gains more": "gain"}


def figures(results: dict) -> dict[str, object]:
    """Every figure the report may quote, by name: `{config}.{metric}.{sft|rl|gain}` (mean over seeds, `.std` its
    spread), `{config}.s{seed}.{metric}.{sft|rl|gain}` (one run; the gain from the exact ends), `{config}.curves.*`,
    `cmp.{config}.{after|gain}.{metric}.*` (a comparison with CE), `rlgain.{config}.*`, `size.*` (what telling it
    would take), `sweep.*`, `settings.*`, `n.*` (counts) and `table.*` (generated Markdown)."""
    from benchmarks import sft_then_rl_study as study

    analysis = results["analysis"]
    out: dict[str, object] = {}
    settings = results["settings"]
    for name, value in settings.items():
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[f"settings.{name}"] = value
    out["settings.learning_rate_text"] = _compact(settings["learning_rate"])
    out["settings.completions_per_step"] = settings["rl_prompts_per_step"] * settings["rl_generations"]
    out["settings.completions"] = settings["rl_steps"] * out["settings.completions_per_step"]
    out["settings.completions_last4"] = 4 * out["settings.completions_per_step"]  # the reward's "last 4 steps"
    for config, entry in analysis["table"].items():
        for key, stages in entry["metrics"].items():
            for stage, stats in stages.items():
                if stats is not None:
                    out[f"{config}.{key}.{stage}"] = stats["mean"]
                    out[f"{config}.{key}.{stage}.std"] = stats["std"]
        for name, stats in entry["curves"].items():
            if stats is not None:
                out[f"{config}.curves.{name}"] = stats["mean"]
    for run in results["runs"]:
        prefix = f"{study.config_name(run['arm'], run['rl_temperature'])}.s{run['seed']}"
        for key in study.table_keys(run["rl_temperature"]) + ["rlT/pass@1", "rlT/pass@8"]:
            before, after = study.run_metric(run, "sft", key), study.run_metric(run, "rl", key)
            if before is not None and after is not None:
                out.update({f"{prefix}.{key}.sft": before, f"{prefix}.{key}.rl": after,
                            f"{prefix}.{key}.gain": after - before})
        for name in ("all_wrong", "all_right", "frac_reward_zero_std", "reward", "entropy"):
            values = run["rl_curves"].get(name)
            if values:
                out[f"{prefix}.curves.{name}"] = statistics.fmean(values)
                out[f"{prefix}.curves.{name}.first"] = values[0]
                out[f"{prefix}.curves.{name}.last4"] = statistics.fmean(values[-4:])
        out[f"{prefix}.sft_seconds"], out[f"{prefix}.rl_seconds"] = run["sft_seconds"], run["rl_seconds"]
    for row in analysis["comparisons"]:
        _effect_figures(out, f"cmp.{row['config']}.{CLAIM_KEYS[row['claim']]}.{row['metric']}", row)
    for row in analysis["rl_gains"]:
        _effect_figures(out, f"rlgain.{row['config']}", row)
    for row in analysis.get("sample_sizes") or []:
        prefix = f"size.{row['config']}.{CLAIM_KEYS[row['claim']]}.{row['metric']}"
        for name in ("measured", "target"):
            for factor in ("seeds", "problems"):
                out[f"{prefix}.{name}.{factor}"] = row[name][factor]
        for part, value in row["components"].items():
            out[f"{prefix}.var.{part}"] = value
    sweep = results.get("sweep")
    if sweep:
        out["sweep.start.pass@1"] = sweep["start"]["pass@1"]
        out["sweep.start.greedy"] = sweep["start"]["greedy_accuracy"]
        out["sweep.chosen"] = _compact(sweep["chosen"])
        for key, rate in sweep["rates"].items():
            for field, value in rate.items():
                out[f"sweep.{key}.{field}"] = value
    comparisons = analysis["comparisons"]
    # The half-widths of the intervals: of a configuration's RL gain, and of the difference of two RL gains.
    for name, rows in (("rl_gains", analysis["rl_gains"]),
                       ("gains_more", [r for r in comparisons if r["claim"] == "RL gains more"])):
        widths = [(r["effect"]["high"] - r["effect"]["low"]) / 2 for r in rows if r["effect"]["low"] is not None]
        if widths:
            out[f"width.{name}.min"], out[f"width.{name}.max"] = min(widths), max(widths)
    out["n.comparisons"] = len(comparisons)
    out["n.tested"] = sum(row["effect"]["p"] is not None for row in comparisons)
    out["n.rl_gains"] = len(analysis["rl_gains"])
    out["n.runs"] = len(results["runs"])
    out["z"] = study_stats.z_needed()
    out["target_effect"] = study.TARGET_EFFECT
    out["table.verdicts"] = verdict_table(comparisons)
    out["table.per_seed"] = per_seed_table(results)
    out["table.sweep"] = sweep_table(sweep) if sweep else ""
    return out


def _compact(value: float) -> str:
    """`2e-6`, `1e-4`, as the commands write them (Python writes `2e-06` and `0.0001`)."""
    text = f"{value:.0e}" if 0 < abs(value) < 1e-3 else format(value, "g")
    return text.replace("e-0", "e-").replace("e+0", "e+")


def _effect_figures(out: dict, prefix: str, row: dict) -> None:
    effect = row["effect"]
    for field in ("effect", "low", "high", "p"):
        out[f"{prefix}.{field}"] = effect[field]
    out[f"{prefix}.holm_p"] = row["holm_p"]
    out[f"{prefix}.label"] = row["label"]
    out[f"{prefix}.holm_label"] = row["holm_label"]
    out[f"{prefix}.interval"] = _interval(effect)


def _interval(effect: dict) -> str:
    if effect["low"] is None:
        return f"{effect['effect']:+.1f} (no interval)".replace("-", study_prose.MINUS)
    return f"{effect['effect']:+.1f} [{effect['low']:+.1f}, {effect['high']:+.1f}]".replace("-", study_prose.MINUS)


METRICS = {"greedy": "greedy", "rlT/pass@1": "pass@1 at the RL T", "rlT/pass@8": "pass@8 at the RL T"}


def verdict_table(comparisons: list[dict]) -> str:
    lines = ["| objective | claim | metric | effect [95 % interval] | verdict | after Holm |", "|---|---|---|---:|---|---|"]
    for row in comparisons:
        lines.append(f"| {row['config']} | {row['claim']} | {METRICS[row['metric']]} | {_interval(row['effect'])} | "
                     f"**{row['label']}** | {row['holm_label']} |")
    return "\n".join(lines)


def per_seed_table(results: dict) -> str:
    """Each run before → after RL, as the report's results section shows it."""
    from benchmarks import sft_then_rl_study as study

    lines = ["| configuration | seed | greedy | pass@1 at the RL T | pass@8 at the RL T | pass@1, T = 1 | distinct answers, "
             "T = 1 | held-out entropy | groups all wrong / all right during RL |",
             "|---|---:|---|---|---|---|---|---|---|"]
    for config, runs in study.by_config(results["runs"]).items():
        for i, run in enumerate(sorted(runs, key=lambda r: r["seed"])):
            def change(key, digits=1):
                return (f"{study.run_metric(run, 'sft', key):.{digits}f} → "
                        f"{study.run_metric(run, 'rl', key):.{digits}f}")
            curves = run["rl_curves"]
            split = (f"{statistics.fmean(curves['all_wrong']):.2f} / {statistics.fmean(curves['all_right']):.2f}"
                     if curves.get("all_wrong") else "—")
            lines.append(f"| {config if i == 0 else ''} | {run['seed']} | {change('greedy')} | {change('rlT/pass@1')} | "
                         f"{change('rlT/pass@8')} | {change('T1/pass@1')} | {change('T1/distinct_answers', 2)} | "
                         f"{change('heldout_entropy', 3)} | {split} |")
    return "\n".join(lines)


def sweep_table(sweep: dict) -> str:
    lines = ["| learning rate | validation pass@1 at T = 1 | change over the SFT start | validation greedy | reward during "
             "RL (first step → last 4) | zero-spread groups |", "|---|---:|---:|---:|---|---:|",
             f"| none (the SFT model) | {sweep['start']['pass@1']:.1f} | | {sweep['start']['greedy_accuracy']:.1f} | | |"]
    for key, rate in sweep["rates"].items():
        name = _compact(rate["learning_rate"])
        name = f"**{name} (chosen)**" if rate["learning_rate"] == sweep["chosen"] else name
        gain = f"{rate['gain']:+.1f} ± {rate['gain_error']:.1f}".replace("-", study_prose.MINUS)
        gain = f"**{gain}**" if rate["learning_rate"] == sweep["chosen"] else gain
        lines.append(f"| {name} | {rate['pass@1']:.1f} | {gain} | {rate['greedy_accuracy']:.1f} | "
                     f"{rate['reward_first']:.3f} → {rate['reward_last4']:.3f} | {rate['zero_spread']:.2f} |")
    return "\n".join(lines)


def render(results: dict) -> str:
    return study_prose.reflow(study_prose.render(TEMPLATE.read_text(), figures(results)))
