"""The real-model study's aggregation over seeds, verdicts, Markdown report and figure.

Pure functions of the results dictionary `benchmarks/real_model_study.py` builds, so the report can be rewritten
from `results.json` alone (`python benchmarks/real_model_study.py --from_results`), and tested on hand-made results.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks import study_stats
from benchmarks.oracle.metrics import mean_std

# Display order and labels of the runs.
LABELS = {
    "base": "base (untrained)",
    "nll": "CE (`nll`, TRL)",
    "gem": "GEM linear β=0.7",
    "gem-ls": "GEM logsigmoid β=0.7",
    "emo": "EMO",
    "gem-target": "GEM target entropy",
}
ORDER = list(LABELS)


def run_of(model: str) -> str:
    """`gem-s1` -> `gem`; `base` -> `base`."""
    return model.rsplit("-s", 1)[0] if "-s" in model and model.rsplit("-s", 1)[1].isdigit() else model


def _stats(values: list[float], seeds: list | None = None) -> dict | None:
    """Mean ± std over seeds, with each seed's value (`values`, and their `seeds` when known: the verdicts pair CE's
    and a loss's runs by seed)."""
    seeds = seeds if seeds is not None else [None] * len(values)
    kept = [(s, v) for s, v in zip(seeds, values)
            if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not kept:
        return None
    mean, std = mean_std([v for _, v in kept])
    out = {"mean": mean, "std": std, "n": len(kept), "values": [v for _, v in kept]}
    if any(s is not None for s, _ in kept):
        out["seeds"] = [s for s, _ in kept]
    return out


def seed_of(model: str) -> int | None:
    """`gem-s1` -> 1; `base` -> None."""
    return int(model.rsplit("-s", 1)[1]) if run_of(model) != model else None


def _by_run(models: dict, value) -> dict:
    """{run: stats over its seeds} of `value(model_summary)` for every evaluated model."""
    grouped: dict[str, list] = {}
    for name, summary in models.items():
        grouped.setdefault(run_of(name), []).append((seed_of(name), value(summary)))
    return {run: _stats([v for _, v in pairs], [s for s, _ in pairs]) for run, pairs in grouped.items()}


def analyse(results: dict) -> dict:
    """Mean ± std over seeds of every reported number, per run, and the paired differences to CE."""
    evaluations = results["evaluations"]
    ks = results["settings"]["k_values"]
    analysis: dict = {"math": {}, "diversity": {}, "heldout": {}, "training": {}}

    analysis["math"] = math_analysis(evaluations["math"], ks)
    if evaluations.get("math_paper"):
        analysis["math_paper"] = math_analysis(evaluations["math_paper"], ks)

    for genre in ("poem", "story"):
        models = evaluations.get(genre, {})
        analysis["diversity"][genre] = {
            key: _by_run(models, lambda s, key=key: s.get("diversity", {}).get(key))
            for key in ("distinct_n", "self_bleu", "embedding")
        }

    base = results["base"]["heldout"]
    heldout = {"base": {key: _stats([base[key]]) for key in ("cross_entropy", "entropy", "accuracy")}}
    heldout.update(epoch_curves(results["runs"]))
    for name, runs in _group(results["runs"]).items():
        analysis["training"][name] = {
            "seconds": _stats([r["train_seconds"] for r in runs]),
            "final_train_loss": _stats([r["final_log"].get("loss") for r in runs]),
            "final_gem_beta": _stats([r["final_log"].get("gem_beta") for r in runs]),
        }
    analysis["long"] = epoch_curves(results.get("long_runs", []))
    for name, runs in _group(results.get("long_runs", [])).items():
        analysis["long"][name]["seconds"] = _stats([r["train_seconds"] for r in runs])
    analysis["heldout"] = heldout
    analysis["verdicts"] = verdicts(analysis)
    return analysis


def math_analysis(models: dict, ks: list[int]) -> dict:
    """Greedy and sample accuracy, pass@k and MV@k (subset-averaged) and the samples' n-gram diversity, per run."""

    def gsm(key, index=None):
        def get(summary):
            value = summary.get("gsm8k", {}).get(key)
            if value is None:
                return None
            return value[index] if index is not None else value
        return get

    kept_ks = next(iter(models.values())).get("gsm8k", {}).get("k", ks) if models else ks
    out = {"greedy": _by_run(models, gsm("greedy_accuracy")), "sample": _by_run(models, gsm("sample_accuracy"))}
    for i, k in enumerate(kept_ks):
        out[f"pass@{k}"] = _by_run(models, gsm("pass_unbiased", i))
        out[f"mv@{k}"] = _by_run(models, gsm("mv_subsets", i))
    out["k"] = list(kept_ks)
    out["distinct_n"] = _by_run(models, lambda s: s.get("diversity", {}).get("distinct_n"))
    return out


def _group(runs: list[dict]) -> dict[str, list[dict]]:
    grouped: dict[str, list] = {}
    for run in runs:
        grouped.setdefault(run["run"], []).append(run)
    return grouped


def epoch_curves(runs: list[dict]) -> dict:
    """{run: {metric: [stats per epoch], "rise_from_best": stats, "best_epoch": stats}} over the seeds of each run.

    `rise_from_best`: how much held-out cross-entropy rose from its lowest epoch to the last (0 when the last epoch
    is the best): overfitting, as the GEM paper reads it from perplexity over the epochs."""
    curves = {}
    for name, group in _group(runs).items():
        epochs = max(len(r["epochs"]) for r in group)
        curves[name] = {
            key: [_stats([r["epochs"][e][key] for r in group if len(r["epochs"]) > e],
                         [r["seed"] for r in group if len(r["epochs"]) > e]) for e in range(epochs)]
            for key in ("cross_entropy", "entropy", "accuracy")
        }
        lows = [min(e["cross_entropy"] for e in r["epochs"]) for r in group]
        curves[name]["rise_from_best"] = _stats([r["epochs"][-1]["cross_entropy"] - low for r, low in zip(group, lows)],
                                                [r["seed"] for r in group])
        curves[name]["best_epoch"] = _stats([1 + min(range(len(r["epochs"])), key=lambda e: r["epochs"][e]["cross_entropy"])
                                             for r in group])
    return curves


def final_log(log_history: list[dict]) -> dict:
    """The last logged value of each training metric (the Trainer's `loss`, `objective`, `entropy`, `gem_beta`...)."""
    out = {}
    for row in log_history:
        if "train_runtime" in row:  # the end-of-training summary averages the whole run
            continue
        out.update({k: v for k, v in row.items() if isinstance(v, (int, float))})
    return out


def _mean(stats):
    return None if stats is None else stats["mean"]


def compare(metric: dict, runs=("gem", "gem-ls"), higher_is_better: bool = True) -> list[dict]:
    """Each of `runs` against CE on one metric (`{run: stats over seeds}`): what we see, and the paired test over the
    seeds both have (`benchmarks/study_stats.py`: Student's t over the per-seed differences; this study keeps one
    figure per run and seed, no per-problem one; with one seed, no interval). Runs without the metric are left out."""
    ce = metric.get("nll")
    if ce is None:
        return []
    rows = []
    for run in runs:
        other = metric.get(run)
        if other is None:
            continue
        effect = study_stats.compare_seeds(_by_seed(other), _by_seed(ce))
        rows.append({"run": run, "seen": f"{_plain(other)} vs CE {_plain(ce)}", "effect": effect,
                     "higher_is_better": higher_is_better,
                     # as many decimals as the metric needs: points of accuracy or diversity, hundredths of a nat
                     "digits": 1 if abs(ce["mean"]) >= 1 else 3})
    return rows


def _by_seed(stats: dict) -> dict:
    """{seed: value} of a run's stats (a run measured once without a seed counts as seed 0)."""
    return dict(zip(stats.get("seeds") or range(stats["n"]), stats["values"]))


def _plain(stats: dict) -> str:
    return f"{stats['mean']:.3g}" + (f" ± {stats['std']:.2g}" if stats["n"] > 1 else "")


def verdicts(analysis: dict) -> list[dict]:
    """One row per paper claim and run (GEM linear and logsigmoid, or EMO, against CE): what we see, the effect with
    its interval and its label, and the label after Holm's adjustment over every row with an interval."""
    math_ = analysis["math"]
    heldout = analysis["heldout"]
    kmax = max(math_["k"]) if math_.get("k") else None
    rows = []

    def add(claim, metric, runs=("gem", "gem-ls"), higher_is_better=True):
        for row in compare(metric, runs, higher_is_better):
            rows.append({"claim": claim, **row})

    def last(key):
        return {run: values[key][-1] for run, values in heldout.items()
                if run != "base" and isinstance(values.get(key), list) and values[key] and values[key][-1] is not None}

    add("GEM overfits less: lower held-out cross-entropy (perplexity) after the last epoch (GEM §5, App. E)",
        last("cross_entropy"), higher_is_better=False)
    rise_claim = "GEM overfits less: held-out cross-entropy rises less from its best epoch to the last"
    rises = {run: values["rise_from_best"] for run, values in heldout.items() if values.get("rise_from_best")}
    short = f" ({max((len(v['cross_entropy']) for k, v in heldout.items() if k != 'base'), default=0)} epochs)"
    if rises.get("nll") and max(s["mean"] for s in rises.values()) == 0.0:
        rows.append({"claim": rise_claim + short, "run": "every run", "effect": None, "label": "not observable here",
                     "seen": "no run overfit: every loss's held-out cross-entropy still fell at the last epoch"})
    else:
        add(rise_claim + short, rises, higher_is_better=False)
    long = analysis.get("long") or {}
    if "nll" in long and "gem" in long:
        epochs = len(long["nll"]["cross_entropy"])
        add(f"{rise_claim} ({epochs} epochs, where CE overfits)",
            {run: values["rise_from_best"] for run, values in long.items()}, ("gem",), higher_is_better=False)
        add(f"GEM overfits less: lower held-out cross-entropy after the last of {epochs} epochs",
            {run: values["cross_entropy"][-1] for run, values in long.items()}, ("gem",), higher_is_better=False)
    add("GEM keeps a higher-entropy output distribution (GEM App. E, Fig. 7)", last("entropy"))
    for genre, plural in (("poem", "poems"), ("story", "stories")):
        for key, name in (("distinct_n", "n-gram"), ("self_bleu", "self-BLEU"), ("embedding", "Sentence-BERT")):
            add(f"GEM writes more diverse {plural} ({name} diversity, GEM Table 2)",
                analysis["diversity"].get(genre, {}).get(key) or {})
    if kmax is not None:
        add("GEM's greedy accuracy on math is at least CE's (GEM Fig. 3)", math_["greedy"])
        add(f"GEM gains at pass@{kmax}: diversity pays off when sampling (GEM Fig. 3-4)", math_[f"pass@{kmax}"])
        add(f"GEM gains at majority vote MV@{kmax} (GEM Fig. 3)", math_[f"mv@{kmax}"])
        paper = analysis.get("math_paper")
        if paper:
            add(f"GEM gains at pass@{kmax} with GEM's own GSM8K sampling (T = 0.6, top-k 50, top-p 0.9)", paper[f"pass@{kmax}"])
            add(f"GEM gains at MV@{kmax} with GEM's own GSM8K sampling (T = 0.6, top-k 50, top-p 0.9)", paper[f"mv@{kmax}"])
        # EMO: better precision (its samples are right more often) at little cost in recall (held-out likelihood).
        add("EMO's samples are more precise: sample accuracy at T = 1 (EMO §4, precision)", math_["sample"], ("emo",))
    add("EMO models the held-out answers better: lower held-out cross-entropy (EMO §4, recall)", last("cross_entropy"),
        ("emo",), higher_is_better=False)
    tested = [row for row in rows if row["effect"] is not None]
    study_stats.judged(tested)
    for row in tested:
        row["effect"] = row["effect"].as_dict()
    return rows


def verdict_table(analysis: dict) -> str:
    rows = analysis["verdicts"]
    tested = [row for row in rows if row["effect"] is not None]
    effects = [study_stats.Effect(**{**row["effect"], "seeds": tuple(row["effect"]["seeds"])}) for row in tested]
    lines = ["The effect is the loss's figure minus CE's (mean of the per-seed differences over the seeds both "
             "have), with its 95 % interval: Student's t over those paired seeds (`benchmarks/study_stats.py`; this "
             "study keeps one figure per run and seed, not per problem or prompt, so the seed is the paired unit; "
             "with one seed there is no interval). **better**: the interval on the claim's side of 0 (below it where "
             "lower is better), **worse**: on the other side, **cannot tell**: it contains 0; two-sided. "
             + study_stats.comparisons_line([{"effect": e} for e in effects]), "",
             "| paper claim | loss | what we see (mean ± std over seeds) | effect [95 % interval] | verdict | p | "
             "Holm p | after Holm | computed by |", "|---|---|---|---:|---|---:|---:|---|---|"]
    for row in rows:
        if row["effect"] is None:
            lines.append(f"| {row['claim']} | {row['run']} | {row['seen']} | — | **{row['label']}** | — | — | — | — |")
            continue
        effect = study_stats.Effect(**{**row["effect"], "seeds": tuple(row["effect"]["seeds"])})
        lines.append(f"| {row['claim']} | {LABELS[row['run']]} | {row['seen']} | "
                     f"{study_stats.interval_text(effect, row['digits'])} | **{row['label']}** | "
                     f"{study_stats.p_text(effect.p)} | {study_stats.p_text(row['holm_p'])} | {row['holm_label']} | "
                     f"{effect.method} |")
    return "\n".join(lines)


def _cell(stats, fmt: str = "{:.2f}") -> str:
    if stats is None:
        return "—"
    if stats["n"] > 1:
        return f"{fmt.format(stats['mean'])} ± {fmt.format(stats['std'])}"
    return fmt.format(stats["mean"])


def _runs_present(analysis: dict) -> list[str]:
    present = set(analysis["heldout"]) | set(analysis["math"].get("greedy", {}))
    return [run for run in ORDER if run in present]


def markdown(results: dict) -> str:
    analysis = results["analysis"]
    runs = _runs_present(analysis)
    env = results["environment"]
    settings = results["settings"]
    seeds = settings["seeds"]
    header = "| | " + " | ".join(f"{LABELS[r]}" + (f" ({len(seeds[r])} seed{'s' * (len(seeds[r]) > 1)})" if r in seeds else "") for r in runs) + " |"
    rule = "|---|" + "---:|" * len(runs)
    out = [header, rule]

    def row(label, table, fmt="{:.2f}"):
        out.append(f"| {label} | " + " | ".join(_cell(table.get(r), fmt) for r in runs) + " |")

    lines = []
    for key, title in (("math", "### Task 1: arithmetic word problems (held-out), sampled at T = 1.0 (no top-k, no top-p)"),
                       ("math_paper", "### Task 1b: the same problems sampled as GEM samples GSM8K (T = 0.6, top-k 50, top-p 0.9)")):
        math_ = analysis.get(key)
        if not math_:
            continue
        out = [header, rule]
        if key == "math":
            row("greedy accuracy, %", math_["greedy"], "{:.1f}")
        row("sample accuracy, %", math_["sample"], "{:.1f}")
        for k in math_["k"]:
            row(f"pass@{k}, %", math_[f"pass@{k}"], "{:.1f}")
        for k in math_["k"]:
            row(f"MV@{k}, %", math_[f"mv@{k}"], "{:.1f}")
        row("n-gram diversity of the samples (×100)", math_["distinct_n"], "{:.1f}")
        lines += [title, "", *out, ""]

    out = [header, rule]
    for genre, plural in (("poem", "poems"), ("story", "stories")):
        for key, name in (("distinct_n", "n-gram"), ("self_bleu", "self-BLEU"), ("embedding", "Sentence-BERT")):
            row(f"{plural}: {name} diversity (×100)", analysis["diversity"][genre][key], "{:.1f}")
    lines += ["### Task 2: creative writing diversity (GEM Table 2's metrics)", "", *out, ""]

    out = [header, rule]
    heldout = analysis["heldout"]
    epochs = max((len(v["cross_entropy"]) for k, v in heldout.items() if k != "base"), default=0)
    base = heldout["base"]
    for key, name, fmt in (("cross_entropy", "held-out cross-entropy (nats)", "{:.4f}"),
                           ("entropy", "held-out entropy (nats)", "{:.4f}"),
                           ("accuracy", "held-out top-1 token accuracy, %", "{:.1f}")):
        out.append(f"| {name}, before training | " + " | ".join(_cell(base[key], fmt) if r == "base" else ""
                                                                 for r in runs) + " |")
        for e in range(epochs):
            table = {r: heldout[r][key][e] for r in runs if r != "base" and r in heldout and len(heldout[r][key]) > e}
            row(f"{name}, epoch {e + 1}", table, fmt)
    row("rise of held-out cross-entropy after its best epoch", {r: heldout[r].get("rise_from_best") for r in runs
                                                                 if r != "base" and r in heldout}, "{:.4f}")
    training = analysis["training"]
    row("training time per run (s)", {r: training[r]["seconds"] for r in training}, "{:.0f}")
    row("final β (GEM with a target entropy)", {r: training[r]["final_gem_beta"] for r in training}, "{:.3f}")
    lines += ["### Task 3: overfitting (held-out cross-entropy and entropy after each epoch)", "", *out, ""]

    long = analysis.get("long") or {}
    if long:
        names = [r for r in ORDER if r in long]
        epochs = max(len(long[r]["cross_entropy"]) for r in names)
        out = ["| | " + " | ".join(f"{LABELS[r]} (seed 0)" for r in names) + " |", "|---|" + "---:|" * len(names)]
        for e in range(epochs):
            out.append(f"| epoch {e + 1}: held-out cross-entropy / entropy (nats) | "
                       + " | ".join(f"{_cell(long[r]['cross_entropy'][e], '{:.4f}')} / {_cell(long[r]['entropy'][e], '{:.4f}')}"
                                    if len(long[r]["cross_entropy"]) > e else "—" for r in names) + " |")
        out.append("| best epoch (lowest held-out cross-entropy) | " + " | ".join(_cell(long[r]["best_epoch"], "{:.0f}") for r in names) + " |")
        out.append("| rise from the best epoch to the last | " + " | ".join(_cell(long[r]["rise_from_best"], "{:.4f}") for r in names) + " |")
        out.append("| training time (s) | " + " | ".join(_cell(long[r].get("seconds"), "{:.0f}") for r in names) + " |")
        lines += [f"### Task 3b: {epochs} epochs over the same {results['settings']['train']} problems (held-out "
                  "statistics only)", "", *out, ""]

    head = [
        f"Measured {env['date']} on {env['machine']}; Python {env['python']}, "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + ".",
        f"Model: `{env['model']}`. Command: `{env['command']}`. "
        + ("Time, per invocation (a later one reuses the finished runs and evaluations): "
           + "; ".join(f"`{i['command']}` {i['minutes']:.1f} min ({i['date']})" for i in results["invocations"]) + "."
           if results.get("invocations") else f"Total time: {results['total_seconds'] / 60:.1f} min."),
        "Answer reader (`benchmarks/real_model/answer_reader.py`): "
        + (f"`{env['answer_reader']}`." if env.get("answer_reader") else
           "not recorded (these results were scored before the reader's version was recorded, 2026-11-28)."),
        "",
        "Cells are mean ± standard deviation over seeds (a single number: one seed).",
        "",
        "### Verdicts",
        "",
        verdict_table(analysis),
        "",
    ]
    return "\n".join(head + lines)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    analysis = results["analysis"]
    runs = [r for r in _runs_present(analysis) if r != "base"]
    long = analysis.get("long") or {}
    # One colour per run in every panel (the base model is grey).
    colour = {r: f"C{i}" for i, r in enumerate(runs)} | {"base": "0.5"}
    fig, axes = plt.subplots(1, 4 if long else 3, figsize=(20 if long else 15, 4.2))
    heldout = analysis["heldout"]
    base = heldout["base"]
    for r in runs:
        if r not in heldout:
            continue
        ce = [base["cross_entropy"]] + heldout[r]["cross_entropy"]
        xs = list(range(len(ce)))
        axes[0].errorbar(xs, [s["mean"] for s in ce], yerr=[s["std"] for s in ce], label=LABELS[r], marker="o", capsize=3,
                         color=colour[r])
        ent = [base["entropy"]] + heldout[r]["entropy"]
        axes[1].errorbar(xs, [s["mean"] for s in ent], yerr=[s["std"] for s in ent], label=LABELS[r], marker="o", capsize=3,
                         color=colour[r])
    axes[0].set(title="held-out cross-entropy", xlabel="epoch", ylabel="nats")
    axes[1].set(title="held-out entropy", xlabel="epoch", ylabel="nats")
    ks = analysis["math"]["k"]
    for r in ["base", *runs]:
        stats = [analysis["math"][f"pass@{k}"].get(r) for k in ks]
        if all(s is not None for s in stats):
            axes[2].errorbar(ks, [s["mean"] for s in stats], yerr=[s["std"] for s in stats], label=LABELS[r], marker="o",
                             capsize=3, color=colour[r])
    axes[2].set(title="arithmetic problems: pass@k (T = 1)", xlabel="k", ylabel="%", xscale="log", xticks=ks)
    axes[2].set_xticklabels([str(k) for k in ks])
    axes[2].xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes[0].legend(fontsize=8)
    axes[2].legend(fontsize=8)
    if long:
        for r in (r for r in ORDER if r in long):
            ce = [base["cross_entropy"]] + long[r]["cross_entropy"]
            axes[3].plot(range(len(ce)), [s["mean"] for s in ce], marker="o", label=f"{LABELS[r]} (seed 0)", color=colour.get(r))
        axes[3].set(title="longer run: held-out cross-entropy", xlabel="epoch", ylabel="nats", yscale="log")
        axes[3].legend(fontsize=8)
    model = Path(results["environment"]["model"]).name.split(".Q4")[0]  # the converted cache folder: its model's name
    fig.suptitle(f"{model}: CE vs GEM vs EMO (mean ± std over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_outputs(results: dict, folder: Path, stem: str = "real_model_study") -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{stem}.json").write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
    (folder / f"{stem}_results.md").write_text(markdown(results) + "\n")
    plot(results, folder / f"{stem}.png")
