"""`prob`, `iw_sft`, `gift` and `slm` in the trainer: fused equals the logits path through the model's patched forward
(the reference's hidden states, each row's sequence, thresholds and selections) with gradient accumulation; the frozen
copy of the starting model as reference, and the base model with the adapters off under LoRA; packed rows weighted per
example; the one-line checks of their fields."""

from __future__ import annotations

import pytest
import torch

from conftest import cpu_config
from trl_emo import SFTConfig, SFTTrainer


def logged(trainer, key):
    return [row[key] for row in trainer.state.log_history if key in row]


SETTINGS = {
    "prob": {"prob_q": 1.0, "prob_only": "bottom", "prob_threshold": 0.3},
    "iw_sft": {},
    "gift": {"gift_beta": 3.0, "gift_smooth_lambda": 0.1},
    "slm": {"slm_scope": "sequence"},
}


@pytest.mark.parametrize("loss_type", list(SETTINGS))
def test_fused_equals_logits_through_the_models_forward(tmp_path, make_model, tokenizer, pc_dataset, loss_type):
    """The same losses and weights step after step, with gradient accumulation (a frozen copy of the starting model as
    the reference of iw_sft, gift and slm)."""
    runs = {}
    for implementation in ("fused", "logits"):
        args = cpu_config(tmp_path / implementation, loss_type=loss_type, loss_implementation=implementation,
                          max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2, optim="sgd",
                          learning_rate=0.5, **SETTINGS[loss_type])
        trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
        assert (trainer._reference is not None) == (loss_type != "prob")
        trainer.train()
        runs[implementation] = trainer
    fused, logits = runs["fused"], runs["logits"]
    assert torch.allclose(torch.tensor(logged(fused, "loss")), torch.tensor(logged(logits, "loss")), rtol=1e-5)
    params = [torch.cat([p.detach().flatten() for p in t.model.parameters()]) for t in (fused, logits)]
    assert torch.allclose(*params, atol=1e-5)  # plain SGD: Adam would turn rounding of tiny gradients into steps
    for row in (r for r in fused.state.log_history if "loss" in r):
        assert row["objective"] == pytest.approx(row["loss"], rel=1e-5)
    metrics = {"prob": "prob_kept", "iw_sft": "iw_sft_weight", "gift": "gift_target_mass", "slm": "slm_selected"}
    values = logged(fused, metrics[loss_type])
    assert len(values) == 3 and all(torch.isfinite(torch.tensor(values)))
    if loss_type == "iw_sft":
        assert values[0] == pytest.approx(1.0, abs=1e-6) and values[-1] != pytest.approx(1.0, abs=1e-4)
    if loss_type == "slm":  # ⌈0.6 N⌉ of each sequence's tokens: a little over 0.6
        assert all(0.6 <= v < 0.8 for v in values)


def test_iw_sft_weighs_each_packed_example_by_its_position_ids(make_model):
    """A packed row (TRL's padding-free collator: `position_ids` restart at 0 at each example) gets one weight per
    example through the patched forward, as the logits path computes it; without `position_ids` the row is one
    sequence."""
    from trl_emo.training import trl_compat as compat
    from trl_emo.training.objective import Objective
    from trl_emo.training.reference import ReferenceModel

    policy, other = make_model(), make_model(seed=5)
    objective = Objective("iw_sft", {"temperature": 1.0, "clip": 16.0, "sum_over_time": True})
    reference = ReferenceModel("model", model=other.eval().requires_grad_(False))
    compat.add_objective_head(policy, objective.fused, reference=reference.hidden_states,
                              reads_sequences=objective.reads_sequences)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 300, (1, 20), generator=g)
    position_ids = torch.cat([torch.arange(8), torch.arange(12)])[None]
    labels = ids.clone()
    labels[position_ids == 0] = -100
    out = policy(input_ids=ids, position_ids=position_ids, labels=labels, trl_emo_loss=True)
    weights = out.result.metrics["iw_sft_weight"]
    assert len(set(weights.tolist())) == 2 and weights[:7].unique().numel() == 1
    # No KV cache, as the trainer's inputs (`trl_compat.loss_inputs`): transformers then masks each packed example apart.
    inputs = {"input_ids": ids, "position_ids": position_ids, "use_cache": False}
    logits = objective.from_logits(policy(**inputs).logits, labels, policy,
                                   reference_logits=reference.logits(policy, inputs), position_ids=position_ids)
    assert torch.allclose(out.loss, logits.loss, rtol=1e-5)
    one_row = policy(input_ids=ids, labels=labels, trl_emo_loss=True)  # without position_ids: one sequence
    assert one_row.result.metrics["iw_sft_weight"].unique().numel() == 1
    # Context parallelism (pre-shifted labels) splits sequences across processes: refused in one line.
    with pytest.raises(ValueError, match="reads whole sequences"):
        policy(input_ids=ids, shift_labels=labels, trl_emo_loss=True)


def test_gift_under_lora_reads_the_base_model_with_the_adapters_off(tmp_path, make_model, tokenizer, pc_dataset):
    from peft import LoraConfig

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    args = cpu_config(tmp_path, loss_type="gift", max_steps=3, learning_rate=5e-2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    assert trainer._reference.kind == "adapters_off" and trainer._reference.model is None
    trainer.train()
    assert all(torch.isfinite(torch.tensor(logged(trainer, "loss"))))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prob_q": -1.0}, "prob_q must be a finite number >= 0"),
        ({"prob_only": "middle", "prob_threshold": 0.5}, "prob_only must be top, bottom or null, got 'middle'"),
        ({"prob_only": "top"}, "prob_only is 'top' but prob_threshold is null"),
        ({"prob_only": "top", "prob_threshold": 1.0}, "prob_threshold must be in [0, 1) with prob_only=top, got 1.0"),
        ({"prob_only": "bottom", "prob_threshold": 0.0}, "prob_threshold must be in (0, 1] with prob_only=bottom"),
        ({"iw_sft_clip": 0.0}, "iw_sft_clip must be in (0.0, inf], got 0.0"),
        ({"iw_sft_temperature": -1.0}, "iw_sft_temperature must be in [0.0, inf], got -1.0"),
        ({"gift_beta": float("inf")}, "gift_beta must be a finite number >= 0"),
        ({"gift_smooth_lambda": 1.5}, "gift_smooth_lambda must be in [0.0, 1.0], got 1.5"),
        ({"gift_formula": "code"}, "gift_formula must be one of authors, paper, got 'code'"),
        ({"slm_keep_ratio": 0.0}, "slm_keep_ratio must be in (0.0, 1.0], got 0.0"),
        ({"slm_scope": "token"}, "slm_scope must be one of batch, sequence, got 'token'"),
        ({"loss_type": "gem", "iw_sft_ref_model": "ref"}, "iw_sft_ref_model is set but loss_type is 'gem'"),
    ],
)
def test_bad_settings_are_one_line_errors_whatever_the_loss(tmp_path, overrides, message):
    with pytest.raises(ValueError) as info:
        SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **overrides)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_iw_sft_and_slm_under_ddp(tmp_path):
    """Two processes with micro-batches of 2 rows (one launch, two trainings). iw-SFT weighs each sequence by its own
    tokens only: exactly one process with batch 4. SLM selects within each micro-batch of each process: exactly one
    process accumulating micro-batches of 2 (docs/losses.md, "Scope"). iw-SFT's reference is another model, so that
    its weights differ from 1 from the first step."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from conftest import CORPUS, free_port, launch_failure
    from trl_emo.models.tiny import save_tiny_causal_lm

    script = Path(__file__).parent / "scripts" / "train_tiny.py"
    tiny = dict(vocab_size=320, hidden_size=32, intermediate_size=64)
    model_dir = save_tiny_causal_lm(CORPUS, output_dir=tmp_path / "model", **tiny)
    reference = save_tiny_causal_lm(CORPUS, output_dir=tmp_path / "reference", seed=1, **tiny)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    runs = {"iw_sft": {"loss_type": "iw_sft", "config": {"iw_sft_ref_model": reference}},
            "slm": {"loss_type": "slm"}}
    ddp = ["--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend",
           "no", "--main_process_port", str(free_port())]
    out = tmp_path / "ddp.json"
    result = subprocess.run([sys.executable, "-m", "accelerate.commands.launch", *ddp, str(script), model_dir, str(out),
                             "runs", "2", "2", json.dumps(runs)], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, launch_failure(result)
    singles = {"iw_sft": (4, {"config": {"iw_sft_ref_model": reference}}),
               "slm": (2, {"config": {"gradient_accumulation_steps": 2}})}
    for name, (batch, extra) in singles.items():
        single = tmp_path / f"single-{name}.json"
        result = subprocess.run([sys.executable, str(script), model_dir, str(single), name, str(batch), "2",
                                 json.dumps(extra)], env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, launch_failure(result)
        two, one = json.loads((tmp_path / f"ddp-{name}.json").read_text()), json.loads(single.read_text())
        assert two["num_processes"] == 2 and one["num_processes"] == 1
        assert torch.allclose(torch.tensor(two["losses"]), torch.tensor(one["losses"]), rtol=1e-5), name
        assert torch.allclose(torch.tensor(two["weights"]), torch.tensor(one["weights"]), atol=1e-5), name
    weights = [row["iw_sft_weight"] for row in json.loads((tmp_path / "ddp-iw_sft.json").read_text())["log_history"]
               if "iw_sft_weight" in row]
    assert weights and all(abs(w - 1) > 1e-3 for w in weights)
