"""The real-model study (`benchmarks/real_model_study.py`): its problems, its verdicts and its report, on hand-made
results (the study itself runs for minutes; `--quick` is run by hand, see docs/real_model_study.md)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.real_model import report  # noqa: E402
from benchmarks.real_model.problems import TEMPLATES, make_problem, make_splits  # noqa: E402
from trl_emo.evaluation.metrics import extract_answer  # noqa: E402


def test_every_worked_step_is_right_and_the_gold_answer_is_what_gsm8k_scoring_reads():
    import random

    rng = random.Random(0)
    step = re.compile(r"(\d+) ([-+*/]) (\d+) = \$?(\d+)")
    seen_templates = set()
    for _ in range(400):
        row = make_problem(rng)
        assert row["query"] == row["question"] and row["response"] == row["answer"]
        final = int(row["response"].rsplit("#### ", 1)[1])
        assert final >= 0
        assert extract_answer(row["response"]) == str(final)
        for a, op, b, c in step.findall(row["response"]):
            value = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b), "/": int(a) / int(b)}[op]
            assert value == int(c), row["response"]
        seen_templates.add(row["question"].split()[1])
    assert len(TEMPLATES) >= 8 and len(seen_templates) > 8


def test_splits_are_disjoint_deterministic_and_independent_of_each_others_sizes():
    splits = make_splits({"train": 50, "validation": 20, "test": 30}, seed=0)
    questions = [r["question"] for rows in splits.values() for r in rows]
    assert len(questions) == len(set(questions)) == 100
    again = make_splits({"train": 50, "validation": 20, "test": 30}, seed=0)
    assert again == splits
    bigger = make_splits({"train": 80, "validation": 20, "test": 30}, seed=0)
    assert bigger["train"][:50] == splits["train"]
    # A different training size may only push a clashing question out of a later split, never reshuffle it.
    assert len({r["question"] for r in bigger["test"]} & {r["question"] for r in splits["test"]}) >= 25
    # Several phrasings of the same steps: the data has more than one good answer per template.
    rows = make_splits({"train": 400}, seed=1)["train"]
    openings = {r["response"].split(" ", 2)[0] for r in rows if r["question"].startswith("A ") and "km" in r["question"]}
    assert len(openings) >= 2


def stats(*values):
    return report._stats(list(values))


def test_a_claim_is_a_paired_test_over_the_seeds():
    metric = {"nll": stats(10.0, 11.0, 12.0), "gem": stats(14.0, 15.0, 16.2), "gem-ls": stats(13.5)}
    gem, gem_ls = report.compare(metric)
    # Seed by seed +4, +4, +4.2: a small spread of the differences, though each arm's own spread is 1.
    assert gem["effect"].label() == "better" and gem["effect"].method == "t over 3 paired seeds"
    assert gem["effect"].effect == pytest.approx(4.0667, abs=1e-4) and "vs CE 11 ± 1" in gem["seen"]
    assert gem_ls["effect"].label() == "cannot tell" and gem_ls["effect"].low is None  # one seed: no interval
    metric["gem"] = stats(12.0, 10.5, 12.5)  # +2, −0.5, +0.5: cannot tell
    assert report.compare(metric, runs=("gem",))[0]["effect"].label() == "cannot tell"
    # Lower is better (cross-entropy): the same gap the other way round is "better".
    metric = {"nll": stats(1.0, 1.1, 1.2), "gem": stats(0.7, 0.75, 0.86)}
    assert report.compare(metric, runs=("gem",), higher_is_better=False)[0]["effect"].label(False) == "better"
    assert report.compare({"gem": stats(1.0)}) == []


def hand_made_results(tmp_path) -> dict:
    def math_summary(greedy, sample, pass_k, mv_k):
        return {"gsm8k": {"k": [1, 2, 4, 8], "greedy_accuracy": greedy, "sample_accuracy": sample,
                          "pass_unbiased": pass_k, "mv_subsets": mv_k}, "diversity": {"distinct_n": 50.0}}

    def creative(distinct):
        return {"diversity": {"distinct_n": distinct, "self_bleu": distinct - 5, "embedding": distinct / 2}}

    models = {"base": math_summary(5.0, 3.0, [3, 6, 10, 15], [3, 3, 4, 5])}
    creative_models = {"base": creative(60.0)}
    runs = []
    for run, seeds, gain in (("nll", [0, 1, 2], 0.0), ("gem", [0, 1, 2], 5.0), ("emo", [0], 1.0)):
        for seed in seeds:
            name = f"{run}-s{seed}"
            models[name] = math_summary(40 + gain + seed, 30 + gain, [30 + gain, 40 + gain, 50 + gain, 60 + gain + seed],
                                        [30, 35, 38 + gain, 40 + gain])
            creative_models[name] = creative(50 + 2 * gain + seed)
            epochs = [{"epoch": e + 1, "cross_entropy": 0.5 - 0.1 * e + (0.15 * (e == 2) if run == "nll" else 0),
                       "entropy": 0.4 + 0.05 * gain, "accuracy": 80.0, "tokens": 100} for e in range(3)]
            runs.append({"run": run, "seed": seed, "path": str(tmp_path / name), "epochs": epochs, "train_seconds": 60.0,
                         "final_log": {"loss": 0.3, **({"gem_beta": 0.7} if run == "gem" else {})}})
    return {
        "environment": {"date": "2026-11-25", "machine": "test", "python": "3.11", "versions": {"torch": "x"},
                        "model": "tiny", "command": "python benchmarks/real_model_study.py"},
        "settings": {"k_values": [1, 2, 4, 8], "train": 128, "seeds": {"nll": [0, 1, 2], "gem": [0, 1, 2], "emo": [0]}},
        "base": {"heldout": {"cross_entropy": 1.0, "entropy": 0.9, "accuracy": 60.0, "tokens": 100},
                 "train": {"cross_entropy": 1.0, "entropy": 0.9, "accuracy": 60.0, "tokens": 100}},
        "runs": runs,
        "evaluations": {"math": models, "poem": creative_models, "story": creative_models},
        "total_seconds": 600.0,
    }


def test_the_report_aggregates_seeds_and_writes_its_verdicts_tables_and_figure(tmp_path):
    results = hand_made_results(tmp_path)
    results["evaluations"]["math_paper"] = results["evaluations"]["math"]  # `--paper_sampling`
    results["analysis"] = report.analyse(results)
    analysis = results["analysis"]
    assert analysis["math"]["greedy"]["nll"]["mean"] == pytest.approx(41.0)
    assert analysis["math"]["greedy"]["nll"]["std"] == pytest.approx(1.0)
    assert analysis["math"]["greedy"]["gem"]["n"] == 3 and analysis["math"]["greedy"]["emo"]["n"] == 1
    # CE's held-out cross-entropy rose 0.05 after its best epoch (epoch 2); GEM's never rose.
    assert analysis["heldout"]["nll"]["rise_from_best"]["mean"] == pytest.approx(0.05)
    assert analysis["heldout"]["gem"]["rise_from_best"]["mean"] == pytest.approx(0.0)
    verdicts = {(row["claim"], row["run"]): row for row in analysis["verdicts"]}
    greedy = next(v for (c, run), v in verdicts.items() if c.startswith("GEM's greedy") and run == "gem")
    # 45, 46, 47 against 40, 41, 42 seed by seed: +5 on every seed, no spread of the differences: no interval.
    assert greedy["effect"]["effect"] == pytest.approx(5.0) and greedy["label"] == "cannot tell"
    poems = next(v for (c, run), v in verdicts.items() if "poems (n-gram" in c and run == "gem")
    assert poems["effect"]["effect"] == pytest.approx(10.0)
    emo = next(v for (c, run), v in verdicts.items() if c.startswith("EMO's samples"))
    assert emo["effect"]["method"] == "one paired seed: no interval" and emo["label"] == "cannot tell"
    assert sum("GEM's own GSM8K sampling" in claim for claim, _ in verdicts) == 2
    assert all("holm_p" in row for row in analysis["verdicts"] if row["effect"] is not None)
    report.write_outputs(results, tmp_path / "out")
    text = (tmp_path / "out" / "real_model_study_results.md").read_text()
    assert "### Task 1b: the same problems sampled as GEM samples GSM8K" in text
    assert "| greedy accuracy, % | 5.0 | 41.0 ± 1.0 | 46.0 ± 1.0 | 41.0 |" in text
    assert "CE (`nll`, TRL) (3 seeds)" in text and "EMO (1 seed)" in text
    assert (tmp_path / "out" / "real_model_study.png").stat().st_size > 10_000
    saved = json.loads((tmp_path / "out" / "real_model_study.json").read_text())
    assert saved["analysis"]["verdicts"] == json.loads(json.dumps(analysis["verdicts"]))


def test_the_study_command_line():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import real_model_study as study

    quick = study.parse_args(["--quick"])
    assert quick.runs == ["nll", "gem"] and quick.seed_plan == {"nll": [0], "gem": [0]} and quick.train == 16
    default = study.parse_args([])
    assert default.seed_plan == {"nll": [0, 1, 2], "gem": [0, 1, 2], "gem-ls": [0], "emo": [0], "gem-target": [0]}
    assert default.test >= 64 and default.samples == 8 and default.epochs == 3
    assert study.parse_args(["--seeds", "4", "5", "--runs", "emo"]).seed_plan == {"emo": [4, 5]}
    recipe = study.recipe_for("gem-ls", 1, "m", Path("d"), Path("r"), default)
    assert recipe["loss_type"] == "gem" and recipe["gem_h"] == "logsigmoid" and recipe["seed"] == 1
    assert recipe["num_train_epochs"] == 3 and recipe["save_strategy"] == "epoch"
    assert recipe_equal_but_loss(study, default)
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "real_model_study.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--lr_sweep" in proc.stdout


def recipe_equal_but_loss(study, args) -> bool:
    """No per-loss tuning: the recipes of two runs differ only in the loss fields, the seed and the folder."""
    a = study.recipe_for("nll", 0, "m", Path("d"), Path("r1"), args)
    b = study.recipe_for("emo", 0, "m", Path("d"), Path("r2"), args)
    differing = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    return differing == {"loss_type", "output_dir"}


def test_overfitting_is_read_from_the_longer_run_when_no_three_epoch_run_overfits(tmp_path):
    results = hand_made_results(tmp_path)
    for run in results["runs"]:  # every loss still improving at its last epoch
        for e, epoch in enumerate(run["epochs"]):
            epoch["cross_entropy"] = 0.5 - 0.1 * e
    curve = {"nll": [0.4, 0.3, 0.25, 0.3, 0.4], "gem": [0.45, 0.33, 0.3, 0.31, 0.32]}
    results["long_runs"] = [
        {"run": run, "seed": 0, "path": "x", "train_seconds": 100.0, "final_log": {},
         "epochs": [{"epoch": e + 1, "cross_entropy": ce, "entropy": 0.3, "accuracy": 90.0, "tokens": 100}
                    for e, ce in enumerate(values)]}
        for run, values in curve.items()
    ]
    results["analysis"] = analysis = report.analyse(results)
    assert analysis["long"]["nll"]["best_epoch"]["mean"] == 3 and analysis["long"]["nll"]["rise_from_best"]["mean"] == pytest.approx(0.15)
    verdicts = {row["claim"]: row for row in analysis["verdicts"]}
    three = next(row for claim, row in verdicts.items() if "rises less" in claim and "3 epochs" in claim)
    assert three["label"] == "not observable here"
    five = next(row for claim, row in verdicts.items() if "rises less" in claim and "5 epochs" in claim)
    # 0.02 vs 0.15, one seed each: the difference is shown, and no interval comes from one seed.
    assert five["effect"]["effect"] == pytest.approx(-0.13) and five["label"] == "cannot tell"
    last = next(row for claim, row in verdicts.items() if "last of 5 epochs" in claim)
    assert last["effect"]["effect"] == pytest.approx(-0.08) and last["effect"]["low"] is None
    text = report.markdown(results)
    assert "### Task 3b: 5 epochs over the same 128 problems" in text and "| best epoch (lowest held-out cross-entropy) | 3 | 3 |" in text
