"""The data layer's uses of TRL internals: how TRL 1.16's `SFTTrainer.__init__` decides whether it can mask the
assistant turns of conversations with a tokenizer's chat template (`trl/trainer/sft_trainer.py`,
`trl/chat_template_utils.py`). The training layer's pieces are in `trl_emo.training.trl_compat`, which re-exports
these; `tests/test_trl_compat.py` compares each with TRL's own behaviour.

TRL itself is imported where a piece is used.
"""

from __future__ import annotations

TRL_VERSION = "1.16.0"  # the TRL release every piece here and in `trl_emo.training.trl_compat` mirrors


def has_generation_markers(chat_template) -> bool:
    """TRL's `has_generation_markers` (`trl/chat_template_utils.py`)."""
    from trl.chat_template_utils import has_generation_markers as trl_has_generation_markers

    return trl_has_generation_markers(chat_template)


def template_masks_assistant_turns(tokenizer) -> bool:
    """Whether TRL can build an assistant mask with this tokenizer's chat template, as is or with the training
    template TRL swaps in for the model families it knows (TRL 1.16 `SFTTrainer.__init__`)."""
    from trl.chat_template_utils import get_training_chat_template

    if has_generation_markers(tokenizer.chat_template):
        return True
    try:
        get_training_chat_template(tokenizer)
    except ValueError:
        return False
    return True
