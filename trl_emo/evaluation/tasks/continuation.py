"""Task `continuation`: open-ended continuation of held-out text (EMO Section 4.1, Table 1).

Each eligible held-out text (a row of the corpus's test split with enough words; WikiText headings
skipped) gives a prefix of the corpus's length in words (Table 4) and the human continuation, the
next `max_new_tokens` words. The policy continues the raw prefix by ancestral sampling (temperature
1, no top-k, no top-p), `n` times (the paper: 5), exactly `max_new_tokens` tokens each (the stop
tokens are suppressed before that, as the authors' script does). Metrics, per model:

- MAUVE (×100) of the n sampling repeats against the human texts (prefix + continuation on both
  sides, as the paper), with its mean and spread over the repeats; features by `mauve_featurizer`
  (default GPT-2 large) and the score by the `mauve-text` package.
- held-out perplexity: the split's documents with one EOS each, concatenated and cut into blocks of
  `continuation_block_size` tokens (what training sees), exp of the mean token NLL.
- distinct-n (distinct n-grams / all n-grams over all continuations of a repeat, n = 1..3) and
  repetition rate rep-n (repeated n-grams within a continuation, n = 2..4), with the human
  continuations' values as the reference.

Caches: `generations/`, `perplexity/<model>.jsonl` (per batch of blocks), `mauve/<model>.jsonl` (per
repeat) and the features in `mauve/_features/` (per text set), so a resumed run redoes nothing.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics

from ...core.errors import ConfigError, HubSource
from ...data.plain_text import CORPORA, documents_from_rows, find_corpus, is_wikitext_heading
from ...data.schemas import DataError
from ...models.hub_ids import model_sources
from .. import metrics
from ..errors import EvaluationError
from ..prompts import PromptExample, PromptSet, is_local, read_rows
from ..report import fmt, table_lines
from ..task_registry import register_task
from .base import EvalTask, GenerationPlan, ModelRun
from .common import package_version

DEFAULT_PROMPTS = "Salesforce/wikitext"
DEFAULT_CONFIG = "wikitext-103-raw-v1"
DISTINCT_ORDERS = (1, 2, 3)
REPETITION_ORDERS = (2, 3, 4)
# Part of the caches' settings: bump when prefix extraction or the perplexity blocks change.
RULES = "words-prefix/v1"


def repetition_rate(text: str, order: int) -> float:
    """rep-n: the share of the text's n-grams that repeat an earlier one, ×100 (0 without any n-gram)."""
    grams = metrics.ngrams(metrics.words(text), order)
    return 100.0 * (1 - len(set(grams)) / len(grams)) if grams else 0.0


def text_metrics(repeats: list[list[str]]) -> dict:
    """distinct-n over each repeat's texts (averaged over repeats) and rep-n averaged over all texts."""
    out = {}
    for order in DISTINCT_ORDERS:
        out[f"distinct_{order}"] = statistics.fmean(metrics.distinct_n(texts, order) for texts in repeats)
    flat = [text for texts in repeats for text in texts]
    for order in REPETITION_ORDERS:
        out[f"rep_{order}"] = statistics.fmean(repetition_rate(text, order) for text in flat)
    return out


def join_continuation(prefix: str, continuation: str) -> str:
    """The prefix and its continuation as one text (a space between, unless the continuation brings one)."""
    if not continuation or continuation[0].isspace():
        return prefix + continuation
    return f"{prefix} {continuation}"


@register_task
class ContinuationTask(EvalTask):
    name = "continuation"
    title = "Open-ended continuation: MAUVE, perplexity, distinct-n, repetition (EMO Table 1)"
    # Section 4.1.1: ancestral ("unbiased") sampling, 5 samples per prefix.
    defaults = {"prompts": DEFAULT_PROMPTS, "n": 5, "temperature": 1.0, "top_k": 0, "top_p": 1.0}
    ignores = (
        "reward_model", "greedy", "k_values", "math_k_values", "reference_column", "answer_column", "diversity",
        "embedding_diversity", "embedding_model",
    )
    fields = (
        "continuation_corpus", "continuation_prefix_words", "continuation_perplexity", "continuation_block_size",
        "mauve", "mauve_featurizer",
    )

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        if name in ("reward_model", "k_values", "math_k_values", "greedy"):
            return " (it scores samples with MAUVE, not a reward model)"
        if name in ("diversity", "embedding_diversity", "embedding_model"):
            return " (it reports distinct-n and repetition rates of the continuations)"
        return ""

    @classmethod
    def hub_sources(cls, config) -> list[HubSource]:
        """Those of any task, and MAUVE's featurizer when MAUVE is on."""
        from ..mauve_score import DEFAULT_FEATURIZER

        sources = super().hub_sources(config)
        if config.mauve:
            sources += model_sources("mauve_featurizer", config.mauve_featurizer or DEFAULT_FEATURIZER)
        return sources

    @classmethod
    def check_config(cls, config) -> None:
        if config.prompts == DEFAULT_PROMPTS and config.prompts_config is None:
            config.prompts_config = DEFAULT_CONFIG
        try:
            corpus = find_corpus(config.prompts, config.prompts_config, config.continuation_corpus or "auto")
        except DataError as exc:
            raise ConfigError(f"continuation_corpus: {exc}") from None
        if config.continuation_prefix_words is None:
            config.continuation_prefix_words = corpus.prefix_words if corpus else 20
        if config.max_new_tokens is None:
            config.max_new_tokens = corpus.generation_length if corpus else 80
        if config.min_new_tokens is None:
            config.min_new_tokens = config.max_new_tokens  # the authors' script forces the full length
        for name in ("continuation_prefix_words", "continuation_block_size"):
            value = getattr(config, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name.endswith("words") else 2):
                raise ConfigError(f"{name} must be a positive integer; got {value!r}.")
        if config.min_new_tokens > config.max_new_tokens:
            raise ConfigError(
                f"min_new_tokens ({config.min_new_tokens}) is larger than max_new_tokens ({config.max_new_tokens})."
            )
        for name in ("continuation_perplexity", "mauve"):
            if not isinstance(getattr(config, name), bool):
                raise ConfigError(f"{name} must be true or false; got {getattr(config, name)!r}.")

    def check(self) -> None:
        if self.config.mauve:
            from ..loading import check_model_source
            from ..mauve_score import DEFAULT_FEATURIZER, check_featurizer, import_mauve

            import_mauve()
            name = self.config.mauve_featurizer or DEFAULT_FEATURIZER
            check_model_source(name, "MAUVE featurizer")
            check_featurizer(name, self.config.trust_remote_code)  # before hours of sampling, not after

    # ------------------------------------------------------------------ prefixes

    def corpus(self):
        config = self.config
        return find_corpus(config.prompts, config.prompts_config, config.continuation_corpus or "auto")

    def load_examples(self) -> PromptSet:
        config = self.config
        rows = read_rows(config.prompts, config.prompts_config, config.prompts_split)
        if not rows:
            raise EvaluationError(f"The prompt set {config.prompts!r} is empty.")
        corpus = self.corpus()
        columns = list(rows[0])
        column = config.prompt_column or (corpus.text_column if corpus and corpus.text_column in columns else None)
        column = column or ("text" if "text" in columns else (columns[0] if len(columns) == 1 else None))
        if column is None or column not in columns:
            raise EvaluationError(
                f"No text column in {config.prompts!r}: it has columns {columns}; name one with `prompt_column`."
            )
        texts = [row.get(column) or "" for row in rows]
        self.documents = documents_from_rows(texts, corpus.documents if corpus else "rows")
        prefix_words, length = config.continuation_prefix_words, config.max_new_tokens
        examples = []
        for index, text in enumerate(texts):
            if is_wikitext_heading(text):
                continue
            words = text.split()
            if len(words) < prefix_words + length:
                continue
            prefix = " ".join(words[:prefix_words])
            examples.append(
                PromptExample(
                    index=len(examples), id=str(index), messages=[{"role": "user", "content": prefix}],
                    instruction=prefix, reference=" ".join(words[prefix_words : prefix_words + length]),
                    row={"row": index},
                )
            )
            if config.max_prompts is not None and len(examples) == config.max_prompts:
                break
        if not examples:
            raise EvaluationError(
                f"No text of {config.prompts!r} (column {column!r}) has the {prefix_words} + {length} words a prefix and "
                "its human continuation need; lower `continuation_prefix_words` or `max_new_tokens`."
            )
        location = os.path.abspath(os.path.expanduser(config.prompts)) if is_local(config.prompts) else config.prompts
        source = {
            "prompts": location, "config": config.prompts_config, "split": config.prompts_split,
            "prompt_column": column, "reference_column": None, "answer_column": None,
            "num_prompts": len(examples), "corpus": corpus.name if corpus else None,
        }
        return PromptSet(examples=examples, source=source)

    def render_prompt(self, tokenizer, example: PromptExample) -> str:
        return example.instruction  # a base model continues the raw text; no template

    # ------------------------------------------------------------------ per policy

    def generation_plan(self, examples: PromptSet) -> GenerationPlan:
        return GenerationPlan(self.config.n, False)

    def needs_reward_model(self) -> bool:
        return False

    def run_policy(self, run: ModelRun, examples: PromptSet) -> None:
        super().run_policy(run, examples)
        if self.config.continuation_perplexity:
            run.extra["perplexity"] = self._perplexity(run)

    def _perplexity(self, run: ModelRun):
        from tqdm.auto import tqdm

        from ..likelihood import load_causal_lm, policy_signature, token_nlls

        config = self.config
        block_size = config.continuation_block_size
        digest = hashlib.sha256(json.dumps(self.documents).encode()).hexdigest()[:16]
        settings = {**policy_signature(run.path), "dtype": config.dtype, "block_size": block_size,
                    "documents": digest, "rules": RULES}
        cache = self.open_cache("perplexity", run, settings, key_fields=("model", "batch"))
        batch_size = config.scoring_batch_size
        # How many blocks there are depends on the tokenizer: a complete cache says so in its "last" row.
        if any(row.get("last") for row in cache.rows.values()):
            return cache
        model, tokenizer = load_causal_lm(run.path, config)
        eos = tokenizer.eos_token or ""
        stream: list[int] = []
        for document in self.documents:  # one EOS per document, as TRL appends it in training
            stream.extend(tokenizer(document + eos)["input_ids"])
        blocks = [stream[i : i + block_size] for i in range(0, len(stream), block_size)]
        blocks = [block for block in blocks if len(block) > 1]
        batches = range(0, len(blocks), batch_size)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        try:
            for number, start in enumerate(tqdm(batches, desc=f"perplexity {run.name}", unit="batch",
                                                disable=not config.progress)):
                if (run.name, number) in cache:
                    continue
                nlls = token_nlls(model, blocks[start : start + batch_size], batch_size, pad)
                cache.append([{
                    "model": run.name, "batch": number, "nll": float(sum(sum(row) for row in nlls)),
                    "tokens": sum(len(row) for row in nlls), "last": start + batch_size >= len(blocks),
                }])
        finally:
            del model
        return cache

    def post_process(self, run: ModelRun, examples: PromptSet) -> None:
        if not self.config.mauve:
            return
        from ..mauve_score import mauve_score

        config = self.config
        n, num_prompts = config.n, len(examples.examples)
        samples = run.samples(num_prompts, n)
        featurizer = self._featurizer()
        humans = self.human_texts(examples)
        settings = {
            "generations": run.generations.fingerprint, **featurizer.signature,
            "human": hashlib.sha256(json.dumps(humans).encode()).hexdigest()[:16],
            "mauve_text": package_version("mauve-text"),
        }
        cache = self.open_cache("mauve", run, settings, key_fields=("model", "sample"))
        human_features = None
        for j in range(n):
            if (run.name, j) in cache:
                continue
            texts = [join_continuation(e.instruction, samples[i][j]) for i, e in enumerate(examples.examples)]
            if human_features is None:  # featurized once for every model (kept on disk)
                human_features = featurizer(humans, desc="featurize human texts")
            model_features = featurizer(texts, desc=f"featurize {run.name} #{j}")
            cache.append([{"model": run.name, "sample": j, **mauve_score(human_features, model_features)}])
        run.extra["mauve"] = cache

    def _featurizer(self):
        if getattr(self, "_features", None) is None:
            from ..mauve_score import Featurizer

            folder = os.path.join(self.config.output_dir, "mauve", "_features")
            self._features = Featurizer(self.config.mauve_featurizer, self.config, folder)
        return self._features

    @staticmethod
    def human_texts(examples: PromptSet) -> list[str]:
        return [join_continuation(e.instruction, " " + e.reference) for e in examples.examples]

    # ------------------------------------------------------------------ metrics and reports

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        config = self.config
        n, num_prompts = config.n, len(examples.examples)
        samples = run.samples(num_prompts, n)
        repeats = [[samples[i][j] for i in range(num_prompts)] for j in range(n)]
        rows = [run.generations.rows[(run.name, i, j)] for i in range(num_prompts) for j in range(n)]
        result = {
            "num_prompts": num_prompts,
            "continuation": text_metrics(repeats),
            "responses": {"mean_tokens": statistics.fmean(r["num_tokens"] for r in rows)},
        }
        if "mauve" in run.extra:
            scores = [run.extra["mauve"].rows[(run.name, j)]["mauve"] for j in range(n)]
            result["mauve"] = {
                "mean": statistics.fmean(scores), "std": statistics.stdev(scores) if n > 1 else 0.0,
                "min": min(scores), "max": max(scores), "per_sample": scores,
                "num_buckets": run.extra["mauve"].rows[(run.name, 0)]["num_buckets"],
            }
        if "perplexity" in run.extra:
            parts = list(run.extra["perplexity"].rows.values())
            nll, tokens = sum(p["nll"] for p in parts), sum(p["tokens"] for p in parts)
            result["perplexity"] = {"perplexity": math.exp(nll / tokens), "nll": nll / tokens, "tokens": tokens}
        return result

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        from ..mauve_score import DEFAULT_FEATURIZER

        humans = [e.reference for e in examples.examples]
        return {
            "corpus": examples.source.get("corpus"), "prefix_words": config.continuation_prefix_words,
            "max_new_tokens": config.max_new_tokens, "min_new_tokens": config.min_new_tokens, "n": config.n,
            "temperature": config.temperature, "top_k": config.top_k, "top_p": config.top_p, "seed": config.seed,
            "backend": config.backend, "prompts": examples.source,
            "mauve_featurizer": (config.mauve_featurizer or DEFAULT_FEATURIZER) if config.mauve else None,
            "mauve_text": package_version("mauve-text") if config.mauve else None,
            "perplexity_block_size": config.continuation_block_size if config.continuation_perplexity else None,
            "human": text_metrics([humans]),
        }

    def header(self, summary: dict) -> str:
        s = summary["settings"]
        corpus = f" ({s['corpus']})" if s["corpus"] else ""
        mauve = f"MAUVE features by `{s['mauve_featurizer']}`" if s["mauve_featurizer"] else "no MAUVE"
        return (
            f"# {self.title}\n\n{s['prompts']['num_prompts']} held-out prefixes of {s['prefix_words']} words from "
            f"`{s['prompts']['prompts']}`{corpus}, {s['n']} continuations each of {s['max_new_tokens']} tokens by "
            f"ancestral sampling (temperature {s['temperature']}, top-k {s['top_k']}, top-p {s['top_p']}); {mauve}, "
            "against the human continuations (the next words of the same text).\n"
        )

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]
        n = summary["settings"]["n"]
        human = summary["settings"]["human"]
        distinct = [f"distinct-{k}" for k in DISTINCT_ORDERS]
        repetition = [f"rep-{k}" for k in REPETITION_ORDERS]
        header = ["model", f"MAUVE (mean ± std, {n} samples)", "perplexity", *distinct, *repetition]
        rows = []

        def row(name, mauve, ppl, values):
            cells = [name, mauve, ppl] + [fmt(values[f"distinct_{k}"]) for k in DISTINCT_ORDERS]
            return cells + [fmt(values[f"rep_{k}"]) for k in REPETITION_ORDERS]

        for name, model in models.items():
            mauve = f"{model['mauve']['mean']:.2f} ± {model['mauve']['std']:.2f}" if "mauve" in model else "–"
            ppl = fmt(model["perplexity"]["perplexity"]) if "perplexity" in model else "–"
            rows.append(row(name, mauve, ppl, model["continuation"]))
        rows.append(row("human continuations", "–", "–", human))
        table = "\n".join(table_lines(header, rows))
        sections = [("Continuations (EMO Table 1: MAUVE ×100; distinct-n and rep-n in %)", table)]
        if any("mauve" in m for m in models.values()):
            per_sample = [
                (f"MAUVE, sample {j}", [m["mauve"]["per_sample"][j] if "mauve" in m else None for m in models.values()])
                for j in range(n)
            ]
            sections.append(("MAUVE per sampling repeat", per_sample))
        return sections


def corpus_table() -> str:
    """Table 4 as Markdown (for the docs and `--help` readers)."""
    lines = ["| corpus | Hub id (config) | text column | prefix words | generated tokens |", "|---|---|---|---:|---:|"]
    for corpus in CORPORA.values():
        hub = f"`{corpus.hub_ids[0]}`" + (f" (`{corpus.config}`)" if corpus.config else "") if corpus.hub_ids else "local files"
        lines.append(f"| {corpus.name} | {hub} | `{corpus.text_column}` | {corpus.prefix_words} | {corpus.generation_length} |")
    return "\n".join(lines)
