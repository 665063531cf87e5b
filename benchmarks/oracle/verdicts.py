"""The oracle study's verdicts: each paper claim as a paired, two-sided test with three labels
(`benchmarks/study_stats.py`), per table the number of comparisons and Holm's adjustment.

The paired unit is the seed: every student of one seed starts from the same checkpoint, sees the same data order and
samples with the same seed, so a loss's per-seed difference with nll (or with nll sampled at the same entropy) is the
item of Student's t (three seeds: two degrees of freedom). The study's measures are exact or averaged over 1,000
held-out sequences and 512 samples inside each seed, and its results keep no per-sequence figure, so the seeds are all
there is to pair over.

Two sources give the differences: a run's `results.json` (each seed's difference, exact), or a committed
`results.md` (mean ± std over the seeds, rounded as printed: the interval is then widened by the rounding,
`study_stats.compare_summary`). The committed report of 2026-11-23 kept only its `results.md`, so
`docs/oracle/verdicts.md` is computed from it:

    python benchmarks/oracle_study.py --verdicts_from docs/oracle/results.md docs/oracle/gem_target_3.8_results.md \\
        --output_dir docs/oracle
"""

from __future__ import annotations

import re
from pathlib import Path

from benchmarks import study_stats

from .report import CLOSENESS_KEYS, TABLE_COLUMNS

REGIMES = ("ample", "limited")
TITLES = {title.split(" (")[0]: key for key, title, _ in TABLE_COLUMNS}
NAMES = {"precision_ppl": "precision PPL_oracle ↓", "recall_ppl": "recall PPL ↓", "forward_kl": "KL(o‖s) ↓",
         "reverse_kl": "KL(s‖o) held-out ↓", "reverse_kl_on_samples": "KL(s‖o) own samples ↓", "entropy": "entropy ↑",
         "generalization_gap": "held-out − train NLL ↓", "ngram_diversity": "n-gram div. ↑", "self_bleu": "self-BLEU ↓"}
LOWER_IS_BETTER = {"precision_ppl", "recall_ppl", "forward_kl", "reverse_kl", "reverse_kl_on_samples",
                   "generalization_gap", "self_bleu"}
EQUAL_ENTROPY = "nll at equal entropy"

# The claims, one table each: (title, [(student, compared with, metrics)]), every one in both regimes. "compared with":
# nll, nll at equal entropy (the matched table), or a comparator of the gem-target table.
CLAIMS = [
    ("EMO (Ren et al., ICLR 2024): lower PPL_oracle than MLE, at equal or better recall", [
        ("emo", "nll", ("precision_ppl", "recall_ppl", "forward_kl", "reverse_kl_on_samples")),
        ("emo", EQUAL_ENTROPY, ("precision_ppl", "recall_ppl", "forward_kl", "reverse_kl_on_samples")),
    ]),
    ("GEM (Li et al., ICLR 2025): higher entropy and diversity at similar cross-entropy; less overfitting", [
        (student, "nll", ("entropy", "ngram_diversity", "self_bleu", "generalization_gap", "recall_ppl"))
        for student in ("gem-linear", "gem-logsigmoid")] + [
        (student, EQUAL_ENTROPY, ("recall_ppl", "forward_kl", "reverse_kl_on_samples", "generalization_gap"))
        for student in ("gem-linear", "gem-logsigmoid")]),
    ("GEM with the oracle's entropy as its target: closer to the oracle in both KL directions", [
        ("gem-target", comparator, ("forward_kl", "reverse_kl_on_samples"))
        for comparator in ("gem-linear", "nll", "nll at gem-target's entropy", "nll at the oracle's entropy")]),
    ("The EMO paper's baselines: better than nll at the same entropy?", [
        ("tailr", "nll", ("recall_ppl", "forward_kl"))] + [
        (student, EQUAL_ENTROPY, ("recall_ppl", "forward_kl", "reverse_kl_on_samples"))
        for student in ("mixce", "tailr-floor", "tailr-authors")]),
]
# The reachable-target run (`--losses nll gem-target --gem_target_entropy 3.8`): its own table.
TARGET_RUN_CLAIMS = [
    ("GEM with a reachable target (3.8 nats): closer to the oracle than nll at the same entropy", [
        ("gem-target", EQUAL_ENTROPY, ("forward_kl", "reverse_kl_on_samples", "recall_ppl"))]),
]

_CELL = re.compile(r"^([+-]?\d+(?:\.(\d+))?) ± (\d+(?:\.(\d+))?) \((\d+)/(\d+)(?: lower)?\)$")


def _cell(text: str) -> dict | None:
    """`+4.79 ± 0.38 (0/3 lower)` -> mean, std, n, lower and the rounding (half a unit of the last printed digit)."""
    match = _CELL.match(text.strip().replace("−", "-"))
    if match is None:
        return None
    decimals = max(len(match.group(2) or ""), len(match.group(4) or ""))
    return {"mean": float(match.group(1)), "std": float(match.group(3)), "n": int(match.group(6)),
            "lower": int(match.group(5)), "rounding": 0.5 * 10 ** -decimals}


def differences_from_markdown(text: str) -> dict:
    """{regime: {"nll" | EQUAL_ENTROPY | a gem-target comparator: {student: {metric: cell}}}} read from a
    `results.md` the study wrote (its paired-difference, equal-entropy and gem-target tables)."""
    out: dict = {}
    regime, kind, keys = None, None, []
    for line in text.splitlines():
        heading = re.match(r"^## '(\w+)' regime", line)
        if heading:
            regime, kind = heading.group(1), None
            out.setdefault(regime, {})
            continue
        if not line.startswith("|"):
            kind = None
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("student − nll", "student − nll at equal entropy", "gem-target − comparator"):
            kind = {"student − nll": "nll", "student − nll at equal entropy": EQUAL_ENTROPY}.get(cells[0], "target")
            keys = [TITLES.get(c) for c in cells[1:]]
            continue
        if kind is None or regime is None or set(cells[0]) <= {"-"}:
            continue
        row = {key: parsed for key, c in zip(keys, cells[1:]) if key and (parsed := _cell(c)) is not None}
        if kind == "target":  # one row per comparator, gem-target the student
            out[regime].setdefault(cells[0], {})["gem-target"] = row
        else:
            out[regime].setdefault(kind, {})[cells[0]] = row
    return out


def differences_from_results(results: dict) -> dict:
    """The same from a run's results (`report.analyse`): each seed's difference where the analysis kept them."""
    out: dict = {}
    for regime in results.get("paired_differences_vs_nll", {}):
        out[regime] = {"nll": results["paired_differences_vs_nll"][regime],
                       EQUAL_ENTROPY: results.get("differences_vs_nll_at_equal_entropy", {}).get(regime, {})}
        for student, comparison in results.get("target_entropy", {}).get(regime, {}).items():
            for comparator, entry in comparison["comparisons"].items():
                out[regime].setdefault(comparator, {})[student] = {k: entry[k] for k in CLOSENESS_KEYS if k in entry}
    return out


def effect(cell: dict) -> study_stats.Effect:
    """The paired test of one difference: from each seed's value when kept, else from the rounded mean ± std."""
    if cell.get("values"):
        return study_stats.compare_seeds(dict(enumerate(cell["values"])))
    return study_stats.compare_summary(cell["mean"], cell["std"], cell["n"], rounding=cell.get("rounding", 0.0))


def verdict_rows(differences: dict, claims: list) -> list[tuple[str, list[dict]]]:
    """Per claim table: its rows (regime, student, comparator, metric, effect, label, Holm), judged together."""
    tables = []
    for title, entries in claims:
        rows = []
        for regime in REGIMES:
            for student, comparator, metrics in entries:
                cells = differences.get(regime, {}).get(comparator, {}).get(student)
                if not cells:
                    continue
                for metric in metrics:
                    if metric in cells:
                        rows.append({"regime": regime, "student": student, "compared_with": comparator,
                                     "metric": metric, "effect": effect(cells[metric]),
                                     "higher_is_better": metric not in LOWER_IS_BETTER})
        if rows:
            tables.append((title, study_stats.judged(rows)))
    return tables


def _digits(metric: str) -> int:
    """The decimals the study's own tables print each metric with."""
    return {"precision_ppl": 2, "recall_ppl": 2, "ngram_diversity": 2, "self_bleu": 2, "entropy": 3}.get(metric, 4)


def markdown(tables: list[tuple[str, list[dict]]]) -> str:
    lines = []
    for title, rows in tables:
        lines += [f"### {title}", "", study_stats.comparisons_line(rows), "",
                  "| regime | loss | compared with | metric | effect [95 % interval] | verdict | p | Holm p | after Holm "
                  "| computed by |", "|---|---|---|---|---:|---|---:|---:|---|---|"]
        for row in rows:
            e = row["effect"]
            lines.append(f"| {row['regime']} | {row['student']} | {row['compared_with']} | {NAMES[row['metric']]} | "
                         f"{study_stats.interval_text(e, _digits(row['metric']))} | **{row['label']}** | "
                         f"{study_stats.p_text(e.p)} | {study_stats.p_text(row['holm_p'])} | {row['holm_label']} | "
                         f"{e.method} |")
        lines.append("")
    return "\n".join(lines)


HEADER = """# Oracle study: verdicts

Each paper claim as a paired, two-sided test (`benchmarks/oracle/verdicts.py`, `benchmarks/study_stats.py`): the
effect is the loss's figure minus the comparator's, the mean of its per-seed differences (every student of a seed
shares its start, data order and sampling seed: the seed is the paired unit; the study keeps no per-sequence figure),
with a 95 % interval from Student's t over the seeds. **better**: the interval on the better side of 0 (the metric's
arrow), **worse**: on the other side, **cannot tell**: it contains 0. Holm's adjustment is over each table's
comparisons.
"""


def verdicts_markdown(main: dict, target_run: dict | None = None, sources: str = "") -> str:
    text = HEADER + (f"\n{sources}\n" if sources else "") + "\n" + markdown(verdict_rows(main, CLAIMS))
    if target_run:
        text += "\n" + markdown(verdict_rows(target_run, TARGET_RUN_CLAIMS))
    return text.rstrip("\n") + "\n"


def write_from_markdown(paths: list[Path], output_dir: Path) -> Path:
    """`verdicts.md` from the committed `results.md` of the main run (and the reachable-target run's)."""
    main = differences_from_markdown(Path(paths[0]).read_text())
    target = differences_from_markdown(Path(paths[1]).read_text()) if len(paths) > 1 else None
    sources = ("Computed from the committed tables " + " and ".join(f"`{Path(p).name}`" for p in paths)
               + " (mean ± std of each seed's difference, as printed: each interval is widened by the rounding).")
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "verdicts.md"
    path.write_text(verdicts_markdown(main, target, sources))
    return path
