"""The row kernels compiled ahead of time for real GPUs, without one: no failure, no register spill.

`python benchmarks/aot_compile.py` runs in a process of its own (conftest.py defines the kernels
for Triton's interpreter on a CPU machine, and those cannot be compiled), with an empty Triton cache
as CI has. It compiles every registered loss's row kernels for sm_80, sm_86, sm_89 and sm_90 at the
launch configuration `RowLaunch.meta` picks for 32,000-, 128,256- and 151,936-token vocabularies,
over all pairs of the kernels' switches and bf16/fp16 logits, and reads ptxas's report of each. Two
third-party losses are registered from a module written here, as a plugin would: one good kernel,
which must be compiled like the built-ins, and one that Triton rejects, which must be reported.
The pure parts (occupancy, ptxas parsing, the launch table, the choice of settings) are tested in
this process.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("triton", reason="compiling the kernels needs `pip install triton` (in the test extra)")

from trl_emo.losses import _triton  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))  # the compile check is a CI tool beside the benchmarks, not in the package
import aot_compile  # noqa: E402

# The modules holding built-in row kernels (`target_stats`: the first pass that prob, iw_sft and slm share; iw_sft and
# slm launch prob's loss kernel), and the losses whose launchers are checked.
BUILT_IN = {"nll", "gem", "emo", "tailr", "mixce", "ce_entropy", "eaft", "asft", "sed", "eksft", "prob", "gift",
            "target_stats", "psft", "curio_sft"}
LAUNCHING = BUILT_IN - {"target_stats"} | {"iw_sft", "slm"}
# Which launch configurations the shared first pass is launched with: its losses' `<loss>_statistics`.
SHARED = {"target_stats": ("prob_statistics", "iw_sft_statistics", "slm_statistics")}

PLUGIN = '''
"""Two third-party losses with row kernels, registered on import like a plugin package's."""
import torch
import trl_emo
from trl_emo.losses._triton import row_inputs, softmax_pass, store_stats, tl, triton, weighted_ce_grad


@triton.jit
def _scaled_ce_rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap, weight,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row, Z_row, y, z_y = row_inputs(Z, z_stride, Y, ZY)
    lse, entropy, idx = softmax_pass(Z_row, BIAS, V, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)
    nll = lse - z_y
    store_stats(STATS, stats_stride, row, weight * nll, nll, entropy, (idx == y).to(tl.float32))
    if WRITE_GRAD:
        weighted_ce_grad(Z_row, BIAS, V, lse, y, weight, GRAD_SCALE, logit_scale, softcap, HAS_BIAS, HAS_SOFTCAP, BLOCK)


@triton.jit
def _broken_rows(
    Z, z_stride, Y, ZY, BIAS, STATS, stats_stride, GRAD_SCALE, V, logit_scale, softcap,
    HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr, WRITE_GRAD: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    tl.store(STATS + row, tl.sum(tl.arange(0, 3).to(tl.float32), 0))  # not a power of two: rejected


def _per_token(logits, targets):
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")


trl_emo.register_loss(
    "scaled_ce", _per_token,
    row_kernel=lambda launch, weight=0.5: _scaled_ce_rows[(launch.rows,)](*launch.args(), weight, **launch.meta()),
)
trl_emo.register_loss(
    "broken_ce", _per_token, row_kernel=lambda launch: _broken_rows[(launch.rows,)](*launch.args(), **launch.meta())
)
'''


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    """One cold compile of every registered row kernel (and the plugin's) for the four targets."""
    root = tmp_path_factory.mktemp("aot")
    (root / "rowplugin.py").write_text(PLUGIN)
    out = root / "kernels.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(root / "triton-cache")  # cold, like CI
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "aot_compile.py"), "--import", "rowplugin", "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=900,
    )
    assert out.exists(), f"exit {result.returncode}\n{result.stderr[-4000:]}"
    data = json.loads(out.read_text())
    data["returncode"] = result.returncode
    return data


def _loss_of(result) -> str:
    return result["kernel"].split(".")[0]


def test_every_row_kernel_compiles_for_every_target_without_spills(summary):
    found = [line for line in aot_compile.problems(summary) if "broken_rows" not in line]
    assert not found, "\n".join(found)
    compiled = {(r["kernel"], r["target"]) for r in summary["results"] if r["ok"]}
    kernels = {kernel for kernel, _ in compiled}
    assert {k.split(".")[0] for k in kernels} >= BUILT_IN
    assert any("_scaled_ce_rows" in k for k in kernels), "the plugin's kernel was not compiled"
    targets = {t["name"] for t in aot_compile.TARGETS.values()}
    assert compiled == {(k, t) for k in kernels for t in targets}


def test_a_kernel_that_does_not_compile_fails_naming_kernel_target_and_configuration(summary):
    assert summary["returncode"] == 1
    broken = [line for line in aot_compile.problems(summary) if "broken_rows" in line]
    assert broken and all(line.startswith("does not compile:") for line in broken)
    for name in ("sm_80", "sm_86", "sm_89", "sm_90"):
        assert any(f"for {name} (BLOCK 2048, 4 warps, bf16" in line and "arange" in line for line in broken), name


def test_the_launches_are_the_ones_the_project_makes(summary):
    """Each build is at the table's configuration, for all three vocabularies, both dtypes, every flag."""
    by_kernel = {}
    for r in summary["results"]:
        if not r["ok"]:
            continue
        by_kernel.setdefault((r["kernel"], r["capability"]), []).append(r)
    for (kernel, capability), results in by_kernel.items():
        name = kernel.split(".")[0]
        if name in BUILT_IN:
            names = SHARED.get(name) or [k for k in _triton.LAUNCH_CONFIGS if k.startswith(name)]
            tables = {_triton.launch_config(k, capability) for k in names}
            assert {(r["block"], r["num_warps"]) for r in results} <= tables, kernel
        assert {r["dtype"] for r in results} == {"bf16", "fp16"}, kernel
        for flag in ("HAS_BIAS", "HAS_SOFTCAP", "WRITE_GRAD"):
            if flag == "WRITE_GRAD" and kernel.endswith("._statistics"):
                assert flag not in results[0]["switches"]  # a first pass (EKSFT's selection) writes no gradient
                continue
            assert {r["switches"][flag] for r in results} == {False, True}, (kernel, flag)
        vocabs = {v for r in results for use in r["uses"] for v in use["vocabs"]}
        assert vocabs == set(aot_compile.VOCABS), kernel
    gem = [r for r in summary["results"] if r["kernel"].startswith("gem.")]
    assert {r["switches"]["LOGSIGMOID"] for r in gem} == {False, True}
    emo = [r for r in summary["results"] if r["kernel"].startswith("emo.")]
    assert {r["switches"]["WEIGHTING"] for r in emo} == {0, 1, 2}
    asft = [r for r in summary["results"] if r["kernel"].startswith("asft.")]
    assert {(r["switches"]["HAS_REF"], r["switches"]["HAS_REF_SOFTCAP"]) for r in asft} == {(False, False), (True, False), (True, True)}
    prob = [r for r in summary["results"] if r["kernel"].startswith("prob.")]
    assert {r["switches"]["HAS_W"] for r in prob} == {False, True}  # unweighted (prob) and weighted (iw_sft, slm, thresholds)
    first = [r for r in summary["results"] if r["kernel"].startswith("target_stats.")]
    assert {(r["switches"]["HAS_REF"], r["switches"]["HAS_REF_SOFTCAP"]) for r in first} == {(False, False), (True, False), (True, True)}
    gift = [r for r in summary["results"] if r["kernel"].startswith("gift.")]
    assert {r["switches"]["HAS_FLOOR"] for r in gift} == {False, True}


def test_each_launcher_asks_for_its_own_table_entry(monkeypatch):
    """Every entry of the shipped table is (2048, 4), so the compiles cannot tell which entry a launcher read: here each
    kernel gets a configuration of its own, and every recorded launch must be at its kernel's."""
    distinct = [(1024, 4), (2048, 2), (2048, 8), (4096, 2), (4096, 4), (4096, 8), (4096, 16), (8192, 4), (8192, 8),
                (16384, 8), (1024, 2), (2048, 4), (16384, 16), (8192, 2), (8192, 16), (16384, 2), (16384, 4), (512, 1),
                (512, 2), (256, 1), (1024, 1), (2048, 1), (4096, 1)]
    names = ["nll", "gem", "gem_logsigmoid", "emo", "tailr", "mixce", "ce_entropy", "eaft", "asft", "sed", "eksft",
             "eksft_statistics", "prob", "prob_statistics", "iw_sft", "iw_sft_statistics", "gift", "slm",
             "slm_statistics", "default", "psft", "curio_sft", "curio_sft_statistics"]
    assert len(set(distinct)) == len(names)
    for name, config in zip(names, distinct):
        monkeypatch.setitem(_triton.LAUNCH_CONFIGS, name, {80: config})
    recorder = aot_compile._Recorder()
    seen = set()
    for setting in aot_compile.all_settings(aot_compile.switch_cases(sorted(LAUNCHING)), flag_sets=[(False, False, True)]):
        loss_kernel = "gem_logsigmoid" if dict(setting.hparams).get("h") == "logsigmoid" else setting.loss
        for build in recorder.launches(setting, 128_256, 86):
            expected = f"{loss_kernel}_statistics" if build.kernel.endswith("._statistics") else loss_kernel
            assert (build.block, build.num_warps) == _triton.LAUNCH_CONFIGS[expected][80], (setting.describe(), build.kernel)
            seen.add(expected)
    assert seen == set(names) - {"default"}


def test_covering_settings_keep_every_pair_of_switch_values():
    """The narrowed set builds every pair of (switch, value) that the full product builds, per kernel."""
    product = aot_compile.all_settings(aot_compile.switch_cases(["emo", "asft", "tailr"]))
    chosen = aot_compile.covering_settings(product)
    assert len(chosen) < len(product) / 3

    def pairs(settings):
        recorder, out = aot_compile._Recorder(), {}
        for setting in settings:
            for build in recorder.launches(setting, 32_000, 86):
                values = sorted({("dtype", setting.dtype), *build.switches.items()}, key=repr)
                out.setdefault(build.kernel, set()).update(itertools.combinations(values, 2))
        return out

    assert pairs(chosen) == pairs(product)


def test_resident_programs_follow_the_register_file_and_the_sm_limits():
    # 128 registers x 16 warps fill the 64K-register file: one program.
    assert aot_compile.programs_per_sm(90, 128, 16) == 1
    # 72 registers -> 2,304 per warp, 7 warps per 16K-register sub-partition, 28 warps: 7 programs of 4.
    assert aot_compile.programs_per_sm(86, 72, 4) == 7
    # Few registers: sm_86/89 stop at 48 warps (12 programs of 4), sm_90 at 64 (16).
    assert aot_compile.programs_per_sm(86, 32, 4) == 12
    assert aot_compile.programs_per_sm(90, 32, 4) == 16
    # Shared memory bounds too (each program also takes 1 KiB reserved).
    assert aot_compile.programs_per_sm(90, 32, 4, shared=100 * 1024) == 2


def test_ptxas_report_is_read_and_a_missing_one_is_an_error():
    log = (
        "ptxas info    : Compiling entry function '_rows' for 'sm_86'\n"
        "ptxas info    : Function properties for _rows\n"
        "    96 bytes stack frame, 96 bytes spill stores, 88 bytes spill loads\n"
        "ptxas info    : Used 128 registers, used 1 barriers, 96 bytes cumulative stack size, 448 bytes cmem[0]\n"
    )
    assert aot_compile._ptxas_report(log) == {"registers": 128, "stack": 96, "spill_stores": 96, "spill_loads": 88}
    with pytest.raises(RuntimeError, match="no resource report"):
        aot_compile._ptxas_report("ptxas fatal   : Unresolved extern function")


def _launch(vocab, target):
    z = torch.empty(4, vocab, dtype=torch.bfloat16, device="meta")
    stats = torch.empty(4, 4, device="meta")
    return _triton.RowLaunch(z, torch.empty(4, dtype=torch.int64), torch.empty(4), None, stats, torch.ones(1), 1.0, None,
                             True, target=target)


def test_meta_reads_the_table_for_the_target_capability(monkeypatch):
    monkeypatch.setitem(_triton.LAUNCH_CONFIGS, "gem", {80: (4096, 8), 89: (8192, 16)})
    assert _launch(128_256, 86).meta("gem") | {} == {"HAS_BIAS": False, "HAS_SOFTCAP": False, "WRITE_GRAD": True,
                                                     "BLOCK": 4096, "num_warps": 8}
    assert _launch(128_256, 90).meta("gem")["BLOCK"] == 8192  # the closest lower capability listed
    assert _launch(128_256, 75).meta("gem")["BLOCK"] == 4096  # below every entry: the lowest
    # A small vocabulary cuts the block, and the warps with it (at least 8 columns per thread).
    small = _launch(300, 89).meta("gem")
    assert (small["BLOCK"], small["num_warps"]) == (512, 2)
    # An unnamed (third-party) kernel takes "default".
    assert _launch(128_256, 90).meta()["BLOCK"] == _triton.launch_config("default", 90)[0]


def test_launch_table_covers_every_built_in_kernel_and_target():
    for name in ("nll", "gem", "gem_logsigmoid", "emo", "tailr", "mixce", "ce_entropy", "eaft", "asft", "prob",
                 "prob_statistics", "iw_sft", "iw_sft_statistics", "gift", "slm", "slm_statistics", "default"):
        assert set(_triton.LAUNCH_CONFIGS[name]) >= set(aot_compile.TARGETS), name


@pytest.mark.parametrize(
    ("configs", "message"),
    [({86: (3000, 4)}, "BLOCK of 'k' for capability 86 must be a power of two"),
     ({86: (2048, 6)}, "num_warps of 'k' for capability 86 must be a power of two"),
     ({"8.6": (2048, 4)}, "major \\* 10 \\+ minor"),
     ({}, "No launch configuration")],
)
def test_register_launch_config_rejects_bad_entries_in_one_line(configs, message):
    with pytest.raises(ValueError, match=message) as info:
        _triton.register_launch_config("k", configs)
    assert "\n" not in str(info.value)
    assert "k" not in _triton.LAUNCH_CONFIGS
