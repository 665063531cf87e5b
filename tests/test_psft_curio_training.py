"""PSFT's old policy and CurioSFT's teacher in the trainer: their schedules (a copy every K steps, a mix every N), no
extra forward while they equal the policy, the fused path equal to the logits path through the model's forward, K = 1
trained as cross-entropy, the adapters alone under LoRA and QLoRA, the state in checkpoints and back on resume (killed
runs resumed bit for bit: `tests/test_faults.py`), bad settings in one line."""

from __future__ import annotations

import logging

import pytest
import torch
from transformers import TrainerCallback

from checkpoint_layouts import drop_records
from conftest import cpu_config, four_bit_model
from trl_emo import SFTConfig, SFTTrainer
from trl_emo.training import lagged_policy
from trl_emo.training.lagged_policy import LaggedPolicy


def logged(trainer, key):
    return [row[key] for row in trainer.state.log_history if key in row]


class Snapshots(TrainerCallback):
    """The trainable weights after every optimizer step (index 0: the starting weights)."""

    def __init__(self, model):
        self.model = model
        self.steps = [self._take()]

    def _take(self):
        return {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad}

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(self._take())


def _trainer(tmp_path, make_model, tokenizer, dataset, loss_type, peft_config=None, **fields):
    args = cpu_config(tmp_path, loss_type=loss_type, **fields)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    snapshots = Snapshots(trainer._base_model())
    trainer.add_callback(snapshots)
    return trainer, snapshots


def _count_lagged_forwards(monkeypatch):
    calls = []
    original = LaggedPolicy.hidden_states

    def counted(self, policy, args, kwargs):
        out = original(self, policy, args, kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(LaggedPolicy, "hidden_states", counted)
    return calls


def test_psft_old_policy_is_the_model_at_the_start_of_each_window(tmp_path, make_model, tokenizer, pc_dataset,
                                                                  monkeypatch):
    """K = 3 over 7 steps: windows start at steps 1, 4 and 7, where the ratio is exactly 1 and no old-policy forward
    runs; in between the old policy is the window's first weights (the ratio moves, some tokens are clipped)."""
    forwards = _count_lagged_forwards(monkeypatch)
    trainer, snapshots = _trainer(tmp_path, make_model, tokenizer, pc_dataset, "psft", psft_old_policy_steps=3,
                                  max_steps=7)
    trainer.train()
    ratios = logged(trainer, "psft_ratio")
    assert [ratios[i] for i in (0, 3, 6)] == [1.0, 1.0, 1.0]
    assert all(ratios[i] != 1.0 for i in (1, 2, 4, 5))
    assert max(logged(trainer, "psft_clipped")) > 0
    assert forwards == [False, True, True, False, True, True, False]
    # After step 7 (no refresh: 7 % 3 != 0) the old policy is the weights after step 6.
    lagged = trainer._lagged
    assert not lagged.in_sync
    assert all(torch.equal(lagged.weights[n], snapshots.steps[6][n]) for n in lagged.weights)
    assert lagged.weights.keys() == snapshots.steps[0].keys()  # full fine-tuning: every parameter


@pytest.mark.parametrize("loss_type", ["psft", "curio_sft"])
def test_fused_equals_logits_through_the_models_forward(tmp_path, make_model, tokenizer, pc_dataset, loss_type):
    """The old policy's / teacher's hidden states through the patched forward (fused) and its full logits (logits path)
    give the same losses and weights, step after step, with gradient accumulation."""
    fields = {"psft_old_policy_steps": 2} if loss_type == "psft" else {"curio_teacher_sync_steps": 1, "curio_topk": 16}
    runs = {}
    for implementation in ("fused", "logits"):
        trainer, _ = _trainer(tmp_path / implementation, make_model, tokenizer, pc_dataset, loss_type,
                              loss_implementation=implementation, max_steps=2, per_device_train_batch_size=4,
                              gradient_accumulation_steps=2, optim="sgd", learning_rate=0.5, **fields)
        trainer.train()
        runs[implementation] = (logged(trainer, "loss"), torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    assert torch.allclose(torch.tensor(runs["fused"][0]), torch.tensor(runs["logits"][0]), rtol=1e-5)
    assert torch.allclose(runs["fused"][1], runs["logits"][1], atol=1e-5)


def test_psft_with_k_1_trains_as_cross_entropy(tmp_path, make_model, tokenizer, pc_dataset):
    """Every step's old policy is the current model: r = 1, each token's loss −1, cross-entropy's gradient, so the
    same weights as TRL's `nll` (plain SGD: Adam would magnify float rounding)."""
    weights = {}
    for loss_type in ("psft", "nll"):
        trainer, _ = _trainer(tmp_path / loss_type, make_model, tokenizer, pc_dataset, loss_type, psft_old_policy_steps=1,
                              max_steps=3, optim="sgd", learning_rate=0.5)
        trainer.train()
        weights[loss_type] = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        if loss_type == "psft":
            assert set(logged(trainer, "loss")) == {-1.0} and set(logged(trainer, "psft_ratio")) == {1.0}
    assert torch.allclose(weights["psft"], weights["nll"], rtol=1e-5, atol=1e-6)


def test_curio_teacher_is_mixed_with_the_policy_on_its_schedule(tmp_path, make_model, tokenizer, pc_dataset,
                                                                monkeypatch):
    """Every 2 steps teacher <- 0.5 teacher + 0.5 policy (their mix, `mul_(1 - a).add_(policy, alpha=a)`); the teacher
    equals the policy only before the first step, the one step without a teacher forward."""
    forwards = _count_lagged_forwards(monkeypatch)
    trainer, snapshots = _trainer(tmp_path, make_model, tokenizer, pc_dataset, "curio_sft", curio_teacher_sync_steps=2,
                                  curio_teacher_mixup_alpha=0.5, max_steps=5)
    trainer.train()
    assert forwards == [False, True, True, True, True]
    for name, teacher in trainer._lagged.weights.items():
        expected = snapshots.steps[0][name].clone()
        for step in (2, 4):
            expected.mul_(0.5).add_(snapshots.steps[step][name], alpha=0.5)
        assert torch.equal(teacher, expected), name
    taus = logged(trainer, "curio_tau")
    assert all(1.1 - 1e-6 <= t <= 1.5 + 1e-6 for t in taus)  # token means in float32 and logged(trainer, "curio_kd")[-1] > 0


def test_the_state_is_in_every_checkpoint_and_back_on_resume(tmp_path, make_model, tokenizer, pc_dataset, caplog):
    """Saved inside each checkpoint with whether it equals the policy; a resume reads it back (the checkpoint's weights,
    not the starting ones); a checkpoint folder named without it re-takes it from the resumed weights, said in one
    line."""
    trainer, snapshots = _trainer(tmp_path, make_model, tokenizer, pc_dataset, "psft", psft_old_policy_steps=3,
                                  max_steps=4, save_strategy="steps", save_steps=2)
    assert lagged_policy.STATE_FILE in trainer.args.checkpoint_side_files(True)
    trainer.train()
    saved = tmp_path / "checkpoint-2" / lagged_policy.STATE_FILE
    assert saved.exists() and (tmp_path / "checkpoint-4" / lagged_policy.STATE_FILE).exists()

    resumed, _ = _trainer(tmp_path, make_model, tokenizer, pc_dataset, "psft", psft_old_policy_steps=3, max_steps=3)
    resumed._restore_side_files(str(tmp_path / "checkpoint-2"))
    # Step 2 is inside the first window: the starting weights, not the policy's.
    assert not resumed._lagged.in_sync
    assert all(torch.equal(resumed._lagged.weights[n], snapshots.steps[0][n]) for n in snapshots.steps[0])
    resumed._restore_side_files(str(tmp_path / "checkpoint-4"))  # one step after the refresh at step 3
    assert all(torch.equal(resumed._lagged.weights[n], snapshots.steps[3][n]) for n in snapshots.steps[0])

    saved.unlink()
    drop_records(saved.parent)  # a checkpoint written without the state (TRL's scripts, another loss), not a damaged one
    again, _ = _trainer(tmp_path, make_model, tokenizer, pc_dataset, "psft", psft_old_policy_steps=3, max_steps=3)
    with caplog.at_level(logging.WARNING, logger="trl_emo.training.trainer"):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    warned = [r.getMessage() for r in caplog.records if lagged_policy.STATE_FILE in r.getMessage()]
    assert len(warned) == 1 and "PSFT's old policy is re-taken from the resumed weights" in warned[0]
    assert logged(again, "psft_ratio")[0] == 1.0  # the first resumed step: old policy = the resumed weights


def test_under_lora_the_old_policy_and_the_teacher_cost_an_adapter(tmp_path, make_model, tokenizer, pc_dataset):
    """The lagged copy is the adapters alone (the base is shared and frozen): its bytes are the trainable ones, a small
    share of the model; the lagged forward runs the base with the old adapters swapped in, and leaves the policy's."""
    from peft import LoraConfig

    peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    for loss_type, fields in (("psft", {"psft_old_policy_steps": 2}), ("curio_sft", {"curio_teacher_sync_steps": 2})):
        trainer, snapshots = _trainer(tmp_path / loss_type, make_model, tokenizer, pc_dataset, loss_type, peft_config,
                                      max_steps=3, learning_rate=5e-2, **fields)
        trainer.train()
        lagged = trainer._lagged
        model = trainer._base_model()
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        assert lagged.weights.keys() == trainable.keys() and all("lora_" in n for n in lagged.weights)
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        assert lagged.nbytes == sum(p.numel() * p.element_size() for p in trainable.values()) < 0.5 * total
        before = {n: p.detach().clone() for n, p in trainable.items()}
        ids = torch.tensor([[5, 9, 12, 30, 7]])
        model.train()
        with torch.no_grad():
            lagged_logits = lagged.logits(model, {"input_ids": ids})
            policy_logits = model(input_ids=ids).logits
        assert lagged_logits is not None and not torch.allclose(lagged_logits, policy_logits)
        # The policy's adapters are back, and its training mode (the lagged forward runs in eval mode).
        assert all(torch.equal(p, before[n]) for n, p in trainable.items())
        assert all(module.training for module in model.modules())


def test_qlora_4bit_on_cpu(tmp_path, make_model, tokenizer, pc_dataset):
    """CurioSFT on a 4-bit base: the teacher is the quantized base with the teacher's adapters swapped in."""
    model, peft_config = four_bit_model(tmp_path / "base", make_model)
    args = cpu_config(tmp_path / "out", loss_type="curio_sft", curio_teacher_sync_steps=1, max_steps=3,
                      learning_rate=1e-2)
    trainer = SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    trainer.train()
    assert len(logged(trainer, "loss")) == 3 and logged(trainer, "curio_kd")[-1] > 0
    assert all("lora_" in name for name in trainer._lagged.weights)


@pytest.mark.parametrize(("fields", "message"), [
    ({"loss_type": "psft", "psft_clip_low": 1.5}, "psft_clip_low must be in [0.0, 1.0], got 1.5."),
    ({"loss_type": "psft", "psft_old_policy_steps": 0}, "psft_old_policy_steps must be a positive integer, got 0."),
    ({"loss_type": "curio_sft", "curio_tau_max": 1.0}, "curio_tau_max must be in [1.1, inf], got 1.0."),
    ({"loss_type": "curio_sft", "curio_topk": 0}, "curio_topk must be a positive integer, got 0."),
    ({"loss_type": "nll", "curio_teacher_mixup_alpha": 1.5}, "curio_teacher_mixup_alpha must be in [0.0, 1.0], got 1.5."),
])
def test_bad_settings_are_one_line_errors(tmp_path, fields, message):
    with pytest.raises(ValueError) as info:
        SFTConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **fields)
    assert str(info.value) == message


def test_sharded_parameters_are_refused_in_one_line():
    from types import SimpleNamespace

    trainer = SimpleNamespace(is_fsdp_enabled=True, is_deepspeed_enabled=False,
                              accelerator=SimpleNamespace(state=SimpleNamespace()))
    with pytest.raises(ValueError, match=r"^loss_type='curio_sft' keeps a lagged copy of the trainable weights, which "
                                         r"DeepSpeed ZeRO-3 and FSDP shard; use DDP or ZeRO-2"):
        LaggedPolicy.build(trainer, 5, 0.99, "curio_sft")
