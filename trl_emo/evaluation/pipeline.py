"""The evaluation from end to end: generate, score, compute metrics, write the reports.

Phases run one after another so that only one model is in memory at a time: every policy's
generations first (each freed before the next is loaded), then the reward model over all of
them, then the metrics. Each phase skips what its JSONL cache already holds.
"""

from __future__ import annotations

import os

from . import metrics
from .config import EvalConfig, EvaluationError
from .generation import GREEDY, generate_for_policy, import_vllm
from .loading import adapter_base, check_model_source, free_memory
from .prompts import PromptSet, load_prompt_set
from .report import write_reports
from .scoring import REFERENCE, LazyRewardModel, score_policy, score_references


def check_models(config: EvalConfig) -> None:
    """Fail before any work on what can be known to be missing: model folders, vLLM."""
    if config.backend == "vllm":
        import_vllm()
    for name, path in config.policies.items():
        check_model_source(path, f"Policy {name!r}")
        base = adapter_base(os.path.expanduser(path)) if os.path.isdir(os.path.expanduser(path)) else None
        if base is not None:
            check_model_source(base, f"Base model of the LoRA adapter {name!r}")
    if config.reward_model:
        check_model_source(config.reward_model, "Reward model")


def run_evaluation(config: EvalConfig) -> dict:
    """Run (or resume) the evaluation described by `config`; return the summary written to summary.json."""
    check_models(config)
    prompt_set = load_prompt_set(config)
    greedy = prompt_set.has_gold if config.greedy is None else config.greedy
    os.makedirs(config.output_dir, exist_ok=True)

    generations = {}
    for name, path in config.policies.items():
        generations[name] = generate_for_policy(name, path, config, prompt_set, greedy)
        free_memory()

    rewards, reference = {}, None
    if config.reward_model:
        reward_model = LazyRewardModel(config)
        try:
            for name in config.policies:
                rewards[name] = score_policy(name, generations[name], reward_model, config, prompt_set)
            if prompt_set.has_references:
                reference = score_references(reward_model, config, prompt_set)
        finally:
            reward_model.close()
            free_memory()

    summary = summarize(config, prompt_set, generations, rewards, reference, greedy)
    write_reports(summary, config.output_dir, plot=config.plot)
    return summary


def summarize(
    config: EvalConfig, prompt_set: PromptSet, generations: dict, rewards: dict, reference, greedy: bool
) -> dict:
    """Every metric of every model, from the cached generations and rewards."""
    num_prompts = len(prompt_set.examples)
    summary = {
        "settings": {
            "n": config.n, "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
            "max_new_tokens": config.max_new_tokens, "seed": config.seed, "backend": config.backend,
            "reward_model": config.reward_model, "prompts": prompt_set.source, "k_values": config.k_values,
            "math_k_values": config.math_k_values,
        },
        "models": {},
    }
    for name, path in config.policies.items():
        cached = generations[name].rows
        responses = [[cached[(name, i, j)]["response"] for j in range(config.n)] for i in range(num_prompts)]
        rows = [cached[(name, i, j)] for i in range(num_prompts) for j in range(config.n)]
        result = {
            "policy": path,
            "num_prompts": num_prompts,
            "responses": {
                "mean_tokens": sum(r["num_tokens"] for r in rows) / len(rows),
                "truncated_percent": 100.0 * sum(r["finish_reason"] == "length" for r in rows) / len(rows),
            },
        }
        if name in rewards:
            scored = rewards[name].rows
            matrix = [[scored[(name, i, j)]["reward"] for j in range(config.n)] for i in range(num_prompts)]
            result["bon"] = metrics.bon_curve(matrix, config.k_values)
            result["mean"] = metrics.mean_curve(matrix, config.k_values)
            if reference is not None:
                kept = [i for i in range(num_prompts) if (REFERENCE, i, 0) in reference.rows]
                reference_rewards = [reference.rows[(REFERENCE, i, 0)]["reward"] for i in kept]
                policy_rewards = [matrix[i] for i in kept]
                result["win_rate"] = metrics.win_rate_curve(policy_rewards, reference_rewards, config.k_values)
                result["win_rate"]["num_prompts"] = len(kept)
        if config.diversity or config.embedding_diversity:
            result["diversity"] = diversity(responses, config)
        if prompt_set.has_gold:
            answers = [[metrics.extract_answer(text) for text in row] for row in responses]
            greedy_answers = None
            if greedy:
                greedy_texts = [cached[(name, i, GREEDY)]["response"] for i in range(num_prompts)]
                greedy_answers = [metrics.extract_answer(text) for text in greedy_texts]
            result["gsm8k"] = metrics.gsm8k_metrics(
                answers, [e.gold for e in prompt_set.examples], config.math_k_values, greedy=greedy_answers
            )
        summary["models"][name] = result
    return summary


def diversity(responses: list[list[str]], config: EvalConfig) -> dict:
    """Diversity of the n responses per prompt, averaged over prompts (×100, higher = more diverse)."""
    out = {}
    if config.diversity:
        out["distinct_n"] = float(sum(metrics.ngram_diversity(row) for row in responses) / len(responses))
        for order in (1, 2, 3):
            out[f"distinct_{order}"] = float(sum(metrics.distinct_n(row, order) for row in responses) / len(responses))
        out["cross_sample_distinct_n"] = metrics.mean_ignoring_none(
            metrics.cross_sample_ngram_diversity(row) for row in responses
        )
        try:
            out["self_bleu"] = metrics.mean_ignoring_none(metrics.self_bleu_diversity(row) for row in responses)
        except ImportError as exc:
            raise EvaluationError("Self-BLEU needs `pip install sacrebleu` (or set `diversity: false`).") from exc
    if config.embedding_diversity:
        from .embeddings import embed

        flat = [text for row in responses for text in row]
        vectors = embed(flat, config.embedding_model, device=config.device, progress=config.progress)
        width = len(responses[0])
        out["embedding"] = metrics.mean_ignoring_none(
            metrics.embedding_diversity(vectors[i * width : (i + 1) * width]) for i in range(len(responses))
        )
    return out
