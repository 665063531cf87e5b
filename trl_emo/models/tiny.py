"""Tiny, offline Llama-style models and tokenizers.

Used by the demo, the oracle study and the tests: everything is built from a config and a
tokenizer trained on the fly with `tokenizers`, so nothing touches the Hugging Face Hub.
Builds are cached on disk, keyed by their parameters, so a second call is instant.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

# The tiny chat template marks assistant turns with `{% generation %}` so that TRL's
# `assistant_only_loss=True` works, and ends every turn with `<|end|>`, which is *not* the
# tokenizer's EOS: this is the Llama-3 situation (`<|eot_id|>` vs `<|end_of_text|>`) that the
# generation-config fix in `trl_emo.sft` exists for.
END_OF_TURN = "<|end|>"
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>", "<|system|>", "<|user|>", "<|assistant|>", END_OF_TURN]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{ '<|assistant|>\n' }}{% generation %}{{ message['content'] + '<|end|>' }}{% endgeneration %}{{ '\n' }}"
    "{%- else -%}"
    "{{ '<|' + message['role'] + '|>\n' + message['content'] + '<|end|>\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>\n' }}{%- endif -%}"
)

DEFAULT_CACHE = Path(os.environ.get("TRL_EMO_CACHE", Path.home() / ".cache" / "trl_emo"))


def train_tokenizer(texts: Iterable[str], vocab_size: int = 512, chat_template: bool = True):
    """Train a byte-level BPE tokenizer on `texts` and wrap it as a transformers fast tokenizer.

    Byte-level BPE can encode any string, so prompts outside the training texts never hit an
    unknown token. `chat_template=False` gives a base-model tokenizer (the Alpaca-prompt path).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts), trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    # A base model's tokenizer adds no BOS by itself; the chat template adds it explicitly.
    if chat_template:
        tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# The tiny Llama of `trl-emo demo` and `trl-emo demo --chain`: big enough to learn the bundled samples' tasks in a
# minute on a CPU.
DEMO_MODEL_SIZE = dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=256)


def tiny_llama_config(
    vocab_size: int,
    hidden_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 4,
    num_key_value_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    tie_word_embeddings: bool = False,
    **kwargs,
):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        **kwargs,
    )


def build_tiny_model(tokenizer, seed: int = 0, **config_kwargs):
    """A randomly initialized `LlamaForCausalLM` sized for `tokenizer`, in float32."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    config = tiny_llama_config(
        len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **config_kwargs,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def build_tiny_reward_model(tokenizer, seed: int = 0, **config_kwargs):
    """A randomly initialized `LlamaForSequenceClassification` with one output (a reward model)."""
    import torch
    from transformers import LlamaForSequenceClassification

    config = tiny_llama_config(
        len(tokenizer),
        num_labels=1,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **config_kwargs,
    )
    torch.manual_seed(seed)
    return LlamaForSequenceClassification(config).float()


def _cache_dir(kind: str, params: dict, cache_dir: str | os.PathLike | None) -> Path:
    key = hashlib.sha256(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Path(cache_dir or DEFAULT_CACHE) / f"{kind}-{key}"


def save_tiny_causal_lm(
    texts: Iterable[str],
    output_dir: str | os.PathLike | None = None,
    vocab_size: int = 512,
    chat_template: bool = True,
    seed: int = 0,
    cache_dir: str | os.PathLike | None = None,
    **config_kwargs,
) -> str:
    """Build (once) a tiny model + tokenizer folder loadable with `from_pretrained`; return its path.

    Without `output_dir` the folder lives in the cache (`$TRL_EMO_CACHE`, default
    `~/.cache/trl_emo`) under a key derived from every argument, so repeated calls reuse it.
    """
    texts = list(texts)
    params = {
        "texts": hashlib.sha256("\x00".join(texts).encode()).hexdigest(),
        "vocab_size": vocab_size,
        "chat_template": chat_template,
        "seed": seed,
        **config_kwargs,
    }
    path = Path(output_dir) if output_dir is not None else _cache_dir("tiny-llama", params, cache_dir)
    if (path / "config.json").exists() and (path / "tokenizer.json").exists():
        return str(path)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size, chat_template=chat_template)
    model = build_tiny_model(tokenizer, seed=seed, **config_kwargs)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    # Rename last, so an interrupted build never leaves a half-written folder that looks complete.
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)
    return str(path)
