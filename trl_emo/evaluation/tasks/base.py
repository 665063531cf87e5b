"""What an evaluation task is: the hooks the pipeline calls, with defaults that fit a generate-then-score task.

The pipeline (`trl_emo.evaluation.pipeline`) owns the order of the work and the machinery every task
shares: one policy in memory at a time, the JSONL caches with their settings fingerprint (resume
without redoing finished work), HF `generate` / vLLM sampling, the reward model, and the reports.
A task decides what is evaluated:

    check()                         before any work: optional packages, data the task needs
    load_examples()                 the prompt set (Hub id or local file of one schema)
    render_prompt(tokenizer, ex)    the text the policy continues
    generation_plan(examples)       sampled and greedy responses per prompt, or None (no generation)
    run_policy(run, examples)       the work done with the policy loaded (default: generate the plan)
    score_rewards(runs, rm, ex)     reward-model scoring (default: every sampled response)
    post_process(run, examples)     per-model work after all models, with its own caches (checkers, execution)
    summarize(run, examples)        the metrics of one model (a JSON-able dict)
    settings(examples)              the run's settings for summary.json / summary.md
    report_sections(summary)        the Markdown tables, models side by side
    plot(summary, output_dir)       figures

A task that needs no generation (scoring candidates by perplexity) returns `None` from
`generation_plan` and overrides `run_policy`; a task with expensive per-response work (running
code, checking answers) keeps it in a `JsonlCache` opened in `post_process` (see `open_cache`).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from ...core import optional
from ...core.errors import ConfigError, HubSource
from ...models.hub_ids import dataset_sources, model_sources
from ..cache import JsonlCache

if TYPE_CHECKING:
    from ..config import EvalConfig
    from ..prompts import PromptExample, PromptSet
    from ..scoring import LazyRewardModel

# Fields every task uses: never "ignored", never owned by one task.
COMMON_FIELDS = (
    "task", "policies", "trust_remote_code", "dtype", "device", "prompts", "prompts_config", "prompts_split",
    "prompt_column", "max_prompts", "prompt_format", "seed", "backend", "generation_batch_size",
    "stop_at_end_of_turn", "vllm_gpu_memory_utilization", "output_dir", "overwrite", "plot", "progress",
)


@dataclass(frozen=True)
class GenerationPlan:
    """What to generate per prompt: `num_samples` sampled responses (0: none) and optionally one greedy one."""

    num_samples: int
    greedy: bool = False


@dataclass
class ModelRun:
    """One policy's state through the pipeline: its caches, filled phase by phase."""

    name: str
    path: str
    generations: JsonlCache | None = None
    rewards: JsonlCache | None = None
    # Task-owned caches and results (verdicts, execution results, perplexities...), by name.
    extra: dict[str, Any] = field(default_factory=dict)

    def samples(self, num_prompts: int, num_samples: int) -> list[list[str]]:
        """The sampled responses, one list of `num_samples` per prompt."""
        rows = self.generations.rows
        return [[rows[(self.name, i, j)]["response"] for j in range(num_samples)] for i in range(num_prompts)]

    def greedy(self, num_prompts: int) -> list[str]:
        from ..generation import GREEDY

        rows = self.generations.rows
        return [rows[(self.name, i, GREEDY)]["response"] for i in range(num_prompts)]

    def reward_matrix(self, num_prompts: int, num_samples: int) -> list[list[float]]:
        rows = self.rewards.rows
        return [[rows[(self.name, i, j)]["reward"] for j in range(num_samples)] for i in range(num_prompts)]


class EvalTask:
    """Base class of the evaluation tasks; subclass it and decorate with `@register_task`.

    Class attributes:
        name: the value of `EvalConfig.task`.
        title: the heading of summary.md.
        defaults: values for `EvalConfig` fields left unset (`None`), e.g. `{"n": 32, "temperature": 0.6}`.
        ignores: `EvalConfig` fields that have no effect on this task; setting one is an error.
        fields: task-specific `EvalConfig` fields this task owns; setting one for another task is an error.
    """

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    ignores: ClassVar[tuple[str, ...]] = ()
    fields: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: EvalConfig):
        self.config = config

    # ------------------------------------------------------------------ configuration

    @classmethod
    def check_fields(cls, config: EvalConfig) -> None:
        """Refuse values set for fields this task ignores or that belong to another task (before defaults apply)."""
        from ..task_registry import field_owners

        defaults = {f.name: f.default for f in dataclasses.fields(config)}
        owners = field_owners()
        for name, default in defaults.items():
            value = getattr(config, name)
            if value is None or value == default or name in COMMON_FIELDS:
                continue
            owner = owners.get(name, ())
            if name in cls.ignores:
                raise ConfigError(f"{name} does not apply to task {cls.name!r}{cls.ignore_reason(name)}; remove it.")
            if owner and cls.name not in owner:
                tasks = "task" + "s" * (len(owner) > 1) + " " + ", ".join(repr(o) for o in owner)
                raise ConfigError(f"{name} belongs to {tasks}; it has no effect on task {cls.name!r}.")

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        """Why `name` does not apply (appended to the error), e.g. `" (it decodes greedily)"`."""
        return ""

    @classmethod
    def check_config(cls, config: EvalConfig) -> None:
        """Task-specific validation after the defaults are applied (raise `ConfigError`)."""

    @classmethod
    def hub_sources(cls, config: EvalConfig) -> list[HubSource]:
        """The Hugging Face Hub ids this task will load for `config`, with the field that named each, for the
        preflight (`trl_emo.core.hub.check_sources`): each policy (or its adapter's base), the reward model, the prompt
        set and the sentence encoder, as far as the task uses them. A task that loads more (or other) ids says so by
        overriding this (`icl`: its benchmarks' datasets and retriever; `continuation`: MAUVE's featurizer)."""
        ignores = set(cls.ignores)
        sources = []
        for name, path in config.policies.items():
            sources += model_sources(f"policies[{name}]", path)
        if config.reward_model and "reward_model" not in ignores:
            sources += model_sources("reward_model", config.reward_model)
        sources += dataset_sources("prompts", config.prompts)
        if config.embedding_model and config.embedding_diversity and "embedding_model" not in ignores:
            sources += model_sources("embedding_model", config.embedding_model)
        return sources

    # ------------------------------------------------------------------ before any work

    def required_packages(self) -> list[optional.Needed]:
        """The optional packages this task needs for its configuration (`trl_emo.core.optional`), checked before any
        model loads: sacrebleu for `diversity`, sentence-transformers (and the default encoder's package) for
        `embedding_diversity`, matplotlib for `plot` when the task draws figures. vLLM (`backend: vllm`) and the
        packages of single tasks (`math`: math-verify; `ifeval`: lm-eval; `continuation`: mauve-text) are checked by
        `check_models` and the task's `check`, also before any model loads."""
        config, cls = self.config, type(self)
        needed = []
        if config.diversity and "diversity" not in cls.ignores:
            needed.append(optional.SACREBLEU)
        if config.embedding_diversity and "embedding_diversity" not in cls.ignores:
            needed.append(optional.SENTENCE_TRANSFORMERS)
            if not config.embedding_model:
                needed.append(optional.MINILM)
        if config.plot and cls.plot is not EvalTask.plot:
            needed.append(optional.MATPLOTLIB)
        return needed

    def check(self) -> None:
        """Fail before any generation on what the task will need later (packages, data)."""

    # ------------------------------------------------------------------ examples and prompts

    def load_examples(self) -> PromptSet:
        from ..prompts import load_prompt_set

        return load_prompt_set(self.config)

    def render_prompt(self, tokenizer, example: PromptExample) -> str:
        """The text the policy continues (default: its chat template, or the Alpaca prompt for base models)."""
        from ..prompts import render_policy_prompt

        return render_policy_prompt(tokenizer, example, self.config.prompt_format)

    # ------------------------------------------------------------------ per policy (loaded one at a time)

    def generation_plan(self, examples: PromptSet) -> GenerationPlan | None:
        """What to generate per prompt; `None` for a task that does not generate."""
        return GenerationPlan(self.config.n, bool(self.config.greedy))

    def run_policy(self, run: ModelRun, examples: PromptSet) -> None:
        """The work done while the policy is loaded; the default fills the generation cache per the plan."""
        from ..generation import generate_for_policy

        plan = self.generation_plan(examples)
        if plan is None:
            return
        run.generations = generate_for_policy(
            run.name, run.path, self.config, examples, plan.greedy, num_samples=plan.num_samples,
            render=self.render_prompt,
        )

    # ------------------------------------------------------------------ reward model

    def needs_reward_model(self) -> bool:
        return bool(self.config.reward_model)

    def score_rewards(self, runs: dict[str, ModelRun], reward_model: LazyRewardModel, examples: PromptSet) -> None:
        """Score every sampled response of every model (cached in `rewards/<model>.jsonl`)."""
        from ..scoring import score_policy

        plan = self.generation_plan(examples)
        for run in runs.values():
            run.rewards = score_policy(
                run.name, run.generations, reward_model, self.config, examples, num_samples=plan.num_samples
            )

    # ------------------------------------------------------------------ after all models

    def post_process(self, run: ModelRun, examples: PromptSet) -> None:
        """Per-model work after generation and scoring (checkers, code execution), in its own caches."""

    def open_cache(self, kind: str, run: ModelRun, settings: dict, key_fields=("model", "prompt_index", "sample")):
        """A task cache `output_dir/<kind>/<model>.jsonl`, tied to `settings` like the generation cache."""
        path = os.path.join(self.config.output_dir, kind, f"{run.name}.jsonl")
        return JsonlCache(path, settings, key_fields, overwrite=self.config.overwrite)

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        """The metrics of one model."""
        raise NotImplementedError

    def settings(self, examples: PromptSet) -> dict:
        """The settings shown in summary.json and summary.md."""
        config = self.config
        return {"prompts": examples.source, "seed": config.seed, "backend": config.backend}

    # ------------------------------------------------------------------ reports

    def header(self, summary: dict) -> str:
        prompts = summary["settings"]["prompts"]
        return f"# {self.title}\n\n{prompts.get('num_prompts')} prompts from `{prompts.get('prompts')}`.\n"

    def report_sections(self, summary: dict) -> list[tuple[str, list[tuple[str, list]]]]:
        """(title, rows) tables for summary.md; each row is (label, one value per model). `rows` may also be a
        Markdown table as a string, for a layout other than metrics × models."""
        return []

    def plot(self, summary: dict, output_dir: str) -> None:
        """Write figures into `output_dir` (called when `plot: true`)."""
