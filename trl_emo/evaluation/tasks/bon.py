"""Task `bon` (the default): best-of-n under a reward model, win rate, diversity, and GSM8K metrics.

`n` samples per prompt (plus a greedy response when gold answers exist), rewards from one
off-the-shelf reward model, and every metric of docs/evaluation.md computed from the caches.
"""

from __future__ import annotations

from .. import metrics
from ..errors import EvaluationError
from ..final_answers import read_gsm8k
from ..math_answers import Equivalence
from ..prompts import PromptSet
from ..scoring import REFERENCE, score_references
from ..task_registry import register_task
from .base import EvalTask, GenerationPlan, ModelRun
from .common import (
    curve_rows,
    diversity,
    diversity_rows,
    response_rows,
    response_stats,
    reward_text,
    sampling_settings,
    sampling_text,
)


@register_task
class BonTask(EvalTask):
    name = "bon"
    title = "Best-of-n evaluation"
    defaults = {"n": 32, "temperature": 0.6, "top_k": 50, "top_p": 0.9, "max_new_tokens": 512}

    def __init__(self, config):
        super().__init__(config)
        self.reference = None

    def generation_plan(self, examples: PromptSet) -> GenerationPlan:
        greedy = examples.has_gold if self.config.greedy is None else self.config.greedy
        return GenerationPlan(self.config.n, greedy)

    def score_rewards(self, runs, reward_model, examples: PromptSet) -> None:
        super().score_rewards(runs, reward_model, examples)
        if examples.has_references:
            self.reference = score_references(reward_model, self.config, examples)

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        return {
            **sampling_settings(config),
            "reward_model": config.reward_model, "prompts": examples.source, "k_values": config.k_values,
            "math_k_values": config.math_k_values,
        }

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        config = self.config
        name, n = run.name, config.n
        num_prompts = len(examples.examples)
        responses = run.samples(num_prompts, n)
        result = {
            "num_prompts": num_prompts,
            "responses": response_stats(run, [(name, i, j) for i in range(num_prompts) for j in range(n)]),
        }
        if run.rewards is not None:
            matrix = run.reward_matrix(num_prompts, n)
            result["bon"] = metrics.bon_curve(matrix, config.k_values)
            result["mean"] = metrics.mean_curve(matrix, config.k_values)
            if self.reference is not None:
                rows = self.reference.rows
                kept = [i for i in range(num_prompts) if (REFERENCE, i, 0) in rows]
                reference_rewards = [rows[(REFERENCE, i, 0)]["reward"] for i in kept]
                result["win_rate"] = metrics.win_rate_curve([matrix[i] for i in kept], reference_rewards, config.k_values)
                result["win_rate"]["num_prompts"] = len(kept)
        if config.diversity or config.embedding_diversity:
            result["diversity"] = diversity(responses, config)
        if examples.has_gold:
            golds = [e.gold for e in examples.examples]
            equivalence = gsm8k_equivalence()
            changed = 0
            answers = []
            for row, gold in zip(responses, golds):
                row_answers, row_changed = gsm8k_answers(row, gold, equivalence)
                answers.append(row_answers)
                changed += row_changed
            greedy_answers = None
            if self.generation_plan(examples).greedy:
                greedy_answers = []
                for text, gold in zip(run.greedy(num_prompts), golds):
                    (answer,), greedy_changed = gsm8k_answers([text], gold, equivalence)
                    greedy_answers.append(answer)
                    changed += greedy_changed
            result["gsm8k"] = metrics.gsm8k_metrics(
                answers, golds, config.math_k_values, greedy=greedy_answers,
                rewards=None if run.rewards is None else run.reward_matrix(num_prompts, n),
            )
            result["gsm8k"]["equivalence"] = "exact" if equivalence is None else "math-verify"
            result["gsm8k"]["verdicts_changed_by_equivalence"] = changed
        return result

    def header(self, summary: dict) -> str:
        settings = summary["settings"]
        prompts = settings["prompts"]
        return (
            f"# {self.title}\n\n{prompts.get('num_prompts')} prompts from `{prompts.get('prompts')}`, "
            f"{sampling_text(settings)}, {reward_text(settings)}.\n"
        )

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]
        sections = []
        for estimator, title in (
            ("unbiased", "Best-of-n reward (unbiased: average over all k-subsets)"),
            ("first_k", "Best-of-n reward (first k samples, as in the reference code)"),
        ):
            rows = curve_rows(models, "bon", "BoN", estimator) + curve_rows(models, "mean", "mean", estimator)
            sections.append((title, rows))
            if estimator == "unbiased":
                win_rows = curve_rows(models, "win_rate", "win", estimator)
                sections.append(("Win rate vs reference, % (Bradley–Terry, best of k)", win_rows))
        sections.append(("Diversity (×100, higher = more diverse)", diversity_rows(models)))
        if any("gsm8k" in m for m in models.values()):
            rows = []
            if any("greedy_accuracy" in m.get("gsm8k", {}) for m in models.values()):
                rows.append(("greedy accuracy", [m.get("gsm8k", {}).get("greedy_accuracy") for m in models.values()]))
            rows.append(("sample accuracy", [m.get("gsm8k", {}).get("sample_accuracy") for m in models.values()]))
            rows += curve_rows(models, "gsm8k", "MV", "mv") + curve_rows(models, "gsm8k", "pass", "pass_first_k")
            rows += curve_rows(models, "gsm8k", "BoN (reward model)", "bon_first_k")
            sections.append(("GSM8K, % (MV@k, pass@k and reward-model BoN@k over the first k samples)", rows))
        sections.append(("Responses", response_rows(models)))
        return sections

    def plot(self, summary: dict, output_dir: str) -> None:
        import os

        from ..report import plot_bon

        if any("bon" in m for m in summary["models"].values()):
            plot_bon(summary, os.path.join(output_dir, "bon.png"))


def gsm8k_equivalence() -> Equivalence | None:
    """math-verify's equivalence when it is installed (the `math` extra), else None (exact comparison only)."""
    try:
        return Equivalence()
    except EvaluationError:
        return None


def gsm8k_answers(texts: list[str], gold: str | None, equivalence: Equivalence | None) -> tuple[list, int]:
    """Canonical GSM8K answers of `texts` (`final_answers.read_gsm8k`: one final answer or none). A response whose
    one answer is a LaTeX expression rather than a number (`2^{10}`) gets the gold answer when math-verify finds that
    single expression equivalent to it. Returns the answers and how many verdicts the equivalence changed. The
    `gsm8k_answer` reward scores with this function, so a reward and the evaluation never disagree."""
    answers = []
    changed = 0
    for text in texts:
        reading = read_gsm8k(text)
        answer = reading.number
        if (answer is None and reading.expression is not None and gold is not None and equivalence is not None
                and equivalence(gold, reading.expression)):
            answer = gold
            changed += 1
        answers.append(answer)
    return answers, changed
