"""Students: a common starting point pre-trained with cross-entropy, then one fine-tune per loss.

This is the EMO paper's continual fine-tuning setting: every loss starts from the same
checkpoint, whose output embedding has been trained on oracle text, so EMO's frozen cost
embedding (a snapshot of that head) carries a learnt notion of token similarity rather than a
random one.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

# Placeholders the study fills in (`fill`): the path of the oracle's output embedding, and the
# oracle's mean next-token entropy over the target tokens of the regime's fine-tuning data.
ORACLE_HEAD = "{oracle_head}"
ORACLE_ENTROPY = "{oracle_entropy}"

# name → SFTConfig fields. Hyper-parameters are the library's defaults (the papers' values:
# GEM beta 0.7, TaiLr/MixCE gamma 0.8, EMO frozen cost, "mle" dynamic weighting); none is tuned here.
LOSSES: dict[str, dict] = {
    "nll": {"loss_type": "nll"},
    "gem-linear": {"loss_type": "gem", "gem_h": "linear"},
    "gem-logsigmoid": {"loss_type": "gem", "gem_h": "logsigmoid"},
    "emo": {"loss_type": "emo"},
    # GEM-linear whose beta adapts toward the oracle's own entropy (`gem_target_entropy`), from the
    # same starting beta (0.7) as gem-linear. The step is the library's default, 0.05 log-beta per nat
    # per optimizer step, which suits runs of 128-250 steps (measured, docs/oracle_study.md): with the
    # entropy gaps seen here (0.4-1 nats) beta crosses 0.7 -> 1 in about 11 steps, and tracks a
    # reachable target (3.8 nats) to within 0.02 nats after about 40 steps; the step-to-step noise of
    # the measured entropy (about 0.07 nats) moves it by 0.4 % a step. 0.2 oscillates (beta swinging
    # over 0.45-1); 0.01 has not settled by the end of the 128-step regime.
    "gem-target": {"loss_type": "gem", "gem_h": "linear", "gem_target_entropy": ORACLE_ENTROPY},
    "tailr": {"loss_type": "tailr"},
    # TaiLr with its weight floored at 0.2 (the floor of the EMO authors' script, without their mixing).
    "tailr-floor": {"loss_type": "tailr", "tailr_min_weight": 0.2},
    # The EMO authors' TaiLr baseline at the same gamma: 0.2 nll + 0.8 TaiLr(0.8, floor 0.2).
    "tailr-authors": {"loss_type": "tailr", "tailr_formula": "authors"},
    "mixce": {"loss_type": "mixce"},
    # Not in the default set:
    "ce_entropy": {"loss_type": "ce_entropy"},
    # EMO whose transport cost comes from the *oracle's* output embedding: an oracle-informed upper
    # bound on what a good cost embedding can do.
    "emo-oracle-cost": {"loss_type": "emo", "emo_cost_embedding": ORACLE_HEAD},
}
DEFAULT_LOSSES = ("nll", "gem-linear", "gem-logsigmoid", "gem-target", "emo", "tailr", "tailr-floor", "tailr-authors",
                  "mixce")


def fill(fields: dict, *, oracle_head, oracle_entropy: float) -> dict:
    """`fields` with the study's placeholders replaced by their values."""
    values = {ORACLE_HEAD: str(oracle_head), ORACLE_ENTROPY: float(oracle_entropy)}
    return {key: values.get(value, value) if isinstance(value, str) else value for key, value in fields.items()}


def sft_config(output_dir, *, seed: int, max_length: int, batch_size: int, learning_rate: float, num_epochs: float,
               logging_steps: int = 10, **loss_fields):
    """A float32 CPU `trl_emo.SFTConfig` (TRL's default bf16 is ~8x slower on CPU)."""
    from trl_emo import SFTConfig

    return SFTConfig(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        logging_steps=logging_steps,
        seed=seed,
        data_seed=seed,
        max_length=max_length,
        per_device_train_batch_size=batch_size,
        learning_rate=learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        weight_decay=0.0,
        num_train_epochs=num_epochs,
        **loss_fields,
    )


def train(model, tokenizer, sequences: torch.Tensor, output_dir, *, seed: int, batch_size: int, learning_rate: float,
          num_epochs: float, loss_fields: dict) -> dict:
    """Train `model` in place through `trl_emo.SFTTrainer` on pre-tokenized `sequences` `[n, T]`.

    Returns the trainer's logged rows, the wall time and the number of optimizer steps.
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from trl_emo import SFTTrainer

    dataset = Dataset.from_dict({"input_ids": sequences.tolist()})
    # An adaptive GEM beta is logged at every step, so that its whole path is in the log history
    # (logging does not change the training).
    logging_steps = 1 if loss_fields.get("gem_target_entropy") is not None else 10
    args = sft_config(output_dir, seed=seed, max_length=sequences.shape[1], batch_size=batch_size,
                      learning_rate=learning_rate, num_epochs=num_epochs, logging_steps=logging_steps, **loss_fields)
    start = time.perf_counter()
    # TRL warns about things that do not apply here (no chat template, pre-tokenized data).
    previous = logging.getLogger("trl").level
    logging.getLogger("trl").setLevel(logging.ERROR)
    try:
        trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
        trainer.remove_callback(PrinterCallback)  # the study prints its own progress
        trainer.train()
    finally:
        logging.getLogger("trl").setLevel(previous)
    seconds = time.perf_counter() - start
    model.eval()
    return {"log_history": trainer.state.log_history, "seconds": seconds, "steps": trainer.state.global_step}


def load(path: str | Path):
    """A float32 copy of a saved student."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
