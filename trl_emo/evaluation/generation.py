"""Sampling responses from the policies: Hugging Face `generate` (default) or vLLM, cached in JSONL."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from ..models.generation_eos import find_end_of_turn_token
from ..models.sources import adapter_rank, load_causal_lm, tokenizer_location
from .cache import JsonlCache, file_signature
from .config import EvalConfig
from .errors import EvaluationError
from .loading import adapter_base, load_tokenizer, resolve_device, resolve_dtype
from .prompts import PromptSet, encode_once, render_policy_prompt

GREEDY = "greedy"
# vLLM schedules its own batches; chunks only bound how much work a kill can lose.
VLLM_CHUNK_PROMPTS = 256
VLLM_MISSING = (
    "backend 'vllm' was requested but vLLM is not installed. Install it with `pip install vllm` "
    "(or `pip install 'trl-emo[vllm]'`; it needs a CUDA GPU), or use `backend: hf`."
)
_VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)


def derive_seed(base: int, *parts) -> int:
    """A seed for one piece of work, fixed by the base seed and the work's position only."""
    digest = hashlib.sha256(repr((base, *parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


@dataclass(frozen=True)
class Batch:
    """One `generate` call: some prompts, samples [start, stop) of each (or one greedy response)."""

    prompts: tuple[int, ...]
    start: int
    stop: int
    greedy: bool = False

    @property
    def samples(self) -> list:
        return [GREEDY] if self.greedy else list(range(self.start, self.stop))


def plan_batches(num_prompts: int, n: int, batch_size: int, greedy: bool = False) -> list[Batch]:
    """Split the work into `generate` calls of at most `batch_size` sequences.

    Batches are cut at fixed positions, so a resumed run rebuilds exactly the batches (and seeds)
    of an uninterrupted one and samples the same responses.
    """
    if greedy:
        starts = range(0, num_prompts, batch_size)
        return [Batch(tuple(range(s, min(s + batch_size, num_prompts))), 0, 1, True) for s in starts]
    if n <= batch_size:
        per = batch_size // n
        return [Batch(tuple(range(s, min(s + per, num_prompts))), 0, n) for s in range(0, num_prompts, per)]
    return [Batch((p,), s, min(s + batch_size, n)) for p in range(num_prompts) for s in range(0, n, batch_size)]


def end_of_turn_token_id(tokenizer) -> int | None:
    """The id of the special token the chat template writes right after an assistant message, if any."""
    token = find_end_of_turn_token(tokenizer)
    return None if token is None else tokenizer.convert_tokens_to_ids(token)


def stop_token_ids(tokenizer, generation_config, end_of_turn: bool) -> list[int]:
    """Tokenizer EOS, every id of `generation_config.eos_token_id`, and the chat's end-of-turn token."""
    ids = []
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    configured = getattr(generation_config, "eos_token_id", None)
    if configured is not None:
        ids.extend(configured if isinstance(configured, (list, tuple)) else [configured])
    if end_of_turn:
        eot = end_of_turn_token_id(tokenizer)
        if eot is not None:
            ids.append(eot)
    return list(dict.fromkeys(int(i) for i in ids))


def generation_settings(config: EvalConfig, path: str, prompt_set: PromptSet, num_samples: int | None = None) -> dict:
    """Everything that decides which responses are sampled: the cache fingerprint."""
    settings = {
        "policy": file_signature(os.path.expanduser(path)),
        "backend": config.backend,
        "n": config.n if num_samples is None else num_samples,
        "temperature": config.temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens,
        "seed": config.seed,
        "dtype": config.dtype,
        # Under the name it had before training and evaluation shared one vocabulary, so caches written then resume.
        "prompt_format": "chat" if config.prompt_format == "chat_template" else config.prompt_format,
        "stop_at_end_of_turn": config.stop_at_end_of_turn,
        # Only the source: rows are checked prompt by prompt, so raising `max_prompts` reuses them.
        "prompts": {k: prompt_set.source[k] for k in ("prompts", "config", "split", "prompt_column")},
    }
    base = adapter_base(path)
    if base is not None:
        settings["base_model"] = file_signature(os.path.expanduser(base))
    if config.backend == "hf":
        settings["generation_batch_size"] = config.generation_batch_size
    if config.min_new_tokens:  # only when set, so caches written before the field existed stay valid
        settings["min_new_tokens"] = config.min_new_tokens
    return settings


class HFGenerator:
    """Batched sampling with `model.generate`: left padding, several samples per prompt."""

    def __init__(self, path: str, config: EvalConfig, tokenizer):
        import torch

        self.device = resolve_device(config.device)
        dtype = resolve_dtype(config.dtype, self.device)
        path = os.path.expanduser(path)
        adapter_base(path)  # an adapter that names no base: an evaluation error
        # An adapter is merged once (every later forward pass as fast as the base model's), into a base resized to
        # the adapter's tokenizer when the SFT run added tokens.
        model = load_causal_lm(path, dtype, trust_remote_code=config.trust_remote_code)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        # Left padding keeps every prompt's last token next to its first generated token.
        tokenizer.padding_side = "left"
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        self.stop_ids = stop_token_ids(tokenizer, model.generation_config, config.stop_at_end_of_turn)
        if not self.stop_ids:
            raise EvaluationError(f"{path}: the tokenizer has no EOS token and the generation config none either.")
        self.config = config
        self._torch = torch

    def generate(self, prompts: list[str], num_samples: int, seed: int, greedy: bool = False) -> list[list[dict]]:
        """`num_samples` responses for each prompt, as dicts with `text`, `num_tokens`, `finish_reason`."""
        torch = self._torch
        encoded = [encode_once(self.tokenizer, text)["input_ids"] for text in prompts]
        batch = self.tokenizer.pad({"input_ids": encoded}, padding=True, return_tensors="pt").to(self.device)
        kwargs = dict(
            max_new_tokens=self.config.max_new_tokens,
            eos_token_id=self.stop_ids,
            pad_token_id=self.tokenizer.pad_token_id,
        )
        if self.config.min_new_tokens:
            kwargs["min_new_tokens"] = self.config.min_new_tokens
        if greedy:
            kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None, num_return_sequences=1)
        else:
            kwargs.update(
                do_sample=True, temperature=self.config.temperature, top_k=self.config.top_k, top_p=self.config.top_p,
                num_return_sequences=num_samples,
            )
        torch.manual_seed(seed)
        with torch.no_grad():
            output = self.model.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], **kwargs
            )
        generated = output[:, batch["input_ids"].shape[1] :].tolist()
        per_prompt = 1 if greedy else num_samples
        stops = set(self.stop_ids)
        results = []
        for i in range(len(prompts)):
            responses = []
            for tokens in generated[i * per_prompt : (i + 1) * per_prompt]:
                end = next((j for j, t in enumerate(tokens) if t in stops), None)
                kept = tokens if end is None else tokens[: end + 1]
                responses.append(
                    {
                        "text": self.tokenizer.decode(kept, skip_special_tokens=True),
                        "num_tokens": len(kept),
                        "finish_reason": "length" if end is None else "stop",
                    }
                )
            results.append(responses)
        return results

    def close(self) -> None:
        self.model = None


def import_vllm():
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest
    except ImportError as exc:
        raise EvaluationError(VLLM_MISSING) from exc
    return LLM, SamplingParams, LoRARequest


class VLLMGenerator:
    """Sampling with vLLM: `SamplingParams(n=...)` per prompt, each with its own seed; LoRA via `LoRARequest`."""

    def __init__(self, path: str, config: EvalConfig, tokenizer, name: str = "policy"):
        LLM, SamplingParams, LoRARequest = import_vllm()
        path = os.path.expanduser(path)
        base = adapter_base(path)
        kwargs = dict(
            model=os.path.expanduser(base) if base else path,
            tokenizer=tokenizer_location(path),
            dtype=config.dtype,
            seed=config.seed,
            trust_remote_code=config.trust_remote_code,
            gpu_memory_utilization=config.vllm_gpu_memory_utilization,
        )
        self.lora = None
        if base is not None:
            rank = adapter_rank(path)
            # vLLM accepts only some ranks: take the smallest one that fits the adapter.
            max_rank = next((r for r in _VLLM_LORA_RANKS if r >= rank), rank)
            kwargs.update(enable_lora=True, max_loras=1, max_lora_rank=max_rank)
            self.lora = LoRARequest(name, 1, path)
        self.llm = LLM(**kwargs)
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, _generation_config_or_none(base or path), config.stop_at_end_of_turn)
        self.config = config
        self.SamplingParams = SamplingParams

    def generate(
        self, prompts: list[str], num_samples: int, seeds: list[int], greedy: bool = False
    ) -> list[list[dict]]:
        # Token ids, not text: vLLM would add a BOS to a template that already has one.
        inputs = [{"prompt_token_ids": encode_once(self.tokenizer, text)["input_ids"]} for text in prompts]
        common = dict(
            max_tokens=self.config.max_new_tokens, stop_token_ids=self.stop_ids, min_tokens=self.config.min_new_tokens or 0
        )
        if greedy:
            params = [self.SamplingParams(n=1, temperature=0.0, **common)] * len(prompts)
        else:
            params = [
                self.SamplingParams(
                    n=num_samples,
                    temperature=self.config.temperature,
                    top_k=self.config.top_k or -1,  # vLLM's "disabled"
                    top_p=self.config.top_p,
                    seed=seed,
                    **common,
                )
                for seed in seeds
            ]
        outputs = self.llm.generate(inputs, params, lora_request=self.lora, use_tqdm=False)
        return [
            [
                {
                    "text": c.text,
                    "num_tokens": len(c.token_ids),
                    "finish_reason": "length" if c.finish_reason == "length" else "stop",
                }
                for c in output.outputs
            ]
            for output in outputs
        ]

    def close(self) -> None:
        # vLLM keeps its GPU memory until the engine is gone; free what can be freed before the next policy.
        self.llm = None
        try:
            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        except ImportError:
            return
        cleanup_dist_env_and_memory()


def _generation_config_or_none(path: str):
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(path)
    except (OSError, ValueError):
        return None


def open_generation_cache(
    name: str, path: str, config: EvalConfig, prompt_set: PromptSet, num_samples: int | None = None
) -> JsonlCache:
    return JsonlCache(
        os.path.join(config.output_dir, "generations", f"{name}.jsonl"),
        generation_settings(config, path, prompt_set, num_samples),
        key_fields=("model", "prompt_index", "sample"),
        overwrite=config.overwrite,
    )


def generate_for_policy(
    name: str,
    path: str,
    config: EvalConfig,
    prompt_set: PromptSet,
    greedy: bool,
    num_samples: int | None = None,
    render=None,
) -> JsonlCache:
    """Fill the policy's generation cache: `num_samples` samples (default `config.n`) and optionally a greedy
    response per prompt; return the cache. `render(tokenizer, example)` builds the prompt text (default: the
    chat template or the Alpaca prompt, per `prompt_format`)."""
    from tqdm.auto import tqdm

    n = config.n if num_samples is None else num_samples
    if render is None:
        def render(tokenizer, example):
            return render_policy_prompt(tokenizer, example, config.prompt_format)

    cache = open_generation_cache(name, path, config, prompt_set, n)
    tokenizer = load_tokenizer(path, config.trust_remote_code, what=f"Policy {name!r}")
    rendered = [render(tokenizer, e) for e in prompt_set.examples]
    for row in cache.rows.values():
        index = row["prompt_index"]
        if index < len(rendered) and row["prompt"] != rendered[index]:
            raise EvaluationError(
                f"{cache.path}: the cached prompt {index} differs from the current one (the prompt set or the chat "
                "template changed). Use another output_dir or set `overwrite: true`."
            )

    num_prompts = len(prompt_set.examples)
    keys = [(name, i, j) for i in range(num_prompts) for j in range(n)]
    if greedy:
        keys += [(name, i, GREEDY) for i in range(num_prompts)]
    done = sum(key in cache for key in keys)
    if done == len(keys):
        return cache

    if config.backend == "vllm":
        generator = VLLMGenerator(path, config, tokenizer, name=name)
        chunk = VLLM_CHUNK_PROMPTS
        batches = []
        if n:
            batches = [Batch(tuple(range(s, min(s + chunk, num_prompts))), 0, n) for s in range(0, num_prompts, chunk)]
        if greedy:
            batches += plan_batches(num_prompts, 1, VLLM_CHUNK_PROMPTS, greedy=True)
    else:
        generator = HFGenerator(path, config, tokenizer)
        batches = plan_batches(num_prompts, n, config.generation_batch_size) if n else []
        if greedy:
            batches += plan_batches(num_prompts, 1, config.generation_batch_size, greedy=True)

    bar = tqdm(total=len(keys), initial=done, desc=f"generate {name}", unit="seq", disable=not config.progress)
    try:
        for batch in batches:
            batch_keys = [(name, i, j) for i in batch.prompts for j in batch.samples]
            missing = [key for key in batch_keys if key not in cache]
            if not missing:
                continue
            texts = [rendered[i] for i in batch.prompts]
            count = batch.stop - batch.start
            if config.backend == "vllm":
                seeds = [derive_seed(config.seed, "prompt", i) for i in batch.prompts]
                outputs = generator.generate(texts, count, seeds, greedy=batch.greedy)
            else:
                seed = derive_seed(config.seed, "batch", batch.prompts[0], batch.start, batch.greedy)
                outputs = generator.generate(texts, count, seed, greedy=batch.greedy)
            rows = []
            for i, responses in zip(batch.prompts, outputs):
                for j, response in zip(batch.samples, responses):
                    if (name, i, j) in cache:
                        continue
                    example = prompt_set.examples[i]
                    rows.append(
                        {
                            "model": name, "prompt_index": i, "prompt_id": example.id, "sample": j,
                            "prompt": rendered[i], "response": response["text"],
                            "num_tokens": response["num_tokens"], "finish_reason": response["finish_reason"],
                        }
                    )
            cache.append(rows)
            bar.update(len(rows))
    finally:
        bar.close()
        generator.close()
        del generator
    return cache
