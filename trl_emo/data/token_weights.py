"""Per-token loss weights in the data: where they come from, how they are checked and laid on the tokens.

Two fields carry them:

- a per-message `weight` in conversational rows (`messages`, or conversational `prompt`/`completion`), OpenAI's
  chat fine-tuning field: a non-negative number, 0 leaves the message out of the loss, 1 (or no `weight`) is the
  default, any other number scales the message's tokens;
- a per-token `loss_weights` list in already-tokenized rows (`input_ids`), one non-negative number per token,
  aligned with `input_ids` (the weight of the token as a label: it scales the loss of predicting that token).

A message's tokens are the ones its rendering adds to the conversation before it: the tokens from where the chat
template's rendering of the messages before it stops matching the whole conversation's (the longest common prefix,
as TRL finds where a completion starts) to where the rendering up to it stops matching. Templates that render a
conversation's beginning alike in every longer conversation (most) give each message exactly its own tokens,
header and end-of-turn included. A template that rewrites earlier turns once more turns follow (Qwen3's drops the
reasoning block of every assistant turn but the last) parts from the conversation inside the rewritten turn, and every
later boundary falls at the same token: the turns cannot be told apart there, so a weighted conversation under such a
template is a one-line error (tokenized rows with `loss_weights` are the way to weigh it).

Weights only ever meet labels: a token whose label is `-100` (a prompt, a masked turn) has no loss to weigh. A weight
of 0 also sets the token's label to `-100`, so that a zero-weight message is masked exactly (and a row left without
any weighted token is dropped, as TRL drops fully masked rows). What the losses do with the weights, and the
normalization (the sum of the weights in place of the token count), is in `trl_emo.losses.fused` and
docs/losses.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from .schemas import DataError

WEIGHTS_COLUMN = "loss_weights"  # per-token weights of tokenized rows, and of the prepared dataset
MESSAGE_FIELD = "weight"  # per-message weight of conversational rows
CONVERSATION_COLUMNS = ("messages", "prompt", "completion")
# ShareGPT's turns (`from`/`value`), which TRL converts to `messages` while it tokenizes: after the weights are laid,
# so a `weight` there would be dropped silently. Refused in one line instead.
SHAREGPT_COLUMN = "conversations"
_SHAREGPT_WEIGHTS = (
    "conversations: per-message weights are read from a `messages` column (role/content turns), not from ShareGPT's "
    "`conversations`: rename the column to messages and each turn's from/value to role/content, or give tokenized "
    "rows with loss_weights."
)
IGNORE_INDEX = -100


def _feature_has_weight(feature) -> bool | None:
    """Whether a `datasets` feature is a list of messages one of which has a `weight` field; None when the feature does
    not say (turns stored as JSON values, as `datasets` stores turns whose keys differ)."""
    inner = getattr(feature, "feature", None)
    if inner is None and isinstance(feature, list) and feature:
        inner = feature[0]
    if type(inner).__name__ == "Json":
        return None
    return isinstance(inner, Mapping) and MESSAGE_FIELD in inner


def _rows_have_weight(dataset, column: str) -> bool:
    """Whether any row's messages in `column` carry a `weight` (read in batches, the column alone)."""
    for batch in dataset.select_columns([column]).iter(batch_size=1024):
        if any(_has_message_weight(messages) for messages in batch[column]):
            return True
    return False


def _has_message_weight(messages) -> bool:
    """Whether a row's turns (a list of messages) give any message a `weight`."""
    return isinstance(messages, list) and any(isinstance(m, Mapping) and m.get(MESSAGE_FIELD) is not None
                                              for m in messages)


def carries_weights(dataset) -> bool:
    """Whether `dataset` (a `datasets.Dataset` or `IterableDataset`) has per-token weights: a `loss_weights` column,
    or conversations whose messages have a `weight` field (read from the features; from the rows where the features
    store the turns as JSON values; from the first row of a streamed dataset without features)."""
    features = getattr(dataset, "features", None)
    if features:
        if WEIGHTS_COLUMN in features:
            return True
        if SHAREGPT_COLUMN in features:
            found = _feature_has_weight(features[SHAREGPT_COLUMN])
            if found or (found is None and _rows_have_weight(dataset, SHAREGPT_COLUMN)):
                raise DataError(_SHAREGPT_WEIGHTS)
        for column in CONVERSATION_COLUMNS:
            if column in features:
                found = _feature_has_weight(features[column])
                if found or (found is None and _rows_have_weight(dataset, column)):
                    return True
        return False
    try:
        first = next(iter(dataset))
    except (StopIteration, TypeError):
        return False
    if WEIGHTS_COLUMN in first:
        return True
    if _has_message_weight(first.get(SHAREGPT_COLUMN)):
        raise DataError(_SHAREGPT_WEIGHTS)
    return any(_has_message_weight(first.get(column)) for column in CONVERSATION_COLUMNS)


def check_weight(value, field: str) -> float:
    """A weight as a float: None (no weight) is 1; anything but a finite non-negative number is a `DataError` naming
    the field."""
    if value is None:
        return 1.0
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    if not ok:
        raise DataError(
            f"{field} must be a non-negative number (0 leaves it out of the loss, 1 is the default), got {value!r}."
        )
    return float(value)


def message_weights(messages: Sequence[Mapping], field: str = "messages") -> list[float]:
    """Each message's weight (1 without a `weight`), checked."""
    return [check_weight(m.get(MESSAGE_FIELD), f"{field}[{i}].{MESSAGE_FIELD}") for i, m in enumerate(messages)]


def conversation_of(row: Mapping) -> tuple[list, str] | None:
    """The messages of a conversational row as TRL tokenizes them (`messages`, or `prompt` + `completion`) and the
    field name for messages, None for other rows."""
    if isinstance(row.get("messages"), list):
        return list(row["messages"]), "messages"
    if isinstance(row.get("prompt"), list) and isinstance(row.get("completion"), list):
        return list(row["prompt"]) + list(row["completion"]), "prompt + completion"
    return None


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def lay_message_weights(
    messages: Sequence[Mapping], input_ids: Sequence[int], tokenize: Callable[[list], list[int]], field: str = "messages"
) -> list[float]:
    """One weight per token of `input_ids` (the whole conversation as tokenized for training) from the messages'
    weights; `tokenize(messages)` renders and tokenizes a conversation as training does (the chat template, tools and
    template arguments of the row). Messages are rendered once per message, only when some weight is not 1."""
    weights = message_weights(messages, field)
    if all(w == 1.0 for w in weights):
        return [1.0] * len(input_ids)
    out: list[float] = []
    start = 0
    for i, weight in enumerate(weights):
        if i + 1 < len(messages):
            prefix = tokenize(list(messages[: i + 1]))
            end = _common_prefix(prefix, input_ids)
            if end < len(prefix) - 1:
                # One trailing token (an end-of-conversation token) may differ; more means the template rewrites
                # this turn once more turns follow, and from there on every later boundary falls at the same token:
                # the turns' tokens cannot be told apart, so a weight of 0 could not mask its turn. Refused.
                raise DataError(
                    f"{field}[{i}]: the chat template renders this turn differently once more turns follow ({end} of "
                    f"its first {len(prefix)} tokens agree; Qwen3's template drops every earlier turn's reasoning "
                    f"block), so per-message {MESSAGE_FIELD}s cannot be laid on its tokens: give tokenized rows with "
                    f"{WEIGHTS_COLUMN}, or a chat template that renders earlier turns alike."
                )
        else:
            end = len(input_ids)
        end = max(end, start)
        out.extend([weight] * (end - start))
        start = end
    return out


def check_token_weights(weights, n_tokens: int, field: str = WEIGHTS_COLUMN) -> list[float]:
    """A tokenized row's `loss_weights`: a list of one non-negative number per token, checked."""
    if not isinstance(weights, (list, tuple)):
        raise DataError(f"{field} must be a list of per-token weights, one per input id, got {type(weights).__name__}.")
    if len(weights) != n_tokens:
        raise DataError(f"{field} has {len(weights)} weights but the row has {n_tokens} input_ids: give one per token.")
    return [check_weight(w, f"{field}[{i}]") for i, w in enumerate(weights)]


def apply_to_labels(labels: Sequence[int], weights: Sequence[float]) -> list[int]:
    """The labels with every zero-weight token masked (`-100`): weight 0 is masking."""
    return [IGNORE_INDEX if w == 0 else label for label, w in zip(labels, weights)]


def truncate(row: Mapping, max_length: int, mode: str) -> dict:
    """`input_ids`, `labels` and `loss_weights` cut to `max_length` as TRL cuts the first two (`keep_start`: the
    first tokens, `keep_end`: the last)."""
    if mode == "keep_start":
        cut = slice(None, max_length)
    elif mode == "keep_end":
        cut = slice(-max_length, None)
    else:
        raise ValueError(f"Unsupported truncation mode: {mode}, expected 'keep_start' or 'keep_end'")
    return {key: list(row[key])[cut] for key in ("input_ids", "labels", WEIGHTS_COLUMN)}
