"""End-to-end trainer step time and peak memory: TRL's nll against trl_emo's losses, each in its own process.

    python benchmarks/step_bench.py --shape llama-3.2-1b --batch 4 --seq 2048               # full fine-tuning, bf16
    python benchmarks/step_bench.py --shape llama-3.2-1b --liger on off                      # with and without Liger
    python benchmarks/step_bench.py --shape llama-3-8b --batch 2 --seq 2048 --qlora on       # QLoRA (nf4, LoRA r=16)
    python benchmarks/step_bench.py --shape tiny --device cpu --steps 3 --warmup 1           # a CPU smoke run
    OMP_NUM_THREADS=1 python benchmarks/step_bench.py --shape tiny --device cpu --clock cpu  # on a shared CPU machine

The model is randomly initialised from the named shape (no download); the data are random token
sequences of exactly `--seq` tokens, every token trained. Every variant is `trl_emo.SFTTrainer`
with one `loss_type` (`nll` is TRL's own loss, untouched), trained for `--warmup + --steps` optimizer
steps; the step time is the median of the last `--steps` (CUDA synchronised at both ends of each
step) and memory is `torch.cuda.max_memory_allocated()` over the run (peak RSS on the CPU).

QLoRA: 4-bit nf4 with double quantisation, bf16 compute, LoRA r=16 on all linear layers, gradient
checkpointing, the model saved once to `--cache` (random weights) so that bitsandbytes quantises it
on load, as in a real run. `benchmarks/gpu_check.py`'s `qlora` stage runs every loss on one model per shape
instead (`quantized_model`, `train_variant`): the linear layers quantized in place on the GPU, no multi-GB save and
reload, the same adapter restored before each variant.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

SHAPES = {
    # Llama-3.2-1B: tied head, 128k vocabulary.
    "llama-3.2-1b": dict(vocab_size=128_256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=True),
    "llama-3-8b": dict(vocab_size=128_256, hidden_size=4096, intermediate_size=14_336, num_hidden_layers=32,
                       num_attention_heads=32, num_key_value_heads=8, tie_word_embeddings=False),
    "tiny": dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=False),
}
VARIANTS = {
    "nll": {"loss_type": "nll"},
    "gem": {"loss_type": "gem"},
    "gem_ls": {"loss_type": "gem", "gem_h": "logsigmoid"},
    "emo": {"loss_type": "emo"},
    "sed": {"loss_type": "sed"},
    "eksft": {"loss_type": "eksft"},
    # At their authors' defaults: PSFT's old policy every 8 steps, CurioSFT's teacher mixed every 5 (each timed step
    # after the first runs the old policy's / teacher's forward: the first step of a window, which needs none, is in the
    # warm-up with `--warmup 1`).
    "psft": {"loss_type": "psft"},
    "curio_sft": {"loss_type": "curio_sft"},
    "prob": {"loss_type": "prob"},
    "iw_sft": {"loss_type": "iw_sft"},
    "gift": {"loss_type": "gift"},
    "slm": {"loss_type": "slm"},
    "emo_live": {"loss_type": "emo", "emo_cost_embedding": "lm_head"},
    "gem_logits": {"loss_type": "gem", "loss_implementation": "logits"},
    "emo_logits": {"loss_type": "emo", "loss_implementation": "logits"},
}
# SED calibrates its threshold on the starting model before the first step: on a few rows here (a one-off cost).
_LOSS_EXTRAS = {"sed": {"sed_threshold_samples": 4}}


def variant_config(variant: str) -> dict:
    """The `SFTConfig` fields of a variant: a named one above, or any registered loss at its defaults."""
    if variant in VARIANTS:
        config = dict(VARIANTS[variant])
    else:
        from trl_emo.losses import list_losses

        if variant not in list_losses():
            raise ValueError(f"unknown variant {variant!r}: one of {', '.join(sorted(VARIANTS))} or a loss_type")
        config = {"loss_type": variant}
    return {**_LOSS_EXTRAS.get(config["loss_type"], {}), **config}


def lora_config():
    """QLoRA's adapter: r=16, alpha 32, on every linear layer (PEFT's "all-linear": the head excluded)."""
    from peft import LoraConfig

    return LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")


def _config(shape: str):
    from transformers import LlamaConfig

    return LlamaConfig(**SHAPES[shape], max_position_embeddings=8192, bos_token_id=1, eos_token_id=2, pad_token_id=0)


def _model_folder(shape: str, cache: Path) -> Path:
    """A saved random-init model of `shape` (QLoRA needs a folder to quantise on load)."""
    import torch
    from transformers import AutoModelForCausalLM

    folder = cache / f"random-{shape}"
    if not (folder / "config.json").exists():
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(_config(shape), dtype=torch.bfloat16)
        model.save_pretrained(str(folder))
        del model
    return folder


def quantized_model(shape: str, device: str):
    """A random model of `shape` on `device` with every linear layer but the head in 4-bit nf4 with double
    quantization and the compute dtype (bf16 on CUDA, float32 on the CPU): the `bitsandbytes.nn.Linear4bit` layers
    transformers' 4-bit loader builds, the embeddings and the head left unquantized as it leaves them, the weights
    quantized in place on the device. No multi-GB save and reload of random weights (minutes for the 8B shape)."""
    import bitsandbytes as bnb
    import torch
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(_config(shape), dtype=dtype)
    head = model.get_output_embeddings()
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            layer = bnb.nn.Linear4bit(child.in_features, child.out_features, bias=child.bias is not None,
                                      compute_dtype=dtype, compress_statistics=True, quant_type="nf4", device="meta")
            layer.weight = bnb.nn.Params4bit(child.weight.data, requires_grad=False, compress_statistics=True,
                                             quant_type="nf4", module=layer).to(device)
            if child.bias is not None:
                layer.bias = child.bias
            setattr(parent, name, layer)
    # What the 4-bit loader marks: TRL and PEFT read `is_loaded_in_4bit`; the Trainer leaves such a model in place.
    model.is_loaded_in_4bit = True
    model.quantization_method = "bitsandbytes"
    if device == "cuda":
        torch.cuda.empty_cache()
    return model


def worker(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    cuda = args.device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    torch.manual_seed(0)
    peft_config = None
    if args.qlora:
        from transformers import BitsAndBytesConfig

        quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                                   bnb_4bit_compute_dtype=dtype)
        model = AutoModelForCausalLM.from_pretrained(str(_model_folder(args.shape, Path(args.cache))), quantization_config=quant,
                                                     dtype=dtype, device_map={"": 0} if cuda else {"": "cpu"})
        peft_config = lora_config()
    else:
        # Built on the device: a random 1B-parameter init on the host took most of a variant's minute on a lent GPU.
        with torch.device("cuda" if cuda else "cpu"):
            model = AutoModelForCausalLM.from_config(_config(args.shape), dtype=dtype)
    return train_variant(model, args.variant, args.shape, args.batch, args.seq, args.steps, args.warmup, args.device,
                         liger=args.liger, qlora=args.qlora, peft_config=peft_config,
                         clock=getattr(args, "clock", "wall"), fastest=getattr(args, "fastest", False))


def train_variant(model, variant: str, shape: str, batch: int, seq: int, steps: int, warmup: int, device: str,
                  liger: bool = False, qlora: bool = False, peft_config=None, clock: str = "wall",
                  fastest: bool = False) -> dict:
    """`warmup + steps` optimizer steps of `trl_emo.SFTTrainer` with `variant` on `model` (a PEFT model, or a plain one
    with `peft_config`); the median step time of the last `steps`, the peak memory (allocated and reserved on CUDA, and
    the device memory outside PyTorch's allocator after the run), the first and last logged losses, the memory the
    loss keeps beside the model."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback

    from trl_emo import SFTConfig, SFTTrainer

    cuda = device == "cuda"
    config = _config(shape)
    total_steps = warmup + steps
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, config.vocab_size, (batch * total_steps, seq), generator=gen)
    dataset = Dataset.from_dict({"input_ids": ids.tolist()})

    # `--clock cpu`: the process's CPU time, which other jobs on a shared machine do not lengthen (with one thread).
    clock = time.process_time if clock == "cpu" else time.perf_counter

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.times, self.start = [], None

        def on_step_begin(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            self.start = clock()

        def on_step_end(self, *_, **__):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(clock() - self.start)

    timer = StepTimer()
    training_args = SFTConfig(
        output_dir=tempfile.mkdtemp(prefix="step_bench_"),
        **variant_config(variant),
        use_liger_kernel=liger,
        bf16=cuda,
        use_cpu=not cuda,
        per_device_train_batch_size=batch,
        max_steps=total_steps,
        max_length=seq,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        gradient_checkpointing=qlora,
        dataloader_num_workers=0,
        disable_tqdm=True,
        seed=0,
    )
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=dataset, peft_config=peft_config,
                         callbacks=[timer], processing_class=_tokenizer_stub(config))
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    timed = timer.times[warmup:]
    # The fastest step (`--fastest`) on a machine shared with other work, whose interference only ever slows a step down.
    result = {"variant": variant, "liger": liger, "qlora": qlora,
              "step_seconds": min(timed) if fastest else statistics.median(timed), "steps_timed": len(timed)}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        result.update(peak_bytes=int(torch.cuda.max_memory_allocated()),
                      peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
                      outside_allocator_bytes=int(total - free - torch.cuda.memory_reserved()))
    else:
        import resource

        result["peak_bytes"] = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    result.update(first_loss=losses[0] if losses else None, last_loss=losses[-1] if losses else None,
                  state_bytes=_state_bytes(trainer))
    return result


def _state_bytes(trainer) -> int:
    """What the loss keeps beside the model: a reference model's weights (a frozen copy; 0 with the adapters off), PSFT's
    old policy or CurioSFT's teacher (the trainable tensors: the adapters under LoRA)."""
    if trainer._lagged is not None:
        return trainer._lagged.nbytes
    model = getattr(trainer._reference, "model", None)
    return sum(p.numel() * p.element_size() for p in model.parameters()) if model is not None else 0


def _tokenizer_stub(config):
    """A minimal tokenizer for pre-tokenised data (the trainer only needs its special tokens and padding)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(config.vocab_size)}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t3")),
                                        bos_token="t1", eos_token="t2", pad_token="t0", unk_token="t3")
    return tokenizer


def run_isolated(variant: str, liger: bool, qlora: bool, args) -> dict:
    cmd = [sys.executable, __file__, "--_worker", variant, "--shape", args.shape, "--batch", str(args.batch),
           "--seq", str(args.seq), "--steps", str(args.steps), "--warmup", str(args.warmup), "--device", args.device,
           "--cache", args.cache, "--clock", args.clock] + (["--_liger"] if liger else []) + (
               ["--_qlora"] if qlora else []) + (["--fastest"] if args.fastest else [])
    result = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if result.returncode != 0:
        tail = result.stderr.strip().splitlines()[-1] if result.stderr.strip() else "failed"
        return {"variant": variant, "liger": liger, "qlora": qlora, "error": tail}
    return json.loads(result.stdout.strip().splitlines()[-1])


def format_table(rows) -> str:
    lines = ["| variant | Liger | QLoRA | step (s) | step / TRL nll | peak memory (GiB) | loss state (MiB) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['variant']} | {r['liger']} | {r['qlora']} | failed: {r['error'][:80]} | | | |")
            continue
        base = next((b for b in rows if b["variant"] == "nll" and b["liger"] == r["liger"] and b["qlora"] == r["qlora"]
                     and "step_seconds" in b), None)
        ratio = f"{r['step_seconds'] / base['step_seconds']:.2f}" if base else "—"
        lines.append(f"| {r['variant']} | {r['liger']} | {r['qlora']} | {r['step_seconds']:.3f} | {ratio} | "
                     f"{r['peak_bytes'] / 2**30:.2f} | {r.get('state_bytes', 0) / 2**20:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(SHAPES))
    parser.add_argument("--variants", nargs="+", default=["nll", "gem", "gem_ls", "emo", "emo_live"],
                        help=f"named variants ({', '.join(sorted(VARIANTS))}) or any loss_type")
    parser.add_argument("--liger", nargs="+", default=["off"], choices=["on", "off"], help="use_liger_kernel settings to run")
    parser.add_argument("--qlora", nargs="+", default=["off"], choices=["on", "off"], help="QLoRA settings to run")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=9, help="timed steps (median)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "trl_emo_step_bench"), help="random models for QLoRA")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="step time as wall-clock time, or as the process's CPU time (a shared CPU machine: run "
                        "with OMP_NUM_THREADS=1)")
    parser.add_argument("--rounds", type=int, default=1, help="run the variants this many times in turn and keep each "
                        "one's fastest round (on a machine shared with other work, which only ever slows a run down)")
    parser.add_argument("--fastest", action="store_true", help="time each variant by its fastest step, not the median")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--_worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--_liger", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_qlora", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args._worker:
        args.variant, args.liger, args.qlora = args._worker, args._liger, args._qlora
        print(json.dumps(worker(args)))
        return 0

    import torch

    from trl_emo import __version__

    command = "python benchmarks/step_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else f"CPU, {os.cpu_count()} cores"
    print(f"# Trainer step benchmark, {date.today().isoformat()}\n\nMachine: {device}, torch {torch.__version__}, "
          f"trl_emo {__version__}  \nCommand: `{command}`  \nShape: {args.shape}, batch {args.batch} x {args.seq} tokens; "
          f"{'fastest' if args.fastest else 'median'} of {args.steps} steps after {args.warmup}"
          + (f"; each variant's fastest of {args.rounds} rounds" if args.rounds > 1 else "")
          + f" ({'process CPU' if args.clock == 'cpu' else 'wall-clock'} time).\n", flush=True)
    rounds = []
    for _ in range(args.rounds):
        rows = []
        for qlora in args.qlora:
            for liger in args.liger:
                for variant in args.variants:
                    rows.append(run_isolated(variant, liger == "on", qlora == "on", args))
                    print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        rounds.append(rows)
    rows = [min(runs, key=lambda r: r.get("step_seconds", float("inf"))) for runs in zip(*rounds)]
    print(format_table(rows), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": device, "command": command, "date": date.today().isoformat(),
                                               "results": rows, "rounds": rounds}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
