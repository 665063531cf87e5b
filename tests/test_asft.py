"""ASFT in the trainer: where its reference model comes from, what it costs, and what goes wrong clearly."""

from __future__ import annotations

import pytest
import torch

from conftest import cpu_config
from trl_emo import SFTTrainer


def _losses(trainer, key="loss"):
    return [row[key] for row in trainer.state.log_history if key in row]


def test_full_fine_tuning_anchors_to_a_frozen_copy_of_the_starting_model(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="asft", asft_alpha=0.5, max_steps=6, learning_rate=1e-2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    start = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    assert trainer._reference.kind == "copy"
    trainer.train()
    reference = trainer._reference.model
    assert not any(p.requires_grad for p in reference.parameters())
    assert all(torch.equal(reference.state_dict()[k], v) for k, v in start.items())  # still the starting weights
    kl = _losses(trainer, "ref_kl")
    # The first step's policy is the reference: KL 0; then the model moves away and the anchor pulls.
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-3


def test_under_lora_the_reference_is_the_base_model_with_adapters_off(tmp_path, make_model, tokenizer, pc_dataset):
    from peft import LoraConfig

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    args = cpu_config(tmp_path, loss_type="asft", asft_alpha=0.5, max_steps=6, learning_rate=5e-2,
                      activation_checkpointing=True)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer,
                         peft_config=peft_config)
    assert trainer._reference.kind == "adapters_off" and trainer._reference.model is None  # no second copy
    trainer.train()
    kl = _losses(trainer, "ref_kl")
    assert kl[0] == pytest.approx(0.0, abs=1e-6) and kl[-1] > 1e-4
    # The reference pass left the adapters on: training changed the model's outputs.
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(2)])
    with torch.no_grad():
        on = trainer.model(input_ids=batch["input_ids"]).logits
        with trainer.model.disable_adapter():
            off = trainer.model(input_ids=batch["input_ids"]).logits
    assert not torch.allclose(on, off)


def test_a_separate_reference_model_and_its_vocabulary(tmp_path, make_model, tokenizer, pc_dataset):
    make_model(seed=7).save_pretrained(str(tmp_path / "ref"))
    args = cpu_config(tmp_path / "out", loss_type="asft", asft_ref_model=str(tmp_path / "ref"), max_steps=2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    assert trainer._reference.kind == "model"
    trainer.train()
    assert _losses(trainer, "ref_kl")[0] > 1e-3  # another model: not zero from the start

    from trl_emo.models.tiny import build_tiny_model, train_tokenizer

    other = train_tokenizer(["a b c d e f g h"] * 4, vocab_size=64)
    build_tiny_model(other, hidden_size=32, intermediate_size=64).save_pretrained(str(tmp_path / "small"))
    args = cpu_config(tmp_path / "bad", loss_type="asft", asft_ref_model=str(tmp_path / "small"))
    with pytest.raises(ValueError, match=r"reference model .* has \d+ output tokens but the model being trained has \d+"):
        SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)


def test_alpha_zero_is_trls_dft_and_runs_no_reference(tmp_path, make_model, tokenizer, pc_dataset):
    ours = SFTTrainer(model=make_model(), args=cpu_config(tmp_path / "asft", loss_type="asft", asft_alpha=0.0, max_steps=3),
                      train_dataset=pc_dataset, processing_class=tokenizer)
    assert ours._reference is None
    ours.train()
    dft = SFTTrainer(model=make_model(), args=cpu_config(tmp_path / "dft", loss_type="dft", max_steps=3),
                     train_dataset=pc_dataset, processing_class=tokenizer)
    dft.train()
    assert torch.allclose(torch.tensor(_losses(ours)), torch.tensor(_losses(dft)), rtol=1e-5)


@pytest.mark.parametrize("setup", ["zero3", "fsdp"])
def test_a_separate_reference_is_refused_where_it_would_not_be_sharded(setup):
    """A frozen copy (or asft_ref_model) under ZeRO-3/FSDP would be a whole model on every rank: a clear error
    naming the ways out, before anything is copied (DeepSpeed's own tests run ASFT with LoRA under ZeRO-3)."""
    from types import SimpleNamespace

    from trl_emo.training.reference import ReferenceModel

    plugin = SimpleNamespace(zero_stage=3)
    trainer = SimpleNamespace(
        _base_model=lambda: None,
        model=object(),  # not a PeftModel
        is_deepspeed_enabled=setup == "zero3",
        is_fsdp_enabled=setup == "fsdp",
        accelerator=SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin)),
    )
    with pytest.raises(ValueError, match="not supported under DeepSpeed ZeRO-3 or FSDP.*use_peft: true"):
        ReferenceModel.build(trainer, None)
