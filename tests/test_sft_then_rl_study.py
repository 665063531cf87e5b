"""The SFT-then-RL study's analysis and report, on synthetic runs (the study itself trains a real model: minutes)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sft_then_rl_study as study  # noqa: E402


def _run(arm, seed, greedy_before, greedy_after, pass8_after):
    def stage(greedy, pass8):
        return {"t1": {"greedy_accuracy": greedy, "pass@1": greedy / 2, "pass@8": pass8, "distinct_answers": 5.0},
                "paper": {"pass@1": greedy / 2, "pass@8": pass8}, "heldout_entropy": 0.1}

    return {"arm": arm, "seed": seed, "sft_seconds": 1.0, "rl_seconds": 1.0, "sft": stage(greedy_before, 50.0),
            "rl": stage(greedy_after, pass8_after), "rl_curves": {"reward": [0.1, 0.2, 0.3, 0.4, 0.5]}}


def _results(runs, arms):
    return {"environment": {"command": "test", "date": "today", "machine": "here"},
            "settings": {"arms": arms, "test": 64}, "runs": runs, "total_seconds": 60.0}


def test_a_gap_must_clear_the_seeds_spread_and_the_test_problems_sampling_error():
    runs = [_run("nll", s, 30, 30 + s, 50) for s in (0, 1)]
    runs += [_run("gem", s, 30, 50, 80) for s in (0, 1)]  # far above: beyond a 64-problem error of ~6 points
    runs += [_run("sed", 0, 30, 33, 52)]  # one seed, 2-3 points above: within the sampling error
    runs += [_run("eksft", 0, 5, 5, 10)]
    analysis = study.analyse(_results(runs, ["nll", "gem", "sed", "eksft"]))
    verdicts = analysis["verdicts"]
    assert verdicts["gem"]["overall"] == "holds"
    assert verdicts["sed"]["overall"] == "partly"  # no spread from one seed, yet not "holds"
    assert verdicts["eksft"]["overall"] == "does not hold"
    assert analysis["table"]["nll"]["t1/greedy_accuracy"]["rl"]["n"] == 2
    assert study._sampling_error(50.0, 64) == 6.25


def test_the_report_lists_every_arm_run_and_verdict():
    runs = [_run("nll", 0, 30, 31, 50), _run("gem", 0, 30, 29, 55)]
    results = _results(runs, ["nll", "gem"])
    results["analysis"] = study.analyse(results)
    text = study.report_markdown(results)
    assert "| gem | **" in text and "| nll-s0 |" in text and "| gem-s0 |" in text
    assert "sampling error" in text


def test_quick_and_default_sizes():
    quick = study.parse_args(["--quick"])
    assert quick.arms == study.QUICK_ARMS and quick.seeds == [0] and quick.rl_steps == study.QUICK["rl_steps"]
    default = study.parse_args([])
    assert default.arms == list(study.ARMS) and default.seeds == study.DEFAULT_SEEDS and default.test == 64
    assert study.parse_args(["--finished_only"]).finished_only
