"""DeepSpeed ZeRO-2 and ZeRO-3, two processes on CPU, against one plain process: every loss.

One launch per ZeRO stage trains a tiny model with each run of `RUNS` in turn (2 optimizer steps,
gradient accumulation 2, per-device batch 2); one plain process does the same with per-device
batch 4, i.e. the same global batches. The tests compare the logged losses, the full gradients
before each optimizer step (`deepspeed.utils.safe_get_full_grad`) and the final full weights.

ZeRO-2 runs the shipped `recipes/accelerate/zero2.yaml` (only the process count and precision
are overridden for two CPU processes). ZeRO-3 runs a DeepSpeed config whose partitioning
thresholds are 0, so that every parameter of the tiny model is really partitioned (with the
defaults, parameters under 1e5 elements stay whole and the head would never need a gather); the
shipped `recipes/accelerate/zero3.yaml` is launched through `trl_emo.sft` on a model whose head is
large enough for DeepSpeed's default thresholds to partition it.

Everything runs on CPU (`CUDA_VISIBLE_DEVICES=""`, DeepSpeed's CPU accelerator, gloo), also on a
machine with a GPU. Skipped where deepspeed is not installed (CI installs it with the `test` extra).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import CORPUS, free_port, launch_failure

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed (pip install -e '.[test]')"
    ),
    pytest.mark.skipif(
        shutil.which(os.environ.get("CXX", "c++")) is None,
        reason="DeepSpeed on CPU compiles a small C++ op when it starts, and no C++ compiler was found",
    ),
]

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = Path(__file__).parent / "scripts" / "train_deepspeed.py"
ACCELERATE_CONFIGS = ROOT / "recipes" / "accelerate"

# Run name -> `SFTConfig` fields (+ "lora": target modules, "checkpoint": save at the last step).
RUNS = {
    "nll": {"loss_type": "nll"},
    "gem": {"loss_type": "gem"},
    "gem_logsigmoid": {"loss_type": "gem", "gem_h": "logsigmoid"},
    "emo": {"loss_type": "emo", "checkpoint": True},  # the frozen snapshot is written next to the checkpoint
    "emo_live": {"loss_type": "emo", "emo_cost_embedding": "lm_head"},
    "emo_live_logits": {"loss_type": "emo", "emo_cost_embedding": "lm_head", "loss_implementation": "logits"},
    "tailr": {"loss_type": "tailr"},
    "mixce": {"loss_type": "mixce"},
    "ce_entropy": {"loss_type": "ce_entropy"},
    "eaft": {"loss_type": "eaft"},
    # ASFT's reference under LoRA is the partitioned base model with the adapters off (no copy).
    "asft_lora": {"loss_type": "asft", "asft_alpha": 0.5, "lora": ["q_proj", "v_proj"]},
    "emo_lora": {"loss_type": "emo", "lora": ["q_proj", "v_proj"]},  # frozen (partitioned) head
    # With a frozen head the live cost is the snapshot's, read inside the loss's own gather (no copy).
    "emo_lora_live": {"loss_type": "emo", "emo_cost_embedding": "lm_head", "lora": ["q_proj", "v_proj"]},
    # SED calibrates its threshold through the sharded model (every rank runs the same rows).
    "sed": {"loss_type": "sed", "sed_threshold_samples": 8},
    # EKSFT selects within each micro-batch of each process; its reference is the base with the adapters off. A larger
    # learning rate: after LoRA's first step (the adapters start at zero) the KL values that select the second step's
    # tokens must stand apart by more than the setups' rounding differences, or a near tie flips one selection.
    # The authors' formula (the label rows after each target) goes through the same machinery.
    "eksft_authors_lora": {"loss_type": "eksft", "eksft_formula": "authors", "eksft_ratio": 0.3,
                           "lora": ["q_proj", "v_proj"], "per_process_scope": True, "learning_rate": 3e-2},
    # A LoRA adapter on the head: its up-projection is read outside its module's forward, gathered with the head.
    "gem_lora_head": {"loss_type": "gem", "lora": ["q_proj", "lm_head"]},
}
TRAINED = list(RUNS)

ZERO3_TEST_CONFIG = {
    "train_batch_size": "auto",
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": False},
    "fp16": {"enabled": False},
    # No `optimizer` block: the trainer's torch AdamW (a DeepSpeed optimizer compiles a fused Adam op).
    "zero_optimization": {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_prefetch_bucket_size": 0,
        "stage3_max_live_parameters": 0,
        "stage3_max_reuse_distance": 0,
        "stage3_gather_16bit_weights_on_model_save": True,
    },
}


def cpu_env() -> dict:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
    )
    return env


def run(cmd, timeout=300):
    # The timeout turns a collective that never completes into a failure instead of a stuck CI job.
    result = subprocess.run(cmd, env=cpu_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, launch_failure(result)
    return result


@pytest.fixture(scope="session")
def deepspeed_cpu():
    """Compile DeepSpeed's shared-memory op once (g++, cached in ~/.cache/torch_extensions), before two ranks race for it."""
    run([sys.executable, "-c", (
        "import deepspeed.ops\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "builder = get_accelerator().create_op_builder('ShareMemCommBuilder')\n"
        "if builder is not None and deepspeed.ops.__compatible_ops__.get(builder.NAME, False):\n"
        "    builder.load()\n"
    )], timeout=400)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("deepspeed")
    model = save_tiny_causal_lm(CORPUS, output_dir=root / "model", vocab_size=320, hidden_size=32, intermediate_size=64)
    return root, model


@pytest.fixture(scope="module")
def one_process(workdir):
    root, model = workdir
    out = root / "one" / "results.pt"
    out.parent.mkdir()
    run([sys.executable, str(SCRIPT), model, str(out), json.dumps(RUNS), "4"])
    return torch.load(out)


@pytest.fixture(scope="module")
def zero(workdir, deepspeed_cpu):
    """stage -> the two-process results, one launch per stage (launched when first asked for)."""
    root, model = workdir
    cache = {}

    def launch(stage: int):
        if isinstance(cache.get(stage), str):
            pytest.fail(f"the ZeRO-{stage} launch failed (see the first failing test):\n{cache[stage][-1500:]}")
        if stage not in cache:
            cache[stage] = "not finished"  # a failed launch fails its other tests at once instead of relaunching
            folder = root / f"zero{stage}"
            folder.mkdir()
            if stage == 2:
                launcher = ["--config_file", str(ACCELERATE_CONFIGS / "zero2.yaml")]
            else:
                config = folder / "ds_config.json"
                config.write_text(json.dumps(ZERO3_TEST_CONFIG))
                launcher = ["--use_deepspeed", "--deepspeed_config_file", str(config), "--zero3_init_flag", "true",
                            "--num_machines", "1"]
            out = folder / "results.pt"
            try:
                run([sys.executable, "-m", "accelerate.commands.launch", *launcher, "--num_processes", "2",
                     "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
                     str(SCRIPT), model, str(out), json.dumps(RUNS), "2"])
            except (AssertionError, subprocess.TimeoutExpired) as exc:
                cache[stage] = str(exc)
                raise
            cache[stage] = torch.load(out)
        return cache[stage]

    return launch


def max_relative_difference(got: dict, expected: dict) -> float:
    assert got.keys() == expected.keys()
    return max(float((got[n] - expected[n]).norm() / expected[n].norm().clamp_min(1e-12)) for n in expected)


@pytest.mark.parametrize("name", TRAINED)
@pytest.mark.parametrize("stage", [2, 3])
def test_two_process_zero_matches_one_process(stage, name, zero, one_process):
    got, expected = zero(stage)[name], one_process[name]
    assert got["zero_stage"] == stage and got["num_processes"] == 2
    assert expected["zero_stage"] == 0 and expected["num_processes"] == 1
    assert len(got["losses"]) == len(expected["losses"]) == 2
    assert torch.allclose(torch.tensor(got["losses"]), torch.tensor(expected["losses"]), rtol=1e-5, atol=1e-6)
    if name != "nll":  # TRL's nll logs no separate cross-entropy
        assert torch.allclose(torch.tensor(got["cross_entropy"]), torch.tensor(expected["cross_entropy"]), rtol=1e-5)
    # Full gradients before each of the two optimizer steps. The second step's inputs already differ
    # by one Adam update of float rounding, hence its looser bound.
    assert len(got["gradients"]) == len(expected["gradients"]) == 2
    for step, bound in enumerate((1e-5, 1e-4)):
        assert sum(float(g.norm()) for g in expected["gradients"][step].values()) > 0
        assert max_relative_difference(got["gradients"][step], expected["gradients"][step]) < bound, step
    weights, reference = got["weights"], expected["weights"]
    assert weights.keys() == reference.keys()
    assert max(float((weights[n] - reference[n]).abs().max()) for n in reference) < 5e-5


def test_zero3_partitions_every_parameter(zero):
    for name in TRAINED:
        record = zero(3)[name]
        # Seen between steps, outside any gather: the head is an empty shard, like every other parameter.
        assert record["head_shapes"] == [(0,), (0,)], name
        assert record["whole_parameters"] == [0, 0], name
    assert zero(2)["gem"]["head_shapes"] == [(320, 32), (320, 32)]


@pytest.mark.parametrize("stage", [2, 3])
def test_emo_frozen_snapshot_is_the_full_initial_head(stage, zero, workdir):
    from safetensors.torch import load_file

    initial_head = load_file(str(Path(workdir[1]) / "model.safetensors"))["lm_head.weight"]
    record = zero(stage)["emo"]
    # Under ZeRO-3 the head is partitioned when training starts: the snapshot comes from a gather.
    assert torch.equal(record["cost_snapshot"], initial_head)
    assert not torch.equal(record["weights"]["lm_head.weight"], initial_head)  # the head trained; the snapshot did not


def test_with_a_frozen_head_the_live_emo_cost_equals_the_snapshot(zero):
    snapshot, live = zero(3)["emo_lora"], zero(3)["emo_lora_live"]
    assert torch.allclose(torch.tensor(live["losses"]), torch.tensor(snapshot["losses"]), rtol=1e-6)
    for step in range(2):
        assert max_relative_difference(live["gradients"][step], snapshot["gradients"][step]) < 1e-6


def test_shipped_zero3_config_trains_through_the_sft_command(tmp_path, deepspeed_cpu):
    """`accelerate launch --config_file recipes/accelerate/zero3.yaml -m trl_emo.sft`, as in the README."""
    from transformers import AutoModelForCausalLM

    from data_fixtures import write_fixture
    from trl_emo.models.tiny import save_tiny_causal_lm

    # A 320 x 320 head (102,400 elements) is above DeepSpeed's default persistence threshold (1e5):
    # with the shipped settings the head is partitioned and the loss has to gather it.
    model_dir = save_tiny_causal_lm(
        CORPUS, output_dir=tmp_path / "model", vocab_size=320, chat_template=False, hidden_size=320, intermediate_size=64
    )
    out = tmp_path / "out"
    run([sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(ACCELERATE_CONFIGS / "zero3.yaml"),
         "--num_processes", "2", "--mixed_precision", "no", "--main_process_port", str(free_port()),
         "-m", "trl_emo.sft", "--recipe", str(ROOT / "recipes" / "demo.yaml"), "--model_name_or_path", model_dir,
         "--dataset_name", write_fixture("alpaca", tmp_path, n_rows=16), "--loss_type", "emo", "--max_steps", "2",
         "--per_device_train_batch_size", "2", "--logging_steps", "1", "--output_dir", str(out)])
    # `zero3_save_16bit_model: true` gathers the shards: the saved folder is a plain, complete model.
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    trained, info = AutoModelForCausalLM.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert trained.lm_head.weight.shape == (320, 320)
    assert not torch.equal(trained.lm_head.weight, initial.lm_head.weight)
