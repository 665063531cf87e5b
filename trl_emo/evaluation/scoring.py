"""Scoring (prompt, response) pairs with an off-the-shelf sequence-classification reward model."""

from __future__ import annotations

import hashlib
import os

from .cache import JsonlCache, file_signature
from .config import EvalConfig
from .errors import EvaluationError
from .loading import not_loadable, resolve_device, resolve_dtype
from .prompts import PromptSet, encode_once

REFERENCE = "_reference"


class RewardModel:
    """`AutoModelForSequenceClassification` whose first logit, at the last real token, is the reward.

    Chat reward models see their own chat template over [user, assistant], rendered as text and
    tokenized without a second BOS; reward models without a chat template (e.g. OpenAssistant's
    DeBERTa) get the (question, answer) text pair.
    """

    def __init__(self, path: str, dtype: str = "auto", device: str | None = None, trust_remote_code: bool = False):
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        path = os.path.expanduser(path)
        self.device = resolve_device(device)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        except OSError as exc:
            if os.path.isdir(path):
                raise
            raise not_loadable("Reward model", path, exc) from exc
        model = AutoModelForSequenceClassification.from_pretrained(
            path, dtype=resolve_dtype(dtype, self.device), trust_remote_code=trust_remote_code
        )
        self.model = model.to(self.device).eval()
        self._torch = torch
        # Last-token pooling finds the last token that is not `pad_token_id`: without a pad id it
        # refuses batches, so make sure the model and the padding agree on one.
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        pad_id = text_config.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.pad_token_id
        if pad_id is None:
            pad_id = self.tokenizer.unk_token_id
        if pad_id is None:
            pad_id = self.tokenizer.eos_token_id
        if pad_id is None:
            raise EvaluationError(f"{path}: neither the reward model nor its tokenizer has a pad, unk or EOS token.")
        config.pad_token_id = pad_id
        text_config.pad_token_id = pad_id
        self.pad_id = int(pad_id)
        self.use_chat_template = bool(getattr(self.tokenizer, "chat_template", None))
        limit = getattr(self.tokenizer, "model_max_length", None)
        # Tokenizers without a limit report a huge sentinel value.
        self.max_length = int(limit) if limit and limit < 1_000_000 else None

    def encode(self, messages: list[dict], response: str) -> list[int]:
        truncation = dict(truncation=True, max_length=self.max_length) if self.max_length else {}
        if self.use_chat_template:
            text = self.tokenizer.apply_chat_template(
                [*messages, {"role": "assistant", "content": response}], tokenize=False
            )
            return list(encode_once(self.tokenizer, text, **truncation)["input_ids"])
        users = [m["content"] for m in messages if m["role"] == "user"]
        question = users[-1] if users else messages[-1]["content"]
        return list(self.tokenizer(question, response, **truncation)["input_ids"])

    def score(self, sequences: list[list[int]]) -> list[float]:
        """Rewards of already-tokenized sequences, right-padded into one batch."""
        torch = self._torch
        if not sequences:
            return []
        # A sequence that ends with the pad id itself would be pooled at the wrong token once padded;
        # score those alone, without padding, reading the very last position.
        clashing = [i for i, ids in enumerate(sequences) if ids and ids[-1] == self.pad_id]
        batched = sorted(set(range(len(sequences))) - set(clashing))
        scores: dict[int, float] = {}
        if batched:
            width = max(len(sequences[i]) for i in batched)
            input_ids = torch.full((len(batched), width), self.pad_id, dtype=torch.long)
            attention = torch.zeros((len(batched), width), dtype=torch.long)
            for row, i in enumerate(batched):
                ids = sequences[i]
                input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                attention[row, : len(ids)] = 1
            with torch.no_grad():
                output = self.model(input_ids=input_ids.to(self.device), attention_mask=attention.to(self.device))
            logits = output.logits
            for row, i in enumerate(batched):
                scores[i] = float(logits[row, 0].float())
        for i in clashing:
            scores[i] = self._score_alone(sequences[i])
        return [scores[i] for i in range(len(sequences))]

    def _score_alone(self, ids: list[int]) -> float:
        torch = self._torch
        config = self.model.config
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        saved = text_config.pad_token_id
        text_config.pad_token_id = config.pad_token_id = None
        try:
            with torch.no_grad():
                logits = self.model(input_ids=torch.tensor([ids], device=self.device)).logits
        finally:
            text_config.pad_token_id = config.pad_token_id = saved
        return float(logits[0, 0].float())

    def close(self) -> None:
        self.model = None


class LazyRewardModel:
    """Loads the reward model the first time something needs scoring, so a finished run loads nothing."""

    def __init__(self, config: EvalConfig):
        self.config = config
        self._model: RewardModel | None = None

    def get(self) -> RewardModel:
        if self._model is None:
            c = self.config
            self._model = RewardModel(c.reward_model, c.dtype, c.device, c.trust_remote_code)
        return self._model

    def close(self) -> None:
        if self._model is not None:
            self._model.close()
        self._model = None


def reward_settings(config: EvalConfig) -> dict:
    return {"reward_model": file_signature(os.path.expanduser(config.reward_model)), "dtype": config.dtype}


def _rewards_cache(config: EvalConfig, name: str, settings: dict) -> JsonlCache:
    path = os.path.join(config.output_dir, "rewards", f"{name}.jsonl")
    return JsonlCache(path, settings, ("model", "prompt_index", "sample"), config.overwrite)


def _text_sha(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def score_rows(
    reward_model: LazyRewardModel,
    cache: JsonlCache,
    items: list[tuple[tuple, list[dict], str, dict]],
    config: EvalConfig,
    desc: str,
) -> None:
    """Score `items` = (cache key, prompt messages, response, extra row fields) that are not cached yet.

    Batches are cut from a fixed order of all items (longest first, to waste little padding), so a
    resumed run scores every pair in the same batch as an uninterrupted one.
    """
    from tqdm.auto import tqdm

    pending = [item for item in items if item[0] not in cache]
    if not pending:
        return
    model = reward_model.get()
    encoded = [model.encode(messages, response) for _, messages, response, _ in items]
    order = sorted(range(len(items)), key=lambda i: (-len(encoded[i]), items[i][0]))
    size = config.scoring_batch_size
    done = len(items) - len(pending)
    bar = tqdm(total=len(items), initial=done, desc=desc, unit="pair", disable=not config.progress)
    try:
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            if all(items[i][0] in cache for i in chunk):
                continue
            rewards = model.score([encoded[i] for i in chunk])
            rows = [
                {**items[i][3], "reward": reward}
                for i, reward in zip(chunk, rewards)
                if items[i][0] not in cache
            ]
            cache.append(rows)
            bar.update(len(rows))
    finally:
        bar.close()


def score_policy(
    name: str,
    generations: JsonlCache,
    reward_model: LazyRewardModel,
    config: EvalConfig,
    prompt_set: PromptSet,
    num_samples: int | None = None,
) -> JsonlCache:
    """Rewards of the policy's `num_samples` (default `n`) sampled responses per prompt (greedy ones are not
    needed for BoN), cached."""
    settings = {**reward_settings(config), "generations": generations.fingerprint}
    cache = _rewards_cache(config, name, settings)
    items = []
    for i, example in enumerate(prompt_set.examples):
        for j in range(config.n if num_samples is None else num_samples):
            row = generations.rows[(name, i, j)]
            key = (name, i, j)
            items.append((key, example.messages, row["response"], {"model": name, "prompt_index": i, "sample": j}))
    score_rows(reward_model, cache, items, config, desc=f"score {name}")
    return cache


def score_references(reward_model: LazyRewardModel, config: EvalConfig, prompt_set: PromptSet) -> JsonlCache:
    """Rewards of the reference responses, for the win rate; shared by all policies."""
    source = {k: prompt_set.source[k] for k in ("prompts", "config", "split", "reference_column")}
    cache = _rewards_cache(config, REFERENCE, {**reward_settings(config), "prompts": source})
    items = []
    for i, example in enumerate(prompt_set.examples):
        if example.reference is None:
            continue
        sha = _text_sha(example.messages, example.reference)
        cached = cache.rows.get((REFERENCE, i, 0))
        if cached is not None and cached.get("sha") != sha:
            raise EvaluationError(
                f"{cache.path}: the cached reference {i} differs from the current one. "
                "Use another output_dir or set `overwrite: true`."
            )
        row = {"model": REFERENCE, "prompt_index": i, "sample": 0, "sha": sha}
        items.append(((REFERENCE, i, 0), example.messages, example.reference, row))
    score_rows(reward_model, cache, items, config, desc="score references")
    return cache
