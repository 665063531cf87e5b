"""The benchmark scripts run (tiny sizes, CPU): they must keep working for the GPU runs in docs/benchmarks.md.

Nothing here asserts a speed: benchmarks measure, tests check that they can.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import loss_bench, step_bench  # noqa: E402


def test_loss_bench_runs_each_variant_and_reports_ratios_and_errors(tmp_path, capsys):
    out = tmp_path / "raw.json"
    assert loss_bench.main(["--sizes", "64x500x16", "--variants", "trl_nll", "gem", "liger_nll", "--repeats", "1",
                            "--accuracy", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| gem |" in table and "| trl_nll | " in table
    rows = {r["variant"]: r for r in json.loads(out.read_text())["results"]["64x500x16"]}
    assert rows["gem"]["seconds"] > 0 and rows["gem"]["peak_extra_bytes"] >= 0
    # float32 on the CPU: only summation order separates the fused path from float64.
    assert rows["gem"]["grad_head_rel_error"] < 1e-5 and rows["trl_nll"]["loss_rel_error"] < 1e-5
    # A missing optional package is reported, not a failure.
    assert "unavailable" in rows["liger_nll"] or "seconds" in rows["liger_nll"]


def test_step_bench_worker_times_trainer_steps():
    args = argparse.Namespace(variant="gem", liger=False, qlora=False, shape="tiny", batch=2, seq=32, steps=2, warmup=1,
                              device="cpu", cache="unused")
    result = step_bench.worker(args)
    assert result["steps_timed"] == 2 and result["step_seconds"] > 0 and result["last_loss"] is not None
    table = step_bench.format_table([result, {**result, "variant": "nll", "step_seconds": result["step_seconds"] / 2}])
    assert "| gem | False | False |" in table and "2.00" in table


def test_loss_bench_interleaves_the_variants_in_one_process(capsys):
    """`--interleave` (a machine shared with other work): every variant in turn in one process, its fastest call."""
    assert loss_bench.main(["--sizes", "64x500x16", "--variants", "trl_nll", "prob", "iw_sft", "--interleave",
                            "--rounds", "1"]) == 0
    table = capsys.readouterr().out
    assert "in one process, in turn, 3 rounds after one" in table
    assert "| prob | " in table and "| iw_sft | " in table and "| — | — |" in table  # no memory figures
