"""The metrics trl_emo logs beside a loss are averaged as the Trainer averages its `loss` and `eval_loss`.

`objective` must be the Trainer's `loss` at every log, whatever the accumulation, the logging window or the batches'
token counts; the other metrics (cross-entropy, entropy, accuracy, a loss's own) are averaged the same way: token
means over each optimizer step, then the mean over the steps of the window. Two processes: `tests/test_ddp.py`.
"""

from __future__ import annotations

import pytest
from datasets import Dataset

from conftest import cpu_config
from trl_emo import SFTTrainer

STEP_METRICS = ("objective", "cross_entropy", "entropy", "mean_token_accuracy")


def uneven_rows(n: int):
    """Completions of 1 to 4 answers: the micro-batches of a step hold different numbers of target tokens."""
    return [{"prompt": f"what is {i} plus {i % 7}?", "completion": f" The answer is {i + i % 7}." * (1 + i % 4)} for i in range(n)]


def train(tmp_path, make_model, tokenizer, rows, **overrides):
    trainer = SFTTrainer(model=make_model(), args=cpu_config(tmp_path, **overrides), train_dataset=Dataset.from_list(rows),
                         processing_class=tokenizer)
    trainer.train()
    return trainer


CASES = {
    # 9 rows in micro-batches of 2, 2 per step: 3 steps, the last of one micro-batch of one row.
    "accumulation": dict(gradient_accumulation_steps=2),
    # 2 epochs of 2 steps (3 micro-batches, then 2), logged every 2 steps.
    "window": dict(gradient_accumulation_steps=3, logging_steps=2, num_train_epochs=2),
}


@pytest.mark.parametrize("case", [*CASES, "without_num_items_in_batch"])
def test_objective_is_the_logged_loss(tmp_path, make_model, tokenizer, case):
    overrides = {"max_steps": -1, "num_train_epochs": 1, **CASES.get(case, CASES["accumulation"])}
    args = cpu_config(tmp_path, loss_type="gem", per_device_train_batch_size=2, per_device_eval_batch_size=2,
                      eval_strategy="steps", eval_steps=2, **overrides)
    trainer = SFTTrainer(model=make_model(), args=args, train_dataset=Dataset.from_list(uneven_rows(9)),
                         eval_dataset=Dataset.from_list(uneven_rows(5)), processing_class=tokenizer)
    if case == "without_num_items_in_batch":
        # A model whose forward takes no loss kwargs gets no `num_items_in_batch`: the Trainer's `loss` is then the
        # mean of the micro-batches' own token means, and so must `objective` be.
        trainer.model_accepts_loss_kwargs = False
    trainer.train()
    logged = [row for row in trainer.state.log_history if "loss" in row]
    assert len(logged) == {"window": 2}.get(case, 3)
    for row in logged:
        assert row["objective"] == pytest.approx(row["loss"], rel=1e-5, abs=1e-6), row
    # Evaluation batches of 2 rows, the last of 1: `eval_loss` weights each batch's token mean by its rows.
    evaluations = [row for row in trainer.state.log_history if "eval_loss" in row]
    assert len(evaluations) >= 1
    for row in evaluations:
        assert row["eval_objective"] == pytest.approx(row["eval_loss"], rel=1e-5, abs=1e-6), row
    again = trainer.evaluate()  # a second evaluation starts afresh
    assert again["eval_objective"] == pytest.approx(again["eval_loss"], rel=1e-5, abs=1e-6)
    assert again["eval_objective"] == pytest.approx(evaluations[-1]["eval_objective"], rel=1e-5)


@pytest.mark.parametrize(("loss_type", "extra"), [("emo", {}), ("gem", {"gem_target_entropy": 3.0})])
def test_step_metrics_are_token_means_over_the_whole_step(tmp_path, make_model, tokenizer, loss_type, extra):
    """Batch 4 in one micro-batch, or in two micro-batches of 2 of different token counts: the same metrics at
    every log (logged every 2 steps), a loss's own (`emo_distance`) and GEM's adapted `gem_beta` included."""
    common = dict(loss_type=loss_type, max_steps=4, logging_steps=2, **extra)
    runs = [
        train(tmp_path / f"{batch}", make_model, tokenizer, uneven_rows(16), per_device_train_batch_size=batch,
              gradient_accumulation_steps=4 // batch, **common)
        for batch in (4, 2)
    ]
    names = (*STEP_METRICS, "loss", "emo_distance" if loss_type == "emo" else "gem_beta")
    big, *accumulated = ([row for row in run.state.log_history if "loss" in row] for run in runs)
    assert len(big) == 2
    for rows in accumulated:
        for row, ref in zip(rows, big, strict=True):
            for name in names:
                assert row[name] == pytest.approx(ref[name], rel=1e-5, abs=1e-6), (row["step"], name)
