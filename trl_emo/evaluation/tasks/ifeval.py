"""Task `ifeval`: IFEval instruction following (GEM's Table 1), scored by lm-evaluation-harness's checkers.

One greedy response per prompt (the 541 prompts of `google/IFEval`, or a local file with its
columns `prompt`, `instruction_id_list`, `kwargs`), rendered with the policy's chat template,
then checked strictly and loosely by lm-eval's IFEval checkers; the verdicts are cached in
`ifeval/<model>.jsonl`. The report gives GEM's Table 1: prompt- and instruction-level accuracy,
strict and loose, one row per model.
"""

from __future__ import annotations

import os

from .. import ifeval_checkers
from ..errors import EvaluationError
from ..generation import GREEDY
from ..prompts import PromptSet, load_prompt_set
from ..report import fmt, table_lines
from ..task_registry import register_task
from .base import EvalTask, GenerationPlan, ModelRun
from .common import package_version, response_rows, response_stats

TABLE_1 = (
    ("prompt_level_strict", "strict, prompt level"),
    ("instruction_level_strict", "strict, instruction level"),
    ("prompt_level_loose", "loose, prompt level"),
    ("instruction_level_loose", "loose, instruction level"),
    ("average", "average"),
)


@register_task
class IFEvalTask(EvalTask):
    name = "ifeval"
    title = "IFEval instruction following"
    # GEM (Appendix D.1): greedy decoding, at most 1,024 new tokens.
    defaults = {"prompts": "google/IFEval", "max_new_tokens": 1024}
    ignores = (
        "n", "temperature", "top_k", "top_p", "greedy", "k_values", "math_k_values", "reward_model",
        "scoring_batch_size", "reference_column", "answer_column", "diversity", "embedding_diversity",
        "embedding_model",
    )

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        if name in ("n", "temperature", "top_k", "top_p", "greedy", "k_values", "math_k_values"):
            return " (it decodes greedily, one response per prompt)"
        if name in ("reward_model", "scoring_batch_size"):
            return " (its checkers, not a reward model, score the responses)"
        return ""

    def check(self) -> None:
        ifeval_checkers.check_available()

    def load_examples(self) -> PromptSet:
        examples = load_prompt_set(self.config, find_answer_column=lambda rows, columns: None, prompt_columns=("prompt",))
        known = set(ifeval_checkers.instruction_ids())
        for example in examples.examples:
            missing = [c for c in ifeval_checkers.COLUMNS if c not in example.row]
            if missing:
                raise EvaluationError(
                    f"{self.config.prompts!r} row {example.index} lacks {missing}: task 'ifeval' needs the columns of "
                    f"google/IFEval ({', '.join(ifeval_checkers.COLUMNS)})."
                )
            if example.row.get("key") is not None:
                example.id = str(example.row["key"])
            ids, kwargs = example.row["instruction_id_list"], example.row["kwargs"]
            unknown = [i for i in ids if i not in known]
            if unknown or len(ids) != len(kwargs):
                problem = f"unknown instruction ids {unknown}" if unknown else "one `kwargs` entry per instruction"
                raise EvaluationError(f"{self.config.prompts!r} row {example.index}: {problem}.")
        return examples

    def generation_plan(self, examples: PromptSet) -> GenerationPlan:
        return GenerationPlan(0, True)

    def needs_reward_model(self) -> bool:
        return False

    def post_process(self, run: ModelRun, examples: PromptSet) -> None:
        from tqdm.auto import tqdm

        settings = {"generations": run.generations.fingerprint, "lm_eval": package_version("lm_eval")}
        cache = self.open_cache("ifeval", run, settings, key_fields=("model", "prompt_index"))
        todo = [e for e in examples.examples if (run.name, e.index) not in cache]
        rows = []
        for example in tqdm(todo, desc=f"check {run.name}", unit="prompt", disable=not self.config.progress):
            response = run.generations.rows[(run.name, example.index, GREEDY)]["response"]
            strict, loose = ifeval_checkers.check(example.row, response)
            rows.append({"model": run.name, "prompt_index": example.index, "strict": strict, "loose": loose})
            if len(rows) == 64:  # checkers are fast: append in chunks, not per prompt
                cache.append(rows)
                rows = []
        cache.append(rows)
        run.extra["ifeval"] = cache

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        rows = run.extra["ifeval"].rows
        verdicts = [rows[(run.name, e.index)] for e in examples.examples]
        result = {
            "num_prompts": len(verdicts),
            "responses": response_stats(run, [(run.name, e.index, GREEDY) for e in examples.examples]),
            "ifeval": ifeval_checkers.accuracies([v["strict"] for v in verdicts], [v["loose"] for v in verdicts]),
        }
        result["ifeval"]["num_instructions"] = sum(len(v["strict"]) for v in verdicts)
        by_kind: dict[str, list[bool]] = {}
        for example, verdict in zip(examples.examples, verdicts):
            for instruction, followed in zip(example.row["instruction_id_list"], verdict["strict"]):
                by_kind.setdefault(instruction.split(":")[0], []).append(followed)
        result["ifeval"]["strict_by_group"] = {k: 100.0 * sum(v) / len(v) for k, v in sorted(by_kind.items())}
        return result

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        return {
            "decoding": "greedy", "max_new_tokens": config.max_new_tokens, "backend": config.backend,
            "prompt_format": config.prompt_format, "prompts": examples.source,
            "checkers": f"lm-eval {package_version('lm_eval')}",
        }

    def header(self, summary: dict) -> str:
        settings = summary["settings"]
        prompts = settings["prompts"]
        return (
            f"# {self.title}\n\n{prompts.get('num_prompts')} prompts from `{prompts.get('prompts')}`, greedy decoding, "
            f"at most {settings['max_new_tokens']} new tokens, checked by {settings['checkers']} "
            "(accuracy, %; GEM's Table 1).\n"
        )

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]
        # Table 1's layout: one row per model, the four accuracies side by side.
        lines = table_lines(
            ["model", *(label for _, label in TABLE_1)],
            [[name, *(fmt(model["ifeval"][key]) for key, _ in TABLE_1)] for name, model in models.items()],
        )
        groups = sorted({g for m in models.values() for g in m["ifeval"]["strict_by_group"]})
        by_group = [(g, [m["ifeval"]["strict_by_group"].get(g) for m in models.values()]) for g in groups]
        return [
            ("IFEval accuracy, % (GEM Table 1)", "\n".join(lines)),
            ("Instructions followed (strict), % by instruction group", by_group),
            ("Responses", response_rows(models)),
        ]

    def plot(self, summary: dict, output_dir: str) -> None:
        from ..report import plot_accuracy_bars

        models = summary["models"]
        values = {label: [m["ifeval"][key] for m in models.values()] for key, label in TABLE_1[:4]}
        plot_accuracy_bars(list(models), values, "IFEval accuracy, %", os.path.join(output_dir, "ifeval.png"))
