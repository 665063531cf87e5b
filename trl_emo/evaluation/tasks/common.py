"""Summary pieces several tasks share: response statistics, diversity, and their summary.md rows."""

from __future__ import annotations

from .. import metrics
from ..config import EvalConfig
from ..errors import EvaluationError
from .base import ModelRun

DIVERSITY_LABELS = (
    ("distinct_n", "distinct-n (n=1,2,3)"), ("cross_sample_distinct_n", "cross-sample distinct-n"),
    ("self_bleu", "self-BLEU diversity"), ("embedding", "embedding diversity"),
)


def sampling_settings(config: EvalConfig) -> dict:
    """The sampling fields every generating task reports (and its caches are keyed on), in one order."""
    return {
        "n": config.n, "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens, "seed": config.seed, "backend": config.backend,
    }


def sampling_text(settings: dict) -> str:
    """The sampling settings as a report header states them."""
    return (
        f"n = {settings['n']}, temperature {settings['temperature']}, top-k {settings['top_k']}, "
        f"top-p {settings['top_p']}"
    )


def reward_text(settings: dict) -> str:
    return f"reward model `{settings['reward_model']}`" if settings["reward_model"] else "no reward model"


def response_stats(run: ModelRun, keys) -> dict:
    """Mean length and share of responses cut by `max_new_tokens`, over the generation rows `keys`."""
    rows = [run.generations.rows[key] for key in keys]
    return {
        "mean_tokens": sum(r["num_tokens"] for r in rows) / len(rows),
        "truncated_percent": 100.0 * sum(r["finish_reason"] == "length" for r in rows) / len(rows),
    }


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
        from ..embeddings import embed

        flat = [text for row in responses for text in row]
        vectors = embed(flat, config.embedding_model, device=config.device, progress=config.progress)
        width = len(responses[0])
        out["embedding"] = metrics.mean_ignoring_none(
            metrics.embedding_diversity(vectors[i * width : (i + 1) * width]) for i in range(len(responses))
        )
    return out


def curve_rows(models: dict, key: str, label: str, estimator: str, section: str | None = None) -> list[tuple]:
    """Rows `label@k` of the curve `models[m][key][estimator]` (or `models[m][section][key]...`)."""

    def get(model):
        holder = model.get(section, {}) if section else model
        return holder.get(key)

    def has(model):
        return bool(get(model)) and estimator in get(model)

    ks = next((get(m)["k"] for m in models.values() if has(m)), [])
    return [
        (f"{label}@{k}", [get(m)[estimator][i] if has(m) else None for m in models.values()])
        for i, k in enumerate(ks)
    ]


def diversity_rows(models: dict) -> list[tuple]:
    return [
        (label, [m.get("diversity", {}).get(key) for m in models.values()])
        for key, label in DIVERSITY_LABELS
        if any(key in m.get("diversity", {}) for m in models.values())
    ]


def response_rows(models: dict) -> list[tuple]:
    return [
        ("mean tokens", [m["responses"]["mean_tokens"] for m in models.values()]),
        ("truncated, %", [m["responses"]["truncated_percent"] for m in models.values()]),
    ]


def package_version(package: str) -> str:
    """The installed version of `package` (recorded in cache settings and summaries), or "unknown"."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "unknown"
