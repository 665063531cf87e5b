"""`trl_emo.SFTTrainer` end to end on a tiny model: every loss, accumulation, masking, errors."""

from __future__ import annotations

import json

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from conftest import conversation_rows, cpu_config
from trl_emo import NonFiniteLossError, SFTTrainer

LOSSES = [
    ("nll", {}),
    ("dft", {}),
    ("gem", {}),
    ("gem", {"gem_h": "logsigmoid"}),
    ("emo", {}),
    ("emo", {"emo_cost_embedding": "lm_head", "emo_weighting": "emo"}),
    ("tailr", {}),
    ("mixce", {}),
    ("ce_entropy", {}),
    ("eaft", {}),
    ("eaft", {"eaft_entropy": "full"}),
    ("sed", {}),
    ("eksft", {}),
    ("eksft", {"eksft_formula": "authors"}),
]


@torch.no_grad()
def dataset_cross_entropy(trainer) -> float:
    """Mean cross-entropy of the trained tokens of the whole (prepared) training set."""
    model = trainer.model
    was_training = model.training
    model.eval()
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(len(trainer.train_dataset))])
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    labels = batch["labels"][:, 1:]
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100)
    model.train(was_training)
    return float(ce)


@pytest.mark.parametrize(("loss_type", "extra"), LOSSES, ids=[f"{n}{'-' + '-'.join(e.values()) if e else ''}" for n, e in LOSSES])
def test_every_loss_lowers_cross_entropy(tmp_path, make_model, tokenizer, pc_dataset, loss_type, extra):
    args = cpu_config(tmp_path, loss_type=loss_type, max_steps=12, **extra)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    before = dataset_cross_entropy(trainer)
    trainer.train()
    after = dataset_cross_entropy(trainer)
    assert after < before - 0.5, (before, after)
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logged) == 12 and all(torch.isfinite(torch.tensor(row["loss"])) for row in logged)
    if loss_type not in ("nll", "dft"):
        for key in ("cross_entropy", "entropy", "mean_token_accuracy", "objective"):
            assert key in logged[-1], key


def _run(tmp_path, make_model, tokenizer, dataset, name, **overrides):
    args = cpu_config(tmp_path / name, **overrides)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=dataset, processing_class=tokenizer)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    return trainer, losses


@pytest.mark.parametrize("loss_type", ["gem", "emo", "eaft", "asft"])
def test_gradient_accumulation_equals_the_large_batch(tmp_path, make_model, tokenizer, pc_dataset, loss_type):
    """Batch 4 x 1 step and batch 2 x 2 accumulation steps give the same per-step losses and weights."""
    common = dict(loss_type=loss_type, max_steps=3, gem_h="logsigmoid")
    big, big_losses = _run(tmp_path, make_model, tokenizer, pc_dataset, "big", per_device_train_batch_size=4, **common)
    acc, acc_losses = _run(
        tmp_path, make_model, tokenizer, pc_dataset, "acc", per_device_train_batch_size=2, gradient_accumulation_steps=2, **common
    )
    assert len(big_losses) == 3
    assert torch.allclose(torch.tensor(big_losses), torch.tensor(acc_losses), rtol=1e-5, atol=1e-6)
    # Adam divides by the gradient's running RMS, so last-bit differences of sums taken in another order
    # reach ~1e-5 in the weights after 3 steps; a wrong token count would be off by ~1e-3 (the learning rate).
    for p, q in zip(big.model.parameters(), acc.model.parameters()):
        assert torch.allclose(p, q, atol=5e-5)


@pytest.mark.parametrize("loss_type", ["gem", "emo", "ce_entropy", "asft"])
@pytest.mark.parametrize("tie", [False, True])
def test_fused_and_logits_implementations_train_identically(tmp_path, make_model, tokenizer, pc_dataset, loss_type, tie):
    def model():
        return make_model(tie_word_embeddings=tie)

    common = dict(loss_type=loss_type, max_steps=3, gem_h="logsigmoid")
    fused, fused_losses = _run(tmp_path, model, tokenizer, pc_dataset, "fused", loss_implementation="fused", **common)
    ref, ref_losses = _run(tmp_path, model, tokenizer, pc_dataset, "logits", loss_implementation="logits", **common)
    assert torch.allclose(torch.tensor(fused_losses), torch.tensor(ref_losses), rtol=1e-5)
    for p, q in zip(fused.model.parameters(), ref.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5)


class _PoisonHead(TrainerCallback):
    """Writes NaN into the head after the given step, as a diverging run would."""

    def __init__(self, trainer_ref, after_step):
        self.trainer_ref, self.after_step = trainer_ref, after_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.after_step:
            with torch.no_grad():
                self.trainer_ref[0].model.get_output_embeddings().weight.fill_(float("nan"))


# Not "nll": TRL's own losses keep TRL's behaviour on a NaN (training goes on; tests/test_drop_in.py).
@pytest.mark.parametrize("loss_type", ["gem", "emo"])
def test_nan_logits_raise_an_error_naming_the_step(tmp_path, make_model, tokenizer, pc_dataset, loss_type):
    ref = []
    args = cpu_config(tmp_path, loss_type=loss_type, max_steps=5)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer, callbacks=[_PoisonHead(ref, 2)])
    ref.append(trainer)
    with pytest.raises(NonFiniteLossError, match="training step 3"):
        trainer.train()


@pytest.mark.parametrize("loss_type", ["gem", "emo"])
def test_all_masked_micro_batch_trains_with_zero_loss(tmp_path, make_model, tokenizer, loss_type):
    ids = tokenizer("what is 2 plus 2? The answer is 4.")["input_ids"]
    rows = [{"input_ids": ids, "labels": [-100] * len(ids)}, {"input_ids": ids, "labels": ids}]
    dataset = Dataset.from_list(rows)
    args = cpu_config(
        tmp_path, loss_type=loss_type, max_steps=2, per_device_train_batch_size=1, dataset_kwargs={"skip_prepare_dataset": True}
    )
    model = make_model()
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    before = [p.detach().clone() for p in model.parameters()]
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert logged[0]["loss"] == 0.0 and logged[0]["grad_norm"] == 0.0
    assert logged[1]["loss"] != 0.0
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_conversational_data_trains_on_assistant_turns_only(tmp_path, make_model, tokenizer):
    dataset = Dataset.from_list(conversation_rows())
    args = cpu_config(tmp_path, loss_type="gem", gem_h="logsigmoid", assistant_only_loss=True, max_steps=6)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=dataset, processing_class=tokenizer)
    example = trainer.train_dataset[0]
    trained = tokenizer.decode([t for t, l in zip(example["input_ids"], example["labels"]) if l != -100])
    assert trained == "The answer is 0.<|end|>"
    before = dataset_cross_entropy(trainer)
    trainer.train()
    assert dataset_cross_entropy(trainer) < before


def test_completion_only_masking_on_prompt_completion_data(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="emo", max_steps=1)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    example = trainer.train_dataset[3]
    trained = tokenizer.decode([t for t, l in zip(example["input_ids"], example["labels"]) if l != -100])
    assert trained.strip() == "The answer is 6.</s>"


def test_saved_model_has_no_cost_embedding_and_stops_at_end_of_turn(tmp_path, make_model, tokenizer, pc_dataset):
    from transformers import AutoModelForCausalLM, GenerationConfig

    args = cpu_config(tmp_path, loss_type="emo", max_steps=2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    model, info = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"), output_loading_info=True)
    assert not info["unexpected_keys"] and not info["missing_keys"], info
    eos = GenerationConfig.from_pretrained(str(tmp_path / "final")).eos_token_id
    eos = [eos] if isinstance(eos, int) else eos
    assert tokenizer.convert_tokens_to_ids("<|end|>") in eos and tokenizer.eos_token_id in eos


def test_frozen_cost_embedding_is_the_initial_head_and_stays(tmp_path, make_model, tokenizer, pc_dataset):
    model = make_model()
    initial = model.get_output_embeddings().weight.detach().clone()
    args = cpu_config(tmp_path, loss_type="emo", max_steps=3)
    trainer = SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    trainer.train()
    assert torch.equal(trainer._objective.cost.weight, initial)
    assert not torch.equal(model.get_output_embeddings().weight, initial)


def test_cost_embedding_from_a_file_and_from_a_model_folder(tmp_path, make_model, tokenizer, pc_dataset):
    from safetensors.torch import save_file

    vocab = len(tokenizer)
    table = torch.randn(vocab, 7)
    save_file({"cost_embedding": table}, str(tmp_path / "cost.safetensors"))
    args = cpu_config(tmp_path / "a", loss_type="emo", max_steps=1, emo_cost_embedding=str(tmp_path / "cost.safetensors"))
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    trainer.train()
    assert torch.equal(trainer._objective.cost.weight, table)

    other = make_model(seed=3)
    other.save_pretrained(str(tmp_path / "other"))
    args = cpu_config(tmp_path / "b", loss_type="emo", max_steps=1, emo_cost_embedding=str(tmp_path / "other"))
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    trainer.train()
    assert torch.allclose(trainer._objective.cost.weight, other.get_output_embeddings().weight)


def test_vocabulary_mismatches_are_clear_errors(tmp_path, make_model, tokenizer, pc_dataset):
    torch.save(torch.randn(len(tokenizer) + 5, 4), str(tmp_path / "wrong.pt"))
    args = cpu_config(tmp_path, loss_type="emo", max_steps=1, emo_cost_embedding=str(tmp_path / "wrong.pt"))
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    with pytest.raises(ValueError, match=rf"Vocabulary mismatch.*{len(tokenizer) + 5} rows.*{len(tokenizer)}"):
        trainer.train()

    model = make_model()
    model.resize_token_embeddings(len(tokenizer) - 10)
    with pytest.raises(ValueError, match="Vocabulary mismatch: the tokenizer has"):
        SFTTrainer(model=model, args=cpu_config(tmp_path / "b", loss_type="gem"), train_dataset=pc_dataset, processing_class=tokenizer)

    with pytest.raises(FileNotFoundError, match="not found"):
        args = cpu_config(tmp_path / "c", loss_type="emo", max_steps=1, emo_cost_embedding=str(tmp_path / "missing.pt"))
        SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer).train()


def test_resume_from_checkpoint_restores_the_frozen_snapshot(tmp_path, make_model, tokenizer, pc_dataset):
    common = dict(loss_type="emo", max_steps=4, save_strategy="steps", save_steps=2, per_device_train_batch_size=4)
    full = SFTTrainer(model=make_model(), args=cpu_config(tmp_path / "full", **common), train_dataset=pc_dataset, processing_class=tokenizer)
    full.train()

    # The interrupted run: stopped after step 2 (its checkpoint-2 is on disk).
    first = SFTTrainer(
        model=make_model(), args=cpu_config(tmp_path / "run", **{**common, "max_steps": 4}), train_dataset=pc_dataset, processing_class=tokenizer
    )

    class Stop(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 2:
                control.should_training_stop = True

    first.add_callback(Stop())
    first.train()
    assert (tmp_path / "run" / "checkpoint-2" / "trl_emo_cost_embedding.safetensors").exists()

    resumed = SFTTrainer(model=make_model(seed=7), args=cpu_config(tmp_path / "run", **common), train_dataset=pc_dataset, processing_class=tokenizer)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4
    assert torch.equal(resumed._objective.cost.weight, full._objective.cost.weight)
    for p, q in zip(full.model.parameters(), resumed.model.parameters()):
        assert torch.allclose(p, q, atol=1e-6)
    state = json.loads((tmp_path / "run" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4


def test_lora_trains_and_keeps_the_head_frozen(tmp_path, make_model, tokenizer, pc_dataset):
    from peft import LoraConfig

    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    args = cpu_config(tmp_path, loss_type="emo", max_steps=10, learning_rate=1e-2, save_strategy="steps", save_steps=10)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer, peft_config=peft_config)
    head_before = trainer.model.get_output_embeddings().weight.detach().clone()
    before = dataset_cross_entropy(trainer)
    trainer.train()
    assert dataset_cross_entropy(trainer) < before
    assert torch.equal(trainer.model.get_output_embeddings().weight, head_before)
    # A frozen head is its own snapshot: EMO reads it at each step, allocates no second copy of
    # it, and writes nothing next to the checkpoint.
    assert not (tmp_path / "checkpoint-10" / "trl_emo_cost_embedding.safetensors").exists()
    assert trainer._objective.head_is_snapshot and trainer._objective.cost is None


def test_a_trained_head_gets_its_own_frozen_snapshot(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="emo", max_steps=2)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    head_before = trainer.model.get_output_embeddings().weight.detach().clone()
    trainer.train()
    head = trainer.model.get_output_embeddings().weight
    assert trainer._objective.cost.weight.data_ptr() != head.data_ptr()
    assert not torch.equal(head, head_before)  # the head trained ...
    assert torch.equal(trainer._objective.cost.weight, head_before)  # ... and the snapshot did not move


def test_qlora_4bit_nf4_on_cpu(tmp_path, make_model, tokenizer, pc_dataset):
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    make_model(hidden_size=64, intermediate_size=128).save_pretrained(str(tmp_path / "base"))
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    # device_map: a CPU test on every machine (bitsandbytes would otherwise quantize onto a present GPU).
    model = AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "base"), quantization_config=quant, dtype=torch.float32, device_map={"": "cpu"}
    )
    assert getattr(model, "is_loaded_in_4bit", False)
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")
    args = cpu_config(tmp_path / "out", loss_type="gem", max_steps=8, learning_rate=1e-2)
    trainer = SFTTrainer(model=model, args=args, train_dataset=pc_dataset, processing_class=tokenizer, peft_config=peft_config)
    before = dataset_cross_entropy(trainer)
    trainer.train()
    assert dataset_cross_entropy(trainer) < before
    assert type(trainer.model.base_model.model.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"


def test_plain_trl_config_is_accepted(tmp_path, make_model, tokenizer, pc_dataset):
    from trl import SFTConfig as TRLConfig

    args = TRLConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, max_steps=1, report_to="none", gradient_checkpointing=False)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    assert trainer.args.loss_type == "nll" and hasattr(trainer.args, "gem_beta")


def _scaled_models(tokenizer):
    """Tiny models whose logits are soft-capped (Gemma-2) or scaled (Cohere, Granite) after the head."""
    from transformers import CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM, GraniteConfig, GraniteForCausalLM

    common = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id)
    return {
        "gemma2-softcap": lambda: Gemma2ForCausalLM(Gemma2Config(head_dim=8, final_logit_softcapping=3.0, **common)),
        "cohere-logit_scale": lambda: CohereForCausalLM(CohereConfig(logit_scale=0.5, **common)),
        "granite-logits_scaling": lambda: GraniteForCausalLM(GraniteConfig(logits_scaling=4.0, **common)),
    }


@pytest.mark.parametrize("arch", ["gemma2-softcap", "cohere-logit_scale", "granite-logits_scaling"])
def test_fused_respects_logit_scaling_and_softcapping(tmp_path, tokenizer, pc_dataset, arch):
    """The fused loss reproduces the model's own logits (scaled / soft-capped after the head)."""
    build = _scaled_models(tokenizer)[arch]

    def model():
        torch.manual_seed(0)
        return build().float()

    common = dict(loss_type="gem", gem_h="logsigmoid", max_steps=2)
    _, fused_losses = _run(tmp_path, model, tokenizer, pc_dataset, "fused", loss_implementation="fused", **common)
    _, ref_losses = _run(tmp_path, model, tokenizer, pc_dataset, "logits", loss_implementation="logits", **common)
    assert torch.allclose(torch.tensor(fused_losses), torch.tensor(ref_losses), rtol=1e-5)


@pytest.mark.parametrize("loss_type", ["gem", "nll"])
def test_a_deep_copy_of_the_trained_model_runs_its_own_weights(tmp_path, make_model, tokenizer, pc_dataset, loss_type):
    """E.g. a reference model made with `copy.deepcopy` after training must not silently run the original."""
    import copy

    args = cpu_config(tmp_path, loss_type=loss_type, max_steps=1)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)
    trainer.train()
    original = trainer.model
    clone = copy.deepcopy(original)
    with torch.no_grad():
        clone.get_output_embeddings().weight.zero_()
    ids = torch.tensor([tokenizer("what is 2 plus 2?")["input_ids"]])
    labels = ids.clone()
    with torch.no_grad():
        assert not clone(input_ids=ids).logits.any()
        assert original(input_ids=ids).logits.any()
        fused = clone(input_ids=ids, labels=labels, fused_lm_head=True)
        assert torch.allclose(fused.log_probs[0, :-1], torch.full_like(fused.log_probs[0, :-1], -torch.log(torch.tensor(float(len(tokenizer))))))
        if loss_type == "gem":
            out = clone(input_ids=ids, labels=labels, trl_emo_loss=True)
            assert torch.allclose(out.result.nll, torch.full_like(out.result.nll, float(torch.log(torch.tensor(float(len(tokenizer)))))))


def test_evaluate_before_training_logs_the_objective_and_cross_entropy(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="emo", max_steps=1)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, eval_dataset=pc_dataset, processing_class=tokenizer)
    metrics = trainer.evaluate()
    assert metrics["eval_cross_entropy"] > 0 and "eval_emo_distance" in metrics
    # With "mle" weighting EMO's value equals the cross-entropy (only its gradient differs).
    assert abs(metrics["eval_loss"] - metrics["eval_cross_entropy"]) < 1e-4


@pytest.mark.parametrize("path", ["fused", "logits"])
def test_label_ids_past_the_head_are_a_vocabulary_error(make_model, path):
    from trl_emo.training.objective import Objective

    model = make_model()
    vocab = model.get_output_embeddings().weight.shape[0]
    objective = Objective("gem", {"beta": 0.7, "h": "linear"})
    with pytest.raises(ValueError, match=rf"Vocabulary mismatch: a label id \({vocab + 3}\)"):
        if path == "fused":
            objective.fused(torch.randn(2, 32), model.get_output_embeddings().weight, None, torch.tensor([1, vocab + 3]))
        else:
            objective.from_logits(torch.randn(1, 3, vocab), torch.tensor([[0, 1, vocab + 3]]), model)


def test_eaft_topk_beyond_the_vocabulary_is_refused_when_the_trainer_is_built(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="eaft", eaft_topk=10_000)
    with pytest.raises(ValueError, match="eaft_topk=10000 is larger than the model's vocabulary"):
        SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)


def test_fused_kernel_settings_reach_the_loss(tmp_path, make_model, tokenizer, pc_dataset):
    args = cpu_config(tmp_path, loss_type="gem", fused_backend="torch", fused_chunk_memory_mb=1.5, fused_fp32_head_grad=True)
    objective = SFTTrainer(model=make_model(), args=args, train_dataset=pc_dataset, processing_class=tokenizer)._objective
    assert (objective.backend, objective.chunk_memory, objective.fp32_head_grad) == ("torch", int(1.5 * 2**20), True)
    with pytest.raises(ValueError, match="fused_backend must be one of auto, triton, torch"):
        cpu_config(tmp_path, loss_type="gem", fused_backend="cuda")
