"""Drop-in means drop-in: the same scenarios through `trl.SFTTrainer` and `trl_emo.SFTTrainer`.

With `loss_type="nll"` both must log the same loss and gradient norm at every step (TRL computes the loss in
both), including on a NaN; with `loss_type="gem"` every scenario must train. Scenarios: the four dataset formats,
completion-only and assistant-only masking, packing, padding-free, PEFT, activation (gradient) checkpointing,
evaluation with `compute_metrics`, fp16 and bf16 weights. Two steps each on a tiny model.
"""

from __future__ import annotations

import math

import pytest
import torch
import trl
from datasets import Dataset
from transformers import TrainerCallback

import trl_emo
from conftest import conversation_rows, prompt_completion_rows
from trl_emo.models.tiny import build_tiny_model

STEPS = 2
BASE = dict(
    use_cpu=True,
    bf16=False,
    max_steps=STEPS,
    per_device_train_batch_size=4,
    learning_rate=1e-3,
    logging_steps=1,
    report_to="none",
    activation_checkpointing=False,
    save_strategy="no",
    max_length=48,
    seed=0,
    dataloader_num_workers=0,
    disable_tqdm=True,
)


def _rows(kind: str, n: int = 8):
    if kind == "language_modeling":
        return [{"text": f"Question {i}: what is {i} plus {i % 7}? The answer is {i + i % 7}."} for i in range(n)]
    if kind == "prompt_completion":
        return prompt_completion_rows(n)
    if kind == "conversational":
        return conversation_rows(n)
    if kind == "conversational_prompt_completion":
        return [{"prompt": r["messages"][:1], "completion": r["messages"][1:]} for r in conversation_rows(n)]
    raise ValueError(kind)


def _accuracy(prediction):
    predictions, labels = prediction
    mask = labels[:, 1:] != -100
    return {"token_accuracy": float((predictions[:, :-1] == labels[:, 1:])[mask].mean())}


# scenario -> (dataset kind, config overrides, model dtype, extra trainer kwargs)
SCENARIOS = {
    "language_modeling": ("language_modeling", {}, torch.float32, {}),
    "prompt_completion (completion-only loss)": ("prompt_completion", {}, torch.float32, {}),
    "prompt_completion (full loss)": ("prompt_completion", {"completion_only_loss": False}, torch.float32, {}),
    "conversational": ("conversational", {}, torch.float32, {}),
    "conversational (assistant-only loss)": ("conversational", {"assistant_only_loss": True}, torch.float32, {}),
    "conversational_prompt_completion": ("conversational_prompt_completion", {}, torch.float32, {}),
    "packing": ("language_modeling", {"packing": True}, torch.float32, {}),
    # TRL enforces no max_length in padding-free batches without packing, and says so.
    "padding_free": ("prompt_completion", {"padding_free": True, "max_length": None}, torch.float32, {}),
    "peft": ("prompt_completion", {}, torch.float32, {"peft": True}),
    "activation_checkpointing": ("prompt_completion", {"activation_checkpointing": True}, torch.float32, {}),
    "eval with compute_metrics": (
        "prompt_completion",
        {"eval_strategy": "steps", "eval_steps": 1, "per_device_eval_batch_size": 4},
        torch.float32,
        {"compute_metrics": True},
    ),
    "fp16 weights": ("prompt_completion", {}, torch.float16, {}),
    "bf16 weights": ("prompt_completion", {}, torch.bfloat16, {}),
}


def _run(module, loss_type, scenario, tokenizer, output_dir, callbacks=(), **overrides):
    """Train `STEPS` steps; return (logged train rows, eval rows, exception, trainable params before, after)."""
    kind, config_overrides, dtype, extra = SCENARIOS[scenario]
    values = {**BASE, **config_overrides, **overrides, "output_dir": str(output_dir), "loss_type": loss_type}
    args = module.SFTConfig(**values)
    rows = _rows(kind)
    kwargs = {}
    if extra.get("peft"):
        from peft import LoraConfig

        kwargs["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    if extra.get("compute_metrics"):
        kwargs["eval_dataset"] = Dataset.from_list(_rows(kind, 4))
        kwargs["compute_metrics"] = _accuracy
        kwargs["preprocess_logits_for_metrics"] = lambda logits, labels: logits.argmax(-1)
    model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64).to(dtype)
    torch.manual_seed(0)  # LoRA's initialization, identical for both trainers
    trainer = None
    try:
        trainer = module.SFTTrainer(
            model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
            callbacks=list(callbacks), **kwargs,
        )
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        trainer.train()
    except Exception as exc:  # noqa: BLE001 - compared between the two trainers below
        return None, None, exc, None, None
    logs = [row for row in trainer.state.log_history if "loss" in row]
    evals = [row for row in trainer.state.log_history if "eval_loss" in row]
    after = {n: p.detach() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return logs, evals, None, before, after


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_nll_is_trl_and_gem_trains(scenario, tokenizer, tmp_path):
    trl_logs, trl_evals, trl_error, _, _ = _run(trl, "nll", scenario, tokenizer, tmp_path / "trl")
    emo_logs, emo_evals, emo_error, _, _ = _run(trl_emo, "nll", scenario, tokenizer, tmp_path / "emo")
    if trl_error is not None or emo_error is not None:
        # Whatever TRL does in a scenario, trl_emo must do the same (CPU kernels missing for a dtype included).
        assert type(emo_error) is type(trl_error), (trl_error, emo_error)
        assert str(emo_error) == str(trl_error)
        return
    assert len(trl_logs) == STEPS
    for ours, theirs in zip(emo_logs, trl_logs, strict=True):
        assert ours["loss"] == theirs["loss"] and ours["grad_norm"] == theirs["grad_norm"], (ours, theirs)
    assert [r["eval_loss"] for r in emo_evals] == [r["eval_loss"] for r in trl_evals]
    if trl_evals:
        assert [r["eval_token_accuracy"] for r in emo_evals] == [r["eval_token_accuracy"] for r in trl_evals]

    logs, evals, error, before, after = _run(trl_emo, "gem", scenario, tokenizer, tmp_path / "gem")
    assert error is None, error
    losses = [row["loss"] for row in logs]
    assert len(losses) == STEPS and all(math.isfinite(v) for v in losses), losses
    assert losses[0] != losses[-1], losses
    assert any(not torch.equal(before[n], after[n]) for n in before), "no trainable parameter changed"
    assert all(torch.isfinite(p.float()).all() for p in after.values())
    if trl_evals:
        assert len(evals) == len(trl_evals) and all(math.isfinite(r["eval_loss"]) for r in evals)
        assert all(0 <= r["eval_token_accuracy"] <= 1 for r in evals)


class _PoisonHead(TrainerCallback):
    """Writes NaN into the output embedding after step 1, as a diverging run would."""

    def __init__(self):
        self.model = None

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.model = model

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            with torch.no_grad():
                self.model.get_output_embeddings().weight.fill_(float("nan"))


def _poisoned(module, loss_type, tokenizer, output_dir, **overrides):
    logs, _, error, _, _ = _run(
        module, loss_type, "prompt_completion (completion-only loss)", tokenizer, output_dir,
        callbacks=[_PoisonHead()], max_steps=3, **overrides,
    )
    return logs, error


@pytest.mark.parametrize("loss_type", ["nll", "dft"])
def test_trl_losses_go_on_through_nan_exactly_like_trl(loss_type, tokenizer, tmp_path):
    """TRL lets a NaN run continue (its own test-suite trains fp16 weights at lr 0.1 that way); so must we."""
    theirs, trl_error = _poisoned(trl, loss_type, tokenizer, tmp_path / "trl")
    ours, error = _poisoned(trl_emo, loss_type, tokenizer, tmp_path / "emo")
    assert trl_error is None and error is None, (trl_error, error)
    assert len(ours) == len(theirs) == 3
    for a, b in zip(ours, theirs):
        assert str(a["loss"]) == str(b["loss"]) and str(a["grad_norm"]) == str(b["grad_norm"]), (a, b)


def test_our_losses_stop_on_nan_unless_switched_off(tokenizer, tmp_path):
    logs, error = _poisoned(trl_emo, "gem", tokenizer, tmp_path / "on")
    assert isinstance(error, trl_emo.NonFiniteLossError) and "training step 2" in str(error)
    logs, error = _poisoned(trl_emo, "gem", tokenizer, tmp_path / "off", stop_on_non_finite_loss=False)
    assert error is None and len(logs) == 3
    assert not math.isfinite(logs[-1]["grad_norm"])
