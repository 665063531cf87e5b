"""Train a saved tiny model with several losses in turn and save what the DeepSpeed tests compare.

Run under `accelerate launch` with DeepSpeed (two processes) or with plain `python` (the one-process
reference). Arguments: model folder, output `.pt` file (written by rank 0), a JSON mapping run
name -> run spec (`SFTConfig` fields, plus `"lora": [target modules]` for a LoRA adapter and
`"checkpoint": true` to save one at the last step, `"per_process_scope": true` for a loss that selects within each
micro-batch of each process: the one-process run then accumulates the same micro-batches), the per-device batch size. Every run: 2 optimizer
steps of gradient accumulation 2, no clipping, so the full gradients before each step and the final
full weights can be compared across set-ups. A run whose trainer cannot be built records the error.
"""

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def deepspeed_engine(trainer):
    wrapped = getattr(trainer.accelerator, "deepspeed_engine_wrapped", None)
    return None if wrapped is None else wrapped.engine


def full_parameters(model):
    """Every parameter whole, on every rank (ZeRO-3 keeps only a shard outside a gather)."""
    import torch
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    if is_deepspeed_zero3_enabled():
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(model.parameters())):
            return {name: p.detach().clone() for name, p in model.named_parameters()}
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def main(model_dir, out_path, runs, per_device_batch):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

    from trl_emo import SFTConfig, SFTTrainer

    rows = [{"prompt": f"what is {i} plus {i % 7}?", "completion": f" The answer is {i + i % 7}."} for i in range(32)]
    results = {}
    for name, spec in runs.items():
        spec = dict(spec)
        lora_targets = spec.pop("lora", None)
        checkpoint = spec.pop("checkpoint", False)
        # A loss whose terms depend on its micro-batch (EKSFT's selection): the one-process reference accumulates the
        # two processes' micro-batches (half the rows, twice the steps) instead of joining them.
        batch, accumulation = per_device_batch, 2
        if spec.pop("per_process_scope", False) and int(os.environ.get("WORLD_SIZE", "1")) == 1:
            batch, accumulation = per_device_batch // 2, 4
        output_dir = os.path.join(os.path.dirname(out_path), f"run-{name}")
        values = dict(
            output_dir=output_dir,
            use_cpu=True,
            bf16=False,
            max_steps=2,
            per_device_train_batch_size=batch,
            gradient_accumulation_steps=accumulation,
            max_grad_norm=0.0,  # no clipping: the gradients are compared as computed
            learning_rate=3e-3,
            logging_steps=1,
            report_to="none",
            gradient_checkpointing=False,
            save_strategy="steps" if checkpoint else "no",
            save_steps=2,
            save_only_model=True,
            max_length=64,
            seed=0,
            disable_tqdm=True,
        )
        values.update(spec)  # a run may change any of these (EKSFT: its learning rate)
        args = SFTConfig(**values)
        # After the config: under ZeRO-3 (zero3_init_flag) the model is partitioned as it loads.
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        peft_config = None
        if lora_targets:
            from peft import LoraConfig

            peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=lora_targets, task_type="CAUSAL_LM")
        try:
            trainer = SFTTrainer(
                model=model,
                args=args,
                train_dataset=Dataset.from_list(rows),
                processing_class=AutoTokenizer.from_pretrained(model_dir),
                peft_config=peft_config,
            )
        except ValueError as exc:  # a combination that cannot work: every rank must say so, none may hang
            results[name] = {"error": str(exc)}
            continue
        record = {"gradients": [], "head_shapes": [], "whole_parameters": []}

        def snapshot_gradients(trainer=trainer, record=record):
            if deepspeed_engine(trainer) is not None:
                from deepspeed.utils import safe_get_full_grad as full_grad  # a collective under ZeRO
            else:
                full_grad = lambda p: p.grad  # noqa: E731
            # Outside any gather: under ZeRO-3 every parameter is an empty shard here.
            record["head_shapes"].append(tuple(trainer.model.get_output_embeddings().weight.shape))
            record["whole_parameters"].append(sum(p.numel() > 0 for p in trainer.model.parameters()))
            record["gradients"].append(
                {n: full_grad(p).detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
            )

        class RecordGradients(TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                engine = deepspeed_engine(trainer)
                if engine is not None:
                    # DeepSpeed steps inside `accelerator.backward`, before `on_pre_optimizer_step`.
                    step = engine.step

                    def recording_step(*a, **k):
                        snapshot_gradients()
                        return step(*a, **k)

                    engine.step = recording_step

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                if deepspeed_engine(trainer) is None:
                    snapshot_gradients()

        trainer.add_callback(RecordGradients())
        trainer.train()
        record["weights"] = full_parameters(trainer.model)
        record["losses"] = [row["loss"] for row in trainer.state.log_history if "loss" in row]
        record["cross_entropy"] = [row.get("cross_entropy") for row in trainer.state.log_history if "loss" in row]
        record["num_processes"] = trainer.accelerator.num_processes
        record["zero_stage"] = trainer.accelerator.state.deepspeed_plugin.zero_stage if deepspeed_engine(trainer) else 0
        trainer.accelerator.wait_for_everyone()
        snapshot_file = os.path.join(output_dir, "checkpoint-2", "trl_emo_cost_embedding.safetensors")
        if os.path.isfile(snapshot_file):
            from safetensors.torch import load_file

            record["cost_snapshot"] = load_file(snapshot_file)["cost_embedding"]
        results[name] = record
        del trainer, model
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(results, out_path)
    if torch.distributed.is_initialized():
        # As trl_emo.training.finish.end_run ends the commands: without it a rank can abort at exit ("terminate called
        # without an active exception").
        from trl_emo.training.finish import final_barrier

        final_barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4]))
