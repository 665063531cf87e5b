"""A LoRA adapter on the output layer, through the fused path (issue 44): gradients equal the logits path's (PEFT's
own forward), TRL's own `nll` included; a `modules_to_save` head trains as a plain head; DoRA on the head is refused in
one line; QLoRA (a 4-bit base, bitsandbytes' CPU backend) with an adapter on the head. Every loss's fused arithmetic
with a low-rank head term is checked against the logits path in tests/test_token_weights.py."""

from __future__ import annotations

import pytest
import torch

from conftest import conversation_rows, cpu_config


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    # The trainers' output folders ("out", which a run locks) go to a temporary folder, not the checkout.
    monkeypatch.chdir(tmp_path)


def lora_config(**overrides):
    from peft import LoraConfig

    values = dict(r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM")
    values.update(overrides)
    return LoraConfig(**values)


def weighted_rows(n=8):
    rows = conversation_rows(n)
    for i, row in enumerate(rows):
        row["messages"][1]["weight"] = 0.5 + i % 3
    return rows


def build(model, tokenizer, rows, loss_type, peft_config, **config):
    from datasets import Dataset

    from trl_emo import SFTTrainer

    args = cpu_config("out", loss_type=loss_type, per_device_train_batch_size=4, **config)
    return SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                      peft_config=peft_config)


def gradients(trainer) -> dict:
    """The trainable parameters' gradients of one batch, fused and from the logits (PEFT's own forward)."""
    batch = trainer._prepare_inputs(trainer.data_collator([trainer.train_dataset[i] for i in range(4)]))
    trainer.model.train()
    out = {}
    for implementation in ("fused", "logits"):
        trainer.args.loss_implementation = implementation
        trainer.model.zero_grad()
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        trainer._train_sums.pop()  # each implementation logs its own metrics
        out[implementation] = (loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()
                                               if p.requires_grad})
    return out


def start_adapters_away_from_zero(model):
    # `lora_B` starts at zero, which would leave `lora_A`'s gradient zero and hide a wrong one.
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.2 * torch.randn(p.shape, generator=g))


def assert_same(grads, rtol=1e-5):
    (loss, fused), (want_loss, logits) = grads["fused"], grads["logits"]
    assert torch.allclose(loss, want_loss, rtol=rtol)
    assert fused.keys() == logits.keys()
    head = [n for n in fused if "lm_head" in n]
    assert head and all(float(fused[n].abs().max()) > 0 for n in head)
    for name in fused:
        scale = float(logits[name].abs().max()) or 1.0
        assert float((fused[name] - logits[name]).abs().max()) <= rtol * scale, name


@pytest.mark.parametrize(
    ("loss_type", "tied", "rows", "config"),
    [
        ("gem", False, conversation_rows, {}),
        ("nll", True, weighted_rows, {}),  # TRL's own loss, sent through trl_emo's nll; a tied head; weights
        ("eksft", False, weighted_rows, {"eksft_formula": "authors", "eksft_ratio": 0.3}),  # label rows, reference
    ],
    ids=["gem", "nll-tied-weighted", "eksft-authors-weighted"],
)
def test_a_lora_head_gets_the_gradients_of_the_logits_path(make_model, tokenizer, loss_type, tied, rows, config):
    trainer = build(make_model(tie_word_embeddings=tied), tokenizer, rows(), loss_type, lora_config(), **config)
    assert trainer._objective is not None and not trainer._trl_weights
    start_adapters_away_from_zero(trainer.model)
    assert_same(gradients(trainer))


def test_a_lora_head_trains_and_its_base_stays_frozen(make_model, tokenizer):
    trainer = build(make_model(), tokenizer, conversation_rows(16), "gem", lora_config(lora_dropout=0.1),
                    max_steps=4, learning_rate=1e-2)
    head = trainer.model.base_model.model.lm_head
    base, lora_b = head.base_layer.weight.detach().clone(), head.lora_B["default"].weight.detach().clone()
    trainer.train()
    assert torch.equal(head.base_layer.weight, base)
    assert not torch.equal(head.lora_B["default"].weight, lora_b)
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert losses[-1] < losses[0]


def test_modules_to_save_head_trains_as_a_plain_head(make_model, tokenizer):
    trainer = build(make_model(), tokenizer, conversation_rows(8), "emo",
                    lora_config(target_modules=["q_proj"], modules_to_save=["lm_head"]))
    grads = gradients(trainer)
    assert any("modules_to_save" in n and "lm_head" in n for n in grads["fused"][1])
    assert_same(grads)


@pytest.mark.parametrize(("loss_type", "dora", "match"), [
    ("gem", True, "DoRA on lm_head"),
    ("psft", False, "LoRA adapter on lm_head with a lagged old policy"),  # the lagged copy's head has its own adapter
])
def test_what_the_fused_path_cannot_compute_is_a_one_line_error(make_model, tokenizer, loss_type, dora, match):
    with pytest.raises(ValueError, match=match) as info:
        build(make_model(), tokenizer, conversation_rows(8), loss_type, lora_config(use_dora=dora))
    assert "\n" not in str(info.value) and "loss_implementation='logits'" in str(info.value)


def test_qlora_with_an_adapter_on_the_head(tmp_path, make_model, tokenizer):
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    make_model(hidden_size=64, intermediate_size=128).save_pretrained(str(tmp_path / "base"))
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path / "base"), quantization_config=quant, dtype=torch.float32,
                                                 device_map={"": "cpu"})
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    trainer = build(model, tokenizer, weighted_rows(16), "gem", lora_config(r=8, lora_alpha=16, target_modules=targets),
                    max_steps=3, learning_rate=1e-2)
    layers = trainer.model.base_model.model
    # bitsandbytes leaves the output layer unquantized: the adapter's base head is a plain linear layer.
    assert type(layers.model.layers[0].self_attn.q_proj.base_layer).__name__ == "Linear4bit"
    assert type(layers.lm_head.base_layer) is torch.nn.Linear
    start_adapters_away_from_zero(trainer.model)
    # TRL keeps QLoRA's adapters in bf16: PEFT's forward rounds their `[tokens, V]` product to bf16, which the fused
    # path forms in float32, hence the bound.
    assert layers.lm_head.lora_B["default"].weight.dtype == torch.bfloat16
    assert_same(gradients(trainer), rtol=1e-2)
    trainer.args.loss_implementation = "fused"
    trainer.train()
    assert all(torch.isfinite(torch.tensor(row["loss"])) for row in trainer.state.log_history if "loss" in row)


def test_seds_calibration_reads_the_adapted_head(make_model, tokenizer):
    """SED's threshold, calibrated through the patched forward, sees the head with its LoRA adapter (merged into a
    copy of the head for the probe): the same masses as PEFT's own merged model."""
    import copy

    from trl_emo.losses.sed import threshold_from_masses
    from trl_emo.training import sed_threshold

    trainer = build(make_model(), tokenizer, conversation_rows(8), "sed", lora_config(), sed_threshold=0.9)
    start_adapters_away_from_zero(trainer.model)
    sequences = [trainer.train_dataset[i]["input_ids"] for i in range(3)]
    got = sed_threshold.calibrate(trainer.model, trainer._base_model(), sequences, 3, 0.7, "cpu")
    merged = copy.deepcopy(trainer.model).merge_and_unload().eval()
    with torch.no_grad():
        masses = [merged(input_ids=torch.tensor([ids])).logits[0].float().softmax(-1).topk(3, dim=-1).values.sum(-1)
                  for ids in sequences]
    assert got == pytest.approx(threshold_from_masses(torch.cat(masses), 0.7), rel=1e-5)
