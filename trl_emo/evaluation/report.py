"""Writing the results: summary.json, summary.md (models side by side) and bon.png."""

from __future__ import annotations

import json
import os


def write_reports(summary: dict, output_dir: str, plot: bool = True) -> None:
    with open(os.path.join(output_dir, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
        handle.write("\n")
    with open(os.path.join(output_dir, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown_table(summary))
    if plot and any("bon" in m for m in summary["models"].values()):
        plot_bon(summary, os.path.join(output_dir, "bon.png"))


def _fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def _curve_rows(models: dict, key: str, label: str, estimator: str) -> list[tuple[str, list]]:
    ks = next((m[key]["k"] for m in models.values() if key in m), [])
    return [
        (f"{label}@{k}", [m[key][estimator][i] if key in m else None for m in models.values()])
        for i, k in enumerate(ks)
    ]


def markdown_table(summary: dict) -> str:
    """One table per metric group, one column per model."""
    models = summary["models"]
    names = list(models)
    settings = summary["settings"]
    sections = []

    def table(title: str, rows: list[tuple[str, list]]) -> None:
        if not rows:
            return
        lines = [f"### {title}", "", "| metric | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
        lines += [f"| {label} | " + " | ".join(_fmt(v) for v in values) + " |" for label, values in rows]
        sections.append("\n".join(lines))

    for estimator, title in (
        ("unbiased", "Best-of-n reward (unbiased: average over all k-subsets)"),
        ("first_k", "Best-of-n reward (first k samples, as in the reference code)"),
    ):
        table(title, _curve_rows(models, "bon", "BoN", estimator) + _curve_rows(models, "mean", "mean", estimator))
        if estimator == "unbiased":
            win_rows = _curve_rows(models, "win_rate", "win", estimator)
            table("Win rate vs reference, % (Bradley–Terry, best of k)", win_rows)
    diversity_labels = [
        ("distinct_n", "distinct-n (n=1,2,3)"), ("cross_sample_distinct_n", "cross-sample distinct-n"),
        ("self_bleu", "self-BLEU diversity"), ("embedding", "embedding diversity"),
    ]
    table(
        "Diversity (×100, higher = more diverse)",
        [
            (label, [m.get("diversity", {}).get(key) for m in models.values()])
            for key, label in diversity_labels
            if any(key in m.get("diversity", {}) for m in models.values())
        ],
    )
    if any("gsm8k" in m for m in models.values()):
        rows = []
        if any("greedy_accuracy" in m.get("gsm8k", {}) for m in models.values()):
            rows.append(("greedy accuracy", [m.get("gsm8k", {}).get("greedy_accuracy") for m in models.values()]))
        rows.append(("sample accuracy", [m.get("gsm8k", {}).get("sample_accuracy") for m in models.values()]))
        rows += _curve_rows(models, "gsm8k", "MV", "mv") + _curve_rows(models, "gsm8k", "pass", "pass_first_k")
        table("GSM8K, % (MV@k and pass@k over the first k samples)", rows)
    table(
        "Responses",
        [
            ("mean tokens", [m["responses"]["mean_tokens"] for m in models.values()]),
            ("truncated, %", [m["responses"]["truncated_percent"] for m in models.values()]),
        ],
    )
    prompts = settings["prompts"]
    reward = f"reward model `{settings['reward_model']}`" if settings["reward_model"] else "no reward model"
    header = (
        f"# Best-of-n evaluation\n\n{prompts.get('num_prompts')} prompts from `{prompts.get('prompts')}`, "
        f"n = {settings['n']}, temperature {settings['temperature']}, top-k {settings['top_k']}, "
        f"top-p {settings['top_p']}, {reward}.\n"
    )
    return header + "\n" + "\n\n".join(sections) + "\n"


def plot_bon(summary: dict, path: str) -> None:
    """BoN@k and mean@k against k (log2 axis), one line per model; first-k estimates dashed."""
    # A bare Figure on the Agg canvas: no pyplot, so no global backend switch and no GUI.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharex=True)
    for (key, title), axis in zip((("bon", "BoN@k"), ("mean", "mean@k")), axes):
        for index, (name, model) in enumerate(summary["models"].items()):
            if key not in model:
                continue
            color = f"C{index % 10}"
            ks = model[key]["k"]
            axis.plot(ks, model[key]["unbiased"], marker="o", color=color, label=name)
            axis.plot(ks, model[key]["first_k"], linestyle="--", color=color, alpha=0.5, label=f"{name} (first k)")
        axis.set_xscale("log", base=2)
        ks = sorted({k for model in summary["models"].values() if key in model for k in model[key]["k"]})
        axis.set_xticks(ks, [str(k) for k in ks])
        axis.minorticks_off()
        axis.set_xlabel("k (samples per prompt)")
        axis.set_ylabel("reward")
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
    axes[0].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
