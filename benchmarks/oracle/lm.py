"""The oracle and the token-level machinery: vocabulary, ancestral sampling, exact scoring.

The oracle is a randomly initialized Llama (`trl_emo.models.tiny`) whose output embedding is multiplied
by a constant chosen so that its mean next-token entropy on its own samples hits a target (random
initialization alone is almost uniform). The scaled weights are the oracle: its distribution is
exactly `softmax(logits)` of that model at temperature 1, and every token id has non-zero
probability, so both KL directions are finite.

Sequences are `[BOS, x_1, ..., x_L]` with a fixed `L`: no padding and no EOS. The token ids are
opaque symbols; ids 0-3 carry the names `<pad>`, `<s>`, `</s>`, `<unk>` only because the trainer
needs a tokenizer that has them, and the oracle may emit them like any other token (all sequences
have the same length, so the collator never pads).
"""

from __future__ import annotations

import math

import torch

from .metrics import Accumulator, entropy, forward_kl, perplexity, reverse_kl, token_nll

SPECIAL_TOKENS = ("<pad>", "<s>", "</s>", "<unk>")
BOS_ID = 1


def make_tokenizer(vocab_size: int):
    """A word-level tokenizer whose vocabulary is exactly the ids `0 .. vocab_size - 1`.

    Only used as the trainer's `processing_class` (padding id, special tokens): the data are
    token ids already. Word `i` (for i ≥ 4) is `"t{i}"`.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must exceed {len(SPECIAL_TOKENS)}, got {vocab_size}")
    vocab = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"t{i}": i for i in range(len(SPECIAL_TOKENS), vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    assert len(tokenizer) == vocab_size and tokenizer.bos_token_id == BOS_ID
    return tokenizer


def model_config(hidden_size: int, num_layers: int, num_heads: int, seq_len: int) -> dict:
    """Architecture keyword arguments for `trl_emo.models.tiny.build_tiny_model` (GQA with half as many KV heads)."""
    return dict(
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        intermediate_size=2 * hidden_size,
        max_position_embeddings=max(64, seq_len + 1),
    )


# ---------------------------------------------------------------------------------------------
# Sampling and scoring
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def sample(model, prefixes: torch.Tensor, new_tokens: int, generator: torch.Generator, batch_size: int = 512) -> torch.Tensor:
    """Ancestral sampling at temperature 1 (no top-k/top-p): `[n, P]` prefixes → `[n, P + new_tokens]`.

    Uses the KV cache; no EOS stops a sequence. `generator` makes it reproducible.
    """
    was_training = model.training
    model.eval()
    outputs = []
    for chunk in prefixes.split(batch_size):
        tokens = [chunk]
        if new_tokens > 0:
            out = model(input_ids=chunk, use_cache=True)
            for step in range(new_tokens):
                probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
                nxt = torch.multinomial(probs, 1, generator=generator)
                tokens.append(nxt)
                if step + 1 < new_tokens:
                    out = model(input_ids=nxt, past_key_values=out.past_key_values, use_cache=True)
        outputs.append(torch.cat(tokens, dim=1))
    model.train(was_training)
    return torch.cat(outputs)


@torch.no_grad()
def log_probs(model, sequences: torch.Tensor) -> torch.Tensor:
    """Next-token log-probabilities (float64) at positions `0 .. T-2`: `[n, T]` → `[n, T-1, V]`."""
    was_training = model.training
    model.eval()
    logits = model(input_ids=sequences).logits[:, :-1]
    model.train(was_training)
    return torch.log_softmax(logits.double(), dim=-1)


@torch.no_grad()
def sample_sequences(model, n: int, length: int, generator: torch.Generator, batch_size: int = 512) -> torch.Tensor:
    """`n` sequences `[BOS, x_1 .. x_length]` sampled from `model`."""
    prefixes = torch.full((n, 1), BOS_ID, dtype=torch.long)
    return sample(model, prefixes, length, generator, batch_size)


@torch.no_grad()
def compare_on_text(student, oracle, sequences: torch.Tensor, first_target: int = 1, batch_size: int = 256) -> dict:
    """Exact per-token comparison of `student` with `oracle` along `sequences`.

    At every position whose target (next token) has index ≥ `first_target` — the prefix is the
    text so far: student and oracle NLL of the actual next token, forward `KL(oracle ‖ student)`,
    reverse `KL(student ‖ oracle)` and both entropies, each summed over the whole vocabulary.
    Returns the means per token, plus `student_ppl` and `oracle_ppl` (exp of the mean NLLs).

    By the chain rule, on sequences sampled from the oracle the mean forward KL estimates the
    sequence-level `KL(P ‖ Q)` per token; on sequences sampled from the student the mean reverse
    KL estimates the sequence-level `KL(Q ‖ P)` per token.
    """
    if not 1 <= first_target < sequences.shape[1]:
        raise ValueError(f"first_target must be in [1, {sequences.shape[1] - 1}], got {first_target}")
    acc = Accumulator()
    for chunk in sequences.split(batch_size):
        ls = log_probs(student, chunk)[:, first_target - 1 :]
        lo = ls if oracle is student else log_probs(oracle, chunk)[:, first_target - 1 :]
        targets = chunk[:, first_target:]
        acc.add(
            targets.numel(),
            student_nll=token_nll(ls, targets).sum(),
            oracle_nll=token_nll(lo, targets).sum(),
            forward_kl=forward_kl(lo, ls).sum(),
            reverse_kl=reverse_kl(lo, ls).sum(),
            student_entropy=entropy(ls).sum(),
            oracle_entropy=entropy(lo).sum(),
        )
    means = acc.means()
    means["student_ppl"] = perplexity(means["student_nll"])
    means["oracle_ppl"] = perplexity(means["oracle_nll"])
    return means


def with_temperature(model, temperature: float):
    """A copy of `model` whose distribution is `softmax(logits / temperature)`: the output embedding
    divided by `temperature` (exact, since the logits are linear in it; the head must not be tied).

    The copy is a fresh instance loaded from the state dict, not `copy.deepcopy`: a model that went
    through a trainer carries a patched `forward` (TRL's fused head, trl_emo's objective head) that
    closes over the *original* instance, so a deep copy would still run the original's weights.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    if getattr(model.config, "tie_word_embeddings", False):
        raise ValueError("with_temperature needs an untied output embedding")
    fresh = type(model)(model.config).to(dtype=model.dtype)
    fresh.load_state_dict(model.state_dict())
    fresh.generation_config = model.generation_config
    with torch.no_grad():
        fresh.get_output_embeddings().weight.div_(temperature)
    return fresh.eval()


# ---------------------------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------------------------


@torch.no_grad()
def mean_entropy_on_own_samples(model, n: int, length: int, seed: int) -> float:
    sequences = sample_sequences(model, n, length, torch.Generator().manual_seed(seed))
    return float(entropy(log_probs(model, sequences)).mean())


@torch.no_grad()
def calibrate_head_scale(model, target_entropy: float, length: int, seed: int, n: int = 64, iterations: int = 18) -> float:
    """Multiply the output embedding by the scale (found by bisection on a log scale) that makes the
    mean next-token entropy on the model's own samples about `target_entropy` nats; return it.

    Entropy falls as the scale grows, so bisection converges; the measurement uses fixed sampling
    seeds, so the result is deterministic.
    """
    head = model.get_output_embeddings().weight
    original = head.detach().clone()
    low, high = 0.0, math.log(1000.0)  # scale in [1, 1000]
    for _ in range(iterations):
        mid = 0.5 * (low + high)
        head.copy_(original * math.exp(mid))
        if mean_entropy_on_own_samples(model, n, length, seed) > target_entropy:
            low = mid
        else:
            high = mid
    scale = math.exp(0.5 * (low + high))
    head.copy_(original * scale)
    return scale


def build_oracle(tokenizer, args):
    """The oracle model (random Llama with a calibrated head scale) and a description of it."""
    from trl_emo.models.tiny import build_tiny_model

    config = model_config(args.oracle_hidden_size, args.oracle_layers, args.oracle_heads, args.seq_len)
    oracle = build_tiny_model(tokenizer, seed=args.oracle_seed, **config).eval()
    scale = calibrate_head_scale(oracle, args.oracle_entropy, args.seq_len, seed=args.oracle_seed)
    for parameter in oracle.parameters():
        parameter.requires_grad_(False)
    info = {
        "architecture": config,
        "parameters": sum(p.numel() for p in oracle.parameters()),
        "seed": args.oracle_seed,
        "head_scale": scale,
        "target_entropy": args.oracle_entropy,
    }
    return oracle, info
