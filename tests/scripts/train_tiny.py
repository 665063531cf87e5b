"""Train a saved tiny model for a few steps and dump the per-step losses (used by the DDP test).

Run under `accelerate launch` (several processes) or plain `python` (one process). An optional last argument, JSON,
adds `SFTConfig` fields (`"config"`), makes the completions of uneven lengths (`"uneven": true`) and evaluates on the
first `"eval_rows"` rows.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(model_dir, out_path, loss_type, per_device_batch, max_steps, extra=None):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_emo import SFTConfig, SFTTrainer
    from trl_emo.training.finish import end_run

    extra = extra or {}
    # Uneven: 1 to 4 answers, so micro-batches and processes hold different numbers of target tokens.
    repeat = (lambda i: 1 + i % 4) if extra.get("uneven") else (lambda i: 1)
    rows = [{"prompt": f"what is {i} plus {i % 7}?", "completion": f" The answer is {i + i % 7}." * repeat(i)} for i in range(32)]
    eval_rows = extra.get("eval_rows")
    config = dict(
        output_dir=os.path.join(os.path.dirname(out_path), f"run-{loss_type}-{per_device_batch}"),
        loss_type=loss_type,
        use_cpu=True,
        bf16=False,
        max_steps=max_steps,
        per_device_train_batch_size=per_device_batch,
        learning_rate=3e-3,
        logging_steps=1,
        report_to="none",
        gradient_checkpointing=False,
        save_strategy="no",
        max_length=64,
        seed=0,
        disable_tqdm=True,
    )
    config.update(extra.get("config", {}))
    args = SFTConfig(**config)
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        args=args,
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:eval_rows]) if eval_rows else None,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.train()
    if trainer.accelerator.is_main_process:
        losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        weights = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        payload = {
            "losses": losses,
            "weights": weights.tolist()[:5000],
            "num_processes": trainer.accelerator.num_processes,
            "cross_entropy": [row.get("cross_entropy") for row in trainer.state.log_history if "loss" in row],
            "log_history": trainer.state.log_history,
        }
        with open(out_path, "w") as handle:
            json.dump(payload, handle)
    # As the commands end: a rank that exits right after its last collective can abort (see end_run).
    end_run(trainer)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), *(json.loads(a) for a in sys.argv[6:7]))
