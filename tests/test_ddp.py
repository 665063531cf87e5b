"""Two processes on CPU (gloo), DDP and FSDP2, give the losses of one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import free_port, launch_failure

SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"

FSDP2_CPU = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_reshard_after_forward: true
  fsdp_state_dict_type: FULL_STATE_DICT
  fsdp_cpu_ram_efficient_loading: false
  fsdp_offload_params: false
num_machines: 1
num_processes: 2
machine_rank: 0
mixed_precision: 'no'
use_cpu: true
"""


def _env():
    env = dict(os.environ)
    # The processes train on the CPU (gloo) on every machine: hiding GPUs keeps accelerate from
    # asking for two of them on a one-GPU machine.
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="")
    return env


@pytest.fixture(scope="module")
def single_process(tmp_path_factory):
    """The reference: one process, per-device batch 4, for each loss (computed once)."""
    from conftest import CORPUS
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("dist")
    model_dir = save_tiny_causal_lm(CORPUS, output_dir=root / "model", vocab_size=320, hidden_size=32, intermediate_size=64)
    cache = {}

    def run(loss_type, max_steps=3, extra=None, batch=4):
        key = (loss_type, max_steps, json.dumps(extra), batch)
        if key not in cache:
            out = root / f"single-{loss_type}-{len(cache)}.json"
            result = subprocess.run([sys.executable, str(SCRIPT), model_dir, str(out), loss_type, str(batch),
                                     str(max_steps), *([json.dumps(extra)] if extra else [])],
                                    env=_env(), capture_output=True, text=True, timeout=300)
            assert result.returncode == 0, launch_failure(result)
            cache[key] = json.loads(out.read_text())
        return cache[key]

    return model_dir, root, run


def _launch(launcher_args, model_dir, out, loss_type, max_steps=3, extra=None):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launcher_args, str(SCRIPT), model_dir, str(out), loss_type,
           "2", str(max_steps), *([json.dumps(extra)] if extra else [])]
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, launch_failure(result)
    return json.loads(out.read_text())


# Micro-batches of uneven token counts, 2 accumulated per step, logs every 2 steps, and an evaluation whose last batch
# is partial (7 rows): the cases where a mean of per-batch means drifts from the Trainer's `loss` and `eval_loss`. The
# answers weigh 0.5 to 3.5 (per-token loss weights, a message's `weight`): the step's normalizer is then the sum of the
# weights of every micro-batch and process, and the metrics are weighted means.
UNEVEN_ACCUMULATED = {
    "uneven": True,
    "weights": True,
    "eval_rows": 7,
    "config": {"gradient_accumulation_steps": 2, "logging_steps": 2, "eval_strategy": "steps", "eval_steps": 2,
               "per_device_eval_batch_size": 2},
}
STEP_METRICS = ("loss", "objective", "cross_entropy", "entropy", "mean_token_accuracy", "emo_distance")


def test_two_process_ddp_matches_one_process(single_process):
    """Same global batch: same losses and weights; and the metrics of each logging window, token means over every
    micro-batch and process of each step (weighted by the per-token weights), are those of one process, with
    `objective` equal to the Trainer's `loss` (and `eval_objective` to `eval_loss`)."""
    model_dir, root, single = single_process
    ddp = _launch(["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
                   "--dynamo_backend", "no", "--main_process_port", str(free_port())], model_dir, root / "ddp.json", "emo",
                  4, UNEVEN_ACCUMULATED)
    reference = single("emo", 4, UNEVEN_ACCUMULATED)
    assert ddp["num_processes"] == 2 and reference["num_processes"] == 1
    assert len(ddp["losses"]) == 2
    assert torch.allclose(torch.tensor(ddp["losses"]), torch.tensor(reference["losses"]), rtol=1e-5)
    assert torch.allclose(torch.tensor(ddp["weights"]), torch.tensor(reference["weights"]), atol=1e-5)
    train = [row for row in ddp["log_history"] if "loss" in row]
    reference_train = [row for row in reference["log_history"] if "loss" in row]
    for row, ref in zip(train, reference_train, strict=True):
        assert row["objective"] == pytest.approx(row["loss"], rel=1e-5)
        for key in STEP_METRICS:
            assert row[key] == pytest.approx(ref[key], rel=1e-5), (row["step"], key)
    evaluations = [row for row in ddp["log_history"] if "eval_loss" in row]
    assert len(evaluations) == 2
    for row in evaluations:
        assert row["eval_objective"] == pytest.approx(row["eval_loss"], rel=1e-5)


def test_two_process_fsdp2_matches_one_process(single_process):
    """The FSDP2 launcher configuration on two CPU processes. Accelerate 1.15 turns FSDP on only for accelerator devices,
    so on a CPU this runs as DDP (docs/distributed.md): it checks the launch and the losses, not FSDP2's sharding."""
    model_dir, root, single = single_process
    config = root / "fsdp2_cpu.yaml"
    config.write_text(FSDP2_CPU)
    fsdp = _launch(["--config_file", str(config), "--main_process_port", str(free_port())], model_dir, root / "fsdp.json", "gem")
    reference = single("gem")
    assert fsdp["num_processes"] == 2
    assert torch.allclose(torch.tensor(fsdp["losses"]), torch.tensor(reference["losses"]), rtol=1e-5)
    assert torch.allclose(torch.tensor(fsdp["cross_entropy"]), torch.tensor(reference["cross_entropy"]), rtol=1e-5)


def test_end_of_a_distributed_command_keeps_its_last_barrier(tmp_path):
    """`end_run`'s barrier handle outlives `main`: a gloo worker thread that dropped the last reference to it (or to
    a collective it waited on) would free tensors at interpreter shutdown and abort the process (see `end_run`)."""
    script = tmp_path / "end.py"
    script.write_text(
        "import torch, torch.distributed as dist\n"
        "from types import SimpleNamespace\n"
        "from trl_emo.training import finish\n"
        "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:%d', rank=0, world_size=1)\n"
        "dist.all_gather([torch.zeros(3)], torch.ones(3))\n"
        "calls = []\n"
        "accelerator = SimpleNamespace(wait_for_everyone=lambda: calls.append('wait'),\n"
        "                              end_training=lambda: (calls.append('end'), dist.destroy_process_group()))\n"
        "finish.end_run(SimpleNamespace(accelerator=accelerator))\n"
        "assert calls == ['end'], calls\n"
        "assert len(finish._FINAL_BARRIERS) == 1 and finish._FINAL_BARRIERS[0].is_completed()\n"
        "assert not dist.is_initialized()\n"
        "print('ok')\n" % free_port()
    )
    result = subprocess.run([sys.executable, str(script)], env=_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.strip() == "ok", launch_failure(result)


def test_end_of_a_one_process_command_waits_through_accelerate():
    from types import SimpleNamespace

    from trl_emo.training import finish

    calls = []
    accelerator = SimpleNamespace(wait_for_everyone=lambda: calls.append("wait"), end_training=lambda: calls.append("end"))
    finish.end_run(SimpleNamespace(accelerator=accelerator))
    assert calls == ["wait", "end"]


DDP = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]


EKSFT = {"eksft_ratio": 0.3, "eksft_lambda_entropy": 0.5, "eksft_lambda_kl": 1.0}


def test_sed_and_eksft_under_ddp(single_process):
    """One launch, two trainings. SED is a token mean and every process calibrates tau on the same rows: two processes
    give one's losses and threshold. EKSFT's selection scope is one micro-batch on one process (docs/losses.md): two
    processes with micro-batches of 2 rows train exactly as one process accumulating the same micro-batches (and not as
    one process whose micro-batches hold all 4 rows: `tests/test_sed_eksft.py` shows the difference)."""
    model_dir, root, single = single_process
    runs = {"sed": {"loss_type": "sed"}, "eksft": {"loss_type": "eksft", "config": EKSFT}}
    out = root / "ddp-new.json"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *DDP, "--main_process_port", str(free_port()), str(SCRIPT),
           model_dir, str(out), "runs", "2", "3", json.dumps(runs)]
    result = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, launch_failure(result)
    ddp = {name: json.loads((root / f"ddp-new-{name}.json").read_text()) for name in runs}
    assert all(run["num_processes"] == 2 for run in ddp.values())

    sed = single("sed")
    assert torch.allclose(torch.tensor(ddp["sed"]["losses"]), torch.tensor(sed["losses"]), rtol=1e-5)
    taus = {row["sed_threshold"] for run in (ddp["sed"], sed) for row in run["log_history"] if "sed_threshold" in row}
    assert len(taus) == 1

    accumulated = single("eksft", 3, {"config": {**EKSFT, "gradient_accumulation_steps": 2}}, batch=2)
    assert torch.allclose(torch.tensor(ddp["eksft"]["losses"]), torch.tensor(accumulated["losses"]), rtol=1e-5)
    assert torch.allclose(torch.tensor(ddp["eksft"]["weights"]), torch.tensor(accumulated["weights"]), atol=1e-5)
