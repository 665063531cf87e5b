"""The final configuration of a `trl_emo.grpo` run, resolved in one function, `resolve_grpo_run`, as
`trl_emo.commands.run_config` resolves the SFT and DPO runs (and with its helpers: `resolve_resume`,
`dpo_starting_model`, `model_init_kwargs`).

A GRPO run starts from an output of `trl_emo.sft`: a full model folder, or a LoRA/QLoRA adapter folder that is merged
into its base first, once, under `<output_dir>/_sft-merged` (exactly as `trl_emo.dpo` does), then trained further,
fully or through a new adapter (`use_peft`). The policy keeps the SFT model's own chat template (the tokenizer saved
in the SFT folder). The rewards are named in the recipe (`reward_funcs`, weighted by TRL's `reward_weights`):
the verifiable rewards of `trl_emo.evaluation.rewards`, or functions of yours by import path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.errors import ConfigError
from .command_line import CommandLine
from .run_config import (
    RunArguments, check_sft_output, evaluation_split, model_settings, sft_tokenizer, starting_policy,
)

# The answer reward a GRPO prompt set gets when the recipe names none.
DEFAULT_REWARDS = {"gsm8k": ["gsm8k_answer"], "math": ["math_answer"]}

@dataclass
class GRPOArguments:
    """
    Options of a `trl_emo.grpo` run besides TRL's `GRPOConfig`: its rewards (their weights are TRL's `reward_weights`)
    and a CPU setting.

    Args:
        reward_funcs (`list[str]` or `None`, *optional*, defaults to `None`):
            The reward functions, in order: `gsm8k_answer`, `math_answer`, `format` (`trl_emo.evaluation.rewards`),
            or a function of yours as `package.module:function`. `None`: the answer reward of the dataset schema
            (`gsm8k_answer` for `gsm8k`, `math_answer` for `math`).
        cpu_keep_freed_memory (`bool`, *optional*, defaults to `True`):
            On a CPU-only run, make glibc keep the memory a step frees for the next step instead of returning it to
            the system and faulting it back in (`trl_emo.commands.cpu_memory`): 1.5 s of a 19 s GRPO step of
            SmolLM2-135M (docs/benchmarks.md, "GRPO step time (CPU)"). No effect on a GPU run.
    """

    reward_funcs: list[str] | None = field(
        default=None,
        metadata={
            "help": "Reward functions: gsm8k_answer, math_answer, format, or package.module:function of your own "
            "(default: the dataset schema's answer reward). Weights: reward_weights.",
            "nargs": "+",
        },
    )
    cpu_keep_freed_memory: bool = field(
        default=True,
        metadata={"help": "CPU-only runs: glibc keeps freed memory for the next step (faster steps; the process's "
                  "memory stays at its peak)."},
    )


def grpo_dataclass_types() -> tuple:
    """What a `trl_emo.grpo` recipe holds: TRL's `ScriptArguments`, `GRPOConfig` and `ModelConfig`,
    `trl_emo.data.DataArguments`, `GRPOArguments` and `RunArguments`, in that order."""
    from trl import GRPOConfig, ModelConfig, ScriptArguments

    from ..data import DataArguments

    return (ScriptArguments, GRPOConfig, ModelConfig, DataArguments, GRPOArguments, RunArguments)


@dataclass
class GRPORun:
    """The final configuration of a `trl_emo.grpo` run: what `--dry_run` prints and `GRPOTrainer` is given.

    Attributes:
        script_args, training_args, model_args, data_args, grpo_args, run_args: the parsed arguments, as used.
        policy: the model GRPO starts from: the SFT model, or its adapter merged into the base
            (`<output_dir>/_sft-merged`; not merged by a dry run).
        tokenizer: the SFT model's tokenizer and chat template (`processing_class`), padded on the left.
        train_dataset, eval_dataset: `{"prompt", "answer"}` rows (`eval_dataset` is None when evaluation is off).
        info: what the dataset loader found (`trl_emo.data.DatasetInfo`).
        reward_funcs: the callables, in the order of `grpo_args.reward_funcs`.
        trainer_kwargs: the trainer's `quantization_config` and `peft_config`.
        notes: lines worth telling the user (printed by `--dry_run`, logged before training).
        hub_sources: the Hub ids the run loads, already checked.
    """

    script_args: Any
    training_args: Any
    model_args: Any
    data_args: Any
    grpo_args: GRPOArguments
    run_args: RunArguments
    policy: str
    tokenizer: Any
    train_dataset: Any
    eval_dataset: Any
    info: Any
    reward_funcs: list
    trainer_kwargs: dict
    notes: list = field(default_factory=list)
    hub_sources: list = field(default_factory=list)


def _rewards(grpo_args: GRPOArguments, training_args, schema: str | None, notes: list) -> list:
    from ..evaluation.rewards import resolve_reward_funcs

    if grpo_args.reward_funcs is None:  # `reward_funcs: []` is not "unset": resolve_reward_funcs rejects it
        if schema not in DEFAULT_REWARDS:
            raise ConfigError(
                f"reward_funcs is required for dataset schema {schema!r} (e.g. reward_funcs: [math_answer] or "
                "[my_pkg.rewards:score]); only gsm8k and math have a default."
            )
        grpo_args.reward_funcs = list(DEFAULT_REWARDS[schema])
        notes.append(f"reward_funcs not set: {grpo_args.reward_funcs} (the {schema} answer reward)")
    functions = resolve_reward_funcs(grpo_args.reward_funcs)
    weights = training_args.reward_weights
    if weights is not None and len(weights) != len(functions):
        raise ConfigError(
            f"reward_weights has {len(weights)} value(s) for {len(functions)} reward function(s) "
            f"({', '.join(grpo_args.reward_funcs)}); give one weight per reward."
        )
    return functions


def check_generation(training_args) -> None:
    """What GRPO's sampling needs, checked before anything loads (transformers and TRL check it at the first step or
    in the trainer, with a traceback): at least one new token, a positive temperature, vLLM installed if asked for."""
    import importlib.util

    if training_args.max_completion_length is not None and training_args.max_completion_length < 1:
        raise ConfigError(f"max_completion_length must be at least 1, got {training_args.max_completion_length}.")
    if training_args.temperature is not None and training_args.temperature <= 0:
        raise ConfigError(f"temperature must be above 0 (GRPO samples its completions), got {training_args.temperature}.")
    if training_args.use_vllm and importlib.util.find_spec("vllm") is None:
        raise ConfigError("use_vllm: true needs vLLM, which is not installed (pip install 'trl[vllm]'); leave use_vllm "
                          "false to generate with transformers.")


def resolve_grpo_run(args: CommandLine) -> GRPORun:
    """Resolve a parsed `trl_emo.grpo` command line into the run's final configuration.

    In order: required fields checked; the starting model located; `output_dir` and `resume_from_checkpoint` checked;
    every Hub id of the run checked (`trl_emo.core.hub`); the SFT folder's tokenizer loaded (left padding, a pad token
    as TRL adds one); the prompt set loaded and formatted; the rewards resolved (names or import paths) and their
    weights checked; the eval split checked; `model_init_kwargs` and the PEFT and quantization settings built
    (`model_settings`); then, everything else known good, an adapter merged (except in a dry run). Raises `ConfigError`/`DataError`/`SourceError`, or
    `HubAccessError` for a Hub id the run cannot load, in one line.
    """
    from ..core.hub import check_sources, hub_errors
    from ..data.verifiable import load_grpo_datasets
    from .preflight import grpo_sources

    script_args, training_args, model_args, data_args, grpo_args, run_args = args.values
    notes = list(args.notes)
    check_sft_output(model_args, training_args, script_args, "e.g. openai/gsm8k with dataset_config main",
                     dry_run=run_args.dry_run)
    check_generation(training_args)
    if training_args.remove_unused_columns:
        # The reference answer reaches the rewards as a dataset column the model does not take: TRL's GRPO needs
        # the columns kept (its default), and with them dropped every reward would see no reference.
        raise ConfigError("remove_unused_columns: true would drop the reference answers the rewards read; leave it "
                          "false (GRPOConfig's default).")
    # Named rewards are resolved (and their weights counted) before anything is loaded or merged; without names, the
    # prompt set's schema gives the default, once the data is read.
    reward_funcs = _rewards(grpo_args, training_args, None, notes) if grpo_args.reward_funcs is not None else None
    # Every Hub id the run will load (the model or its adapter's base, the dataset), checked before merging.
    hub_sources = grpo_sources(script_args, model_args)
    check_sources(hub_sources)
    with hub_errors(hub_sources):
        tokenizer = sft_tokenizer(model_args, training_args)
        tokenizer.padding_side = "left"  # as TRL's own loading: prompts are left-padded for generation
        train_dataset, eval_dataset, info = load_grpo_datasets(script_args, data_args, tokenizer)
        if reward_funcs is None:
            reward_funcs = _rewards(grpo_args, training_args, info.schema, notes)
        eval_dataset = evaluation_split(training_args, script_args, eval_dataset)
        trainer_kwargs = model_settings(model_args, training_args)
        # Last: a merge takes minutes and the whole model's memory, so every check above comes first.
        policy = starting_policy(model_args, training_args, run_args.dry_run)
    return GRPORun(
        script_args, training_args, model_args, data_args, grpo_args, run_args, policy, tokenizer, train_dataset,
        eval_dataset, info, reward_funcs, trainer_kwargs, notes, hub_sources,
    )
