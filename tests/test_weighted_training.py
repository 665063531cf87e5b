"""Per-token loss weights from the data through `trl_emo.SFTTrainer` (issue 44): a conversation's per-message
`weight` and a tokenized row's `loss_weights` laid on the tokens, carried through truncation, packing and the
collator (padding-free included), normalized by the step's sum of weights; weight 1 is no weight, bit for bit;
weight 0 is masking; gradient accumulation is exact; bad weights are one-line errors naming the field."""

from __future__ import annotations

import pytest
import torch

from conftest import cpu_config


@pytest.fixture(autouse=True)
def _in_a_temporary_folder(tmp_path, monkeypatch):
    # The trainers' output folders ("out", which a run locks) go to a temporary folder, not the checkout.
    monkeypatch.chdir(tmp_path)

WEIGHTED = [0.5, 2.0]  # the two assistant turns' weights


def conversations(n=16, weights=(0.5, 2.0), with_weights=True):
    rows = []
    for i in range(n):
        first, second = ({"weight": weights[0]}, {"weight": weights[1]}) if with_weights else ({}, {})
        rows.append({"messages": [
            {"role": "user", "content": f"what is {i} plus {i % 7}?"},
            {"role": "assistant", "content": f"The answer is {i + i % 7}." * (1 + i % 3), **first},
            {"role": "user", "content": "are you sure?"},
            {"role": "assistant", "content": f"Yes, {i + i % 7}.", **second},
        ]})
    return rows


def dataset(rows):
    from datasets import Dataset

    return Dataset.from_list(rows)


def prepared(tokenizer, rows, **config):
    from trl_emo.training.trl_compat import prepare_sft_examples

    config.setdefault("assistant_only_loss", "messages" in rows[0])
    args = cpu_config("out", **config)
    return prepare_sft_examples(dataset(rows), tokenizer, args, len(rows))


def trained(make_model, tokenizer, rows, steps=2, loss_type="gem", **config):
    from trl_emo import SFTTrainer

    config = {"assistant_only_loss": True, "max_steps": steps, "per_device_train_batch_size": 4, **config}
    trainer = SFTTrainer(model=make_model(), args=cpu_config(config.pop("output_dir", "out"), loss_type=loss_type,
                                                             **config),
                         train_dataset=dataset(rows), processing_class=tokenizer)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    return trainer, losses, [p.detach().clone() for p in trainer.model.parameters()]


def test_message_weights_fall_on_their_messages_tokens(tokenizer):
    rows = conversations(2)
    row = prepared(tokenizer, rows)[1]
    assert len(row["loss_weights"]) == len(row["input_ids"]) == len(row["labels"])
    trained_tokens = [(tokenizer.decode([t]), w) for t, label, w in zip(row["input_ids"], row["labels"], row["loss_weights"])
                      if label != -100]
    # Each assistant turn's generation (its text and end of turn) carries its message's weight.
    text = {w: "".join(tok for tok, weight in trained_tokens if weight == w) for w in WEIGHTED}
    assert text[0.5] == "The answer is 2.The answer is 2.<|end|>" and text[2.0] == "Yes, 2.<|end|>"
    assert {w for _, w in trained_tokens} == set(WEIGHTED)


def test_bad_weights_are_one_line_errors_naming_the_field(tokenizer):
    from trl_emo.data import DataError

    cases = [
        (conversations(2, weights=(-1.0, 1.0)), r"messages\[1\]\.weight must be a non-negative number"),
        (conversations(2, weights=("high", "low")), r"messages\[1\]\.weight must be .* got .high."),
        ([{"input_ids": [1, 2, 3], "loss_weights": [1.0, 2.0]}], r"loss_weights has 2 weights but the row has 3"),
        ([{"input_ids": [1, 2, 3], "loss_weights": [1.0, float("inf"), 1.0]}], r"loss_weights\[1\] must be"),
    ]
    for rows, match in cases:
        with pytest.raises((DataError, ValueError), match=match) as info:
            prepared(tokenizer, rows)
        assert "\n" not in str(info.value)
    # The Alpaca prompt (a base model without a chat template) folds the turns: weights are refused, not dropped.
    from trl_emo.data import format_example

    with pytest.raises(DataError, match="per-message weights, which need the chat template"):
        format_example(conversations(1)[0], "messages", "alpaca")
    assert "prompt" in format_example(conversations(1, weights=(1, 1.0))[0], "messages", "alpaca")


def test_packing_and_padding_free_carry_the_weights_beside_the_labels(tokenizer):
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    from trl_emo.training.trl_compat import weighted_collator

    rows = conversations(6)
    plain = {tuple(r["input_ids"]): (r["labels"], r["loss_weights"]) for r in prepared(tokenizer, rows)}
    packed = prepared(tokenizer, rows, packing=True, max_length=128)
    assert len(packed) < len(rows)
    collator = weighted_collator(DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True))
    batch = collator([dict(r) for r in packed])
    assert batch["loss_weights"].shape == batch["labels"].shape
    # Every example, cut out of the packed rows, has its own labels and weights.
    seen = 0
    for row in packed:
        start = 0
        for length in row["seq_lengths"]:
            ids = tuple(row["input_ids"][start:start + length])
            assert (row["labels"][start:start + length], row["loss_weights"][start:start + length]) == plain[ids]
            start, seen = start + length, seen + 1
    assert seen == len(rows)
    labels, weights = batch["labels"][0], batch["loss_weights"][0]
    assert set(weights[labels != -100].tolist()) == set(WEIGHTED)
    # Padded batches: zero weights past each example.
    padded = weighted_collator(DataCollatorForLanguageModeling(pad_token_id=0, pad_to_multiple_of=8))(
        [dict(r) for r in prepared(tokenizer, rows[:2])])
    assert padded["loss_weights"].shape == padded["labels"].shape and padded["labels"].shape[1] % 8 == 0
    assert bool((padded["loss_weights"][padded["attention_mask"] == 0] == 0).all())


@pytest.mark.parametrize("loss_type", ["gem", "nll"])
def test_weight_one_everywhere_trains_bit_for_bit_as_without_weights(make_model, tokenizer, loss_type):
    plain = trained(make_model, tokenizer, conversations(8, with_weights=False), loss_type=loss_type)
    ones = trained(make_model, tokenizer, conversations(8, weights=(1, 1.0)), loss_type=loss_type)
    assert ones[0]._weighted_data and not plain[0]._weighted_data
    assert ones[1] == plain[1]
    assert all(torch.equal(a, b) for a, b in zip(ones[2], plain[2]))


def test_zero_weight_on_a_message_is_masking_it(make_model, tokenizer):
    """Weight 0 on the first answer trains exactly what a prompt/completion row with that answer in its prompt
    trains (TRL masks the prompt)."""
    weighted = conversations(8, weights=(0, 1))
    as_prompt = [{"prompt": r["messages"][:3], "completion": r["messages"][3:]} for r in conversations(8, with_weights=False)]
    got = trained(make_model, tokenizer, weighted)
    want = trained(make_model, tokenizer, as_prompt)
    assert got[1] == want[1]
    assert all(torch.equal(a, b) for a, b in zip(got[2], want[2]))


def test_gradient_accumulation_with_weights_is_exact(make_model, tokenizer):
    """The step's normalizer is its sum of weights: two micro-batches of 2 equal one batch of 4."""
    rows = conversations(8, weights=(0.25, 3.0))
    for i, row in enumerate(rows):  # weights that differ between examples
        row["messages"][3]["weight"] = 0.5 + i
    one = trained(make_model, tokenizer, rows, steps=1, per_device_train_batch_size=4)
    accumulated = trained(make_model, tokenizer, rows, steps=1, per_device_train_batch_size=2,
                          gradient_accumulation_steps=2)
    assert accumulated[1] == pytest.approx(one[1], rel=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(accumulated[2], one[2]))


def test_tokenized_loss_weights_weigh_each_token(make_model, tokenizer):
    """`loss_weights` of tokenized rows: the trainer's loss is the framework-free loss with the same weights."""
    from trl_emo import SFTTrainer
    from trl_emo.losses import fused_lm_loss

    g = torch.Generator().manual_seed(0)
    rows = []
    for i in range(4):
        ids = tokenizer(f"Question {i}: the colour red and the animal owl.")["input_ids"]
        rows.append({"input_ids": ids, "loss_weights": (2 * torch.rand(len(ids), generator=g)).tolist()})
    trainer = SFTTrainer(model=make_model(), args=cpu_config("out", loss_type="gem", per_device_train_batch_size=4),
                         train_dataset=dataset(rows), processing_class=tokenizer)
    batch = trainer.data_collator([trainer.train_dataset[i] for i in range(4)])
    assert "loss_weights" in batch
    model = trainer.model
    loss = trainer.compute_loss(model, dict(batch))
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    want = fused_lm_loss(hidden, model.lm_head.weight, batch["labels"], "gem", weights=batch["loss_weights"])
    assert torch.allclose(loss, want, rtol=1e-6)


def test_weights_on_some_messages_of_a_json_file_are_found(tmp_path, tokenizer):
    """A JSON Lines file whose turns differ in keys (a `weight` on some) loads as JSON values: the weights are still
    found, the `messages` schema accepts the column, and the trained tokens carry them."""
    import json

    from datasets import load_dataset

    from trl_emo.data.schemas import MESSAGES, feature_kind
    from trl_emo.data.token_weights import carries_weights

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in conversations(3)))
    data = load_dataset("json", data_files=str(path), split="train")
    assert feature_kind(data.features["messages"]) == MESSAGES and carries_weights(data)
    unweighted = tmp_path / "plain.jsonl"
    unweighted.write_text("".join(json.dumps(row) + "\n" for row in conversations(3, with_weights=False)))
    assert not carries_weights(load_dataset("json", data_files=str(unweighted), split="train"))
    row = prepared(tokenizer, [dict(r) for r in data])[0]
    assert {w for w, label in zip(row["loss_weights"], row["labels"]) if label != -100} == set(WEIGHTED)


def test_weighted_evaluation_with_trls_nll(make_model, tokenizer):
    """TRL's `nll` with weights evaluates weighted too (`eval_objective` is `eval_loss`); a weighted dataset handed to
    `evaluate()` of a trainer built without weights is refused in one line instead of evaluated unweighted."""
    from trl_emo import SFTTrainer

    trainer = SFTTrainer(model=make_model(), args=cpu_config("out", loss_type="nll", assistant_only_loss=True,
                                                              per_device_eval_batch_size=4),
                         train_dataset=dataset(conversations(8)), eval_dataset=dataset(conversations(6)),
                         processing_class=tokenizer)
    metrics = trainer.evaluate()
    assert trainer._trl_weights and metrics["eval_objective"] == pytest.approx(metrics["eval_loss"], rel=1e-6)
    plain = SFTTrainer(model=make_model(), args=cpu_config("out", loss_type="gem", assistant_only_loss=True),
                       train_dataset=dataset(conversations(8, with_weights=False)), processing_class=tokenizer)
    with pytest.raises(ValueError, match="has per-token loss weights but the trainer was built on data without them"):
        plain.evaluate(dataset(conversations(4)))
