"""Aggregation over seeds, the Markdown table and the plot of the oracle study."""

from __future__ import annotations

from collections import defaultdict

from .metrics import interpolate, mean_std

# (key, column header, format); arrows say which direction is better where there is one.
TABLE_COLUMNS = (
    ("precision_ppl", "PPL_oracle(student samples) ↓ (precision)", "{:.2f}"),
    ("recall_ppl", "PPL_student(held-out) ↓ (recall)", "{:.2f}"),
    ("forward_kl", "KL(oracle‖student) ↓", "{:.4f}"),
    ("reverse_kl", "KL(student‖oracle) ↓", "{:.4f}"),
    ("reverse_kl_on_samples", "KL(student‖oracle) on own samples ↓", "{:.4f}"),
    ("entropy", "entropy (nats)", "{:.3f}"),
    ("generalization_gap", "held-out − train NLL", "{:.4f}"),
    ("ngram_diversity", "n-gram div. ↑", "{:.2f}"),
    ("distinct_2", "distinct-2 ↑", "{:.2f}"),
    ("self_bleu", "self-BLEU ↓", "{:.2f}"),
)

FRONTIER_COLUMNS = ("precision_ppl", "recall_ppl", "forward_kl", "reverse_kl_on_samples", "entropy", "ngram_diversity",
                    "self_bleu")

FRONTIER_PREFIX = "nll@T="


def frontier_name(temperature: float) -> str:
    """Row name of the nll student sampled at `temperature`."""
    return f"{FRONTIER_PREFIX}{temperature:g}"


def tempered_oracle_name(beta: float) -> str:
    """Row name of the oracle at temperature `1 / beta` (GEM-linear's infinite-data target)."""
    return f"oracle@T=1/{beta:g}"


def is_frontier(name: str) -> bool:
    return name.startswith(FRONTIER_PREFIX)


def is_reference(name: str) -> bool:
    return name == "start" or name.startswith("oracle")


def frontier_temperature(name: str) -> float:
    return float(name[len(FRONTIER_PREFIX):])


def analyse(runs: list[dict], regimes: list[str], training: list[dict] | None = None) -> dict:
    """Per regime: the summary over seeds, the paired differences with nll, the differences with
    nll at equal entropy (when nll and its temperature curve were measured), and the closeness to
    the oracle of each GEM student with a target entropy (when `training` holds its beta path)."""
    out = {"summary": {}, "paired_differences_vs_nll": {}, "differences_vs_nll_at_equal_entropy": {},
           "target_entropy": {}}
    for regime in regimes:
        rows = [row for row in runs if row["regime"] in (regime, None)]
        out["summary"][regime] = summarize(rows)
        names = {row["student"] for row in rows}
        if "nll" in names:
            out["paired_differences_vs_nll"][regime] = paired_differences(rows)
            if any(is_frontier(name) for name in names):
                out["differences_vs_nll_at_equal_entropy"][regime] = matched_entropy_differences(rows)
        paths = [row for row in training or [] if row["regime"] == regime and "gem_beta" in row]
        for student in sorted({row["student"] for row in paths}):
            out["target_entropy"].setdefault(regime, {})[student] = target_entropy_comparison(
                rows, [row for row in paths if row["student"] == student], student)
    return out


def summarize(runs: list[dict]) -> dict:
    """`{student: {metric: {"mean", "std", "n"}}}` over the seeds of `runs` (rows with `student`, `seed`, metrics)."""
    grouped: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in runs:
        for key, value in row["metrics"].items():
            grouped[row["student"]][key].append(value)
    summary = {}
    for student, metrics in grouped.items():
        summary[student] = {}
        for key, values in metrics.items():
            mean, std = mean_std(values)
            summary[student][key] = {"mean": mean, "std": std, "n": len(values)}
    return summary


def paired_differences(runs: list[dict], baseline: str = "nll") -> dict:
    """Per-seed differences `student − baseline`, as mean ± std over seeds (the seeds are paired:
    same start, same data order, same sampling seed), with the count of seeds where the student is lower."""
    by_seed = defaultdict(dict)
    for row in runs:
        by_seed[row["seed"]][row["student"]] = row["metrics"]
    out: dict[str, dict] = {}
    students = sorted({row["student"] for row in runs if not is_frontier(row["student"]) and row["student"] != baseline
                       and not row["student"].startswith("oracle")})
    for student in students:
        out[student] = {}
        for key, _, _ in TABLE_COLUMNS:
            diffs = [m[student][key] - m[baseline][key] for m in by_seed.values()
                     if key in m.get(student, {}) and key in m.get(baseline, {})]
            if not diffs:
                continue
            mean, std = mean_std(diffs)
            out[student][key] = {"mean": mean, "std": std, "n": len(diffs), "lower": sum(d < 0 for d in diffs),
                                 "values": diffs}
    return out


MATCHED_KEYS = ("precision_ppl", "recall_ppl", "forward_kl", "reverse_kl", "reverse_kl_on_samples", "generalization_gap",
                "ngram_diversity", "self_bleu")
LOG_KEYS = ("precision_ppl", "recall_ppl")


def matched_entropy_differences(runs: list[dict], baseline: str = "nll") -> dict:
    """Per seed, `student − baseline at the temperature giving the student's entropy`, mean ± std over seeds.

    The baseline's values at the student's entropy are interpolated along its temperature curve
    (the `nll@T=…` rows plus `nll` itself at T = 1), linearly in entropy (perplexities linearly in
    log). Seeds where the student's entropy lies outside the curve are counted in `outside`. This
    asks whether a loss does better than simply sampling the cross-entropy model at another
    temperature.
    """
    by_seed = defaultdict(dict)
    for row in runs:
        by_seed[row["seed"]][row["student"]] = row["metrics"]
    students = sorted({row["student"] for row in runs if not is_frontier(row["student"]) and not is_reference(row["student"])
                       and row["student"] != baseline})
    out: dict[str, dict] = {}
    for student in students:
        diffs: dict[str, list[float]] = defaultdict(list)
        outside = 0
        for metrics in by_seed.values():
            if student not in metrics or baseline not in metrics:
                continue
            curve = [m for name, m in metrics.items() if is_frontier(name) or name == baseline]
            entropy = metrics[student]["entropy"]
            if len(curve) < 2 or interpolate([m["entropy"] for m in curve], [0.0] * len(curve), entropy) is None:
                outside += 1
                continue
            for key in MATCHED_KEYS:
                matched = interpolate([m["entropy"] for m in curve], [m[key] for m in curve], entropy,
                                      log=key in LOG_KEYS)
                diffs[key].append(metrics[student][key] - matched)
        out[student] = {"outside": outside}
        for key, values in diffs.items():
            mean, std = mean_std(values)
            out[student][key] = {"mean": mean, "std": std, "n": len(values), "lower": sum(v < 0 for v in values),
                                 "values": values}
    return out


def curve_at_entropy(metrics_by_student: dict, entropy: float, baseline: str = "nll") -> dict | None:
    """One seed's `baseline` temperature curve (`nll@T=…` rows and `nll` at T = 1) interpolated at
    `entropy`: the `MATCHED_KEYS`, and the temperature itself; `None` outside the curve."""
    names = [name for name in metrics_by_student if is_frontier(name) or name == baseline]
    if baseline not in metrics_by_student or len(names) < 2:
        return None
    xs = [metrics_by_student[name]["entropy"] for name in names]
    if interpolate(xs, [0.0] * len(xs), entropy) is None:
        return None
    out = {key: interpolate(xs, [metrics_by_student[name][key] for name in names], entropy, log=key in LOG_KEYS)
           for key in MATCHED_KEYS}
    out["temperature"] = interpolate(xs, [1.0 if name == baseline else frontier_temperature(name) for name in names],
                                     entropy)
    out["entropy"] = entropy
    return out


# What "closer to the oracle in both KL directions" reads: the forward KL on held-out oracle text and
# the reverse KL on the student's own samples (both sequence-level, per token); the reverse KL on
# held-out prefixes is reported beside them.
CLOSENESS_KEYS = ("forward_kl", "reverse_kl_on_samples", "reverse_kl")
TARGET_ROW_KEYS = ("entropy", "forward_kl", "reverse_kl_on_samples", "reverse_kl", "recall_ppl", "precision_ppl",
                   "temperature")


def target_entropy_comparison(runs: list[dict], paths: list[dict], student: str, fixed: str = "gem-linear",
                              baseline: str = "nll") -> dict:
    """How close to the oracle a GEM student with a target entropy lands, beside fixed-beta GEM, `baseline`
    at T = 1, `baseline` sampled at the entropy the student reached, and `baseline` sampled at the oracle's own
    entropy (both interpolated along its temperature curve, per seed); per comparator, the paired differences
    in both KL directions and on how many seeds the student is closer in both. `paths` are the student's
    training records (their `gem_beta` entries)."""
    by_seed = defaultdict(dict)
    for row in runs:
        by_seed[row["seed"]][row["student"]] = row["metrics"]
    oracle = by_seed[None].get("oracle")
    rows: dict[str, list[dict]] = defaultdict(list)
    for seed, metrics in by_seed.items():
        if seed is None or student not in metrics:
            continue
        rows[student].append(metrics[student])
        for name in (fixed, baseline):
            if name in metrics:
                rows[name].append(metrics[name])
        reached = curve_at_entropy(metrics, metrics[student]["entropy"], baseline)
        if reached is not None:
            rows[f"{baseline} at {student}'s entropy"].append(reached)
        if oracle is not None:
            at_oracle = curve_at_entropy(metrics, oracle["entropy"], baseline)
            if at_oracle is not None:
                rows[f"{baseline} at the oracle's entropy"].append(at_oracle)
    table = {}
    if oracle is not None:
        table["oracle"] = {key: {"mean": oracle[key], "std": 0.0, "n": 1} for key in TARGET_ROW_KEYS if key in oracle}
    for name, values in rows.items():
        table[name] = {}
        for key in TARGET_ROW_KEYS:
            present = [v[key] for v in values if v.get(key) is not None]
            if present:
                mean, std = mean_std(present)
                table[name][key] = {"mean": mean, "std": std, "n": len(present)}
    comparisons = {}
    own = rows[student]
    for name, values in rows.items():
        if name == student or len(values) != len(own):
            continue
        entry = {}
        for key in CLOSENESS_KEYS:
            diffs = [a[key] - b[key] for a, b in zip(own, values)]
            mean, std = mean_std(diffs)
            entry[key] = {"mean": mean, "std": std, "n": len(diffs), "lower": sum(d < 0 for d in diffs), "values": diffs}
        entry["closer_in_both"] = sum(a["forward_kl"] < b["forward_kl"]
                                      and a["reverse_kl_on_samples"] < b["reverse_kl_on_samples"]
                                      for a, b in zip(own, values))
        entry["n"] = len(own)
        comparisons[name] = entry
    beta = {
        "start": sorted({p["gem_beta"]["start"] for p in paths}),
        "end": dict(zip(("mean", "std"), mean_std(p["gem_beta"]["end"] for p in paths))),
        "min": min(p["gem_beta"]["min"] for p in paths),
        "max": max(p["gem_beta"]["max"] for p in paths),
        "first_step_at_1": [p["gem_beta"]["first_step_at_1"] for p in paths],
        "steps": [p["steps"] for p in paths],
        "target_entropy": sorted({p["gem_beta"]["target_entropy"] for p in paths}),
        "train_entropy_first": dict(zip(("mean", "std"), mean_std(p["gem_beta"]["train_entropy_first"] for p in paths))),
        "train_entropy_last10": dict(zip(("mean", "std"), mean_std(p["gem_beta"]["train_entropy_last10"] for p in paths))),
    }
    return {"rows": table, "comparisons": comparisons, "beta": beta}


def markdown_target_entropy(student: str, result: dict) -> str:
    """The rows, the paired comparisons and beta's path of `target_entropy_comparison`."""
    titles = {key: title.split(" (")[0] for key, title, _ in TABLE_COLUMNS}
    titles["temperature"] = "T"
    fmts = {key: fmt for key, _, fmt in TABLE_COLUMNS} | {"temperature": "{:.3f}"}
    lines = ["| student | " + " | ".join(titles[k] for k in TARGET_ROW_KEYS) + " |",
             "|---|" + "---:|" * len(TARGET_ROW_KEYS)]
    for name, row in result["rows"].items():
        cells = [_cell(row[key], fmts[key]) if key in row else "" for key in TARGET_ROW_KEYS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", f"| {student} − comparator | " + " | ".join(titles[k] for k in CLOSENESS_KEYS)
              + " | closer in both (forward, reverse on own samples) |", "|---|" + "---:|" * (len(CLOSENESS_KEYS) + 1)]
    for name, entry in result["comparisons"].items():
        cells = []
        for key in CLOSENESS_KEYS:
            d = entry[key]
            sign = "+" if d["mean"] >= 0 else ""
            cells.append(f"{sign}{fmts[key].format(d['mean'])} ± {fmts[key].format(d['std'])} ({d['lower']}/{d['n']} lower)")
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {entry['closer_in_both']}/{entry['n']} seeds |")
    beta = result["beta"]
    at_1 = beta["first_step_at_1"]
    reached = [s for s in at_1 if s is not None]
    lines += [
        "",
        f"beta: start {', '.join(f'{b:g}' for b in beta['start'])}; end {beta['end']['mean']:.4f} ± "
        f"{beta['end']['std']:.4f}; range over seeds and steps {beta['min']:.4f}–{beta['max']:.4f}; at its bound 1 "
        + (f"from step {', '.join(str(s) for s in at_1)} of {', '.join(str(s) for s in beta['steps'])}"
           if reached else "never")
        + f". Training entropy (mean over the step's target tokens): {beta['train_entropy_first']['mean']:.3f} at the "
        f"first step, {beta['train_entropy_last10']['mean']:.3f} ± {beta['train_entropy_last10']['std']:.3f} over the "
        f"last 10 steps; target {', '.join(f'{t:.3f}' for t in beta['target_entropy'])} nats.",
    ]
    return "\n".join(lines)


def markdown_matched(differences: dict, baseline: str = "nll") -> str:
    titles = {key: title.split(" (")[0] for key, title, _ in TABLE_COLUMNS}
    fmts = {key: fmt for key, _, fmt in TABLE_COLUMNS}
    lines = [
        f"| student − {baseline} at equal entropy | " + " | ".join(titles[k] for k in MATCHED_KEYS) + " |",
        "|---|" + "---:|" * len(MATCHED_KEYS),
    ]
    for student, row in differences.items():
        if not any(key in row for key in MATCHED_KEYS):
            lines.append(f"| {student} | " + " | ".join(
                [f"entropy outside the {baseline} temperature curve ({row['outside']} seed(s))"]
                + [""] * (len(MATCHED_KEYS) - 1)) + " |")
            continue
        cells = []
        for key in MATCHED_KEYS:
            d = row[key]
            sign = "+" if d["mean"] >= 0 else ""
            cells.append(f"{sign}{fmts[key].format(d['mean'])} ± {fmts[key].format(d['std'])} ({d['lower']}/{d['n']} lower)")
        lines.append(f"| {student} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(stats: dict, fmt: str) -> str:
    if stats["n"] > 1:
        return f"{fmt.format(stats['mean'])} ± {fmt.format(stats['std'])}"
    return fmt.format(stats["mean"])


def order(students) -> list[str]:
    """References first (oracle rows, then the start), then the trained students; no frontier rows."""
    students = [s for s in students if not is_frontier(s)]
    oracles = [s for s in students if s.startswith("oracle")]
    start = [s for s in students if s == "start"]
    return oracles + start + [s for s in students if not is_reference(s)]


def frontier(summary: dict) -> list[str]:
    """The nll student's rows by temperature, nll itself (T = 1) included, sorted by temperature."""
    rows = [(frontier_temperature(s), s) for s in summary if is_frontier(s)]
    if "nll" in summary:
        rows.append((1.0, "nll"))
    return [s for _, s in sorted(rows)]


def markdown_table(summary: dict, columns=TABLE_COLUMNS, students: list[str] | None = None) -> str:
    header = "| student | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    lines = [header, rule]
    for student in (order(summary) if students is None else students):
        cells = [_cell(summary[student][key], fmt) if key in summary[student] else "" for key, _, fmt in columns]
        lines.append(f"| {student} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_differences(differences: dict, baseline: str = "nll") -> str:
    keys = ("precision_ppl", "recall_ppl", "forward_kl", "reverse_kl", "reverse_kl_on_samples", "entropy",
            "generalization_gap", "ngram_diversity", "self_bleu")
    titles = {key: title.split(" (")[0] for key, title, _ in TABLE_COLUMNS}
    fmts = {key: fmt for key, _, fmt in TABLE_COLUMNS}
    lines = [
        f"| student − {baseline} | " + " | ".join(titles[k] for k in keys) + " |",
        "|---|" + "---:|" * len(keys),
    ]
    for student in order(differences):
        cells = []
        for key in keys:
            d = differences[student].get(key)
            if d is None:
                cells.append("")
                continue
            sign = "+" if d["mean"] >= 0 else ""
            cells.append(f"{sign}{fmts[key].format(d['mean'])} ± {fmts[key].format(d['std'])} ({d['lower']}/{d['n']} lower)")
        lines.append(f"| {student} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(summaries: dict, path: str, titles: dict | None = None, suptitle: str = "") -> None:
    """One row of four panels per regime (`summaries`: `{regime: summary}`): precision vs recall,
    forward vs reverse KL (both with ±1 std error bars over seeds), entropy, and diversity
    (n-gram diversity and 100 − self-BLEU)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    titles = titles or {}
    rows = len(summaries)
    fig, grid = plt.subplots(rows, 4, figsize=(22, 5.2 * rows), squeeze=False)
    for axes, (regime, summary) in zip(grid, summaries.items()):
        _plot_row(plt, axes, summary)
        axes[0].set_title(titles.get(regime, regime), loc="left", fontsize=11)
    if suptitle:
        fig.suptitle(suptitle)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _off_scale(summary: dict, students: list[str]) -> list[str]:
    """Students whose held-out perplexity is more than twice the reference's (nll, else the start):
    collapsed models that would squash every scatter panel; they are listed in a corner instead."""
    reference = summary.get("nll", summary.get("start"))
    if reference is None:
        return []
    limit = 2 * reference["recall_ppl"]["mean"]
    return [s for s in students if summary[s]["recall_ppl"]["mean"] > limit]


def _plot_row(plt, axes, summary: dict) -> None:
    students = order(summary)
    curve = frontier(summary)
    # One distinct color per student: tab10's, then a few more (tab20's pairs of shades would look alike).
    palette = [plt.cm.tab10(i) for i in range(10)] + ["black", "darkgoldenrod", "navy", "lime", "magenta"]
    colors = {s: palette[i % len(palette)] for i, s in enumerate(students)}
    off = _off_scale(summary, students)
    shown = [s for s in students if s not in off]

    def point(ax, s, xkey, ykey):
        m = summary[s]
        big = s.startswith("oracle")
        ax.errorbar(m[xkey]["mean"], m[ykey]["mean"], xerr=m[xkey]["std"], yerr=m[ykey]["std"],
                    fmt="*" if big else ("s" if s == "start" else "o"), color=colors[s], label=s, capsize=3,
                    markersize=11 if big else 6)

    def nll_curve(ax, xkey, ykey):
        if len(curve) < 2:
            return
        xs = [summary[s][xkey]["mean"] for s in curve]
        ys = [summary[s][ykey]["mean"] for s in curve]
        temps = [1.0 if s == "nll" else frontier_temperature(s) for s in curve]
        ax.plot(xs, ys, ls="--", lw=1, color="gray", marker=".",
                label=f"nll at T = {min(temps):g}…{max(temps):g} (gray labels: T)")
        for t, x, y in zip(temps, xs, ys):
            if t != 1.0 and abs(round(t * 10) - t * 10) < 1e-6:  # label every 0.1
                ax.annotate(f"{t:g}", (x, y), fontsize=7, color="gray", xytext=(3, 3), textcoords="offset points")

    def note_off_scale(ax):
        ax.margins(0.08)
        if off:
            text = "off scale: " + "; ".join(
                f"{s} (recall PPL {summary[s]['recall_ppl']['mean']:.0f}, precision PPL "
                f"{summary[s]['precision_ppl']['mean']:.1f}, entropy {summary[s]['entropy']['mean']:.2f})" for s in off)
            ax.text(0.01, 0.01, text, transform=ax.transAxes, fontsize=7, va="bottom", ha="left",
                    bbox=dict(facecolor="white", alpha=0.8, edgecolor="lightgray"))

    ax = axes[0]
    nll_curve(ax, "recall_ppl", "precision_ppl")
    for s in shown:
        point(ax, s, "recall_ppl", "precision_ppl")
    ax.set_xlabel("recall: student PPL on held-out oracle text (lower = better)")
    ax.set_ylabel("precision: oracle PPL of student samples\n(lower = better; log scale)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="upper left")
    note_off_scale(ax)

    ax = axes[1]
    nll_curve(ax, "forward_kl", "reverse_kl_on_samples")
    for s in shown:
        if summary[s]["forward_kl"]["mean"] > 0:  # the oracle itself sits at (0, 0)
            point(ax, s, "forward_kl", "reverse_kl_on_samples")
    ax.set_xlabel("forward KL(oracle‖student) on held-out oracle text (nats/token)")
    ax.set_ylabel("reverse KL(student‖oracle) on the student's samples (nats/token)")
    ax.grid(alpha=0.3)
    note_off_scale(ax)

    ax = axes[2]
    nll_curve(ax, "entropy", "recall_ppl")
    for s in shown:
        point(ax, s, "entropy", "recall_ppl")
    ax.set_xlabel("student entropy on held-out prefixes (nats/token)")
    ax.set_ylabel("held-out perplexity (= exp cross-entropy; lower = better)")
    ax.grid(alpha=0.3)
    note_off_scale(ax)

    ax = axes[3]
    xs = list(range(len(students)))
    width = 0.4
    ngram = [summary[s]["ngram_diversity"]["mean"] for s in students]
    bleu_div = [100 - summary[s]["self_bleu"]["mean"] for s in students]
    ax.bar([x - width / 2 for x in xs], ngram, width, yerr=[summary[s]["ngram_diversity"]["std"] for s in students],
           capsize=2, label="n-gram diversity (distinct-1..3)", color="tab:blue")
    ax.bar([x + width / 2 for x in xs], bleu_div, width, yerr=[summary[s]["self_bleu"]["std"] for s in students],
           capsize=2, label="100 − self-BLEU", color="tab:orange")
    ax.set_xticks(xs, students, rotation=30, ha="right")
    ax.set_ylim(0, 105)
    ax.set_ylabel("diversity of the samples of one prefix (higher = more diverse)")
    ax.legend(fontsize=8, loc="lower right")
