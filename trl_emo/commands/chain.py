"""`trl-emo demo --chain`: the whole chain offline, on the bundled samples, through the commands a user would type.

1. SFT with each loss (`nll`, `gem`; `--losses`) on the UltraFeedback-schema sample's `train_sft` conversations (its
   right answers, the GSM8K-style problems' `#### n` lines among them): `trl_emo.sft`, recipe `demo` (tiny model) or
   `demo_pretrained` (`--model`, LoRA).
2. DPO from each SFT model on the sample's preference pairs (`train_prefs`): `trl_emo.dpo`, recipe `demo_dpo`.
3. A reward model built on the fly: a tiny Llama with its own tokenizer (trained on the samples' text), trained as a
   Bradley-Terry classifier by TRL's `RewardTrainer` on the same pairs; its accuracy on `test_prefs` is printed.
4. Best-of-n of every SFT and DPO model under that reward model, on the `test_prefs` prompts: `trl-emo eval`.
5. GRPO from each DPO model on the GSM8K-style problems, rewards `gsm8k_answer` + `format`: `trl_emo.grpo`, recipe
   `demo_grpo`.
6. Evaluation of the DPO and GRPO models on the held-out problems (greedy accuracy, pass@k, MV@k): `trl-emo eval`.

Each stage prints the command it runs (to rerun or change it), its result and where its outputs are. On the tiny
model trained from scratch the numbers only show that every stage runs (a few minutes on 2 cores); `--model` runs the
chain on a pretrained model (`"$(python -m trl_emo.real_model)"`: SmolLM2-135M-Instruct).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

# Optimizer steps per stage (`--max_steps` sets them all); the SFT stage takes the recipe's own with --model.
STEPS = {"sft": 60, "dpo": 20, "reward_model": 60, "grpo": 8}
QUICK_STEPS = 2
EVAL = {"n": 4, "max_prompts": 8, "max_new_tokens": 48}
QUICK_EVAL = {"n": 2, "max_prompts": 2, "max_new_tokens": 16}
LORA = ["--use_peft", "true", "--lora_target_modules", "all-linear", "--lora_r", "16"]
REWARD_MODEL_SIZE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128)


def _say(text: str) -> None:
    print(f"[chain] {text}", flush=True)


def _run(stage: str, module, argv: list[str]) -> None:
    """Run a command in this process as `trl-emo <stage> ...` would; a failure stops the chain with its status."""
    _say(f"{stage}: trl-emo {module.__name__.rsplit('.', 1)[-1].replace('evaluate', 'eval')} "
         + " ".join(shlex.quote(a) for a in argv))
    start = time.time()
    status = module.run(argv)
    if status:
        raise SystemExit(status)
    _say(f"{stage}: done in {time.time() - start:.0f} s")


def sample_texts() -> list[str]:
    """The text of every bundled chain sample (a tokenizer is trained on it)."""
    from ..data import gsm8k_sample_path, ultrafeedback_sample_path

    texts = []
    for folder in (ultrafeedback_sample_path(), gsm8k_sample_path()):
        for path in sorted(Path(folder).glob("*.jsonl")):
            for line in path.read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                texts += [m["content"] for m in row.get("chosen", []) + row.get("rejected", [])]
                texts += [row[k] for k in ("question", "answer") if k in row]
    return texts


def train_reward_model(output_dir: Path, max_steps: int) -> tuple[str, float]:
    """A tiny reward model trained by TRL's `RewardTrainer` on the bundled preference pairs; its folder and its
    accuracy (chosen scored above rejected) on the held-out pairs."""
    import torch
    from datasets import load_dataset
    from trl import RewardConfig, RewardTrainer

    from ..data import ultrafeedback_sample_path
    from ..models.tiny import build_tiny_reward_model, train_tokenizer

    folder = Path(ultrafeedback_sample_path())
    tokenizer = train_tokenizer(sample_texts(), vocab_size=1024, chat_template=True)
    model = build_tiny_reward_model(tokenizer, seed=0, **REWARD_MODEL_SIZE)
    pairs = load_dataset("json", data_files={"train": str(folder / "train_prefs.jsonl"),
                                             "test": str(folder / "test_prefs.jsonl")})
    args = RewardConfig(output_dir=str(output_dir), max_steps=max_steps, per_device_train_batch_size=16,
                        learning_rate=1e-3, lr_scheduler_type="constant", use_cpu=True, bf16=False, report_to="none",
                        save_strategy="no", logging_steps=max(1, max_steps // 4), max_length=256, seed=0)
    trainer = RewardTrainer(model=model, args=args, train_dataset=pairs["train"].select_columns(["chosen", "rejected"]),
                            processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(output_dir))
    tokenizer.save_pretrained(str(output_dir))

    def score(conversation) -> float:
        ids = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True, return_tensors="pt")
        with torch.no_grad():
            return model(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"]).logits[0, 0].item()

    model.eval()
    held_out = pairs["test"]
    right = sum(score(row["chosen"]) > score(row["rejected"]) for row in held_out)
    return str(output_dir), right / len(held_out)


def _grpo_rewards(folder: Path) -> str:
    """The first and last logged mean reward of a GRPO run (its trainer_state.json)."""
    state = folder / "trainer_state.json"
    if not state.is_file():
        return "no log"
    rows = [r for r in json.loads(state.read_text())["log_history"] if "reward" in r]
    if not rows:
        return "no reward logged"
    return f"mean reward {rows[0]['reward']:.3f} at step {rows[0]['step']}, {rows[-1]['reward']:.3f} at step {rows[-1]['step']}"


def main(args) -> int:
    """Run the chain from the demo's parsed command line (`--chain`)."""
    from ..core.optional import MATPLOTLIB, SACREBLEU
    from ..data import gsm8k_sample_path, ultrafeedback_sample_path
    from . import dpo, evaluate, grpo, sft

    start = time.time()
    out = Path(args.output_dir)
    quick = args.quick
    steps = {k: args.max_steps or (QUICK_STEPS if quick else v) for k, v in STEPS.items()}
    evaluation = QUICK_EVAL if quick else EVAL
    preferences, problems = ultrafeedback_sample_path(), gsm8k_sample_path()
    _say(f"bundled samples: {preferences} (UltraFeedback schema), {problems} (GSM8K schema)")
    if args.model is None:
        from ..models.tiny import DEMO_MODEL_SIZE, save_tiny_causal_lm

        model = save_tiny_causal_lm(sample_texts(), vocab_size=1024, chat_template=True, seed=0, **DEMO_MODEL_SIZE)
        sft_recipe, peft = "demo", []
        _say(f"model: a tiny chat Llama trained from scratch, cached in {model}")
    else:
        from ..models.real_model import RealModelUnavailable, pretrained_model

        try:
            model = pretrained_model(args.model)
        except RealModelUnavailable as exc:
            print(f"trl-emo demo: error: {exc}", file=sys.stderr)
            return 2
        sft_recipe, peft = "demo_pretrained", LORA
        _say(f"model: {args.model} (LoRA at every stage)")
    recipe = args.recipe or sft_recipe
    sft_steps = [] if args.model is not None and not (args.max_steps or quick) else ["--max_steps", str(steps["sft"])]
    losses = [name.strip() for name in args.losses.split(",") if name.strip()]

    # 1-2. SFT with each loss, then DPO from each.
    policies = {}
    for loss in losses:
        _run(f"1/6 SFT ({loss})", sft, ["--recipe", recipe, "--model_name_or_path", model, "--dataset_name",
                                        preferences, "--dataset_schema", "ultrafeedback", "--dataset_train_split",
                                        "train_sft", "--dataset_test_split", "test_sft", "--prompt_format",
                                        "chat_template", "--loss_type", loss, "--output_dir", str(out / f"sft-{loss}"),
                                        *sft_steps])
        policies[f"sft-{loss}"] = str(out / f"sft-{loss}")
    for loss in losses:
        _run(f"2/6 DPO (after {loss})", dpo, ["--recipe", "demo_dpo", "--model_name_or_path", str(out / f"sft-{loss}"),
                                             "--dataset_name", preferences, "--output_dir", str(out / f"dpo-{loss}"),
                                             "--max_steps", str(steps["dpo"]), *peft])
        policies[f"dpo-{loss}"] = str(out / f"dpo-{loss}")

    # 3. The reward model, built on the fly.
    _say(f"3/6 reward model: a tiny Llama classifier, TRL's RewardTrainer, {steps['reward_model']} steps on "
         f"{preferences}/train_prefs.jsonl")
    reward_model, accuracy = train_reward_model(out / "reward-model", steps["reward_model"])
    _say(f"3/6 reward model: held-out pair accuracy {accuracy:.2f} (chosen scored above rejected); saved to "
         f"{reward_model}")

    # 4. Best-of-n under it. Metrics from optional packages only when installed (the plain install has none).
    extras = ["--diversity", str(SACREBLEU.installed()).lower(), "--embedding_diversity", "false",
              "--plot", str(MATPLOTLIB.installed()).lower()]
    common = ["--n", str(evaluation["n"]), "--max_new_tokens", str(evaluation["max_new_tokens"]), "--max_prompts",
              str(evaluation["max_prompts"]), "--temperature", "1.0", "--progress", "false", "--overwrite", "true"]
    _run("4/6 best-of-n", evaluate, ["--policies", *(f"{k}={v}" for k, v in policies.items()), "--reward_model",
                                     reward_model, "--prompts", f"{preferences}/test_prefs.jsonl", "--prompt_column",
                                     "prompt", *common, *extras, "--output_dir", str(out / "eval-best-of-n")])

    # 5-6. GRPO from each DPO model on the problems, then the problems' evaluation.
    finals = {}
    for loss in losses:
        folder = out / f"grpo-{loss}"
        _run(f"5/6 GRPO (after {loss})", grpo, ["--recipe", "demo_grpo", "--model_name_or_path",
                                               str(out / f"dpo-{loss}"), "--dataset_name", problems, "--output_dir",
                                               str(folder), "--max_steps", str(steps["grpo"]), *peft,
                                               *(["--max_completion_length", "16"] if quick else [])])
        _say(f"5/6 GRPO (after {loss}): {_grpo_rewards(folder)}; saved to {folder}")
        finals.update({f"dpo-{loss}": str(out / f"dpo-{loss}"), f"grpo-{loss}": str(folder)})
    _run("6/6 evaluation", evaluate, ["--policies", *(f"{k}={v}" for k, v in finals.items()), "--prompts",
                                      f"{problems}/test.jsonl", "--prompt_column", "question", "--answer_column",
                                      "answer", *common, "--diversity", "false", "--embedding_diversity", "false",
                                      "--plot", str(MATPLOTLIB.installed()).lower(),
                                      "--output_dir", str(out / "eval-gsm8k")])
    if not SACREBLEU.installed() or not MATPLOTLIB.installed():
        _say("self-BLEU and the figures need `pip install 'trl-emo[eval]'` (sacrebleu, matplotlib); left out here")
    _say(f"done in {time.time() - start:.0f} s: every stage's output is under {out}/ "
         f"({', '.join(sorted(p.name for p in out.iterdir() if p.is_dir()))})")
    return 0
