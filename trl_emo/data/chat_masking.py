"""Loss on the assistant turns only, whatever the tokenizer's chat template.

TRL masks the other turns of `messages` rows (`assistant_only_loss=True`) with the chat template's
`{% generation %}` markers; when a template has none, TRL swaps in a training version of the templates it knows
and fails in `SFTTrainer.__init__` for any other. Many base models ship such a template. A conversation whose only
assistant turn is its last one needs no markers: as a conversational prompt/completion row (the turns before the
answer as `prompt`, the answer as `completion`), TRL's completion-only loss masks the prompt with any template,
and that is exactly the assistant-only loss. Longer conversations cannot be masked that way, so they are a clear
error naming the two ways out, raised before any model is loaded (the same in a dry run and in training).
"""

from __future__ import annotations

from .schemas import DataError

# TRL's decision, mirrored in the data layer's module of TRL internals.
from .trl_compat import template_masks_assistant_turns


def has_one_final_answer(messages) -> bool:
    """Whether the conversation's only assistant turn is its last turn (system and user turns before it)."""
    roles = [message["role"] for message in messages]
    return len(roles) >= 2 and roles[-1] == "assistant" and roles.count("assistant") == 1


def _count_longer(dataset) -> int:
    flags = dataset.map(
        lambda batch: {"single": [has_one_final_answer(m) for m in batch]},
        input_columns="messages",
        batched=True,
        remove_columns=dataset.column_names,
        desc="Counting assistant turns",
    )
    return len(flags) - sum(flags["single"])


def _to_prompt_completion(dataset):
    return dataset.map(
        lambda messages: {"prompt": messages[:-1], "completion": messages[-1:]},
        input_columns="messages",
        remove_columns=["messages"],
        desc="Conversations -> prompt/completion",
    )


def route_conversations(train_dataset, eval_dataset, tokenizer, template_source: str | None = None):
    """Make `messages` datasets trainable with an assistant-only loss under `tokenizer`'s chat template.

    Returns `(train, eval, routed)`. With a template TRL can mask, nothing changes (`routed=False`). Otherwise, when
    every conversation ends in its only assistant turn, both datasets become conversational prompt/completion rows
    (`routed=True`: train with `assistant_only_loss=False`, TRL's completion-only loss masks the prompt). Otherwise
    raises `DataError` in one line.
    """
    if template_masks_assistant_turns(tokenizer):
        return train_dataset, eval_dataset, False
    datasets = {"training": train_dataset, "evaluation": eval_dataset}
    for split, dataset in datasets.items():
        if dataset is None:
            continue
        longer = _count_longer(dataset)
        if longer:
            source = f" (from {template_source})" if template_source else ""
            raise DataError(
                f"{longer} of {len(dataset)} {split} conversations have more than one assistant turn, and the chat "
                f"template{source} has no {{% generation %}} markers that TRL could add, so their assistant turns "
                "cannot be masked: pass --assistant_only_loss false to train on every token, or "
                "--chat_template_path with a template that has {% generation %} markers (a .jinja file or a model)."
            )
    train_dataset = _to_prompt_completion(train_dataset)
    if eval_dataset is not None:
        eval_dataset = _to_prompt_completion(eval_dataset)
    return train_dataset, eval_dataset, True
