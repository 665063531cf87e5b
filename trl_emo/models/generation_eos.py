"""Make generation stop at the chat template's end-of-turn token.

Chat models end an assistant turn with a token that is often not the tokenizer's EOS (Llama-3:
`<|eot_id|>` vs `<|end_of_text|>`). A fine-tuned model whose `generation_config.eos_token_id`
lacks it never stops at the end of its turn. The token is found by rendering a one-turn
conversation and reading what the template writes right after the assistant's text.
"""

from __future__ import annotations

_PROBE = "trl-emo-probe-answer"


def find_end_of_turn_token(tokenizer) -> str | None:
    """The special token the chat template puts right after an assistant message, if any."""
    if getattr(tokenizer, "chat_template", None) is None:
        return None
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _PROBE}], tokenize=False
        )
    except Exception:  # a template that rejects this conversation shape: nothing to learn from it
        return None
    if not isinstance(text, str) or _PROBE not in text:
        return None
    tail = text.split(_PROBE, 1)[1]
    special = set(tokenizer.all_special_tokens) | {
        str(token) for token in getattr(tokenizer, "added_tokens_decoder", {}).values() if getattr(token, "special", False)
    }
    for token in sorted(special, key=len, reverse=True):
        if token and tail.lstrip(" ").startswith(token):
            return token
    return None


def add_end_of_turn_to_generation_config(model, tokenizer) -> int | None:
    """Add the end-of-turn token id to `model.generation_config.eos_token_id`; return it (or None)."""
    token = find_end_of_turn_token(tokenizer)
    generation_config = getattr(model, "generation_config", None)
    if token is None or generation_config is None:
        return None
    token_id = tokenizer.convert_tokens_to_ids(token)
    eos = generation_config.eos_token_id
    eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in eos:
        eos.append(tokenizer.eos_token_id)
    if token_id not in eos:
        eos.append(token_id)
    generation_config.eos_token_id = eos[0] if len(eos) == 1 else eos
    return token_id
