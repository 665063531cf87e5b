"""Two-process DDP on CPU (gloo) gives the losses and weights of one process with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).parent / "scripts" / "train_tiny.py"


def _env():
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(Path(__file__).parent))
    return env


@pytest.mark.parametrize("loss_type", ["emo"])
def test_two_process_ddp_matches_one_process(tmp_path, make_model, tokenizer, loss_type):
    model_dir = tmp_path / "model"
    make_model().save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))

    ddp_out = tmp_path / "ddp.json"
    launch = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", "29517",
        str(SCRIPT), str(model_dir), str(ddp_out), loss_type, "2", "3",
    ]
    result = subprocess.run(launch, env=_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]

    single_out = tmp_path / "single.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(model_dir), str(single_out), loss_type, "4", "3"],
        env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]

    ddp, single = json.loads(ddp_out.read_text()), json.loads(single_out.read_text())
    assert ddp["num_processes"] == 2 and single["num_processes"] == 1
    assert len(ddp["losses"]) == 3
    assert torch.allclose(torch.tensor(ddp["losses"]), torch.tensor(single["losses"]), rtol=1e-5)
    assert torch.allclose(torch.tensor(ddp["cross_entropy"]), torch.tensor(single["cross_entropy"]), rtol=1e-5)
    assert torch.allclose(torch.tensor(ddp["weights"]), torch.tensor(single["weights"]), atol=1e-5)
