"""`benchmarks/gpu_check.py`, the one command for a lent GPU: what can be checked without one.

The command line, the deadline runner (a stuck stage is killed with everything it started), the
report written after every variant, and the rows it gives for an anchor that is not installed, a
variant that failed or ran out of time, and a row kernel that fell back to PyTorch.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _load(name):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


gpu_check = _load("gpu_check")

MACHINE = {"gpu": "Test GPU", "capability": "9.0", "sms": 132, "memory_gib": 79.1, "cuda": "13.0", "cpus": 16, "python": "3.12"}
VERSIONS = {"torch": "2.11.0", "liger-kernel": "not installed"}


def test_help_and_list_work_from_a_clean_checkout():
    """No GPU, no install: only the standard library and the checkout are needed to ask what it does."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--help"], capture_output=True,
                         text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    for word in ("--budget", "--stages", "kernels", "rowconf", "loss", "qlora", "tests", "PYTHONPATH"):
        assert word in out.stdout
    listed = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_check.py"), "--list"], capture_output=True,
                            text=True, timeout=60)
    assert [line.split()[0] for line in listed.stdout.splitlines()] == [s.name for s in gpu_check.STAGES]


@pytest.mark.parametrize(("argv", "message"), [
    (["--stages", "loss", "warp"], "unknown stage 'warp'"),
    (["--budget", "5"], "--budget must be between 10 and 3600 seconds, got 5"),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        gpu_check.parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_without_a_gpu_it_says_so_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "machine", lambda: {"cpus": 2, "python": "3.11"})
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA GPU here" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_stuck_command_is_killed_with_what_it_started():
    start = time.monotonic()
    outcome = gpu_check.run_limited(["sh", "-c", "sleep 30 & sleep 30; echo never"], timeout=1.0)
    assert outcome.timed_out and outcome.returncode is None
    assert time.monotonic() - start < 10  # the backgrounded sleep holds no pipe open past the kill
    assert "never" not in outcome.stdout
    done = gpu_check.run_limited([sys.executable, "-c", "print('{\"x\": 1}')"], timeout=30)
    assert not done.timed_out and done.returncode == 0 and gpu_check.last_json(done.stdout) == {"x": 1}


def _report(tmp_path, budget=60.0):
    return gpu_check.Report(tmp_path, "python benchmarks/gpu_check.py", budget, info=MACHINE, env=VERSIONS)


def _py(payload: dict | None, sleep: float = 0.0, fail: bool = False) -> list[str]:
    code = f"import json, sys, time; time.sleep({sleep}); "
    code += "sys.exit('boom: no such kernel')" if fail else f"print(json.dumps({payload!r}))"
    return [sys.executable, "-c", code]


def test_variants_run_under_caps_and_the_report_is_rewritten_after_each(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "_env", lambda: None)
    monkeypatch.setattr(gpu_check, "MIN_START_S", 0.5)
    report = _report(tmp_path)
    stage = gpu_check.Stage("loss", 4.0, "loss benchmark")
    seen = []

    def command(variant):
        if seen:  # the report already holds every earlier variant's row
            rows = json.loads(report.json_path.read_text())["stages"]["loss"]["rows"]
            assert [r["variant"] for r in rows] == seen
        seen.append(variant)
        return {
            "trl_nll": _py({"variant": "trl_nll", "seconds": 0.107, "peak_extra_bytes": 3 * 2**30}),
            "liger_nll": _py({"variant": "liger_nll", "unavailable": "liger_kernel is not installed"}),
            "gem": _py({"variant": "gem", "seconds": 0.1, "fallbacks": {"gem": "OutOfResources: shared memory"}}),
            "emo": _py(None, fail=True),
            "slow": _py(None, sleep=30),
        }[variant]

    gpu_check._run_variants(report, stage, gpu_check.Budget(60), ["trl_nll", "liger_nll", "gem", "emo", "slow", "late"],
                            command, ["seconds", "peak_extra_bytes"])
    rows = {r["variant"]: r for r in json.loads(report.json_path.read_text())["stages"]["loss"]["rows"]}
    assert rows["trl_nll"]["seconds"] == 0.107
    assert rows["liger_nll"]["note"] == "not installed: liger_kernel is not installed"
    assert rows["gem"]["note"] == "fell back to PyTorch: gem: OutOfResources: shared memory"
    assert rows["emo"]["note"].startswith("failed (exit 1): boom: no such kernel")
    assert rows["slow"]["note"].startswith("stopped after")
    assert rows["late"]["note"] == "not run: out of time"
    text = report.md_path.read_text()
    assert "| liger_nll |  |  | not installed: liger_kernel is not installed |" in text
    assert "**Row kernels that fell back to PyTorch:**" in text and "- `gem`: OutOfResources: shared memory" in text
    assert "Test GPU (compute capability 9.0, 132 SMs" in text and "liger-kernel not installed" in text


def test_the_budget_stops_the_run_between_stages(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "_env", lambda: None)
    report = _report(tmp_path, budget=10)
    budget = gpu_check.Budget(10, start=time.monotonic() - 8)  # 2 s left: nothing more is started
    gpu_check._run_variants(report, gpu_check.Stage("step", 100, "trainer step"), budget, ["nll", "gem"],
                            lambda v: _py({"variant": v}), ["step_seconds"])
    rows = json.loads(report.json_path.read_text())["stages"]["step"]["rows"]
    assert [r["note"] for r in rows] == ["not run: out of time"] * 2


def test_a_missing_anchor_is_a_row_from_the_real_loss_benchmark(monkeypatch):
    """loss_bench's own worker, on the CPU, for an anchor whose package is absent."""
    loss_bench = _load("loss_bench")
    monkeypatch.setitem(loss_bench.OPTIONAL, "liger_nll", "surely_not_an_installed_module")
    result = loss_bench.worker("liger_nll", 8, 16, 8, "float32", "cpu", 1, None, {}, False)
    row = gpu_check._variant_row("liger_nll", gpu_check.Outcome(0, "", "", 1.0, False), result)
    assert row["note"] == "not installed: surely_not_an_installed_module is not installed"


def test_the_one_process_stages_become_one_row_per_loss_and_configuration(tmp_path, monkeypatch):
    """`kernels` and `rowconf` workers report several rows at once; the report lists each."""
    monkeypatch.setattr(gpu_check, "_env", lambda: None)
    payloads = {
        "--_kernels": {"losses": [{"variant": "nll", "loss_rel_error": 1e-6, "backend": "triton", "fallbacks": {}},
                                  {"variant": "emo", "backend": "torch (fallback)", "fallbacks": {"emo": "PTXASError: x"}}]},
        "--_rowconf": {"variant": "nll", "configs": [{"block": 2048, "warps": 4, "table": True, "ms": 0.9},
                                                      {"block": 16384, "warps": 16, "table": False, "ms": 1.4}]},
    }
    monkeypatch.setattr(gpu_check, "_self", lambda flag, *rest: _py(payloads[flag]))
    monkeypatch.setattr(gpu_check, "ROW_KERNELS", ["nll"])
    report = _report(tmp_path)
    budget = gpu_check.Budget(60)
    gpu_check.stage_kernels(report, gpu_check.Stage("kernels", 30, "row kernels"), budget)
    gpu_check.stage_rowconf(report, gpu_check.Stage("rowconf", 30, "configurations"), budget)
    stages = json.loads(report.json_path.read_text())["stages"]
    assert [(r["variant"], r.get("note", "")) for r in stages["kernels"]["rows"]] == [
        ("nll", ""), ("emo", "fell back to PyTorch: emo: PTXASError: x")]
    assert [(r["variant"], r["block"], r["table"]) for r in stages["rowconf"]["rows"]] == [("nll", 2048, True), ("nll", 16384, False)]
    assert "- `emo`: PTXASError: x" in report.md_path.read_text()


# -- the qlora stage: every loss under QLoRA, Liger's layers, the consumer cards --------------------------------------


def test_the_qlora_stage_covers_every_registered_loss_and_liger():
    from trl_emo.losses import list_losses

    variants = gpu_check.qlora_variants()
    assert variants[:3] == ["nll", "gem", "emo"] and variants[-1] == "gem_liger"
    assert set(variants) == set(list_losses()) | {"gem_liger"} and len(variants) == len(set(variants))
    assert set(gpu_check.QLORA_SHAPES) == {"llama-3.2-1b", "llama-3-8b"}


def test_the_qlora_worker_trains_each_variant_on_one_quantized_model_on_the_cpu(monkeypatch, capsys):
    """The stage's worker for real, on the CPU (bitsandbytes' CPU backend) and a tiny shape: the model quantized in
    place, LoRA on every linear layer, TRL's nll then a trl_emo loss on the same model, one JSON row per variant as it
    goes, a missing Liger reported as such."""
    monkeypatch.setattr(gpu_check, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_check, "SEQ", 16)
    monkeypatch.setattr(gpu_check, "QLORA_SHAPES", {"tiny": (1, 1, 0)})
    gpu_check.worker_qlora("tiny", 300, ["nll", "gem", "gem_liger"])
    rows = gpu_check.all_json(capsys.readouterr().out)
    assert [r["variant"] for r in rows] == ["nll", "gem", "gem_liger"]
    for row in rows[:2]:
        assert "error" not in row, row
        assert row["qlora"] and row["quantized_layers"] == 14  # 2 layers x 7 linear layers, the head left out
        assert row["step_seconds"] > 0 and row["first_loss"] == row["first_loss"] and row["fallbacks"] == {}
    liger = rows[2]
    assert "unavailable" in liger or liger.get("liger_layers", "").startswith("Liger layers:")
    summary = gpu_check.qlora_summary(rows)
    assert summary[1]["vs_nll"] == pytest.approx(rows[1]["step_seconds"] / rows[0]["step_seconds"])


def _lines(rows, sleep=0.0):
    code = "import json, sys, time\n" + "".join(f"print(json.dumps({r!r}), flush=True)\n" for r in rows)
    return [sys.executable, "-c", code + f"time.sleep({sleep})\n"]


def test_the_qlora_stage_reports_ratios_the_liger_check_and_the_cards_each_configuration_fits(tmp_path, monkeypatch):
    monkeypatch.setattr(gpu_check, "_env", lambda: None)
    monkeypatch.setattr(gpu_check, "MIN_START_S", 0.5)
    gib = 2**30

    def row(variant, step, reserved, first, **extra):
        return {"variant": variant, "step_seconds": step, "peak_bytes": reserved - gib // 2, "peak_reserved_bytes": reserved,
                "outside_allocator_bytes": gib // 2, "first_loss": first, "last_loss": first - 0.1, **extra}

    small = [row("nll", 1.0, 3 * gib, 12.0), row("gem", 1.25, 3 * gib, 12.5),
             row("gem_liger", 1.0, int(2.5 * gib), 12.5 * 1.001, liger_layers="Liger layers: LlamaRMSNorm")]
    large = [row("nll", 4.0, 9 * gib + gib // 10, 12.0),
             {"variant": "gem", "error": "OutOfMemoryError: CUDA out of memory"},
             {"variant": "emo", "note": "not run: out of time"}]
    calls = []

    def command(*args):
        shape = args[args.index("--_shape") + 1]
        calls.append((shape, float(args[args.index("--_seconds") + 1])))
        return _lines(small) if shape == "llama-3.2-1b" else _lines(large, sleep=30)  # the second one is stopped

    monkeypatch.setattr(gpu_check, "_self", command)
    report = _report(tmp_path)
    gpu_check.stage_qlora(report, gpu_check.Stage("qlora", 5, "QLoRA"), gpu_check.Budget(60))
    assert [shape for shape, _ in calls] == ["llama-3.2-1b", "llama-3-8b"]
    data = json.loads(report.json_path.read_text())
    rows = {(r["shape"], r["variant"]): r for r in data["stages"]["qlora"]["rows"]}
    assert rows[("llama-3.2-1b", "gem")]["vs_nll"] == pytest.approx(1.25)
    liger = rows[("llama-3.2-1b", "gem_liger")]
    assert liger["loss_vs_gem"] == pytest.approx(1e-3)
    assert "first loss equals gem's without Liger within 0.01" in liger["note"] and "LlamaRMSNorm" in liger["note"]
    assert rows[("llama-3-8b", "gem")]["note"] == "failed: OutOfMemoryError: CUDA out of memory"
    assert rows[("llama-3-8b", "worker")]["note"].startswith("stopped after")
    assert data["stages"]["qlora"]["status"] == "out of time"
    fit = {r["variant"]: r for r in data["stages"]["qlora_fit"]["rows"]}
    assert fit["llama-3.2-1b nll"]["needed_gib"] == pytest.approx(3.5)
    assert [fit["llama-3.2-1b nll"][f"{c} GiB"] for c in (8, 12, 16, 24)] == ["yes"] * 4
    assert [fit["llama-3-8b nll"][f"{c} GiB"] for c in (8, 12, 16, 24)] == ["no", "yes", "yes", "yes"]
    text = report.md_path.read_text()
    assert "## qlora_fit:" in text and "| llama-3-8b nll | 9.6 | no | yes | yes | yes |" in text
