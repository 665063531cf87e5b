"""Aggregation over seeds, the Markdown table and the plot of the oracle study."""

from __future__ import annotations

from collections import defaultdict

from .metrics import mean_std

# (key, column header, format); arrows say which direction is better where there is one.
TABLE_COLUMNS = (
    ("precision_ppl", "PPL_oracle(student samples) ↓ (precision)", "{:.2f}"),
    ("recall_ppl", "PPL_student(held-out) ↓ (recall)", "{:.2f}"),
    ("forward_kl", "KL(oracle‖student) ↓", "{:.4f}"),
    ("reverse_kl", "KL(student‖oracle) ↓", "{:.4f}"),
    ("entropy", "entropy (nats)", "{:.3f}"),
    ("generalization_gap", "held-out − train NLL", "{:.4f}"),
    ("ngram_diversity", "n-gram div. ↑", "{:.2f}"),
    ("distinct_2", "distinct-2 ↑", "{:.2f}"),
    ("self_bleu", "self-BLEU ↓", "{:.2f}"),
)

REFERENCE_ROWS = ("oracle", "start")


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
    students = sorted({row["student"] for row in runs} - {baseline, "oracle"})
    for student in students:
        out[student] = {}
        for key, _, _ in TABLE_COLUMNS:
            diffs = [m[student][key] - m[baseline][key] for m in by_seed.values() if student in m and baseline in m]
            if not diffs:
                continue
            mean, std = mean_std(diffs)
            out[student][key] = {"mean": mean, "std": std, "n": len(diffs), "lower": sum(d < 0 for d in diffs)}
    return out


def _cell(stats: dict, fmt: str) -> str:
    if stats["n"] > 1:
        return f"{fmt.format(stats['mean'])} ± {fmt.format(stats['std'])}"
    return fmt.format(stats["mean"])


def order(students) -> list[str]:
    return [s for s in REFERENCE_ROWS if s in students] + [s for s in students if s not in REFERENCE_ROWS]


def markdown_table(summary: dict, columns=TABLE_COLUMNS) -> str:
    header = "| student | " + " | ".join(title for _, title, _ in columns) + " |"
    rule = "|---|" + "---:|" * len(columns)
    lines = [header, rule]
    for student in order(summary):
        cells = [_cell(summary[student][key], fmt) if key in summary[student] else "" for key, _, fmt in columns]
        lines.append(f"| {student} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown_differences(differences: dict, baseline: str = "nll") -> str:
    keys = ("precision_ppl", "recall_ppl", "forward_kl", "reverse_kl", "entropy", "ngram_diversity", "self_bleu")
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


def plot(summary: dict, path: str, title: str = "") -> None:
    """Four panels: precision vs recall, forward vs reverse KL (both with ±1 std error bars over
    seeds), entropy, and diversity (n-gram diversity, 100 − self-BLEU)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    students = order(summary)
    colors = {s: plt.cm.tab10(i % 10) for i, s in enumerate(students)}
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))

    def scatter(ax, xkey, ykey, xlabel, ylabel):
        for s in students:
            m = summary[s]
            marker = "*" if s == "oracle" else ("s" if s == "start" else "o")
            ax.errorbar(m[xkey]["mean"], m[ykey]["mean"], xerr=m[xkey]["std"], yerr=m[ykey]["std"], fmt=marker,
                        color=colors[s], label=s, capsize=3, markersize=9 if s == "oracle" else 6)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)

    scatter(axes[0, 0], "recall_ppl", "precision_ppl", "recall: student PPL on held-out oracle text (lower = better)",
            "precision: oracle PPL of student samples (lower = better)")
    axes[0, 0].legend(fontsize=8)
    trained = [s for s in students if s != "oracle"]
    sub = {s: summary[s] for s in trained}
    ax = axes[0, 1]
    for s in trained:
        m = sub[s]
        ax.errorbar(m["forward_kl"]["mean"], m["reverse_kl"]["mean"], xerr=m["forward_kl"]["std"],
                    yerr=m["reverse_kl"]["std"], fmt="s" if s == "start" else "o", color=colors[s], label=s, capsize=3)
    ax.set_xlabel("forward KL(oracle‖student), nats/token")
    ax.set_ylabel("reverse KL(student‖oracle), nats/token")
    ax.grid(alpha=0.3)

    ax = axes[1, 0]
    xs = range(len(students))
    ax.bar(xs, [summary[s]["entropy"]["mean"] for s in students], yerr=[summary[s]["entropy"]["std"] for s in students],
           color=[colors[s] for s in students], capsize=3)
    if "oracle" in summary:
        ax.axhline(summary["oracle"]["entropy"]["mean"], color="k", ls="--", lw=1, label="oracle entropy")
        ax.legend(fontsize=8)
    ax.set_xticks(list(xs), students, rotation=30, ha="right")
    ax.set_ylabel("mean next-token entropy on held-out prefixes (nats)")
    lows = [summary[s]["entropy"]["mean"] - summary[s]["entropy"]["std"] for s in students]
    highs = [summary[s]["entropy"]["mean"] + summary[s]["entropy"]["std"] for s in students]
    pad = 0.15 * (max(highs) - min(lows) + 1e-9)
    ax.set_ylim(min(lows) - pad, max(highs) + pad)

    ax = axes[1, 1]
    width = 0.4
    ngram = [summary[s]["ngram_diversity"]["mean"] for s in students]
    ngram_err = [summary[s]["ngram_diversity"]["std"] for s in students]
    bleu_div = [100 - summary[s]["self_bleu"]["mean"] for s in students]
    bleu_err = [summary[s]["self_bleu"]["std"] for s in students]
    ax.bar([x - width / 2 for x in xs], ngram, width, yerr=ngram_err, capsize=2, label="n-gram diversity", color="tab:blue")
    ax.bar([x + width / 2 for x in xs], bleu_div, width, yerr=bleu_err, capsize=2, label="100 − self-BLEU", color="tab:orange")
    ax.set_xticks(list(xs), students, rotation=30, ha="right")
    values = ngram + bleu_div
    spread = max(values) - min(values) + 1e-9
    ax.set_ylim(min(values) - 0.5 * spread - 1, max(values) + 0.5 * spread + 1)
    ax.set_ylabel("diversity of k samples per prefix (higher = more diverse)")
    ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
