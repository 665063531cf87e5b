"""The evaluation from end to end, for any task: generate, score, post-process, summarize, report.

Phases run one after another so that only one model is in memory at a time: every policy's
work first (generation, or whatever the task does with the policy loaded; each policy freed
before the next is loaded), then the reward model over all of them, then the task's per-model
post-processing and metrics. Each phase skips what its JSONL cache already holds.
"""

from __future__ import annotations

import os

from ..core.errors import HubSource
from ..core.hub import check_sources, hub_errors
from ..core.optional import require
from .config import EvalConfig
from .generation import import_vllm
from .loading import adapter_base, check_model_source, free_memory
from .report import write_reports
from .scoring import LazyRewardModel
from .tasks import EvalTask, ModelRun


def check_models(config: EvalConfig) -> None:
    """Fail before any work on what can be known to be missing: model folders, vLLM."""
    if config.backend == "vllm":
        import_vllm()
    for name, path in config.policies.items():
        check_model_source(path, f"Policy {name!r}")
        base = adapter_base(path)
        if base is not None:
            check_model_source(base, f"Base model of the LoRA adapter {name!r}")
    if config.reward_model:
        check_model_source(config.reward_model, "Reward model")


def eval_sources(config: EvalConfig) -> list[HubSource]:
    """The Hub ids an evaluation loads, as its task declares them (`EvalTask.hub_sources`): each policy (or its
    adapter's base), the reward model, the prompt set (or the ICL benchmarks' datasets), the MAUVE featurizer, the
    sentence encoders, as far as the task uses them."""
    return config.task_class().hub_sources(config)


def make_task(config: EvalConfig) -> EvalTask:
    return config.task_class()(config)


def run_evaluation(config: EvalConfig) -> dict:
    """Run (or resume) the evaluation described by `config`; return the summary written to summary.json.

    The optional packages the task needs are checked first (`EvalTask.required_packages`: one line naming the package
    and its extra). Every Hub id it loads is checked then (`eval_sources`, `trl_emo.core.hub.check_sources`); a Hub failure, then or later, is a
    `HubAccessError` naming the field."""
    require(make_task(config).required_packages())  # before any Hub lookup, model or generation
    hub_sources = eval_sources(config)
    check_sources(hub_sources)
    with hub_errors(hub_sources):
        return _run_evaluation(config)


def _run_evaluation(config: EvalConfig) -> dict:
    task = make_task(config)
    check_models(config)
    task.check()
    examples = task.load_examples()
    os.makedirs(config.output_dir, exist_ok=True)

    runs = {name: ModelRun(name, path) for name, path in config.policies.items()}
    for run in runs.values():
        task.run_policy(run, examples)
        free_memory()

    if task.needs_reward_model():
        reward_model = LazyRewardModel(config)
        try:
            task.score_rewards(runs, reward_model, examples)
        finally:
            reward_model.close()
            free_memory()

    for run in runs.values():
        task.post_process(run, examples)

    summary = {"task": task.name, "settings": task.settings(examples), "models": {}}
    for name, run in runs.items():
        summary["models"][name] = {"policy": run.path, **task.summarize(run, examples)}
    write_reports(summary, config.output_dir, plot=config.plot, task=task)
    return summary
