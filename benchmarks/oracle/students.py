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

# name → SFTConfig fields. Hyper-parameters are the library's defaults (the papers' values:
# GEM beta 0.7, TaiLr/MixCE gamma 0.8, EMO frozen cost, "mle" dynamic weighting); none is tuned here.
LOSSES: dict[str, dict] = {
    "nll": {"loss_type": "nll"},
    "gem-linear": {"loss_type": "gem", "gem_h": "linear"},
    "gem-logsigmoid": {"loss_type": "gem", "gem_h": "logsigmoid"},
    "emo": {"loss_type": "emo"},
    "tailr": {"loss_type": "tailr"},
    "mixce": {"loss_type": "mixce"},
    # Not in the default set:
    "ce_entropy": {"loss_type": "ce_entropy"},
    # TaiLr with its weight floored at 0.2, as the EMO authors' script does (`tailr_min_weight`).
    "tailr-floor": {"loss_type": "tailr", "tailr_min_weight": 0.2},
    # EMO whose transport cost comes from the *oracle's* output embedding: an oracle-informed upper
    # bound on what a good cost embedding can do (the path is filled in by the study).
    "emo-oracle-cost": {"loss_type": "emo", "emo_cost_embedding": "{oracle_head}"},
}
DEFAULT_LOSSES = ("nll", "gem-linear", "gem-logsigmoid", "emo", "tailr", "mixce")


def sft_config(output_dir, *, seed: int, max_length: int, batch_size: int, learning_rate: float, num_epochs: float,
               **loss_fields):
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
        logging_steps=10,
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

    Returns the trainer's logged rows and the wall time.
    """
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from trl_emo import SFTTrainer

    dataset = Dataset.from_dict({"input_ids": sequences.tolist()})
    args = sft_config(output_dir, seed=seed, max_length=sequences.shape[1], batch_size=batch_size,
                      learning_rate=learning_rate, num_epochs=num_epochs, **loss_fields)
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
