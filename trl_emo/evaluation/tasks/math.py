"""Task `math`: MATH problems (GEM's Figure 3): greedy accuracy, MV@k, BoN@k with a reward model, pass@k.

Problems from `HuggingFaceH4/MATH-500` (default), `EleutherAI/hendrycks_math` or a local file of
either schema (`problem`, and `answer` or a worked `solution` whose last `\\boxed{}` is the
answer). Each response's final answer is its last `\\boxed{}` (else its last line) and is
compared with the gold answer by `math-verify`; equivalent answers are one answer for majority
voting. Verdicts are cached in `verdicts/<model>.jsonl` (one prompt at a time), so a resumed or
re-summarized run does not check answers again.
"""

from __future__ import annotations

import hashlib
import json
import os

from .. import metrics
from ..errors import EvaluationError
from ..generation import GREEDY
from ..math_answers import Equivalence, cluster_answers, extract_math_answer, import_math_verify, math_gold
from ..prompts import PROMPT_COLUMNS, PromptSet, load_prompt_set
from ..task_registry import register_task
from .base import EvalTask, GenerationPlan, ModelRun
from .common import (
    diversity,
    diversity_rows,
    package_version,
    response_rows,
    response_stats,
    reward_text,
    sampling_settings,
    sampling_text,
)

# Part of the verdict cache's settings: bump when extraction or clustering changes.
ANSWER_RULES = "one-final-answer/v2"


def math_verdicts(texts: list[str], gold: str | None, equivalent: Equivalence) -> list[tuple[str | None, bool]]:
    """Each response's final answer (`extract_math_answer`: one final answer or None) and whether math-verify finds it
    equivalent to `gold`: the verdicts this task caches, and the `math_answer` reward's."""
    answers = [extract_math_answer(text) for text in texts]
    return [(answer, equivalent(gold, answer)) for answer in answers]


def math_answer_column(rows: list[dict], columns: list[str]) -> str | None:
    """MATH-500's `answer`, else the worked `solution` (hendrycks_math), whose last `\\boxed{}` is taken."""
    return next((c for c in ("answer", "solution") if c in columns), None)


@register_task
class MathTask(EvalTask):
    name = "math"
    title = "MATH: greedy accuracy, MV@k and BoN@k"
    # GEM (Appendix D.3): MATH is sampled like GSM8K, 32 responses at temperature 0.6, top-k 50, top-p 0.9.
    # The paper gives no length for MATH; its solutions run longer than GSM8K's, hence 1024 new tokens.
    defaults = {
        "prompts": "HuggingFaceH4/MATH-500", "n": 32, "temperature": 0.6, "top_k": 50,
        "top_p": 0.9, "max_new_tokens": 1024,
    }
    ignores = ("reference_column", "k_values")

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        return {
            "reference_column": " (there is no win rate; gold answers come from `answer_column`)",
            "k_values": " (its k are `math_k_values`)",
        }.get(name, "")

    def check(self) -> None:
        import_math_verify()

    def load_examples(self) -> PromptSet:
        examples = load_prompt_set(
            self.config, find_answer_column=math_answer_column, parse_gold=math_gold,
            prompt_columns=("problem", *PROMPT_COLUMNS),
        )
        if self.config.answer_column is None:
            # A file mixing both schemas: rows without `answer` take their solution's boxed answer.
            for example in examples.examples:
                if example.gold is None and example.row.get("solution"):
                    example.gold = math_gold(example.row["solution"])
        if not examples.has_gold:
            raise EvaluationError(
                f"{self.config.prompts!r} has no gold answers: task 'math' needs an `answer` or `solution` column "
                "(or name one with `answer_column`)."
            )
        return examples

    def generation_plan(self, examples: PromptSet) -> GenerationPlan:
        return GenerationPlan(self.config.n, True if self.config.greedy is None else self.config.greedy)

    def post_process(self, run: ModelRun, examples: PromptSet) -> None:
        from tqdm.auto import tqdm

        plan = self.generation_plan(examples)
        golds = [e.gold for e in examples.examples]
        settings = {
            "generations": run.generations.fingerprint,
            "golds": hashlib.sha256(json.dumps(golds).encode()).hexdigest()[:16],
            "math_verify": package_version("math-verify"),
            "answer_rules": ANSWER_RULES,
        }
        cache = self.open_cache("verdicts", run, settings)
        equivalent = Equivalence()
        samples = list(range(plan.num_samples)) + ([GREEDY] if plan.greedy else [])
        todo = [i for i in range(len(golds)) if any((run.name, i, j) not in cache for j in samples)]
        for i in tqdm(todo, desc=f"check answers {run.name}", unit="prompt", disable=not self.config.progress):
            texts = [run.generations.rows[(run.name, i, j)]["response"] for j in range(plan.num_samples)]
            verdicts = math_verdicts(texts, golds[i], equivalent)
            labels = cluster_answers([answer for answer, _ in verdicts], equivalent)
            rows = [
                {"model": run.name, "prompt_index": i, "sample": j, "answer": answer, "cluster": label,
                 "correct": correct}
                for j, ((answer, correct), label) in enumerate(zip(verdicts, labels))
            ]
            if plan.greedy:
                ((answer, correct),) = math_verdicts(
                    [run.generations.rows[(run.name, i, GREEDY)]["response"]], golds[i], equivalent
                )
                rows.append(
                    {"model": run.name, "prompt_index": i, "sample": GREEDY, "answer": answer, "cluster": None,
                     "correct": correct}
                )
            cache.append(rows)
        run.extra["verdicts"] = cache

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        config = self.config
        plan = self.generation_plan(examples)
        n, num_prompts = plan.num_samples, len(examples.examples)
        verdicts = run.extra["verdicts"].rows
        kept = [i for i, e in enumerate(examples.examples) if e.gold is not None]
        rows = [[verdicts[(run.name, i, j)] for j in range(n)] for i in kept]
        correct = [[r["correct"] for r in row] for row in rows]
        labels = [[r["cluster"] for r in row] for row in rows]
        # A cluster's verdict is its first member's (members are equivalent to it).
        label_correct = [{} for _ in rows]
        for row, verdict in zip(rows, label_correct):
            for r in row:
                if r["cluster"] is not None:
                    verdict.setdefault(r["cluster"], r["correct"])
        greedy = [verdicts[(run.name, i, GREEDY)]["correct"] for i in kept] if plan.greedy else None
        rewards = None
        if run.rewards is not None:
            matrix = run.reward_matrix(num_prompts, n)
            rewards = [matrix[i] for i in kept]
        result = {
            "num_prompts": num_prompts,
            "responses": response_stats(run, [(run.name, i, j) for i in range(num_prompts) for j in range(n)]),
            "math": metrics.answer_metrics(correct, labels, label_correct, config.math_k_values, greedy, rewards),
        }
        result["math"]["no_answer_percent"] = 100.0 * sum(r["answer"] is None for row in rows for r in row) / (
            len(rows) * n
        )
        if config.diversity or config.embedding_diversity:
            result["diversity"] = diversity(run.samples(num_prompts, n), config)
        return result

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        return {
            **sampling_settings(config),
            "reward_model": config.reward_model, "prompts": examples.source, "math_k_values": config.math_k_values,
            "equivalence": f"math-verify {package_version('math-verify')}",
        }

    def header(self, summary: dict) -> str:
        settings = summary["settings"]
        prompts = settings["prompts"]
        return (
            f"# {self.title}\n\n{prompts.get('num_prompts')} problems from `{prompts.get('prompts')}`, "
            f"{sampling_text(settings)}, {reward_text(settings)}; answers from `\\boxed{{}}` (else the last line), "
            f"equivalence by {settings['equivalence']}.\n"
        )

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]

        def value(key):
            return [m["math"].get(key) for m in models.values()]

        first_k = [("greedy accuracy", value("greedy_accuracy")), ("sample accuracy", value("sample_accuracy"))]
        first_k += self._rows(models, "mv", "MV")
        first_k += self._rows(models, "bon_first_k", "BoN (reward model)")
        first_k += self._rows(models, "pass_first_k", "pass")
        subsets = self._rows(models, "mv_subsets", "MV") + self._rows(models, "bon_unbiased", "BoN (reward model)")
        subsets += self._rows(models, "pass_unbiased", "pass")
        return [
            ("MATH accuracy, % (GEM Figure 3: greedy, MV@k, BoN@k; first k samples)", first_k),
            ("MATH accuracy, % (average over k-subsets of the n samples)", subsets),
            ("Diversity (×100, higher = more diverse)", diversity_rows(models)),
            ("Responses", response_rows(models) + [("no final answer, %", value("no_answer_percent"))]),
        ]

    @staticmethod
    def _rows(models: dict, key: str, label: str) -> list:
        ks = next((m["math"]["k"] for m in models.values()), [])
        if not any(key in m["math"] for m in models.values()):
            return []
        return [
            (f"{label}@{k}", [m["math"][key][i] if key in m["math"] else None for m in models.values()])
            for i, k in enumerate(ks)
        ]

    def plot(self, summary: dict, output_dir: str) -> None:
        from ..report import plot_accuracy_bars

        models = summary["models"]
        k = max(next(iter(models.values()))["math"]["k"])
        bars = {"greedy": "greedy_accuracy", f"MV@{k}": "mv", f"BoN@{k}": "bon_first_k", f"pass@{k}": "pass_first_k"}
        values = {}
        for label, key in bars.items():
            column = [m["math"].get(key) for m in models.values()]
            column = [v[-1] if isinstance(v, list) else v for v in column]
            if any(v is not None for v in column):
                values[label] = column
        plot_accuracy_bars(list(models), values, "MATH accuracy, %", os.path.join(output_dir, "math.png"))

