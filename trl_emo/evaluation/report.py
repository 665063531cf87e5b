"""Writing the results: summary.json, summary.md (models side by side) and figures (bon.png)."""

from __future__ import annotations

import json
import os


def write_reports(summary: dict, output_dir: str, plot: bool = True, task=None) -> None:
    """summary.json, summary.md (the task's tables) and the task's figures (when `plot`)."""
    if task is None:
        from .task_registry import get_task

        task = get_task(summary.get("task", "bon"))(None)
    with open(os.path.join(output_dir, "summary.json"), "w", encoding="utf-8") as handle:
        json.dump(summary, handle, indent=2, sort_keys=True)
        handle.write("\n")
    with open(os.path.join(output_dir, "summary.md"), "w", encoding="utf-8") as handle:
        handle.write(markdown_table(summary, task))
    if plot:
        task.plot(summary, output_dir)


def fmt(value) -> str:
    return "–" if value is None else f"{value:.2f}"


def table_lines(header: list[str], rows) -> list[str]:
    """A Markdown table: the first column (names) left-aligned, the others (numbers) right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def markdown_table(summary: dict, task) -> str:
    """The task's header, then one table per metric group with one column per model."""
    names = list(summary["models"])
    sections = []
    for title, rows in task.report_sections(summary):
        if not rows:
            continue
        if isinstance(rows, str):  # a table the task laid out itself
            sections.append(f"### {title}\n\n{rows}")
            continue
        table = table_lines(["metric", *names], [[label, *map(fmt, values)] for label, values in rows])
        sections.append("\n".join([f"### {title}", "", *table]))
    return task.header(summary) + "\n" + "\n\n".join(sections) + "\n"


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


def plot_accuracy_bars(models: list[str], values: dict[str, list], ylabel: str, path: str) -> None:
    """Grouped bars: one group per metric (`values` label -> one value per model), one colour per model."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(2 + 1.6 * len(values), 3.5))
    FigureCanvasAgg(fig)
    axis = fig.subplots()
    width = 0.8 / max(len(models), 1)
    for index, name in enumerate(models):
        xs = [group + (index - (len(models) - 1) / 2) * width for group in range(len(values))]
        heights = [column[index] if column[index] is not None else 0.0 for column in values.values()]
        axis.bar(xs, heights, width=width, color=f"C{index % 10}", label=name)
    axis.set_xticks(range(len(values)), list(values))
    axis.set_ylabel(ylabel)
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
