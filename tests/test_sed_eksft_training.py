"""SED-SFT and EKSFT in the trainer: SED's threshold calibrated as the authors' script does and kept on resume; EKSFT's
reference model (a frozen copy, the adapters off, another model), its label rows through the model's patched forward,
its logged selection; LoRA and QLoRA; the command line."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from checkpoint_layouts import drop_records
from conftest import cpu_config, four_bit_model
from trl_emo import SFTTrainer
from trl_emo.losses.sed import threshold_from_masses, top_k_mass
from trl_emo.training import sed_threshold


def logged(trainer, key):
    return [row[key] for row in trainer.state.log_history if key in row]


@torch.no_grad()
def direct_threshold(model, dataset, top_k=10, ratio=0.7, rows=100):
    """The authors' calibration, written out: every position of the first rows, top-k mass, the `ratio` quantile."""
    masses = []
    for row in list(dataset)[:rows]:
        logits = model(input_ids=torch.tensor([row["input_ids"]])).logits[0].float()
        masses.append(logits.softmax(-1).topk(top_k, -1).values.sum(-1))
    return threshold_from_masses(torch.cat(masses), ratio)


def test_sed_calibrates_its_threshold_on_the_starting_model_and_keeps_it_on_resume(
    tmp_path, make_model, tokenizer, pc_dataset, monkeypatch, caplog
):
    args = cpu_config(tmp_path, loss_type="sed", max_steps=4, save_strategy="steps", save_steps=2,
                      sed_threshold_samples=12)
    model = make_model()
    trainer = SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    expected = direct_threshold(trainer.model, trainer.train_dataset, rows=12)
    assert trainer._objective.hparams["threshold"] is None
    trainer.train()
    tau = trainer._objective.hparams["threshold"]
    assert tau == pytest.approx(expected, rel=1e-5)
    assert logged(trainer, "sed_threshold") and set(logged(trainer, "sed_threshold")) == {tau}
    shares = logged(trainer, "sed_mask")
    assert shares and all(0.0 <= s <= 1.0 for s in shares) and max(shares) > 0
    for row in (r for r in trainer.state.log_history if "loss" in r):
        assert row["objective"] == pytest.approx(row["loss"], rel=1e-5)
    saved = json.loads((tmp_path / "checkpoint-2" / sed_threshold.STATE_FILE).read_text())
    assert float(saved["sed_threshold"]) == tau

    # Resumed: the threshold of the checkpoint, never a calibration on trained weights.
    def refuse(*_, **__):
        raise AssertionError("calibrated again on resume")

    monkeypatch.setattr(sed_threshold, "calibrate", refuse)
    resumed = SFTTrainer(model=make_model(), args=cpu_config(tmp_path, loss_type="sed", max_steps=4),
                         train_dataset=pc_dataset, processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert resumed._objective.hparams["threshold"] == tau

    # A checkpoint without the file (written before it existed, by a trl_emo without checkpoint manifests): calibrated
    # again on the trained weights, and said so in one line.
    (tmp_path / "checkpoint-2" / sed_threshold.STATE_FILE).unlink()
    drop_records(tmp_path / "checkpoint-2")
    monkeypatch.setattr(sed_threshold, "calibrate", lambda *a, **k: 0.5)
    again = SFTTrainer(model=make_model(), args=cpu_config(tmp_path, loss_type="sed", max_steps=3),
                       train_dataset=pc_dataset, processing_class=tokenizer)
    with caplog.at_level(logging.WARNING, logger="trl_emo.training.trainer"):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    warned = [r.getMessage() for r in caplog.records if sed_threshold.STATE_FILE in r.getMessage()]
    assert len(warned) == 1 and "calibrated again, on the resumed (trained) weights" in warned[0]
    assert "\n" not in warned[0] and again._objective.hparams["threshold"] == 0.5


@pytest.fixture(scope="module")
def sed_trainers(tmp_path_factory, tokenizer):
    """The same starting model and examples, without and with packing (TRL's rows then hold several examples); module
    scope, so both calibration tests share them (`make_model` and `pc_dataset` are per test)."""
    from conftest import prompt_completion_rows
    from datasets import Dataset
    from trl_emo.models.tiny import build_tiny_model

    dataset = Dataset.from_list(prompt_completion_rows(12))
    trainers = {}
    for packing in (False, True):
        args = cpu_config(tmp_path_factory.mktemp(f"packing_{packing}"), loss_type="sed", packing=packing, max_steps=1)
        model = build_tiny_model(tokenizer, seed=0, hidden_size=32, intermediate_size=64)
        trainers[packing] = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    return trainers


def calibrated(trainer, count=100):
    examples = sed_threshold.calibration_sequences(trainer.train_dataset, count)
    return sed_threshold.calibrate(trainer.model, trainer._base_model(), examples, 10, 0.7, "cpu")


def test_sed_calibration_runs_each_packed_example_as_its_own_sequence(sed_trainers):
    """Packed rows (`seq_lengths`) are split into their examples, each run alone as the loss sees it, and the count is
    of examples: packing on and off give the same τ on the same examples (before: each packed row ran as one causal
    sequence, examples attending to the ones before them, and "the first N rows" were N packed rows)."""
    plain, packed = sed_trainers[False].train_dataset, sed_trainers[True].train_dataset
    assert "seq_lengths" in packed.column_names and len(packed) < len(plain)
    whole = {p: sed_threshold.calibration_sequences(t.train_dataset, 100) for p, t in sed_trainers.items()}
    assert len(whole[True]) == len(plain) and sorted(whole[True]) == sorted(whole[False])
    first = sed_threshold.calibration_sequences(packed, 5)
    assert len(first) == 5 and all(ids in whole[False] for ids in first)  # five examples, not five packed rows
    tau = calibrated(sed_trainers[False])
    assert calibrated(sed_trainers[True]) == tau
    # And as the trainer calibrates before its first step (its dataset, its count, the broadcast).
    packed_trainer = sed_trainers[True]
    packed_trainer._calibrate_sed_threshold(packed_trainer.model, {"input_ids": torch.zeros(1, 1, dtype=torch.long)})
    assert packed_trainer._objective.hparams["threshold"] == tau


def test_sed_calibration_cuts_packed_rows_into_examples():
    rows = [
        {"input_ids": [1, 2, 3, 4, 5, 6], "seq_lengths": [2, 3, 1]},  # TRL's best-fit packing
        {"input_ids": [7, 8, 9, 10], "position_ids": [0, 1, 0, 1]},  # positions that restart
        {"input_ids": []},
        {"input_ids": [11, 12, 13]},  # one sequence (no packing, or "wrapped")
    ]
    assert sed_threshold.calibration_sequences(rows, 100) == [[1, 2], [3, 4, 5], [6], [7, 8], [9, 10], [11, 12, 13]]
    assert sed_threshold.calibration_sequences(rows, 4) == [[1, 2], [3, 4, 5], [6], [7, 8]]
    with pytest.raises(ValueError, match="seq_lengths sum to 5 but it has 6 tokens"):
        sed_threshold.calibration_sequences([{"input_ids": [1, 2, 3, 4, 5, 6], "seq_lengths": [2, 3]}], 10)


def test_sed_calibration_runs_in_float32_without_autocast(sed_trainers):
    """Under the mixed-precision autocast (accelerate wraps the forward in it with bf16: true), the calibration's
    forward and head product stay in float32, as the fused loss's head step does: the same τ."""
    trainer = sed_trainers[False]
    plain = calibrated(trainer, 6)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = calibrated(trainer, 6)
    assert mixed == plain


def test_sed_calibration_top_k_beyond_the_vocabulary_is_a_clear_error(tmp_path, make_model, tokenizer, pc_dataset):
    model = make_model()
    vocab = model.get_output_embeddings().weight.shape[0]
    args = cpu_config(tmp_path, loss_type="sed", sed_threshold_top_k=vocab + 1, max_steps=1)
    trainer = SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match=f"sed_threshold_top_k={vocab + 1} is larger than the model's vocabulary"):
        trainer.train()


def test_sed_with_a_given_threshold_runs_no_calibration(tmp_path, make_model, tokenizer, pc_dataset, monkeypatch):
    monkeypatch.setattr(sed_threshold, "calibrate", lambda *a, **k: pytest.fail("calibrated"))
    args = cpu_config(tmp_path, loss_type="sed", sed_threshold=0.5, sed_lambda=0.5, max_steps=2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    trainer.train()
    assert "sed_threshold" not in trainer.state.log_history[0]


def test_top_k_mass_of_hidden_states_is_that_of_the_logits(make_model):
    model = make_model()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state
        logits = model(input_ids=ids).logits
    got = top_k_mass(hidden, model.lm_head.weight, None, None, 3, chunk_rows=4)
    assert torch.allclose(got, logits.softmax(-1).topk(3, -1).values.sum(-1).flatten(), atol=1e-6)


def test_eksft_full_fine_tuning_selects_against_a_frozen_copy(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="eksft", max_steps=6, learning_rate=1e-2, eksft_ratio=0.3)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    assert trainer._reference.kind == "copy"
    trainer.train()
    kl = logged(trainer, "eksft_kl")
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-4  # the first step's policy is the reference
    for key in ("eksft_dropped", "eksft_entropy_selected", "eksft_kl_selected", "eksft_overlap"):
        values = logged(trainer, key)
        assert values and all(0.0 <= v <= 1.0 for v in values), key
    # ⌊0.3 N⌋ tokens by each criterion, per micro-batch: a little under 0.3 of the tokens each.
    assert all(0.2 < v <= 0.3 + 1e-6 for v in logged(trainer, "eksft_entropy_selected"))
    assert all(o <= min(e, k) + 1e-9 for o, e, k in zip(logged(trainer, "eksft_overlap"),
                                                          logged(trainer, "eksft_entropy_selected"),
                                                          logged(trainer, "eksft_kl_selected")))
    for row in (r for r in trainer.state.log_history if "loss" in r):
        assert row["objective"] == pytest.approx(row["loss"], rel=1e-5)


@pytest.mark.parametrize("formula", ["authors", "paper"])
def test_eksft_fused_equals_logits_through_the_models_forward(tmp_path, make_model, tokenizer, pc_dataset, formula):
    """The fused path (through the patched forward: label rows, the reference's hidden states) and the logits path give
    the same losses and weights, step after step, with gradient accumulation."""
    runs = {}
    for implementation in ("fused", "logits"):
        args = cpu_config(tmp_path / implementation, loss_type="eksft", eksft_formula=formula, eksft_ratio=0.4,
                          eksft_lambda_entropy=0.5, eksft_lambda_kl=1.0, loss_implementation=implementation,
                          max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2, optim="sgd",
                          learning_rate=0.1)
        trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
        trainer.train()
        runs[implementation] = (logged(trainer, "loss"), torch.cat([p.detach().flatten() for p in trainer.model.parameters()]))
    assert torch.allclose(torch.tensor(runs["fused"][0]), torch.tensor(runs["logits"][0]), rtol=1e-5)
    # Plain SGD: Adam would turn float32 rounding of near-zero gradients into whole steps of the learning rate.
    assert torch.allclose(runs["fused"][1], runs["logits"][1], atol=1e-5)


def test_eksft_under_lora_uses_the_adapters_off_and_a_separate_reference_is_checked(
    tmp_path, make_model, tokenizer, pc_dataset
):
    from peft import LoraConfig

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    args = cpu_config(tmp_path / "lora", loss_type="eksft", eksft_formula="authors", max_steps=4, learning_rate=5e-2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    assert trainer._reference.kind == "adapters_off" and trainer._reference.model is None
    trainer.train()
    assert logged(trainer, "eksft_kl")[-1] > 0

    make_model(seed=7).save_pretrained(str(tmp_path / "ref"))
    args = cpu_config(tmp_path / "other", loss_type="eksft", eksft_ref_model=str(tmp_path / "ref"), max_steps=1)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    assert trainer._reference.kind == "model"
    trainer.train()
    assert logged(trainer, "eksft_kl")[0] > 1e-3  # another model: not zero from the start
    with pytest.raises(ValueError, match="eksft_ref_model is set but loss_type is 'sed'"):
        cpu_config(tmp_path / "bad", loss_type="sed", eksft_ref_model=str(tmp_path / "ref"))


def test_eksft_ratio_zero_is_cross_entropy_without_a_reference(tmp_path, make_model, tokenizer, pc_dataset):
    runs = {}
    # Both formulas: the authors' one reads label rows only for its selection, none at ratio 0.
    for loss_type, extra in (("eksft", {"eksft_ratio": 0.0}), ("eksft_authors", {"eksft_ratio": 0.0}),
                             ("ce_entropy", {"entropy_coef": 0.0})):
        if loss_type == "eksft_authors":
            loss_type, extra = "eksft", {**extra, "eksft_formula": "authors"}
            name = "eksft_authors"
        else:
            name = loss_type
        trainer = SFTTrainer(model=make_model(), args=cpu_config(tmp_path / name, loss_type=loss_type, max_steps=3,
                                                                 **extra),
                             train_dataset=pc_dataset, processing_class=tokenizer)
        runs[name] = trainer
        trainer.train()
    assert runs["eksft"]._reference is None and runs["eksft_authors"]._reference is None
    for name in ("eksft", "eksft_authors"):
        assert torch.allclose(torch.tensor(logged(runs[name], "loss")), torch.tensor(logged(runs["ce_entropy"], "loss")),
                              rtol=1e-5), name


def test_qlora_4bit_on_cpu(tmp_path, make_model, tokenizer, pc_dataset):
    """EKSFT, the loss with the most machinery (its reference is the 4-bit base with the adapters off)."""
    model, peft_config = four_bit_model(tmp_path / "base", make_model)
    args = cpu_config(tmp_path / "out", loss_type="eksft", max_steps=3, learning_rate=1e-2)
    trainer = SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    trainer.train()
    losses = logged(trainer, "loss")
    assert len(losses) == 3 and all(torch.isfinite(torch.tensor(losses)))
    assert type(trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
