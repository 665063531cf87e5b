"""Train a saved tiny model for a few steps and dump the per-step losses (used by the DDP test).

Run under `accelerate launch` (several processes) or plain `python` (one process). An optional last argument, JSON,
adds `SFTConfig` fields (`"config"`), makes the completions of uneven lengths (`"uneven": true`), evaluates on the
first `"eval_rows"` rows, trains a LoRA adapter on the modules `"lora"` names and, with `"weights": true`, trains
on conversations whose answers carry per-message weights.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(model_dir, out_path, loss_type, per_device_batch, max_steps, extra=None, last=True):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_emo import SFTConfig, SFTTrainer
    from trl_emo.training.finish import end_run

    extra = extra or {}
    # Uneven: 1 to 4 answers, so micro-batches and processes hold different numbers of target tokens.
    repeat = (lambda i: 1 + i % 4) if extra.get("uneven") else (lambda i: 1)
    rows = [{"prompt": f"what is {i} plus {i % 7}?", "completion": f" The answer is {i + i % 7}." * repeat(i)} for i in range(32)]
    if extra.get("weights"):
        # Conversations whose answers weigh 0.5 to 3.5 (per-token loss weights, a message's `weight`).
        rows = [{"prompt": [{"role": "user", "content": row["prompt"]}],
                 "completion": [{"role": "assistant", "content": row["completion"], "weight": 0.5 + i % 4}]}
                for i, row in enumerate(rows)]
    eval_rows = extra.get("eval_rows")
    config = dict(
        output_dir=os.path.join(os.path.dirname(out_path), f"run-{os.path.basename(out_path)[:-5]}-{loss_type}"),
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
    peft_config = None
    if extra.get("lora"):
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=extra["lora"], task_type="CAUSAL_LM")
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32),
        args=args,
        train_dataset=Dataset.from_list(rows),
        eval_dataset=Dataset.from_list(rows[:eval_rows]) if eval_rows else None,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=peft_config,
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
            "trainable": torch.cat([p.detach().flatten() for p in trainer.model.parameters() if p.requires_grad]).tolist(),
            "log_history": trainer.state.log_history,
        }
        with open(out_path, "w") as handle:
            json.dump(payload, handle)
    if last:
        # As the commands end: a rank that exits right after its last collective can abort (see end_run).
        end_run(trainer)
    else:
        trainer.accelerator.wait_for_everyone()


def several(model_dir, out_path, runs, per_device_batch, max_steps):
    """One launch, several trainings in turn (`runs`: name -> {"loss_type", "batch" (default: the launch's), and the
    `extra` keys of `main`}); each writes `<out_path stem>-<name>.json`."""
    names = list(runs)
    for name in names:
        spec = dict(runs[name])
        loss_type, batch = spec.pop("loss_type"), spec.pop("batch", per_device_batch)
        out = out_path.replace(".json", f"-{name}.json")
        main(model_dir, out, loss_type, batch, max_steps, spec, last=name == names[-1])


if __name__ == "__main__":
    extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else None
    if sys.argv[3] == "runs":
        several(sys.argv[1], sys.argv[2], extra, int(sys.argv[4]), int(sys.argv[5]))
    else:
        main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), extra)
