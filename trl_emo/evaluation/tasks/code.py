"""What the code tasks (`humaneval`, `mbpp`) share: the Magicoder prompt, running the programs, pass@k.

GEM's Appendix D: 200 samples per problem at temperature 0.6, top-k 50, top-p 0.9, the Magicoder
prompt, pass@{1, 10, 20, 50, 100}. Each sample's program (the code up to the end of the code block
the prompt opened, sanitized) runs with its benchmark's tests in `trl_emo.evaluation.sandbox`; the
verdicts go to `execution/<model>.jsonl`, so a resumed run executes nothing twice. Identical programs
of one problem run once. Nothing runs without `allow_code_execution: true`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import time
from collections import Counter
from dataclasses import dataclass

from ...core.errors import ConfigError
from .. import metrics
from ..errors import EvaluationError
from ..generation import GREEDY
from ..prompts import PromptSet, load_prompt_set, render_policy_prompt
from ..report import fmt, table_lines
from ..sandbox import (
    CHECKER_VERSION,
    CodeJob,
    extract_code,
    magicoder_prompt,
    run_checks,
    sanitize,
)
from .base import EvalTask, GenerationPlan, ModelRun
from .common import response_rows, response_stats, sampling_settings, sampling_text

CODE_FIELDS = (
    "allow_code_execution", "allow_unconfined_code_execution", "code_execution_timeout", "code_execution_memory_mb",
    "code_execution_workers", "code_prompt", "code_k_values",
)
CODE_PROMPTS = ("magicoder", "policy")
DEFAULT_CODE_K = (1, 10, 20, 50, 100)
OUTCOMES = (
    ("passed", "passed"), ("failed", "failed a test"), ("error", "raised an error"), ("timeout", "timed out"),
    ("memory", "ran out of memory"), ("output_limit", "printed too much"), ("exited_early", "exited before the checks"),
    ("untrusted_result", "returned a non-comparable object"), ("killed", "killed by a limit"),
)
OPT_IN = (
    "Task {task!r} runs the programs the models write; pass `--allow_code_execution true` (or set "
    "`allow_code_execution: true` in the recipe) to allow it. Each program runs in a sandbox: its own process and "
    "empty directory, time, memory and output limits, no inherited environment, killed with its process group."
)


@dataclass(frozen=True)
class CodeProblem:
    """One benchmark problem: the instruction, how the answer starts, and how its program is checked."""

    instruction: str
    response_prefix: str
    # Prepended to the extracted code to make the program (HumanEval: the function's signature and docstring).
    program_prefix: str
    setup: str
    checks: str

    def program(self, response: str) -> str:
        return sanitize(self.program_prefix + extract_code(response))


class CodeTask(EvalTask):
    """Base of the code tasks; a subclass sets `name`, `title`, `benchmark`, `prompt_columns`, `defaults["prompts"]`
    and `problem`."""

    benchmark = ""
    # The benchmark's own columns, in order of preference, that hold the problem statement.
    prompt_columns: tuple[str, ...] = ("prompt",)
    defaults = {
        "n": 200, "temperature": 0.6, "top_k": 50, "top_p": 0.9,
        # GEM gives no length for code; 512 new tokens is Magicoder's text2code setting.
        "max_new_tokens": 512,
        "code_execution_timeout": 10.0, "code_execution_memory_mb": 2048, "code_prompt": "magicoder",
    }
    ignores = (
        "reward_model", "scoring_batch_size", "reference_column", "answer_column", "k_values", "math_k_values",
        "diversity", "embedding_diversity", "embedding_model",
    )
    fields = CODE_FIELDS

    def __init__(self, config):
        super().__init__(config)
        self.problems: list[CodeProblem] = []
        self._sandbox = None
        self._announced = False

    @classmethod
    def ignore_reason(cls, name: str) -> str:
        if name in ("reward_model", "scoring_batch_size"):
            return " (its tests, not a reward model, judge the programs)"
        if name in ("k_values", "math_k_values"):
            return " (its k are `code_k_values`)"
        if name in ("diversity", "embedding_diversity", "embedding_model"):
            return " (it reports pass@k, as the paper does for code)"
        return ""

    @classmethod
    def check_config(cls, config) -> None:
        for name in ("allow_code_execution", "allow_unconfined_code_execution"):
            if not isinstance(getattr(config, name), bool):
                raise ConfigError(f"{name} must be true or false; got {getattr(config, name)!r}.")
        try:
            config.code_execution_timeout = float(config.code_execution_timeout)
        except (TypeError, ValueError):
            value = config.code_execution_timeout
            raise ConfigError(f"code_execution_timeout must be a number; got {value!r}.") from None
        if not config.code_execution_timeout > 0:
            raise ConfigError(f"code_execution_timeout must be > 0; got {config.code_execution_timeout}.")
        for name, minimum in (("code_execution_memory_mb", 64), ("code_execution_workers", 1)):
            value = getattr(config, name)
            if value is None:
                continue
            if isinstance(value, bool) or not str(value).isdigit() or int(value) < minimum:
                raise ConfigError(f"{name} must be an integer >= {minimum}; got {value!r}.")
            setattr(config, name, int(value))
        if config.code_prompt not in CODE_PROMPTS:
            raise ConfigError(f"code_prompt must be one of {', '.join(CODE_PROMPTS)}; got {config.code_prompt!r}.")
        if config.code_prompt == "magicoder" and config.prompt_format != "auto":
            raise ConfigError(
                "prompt_format applies to the code tasks only with `code_prompt: policy` (the Magicoder prompt is "
                "plain text, the same for every model)."
            )
        config.code_k_values = config._checked_ks(
            "code_k_values", config.code_k_values, [k for k in DEFAULT_CODE_K if k <= config.n]
        )

    # ------------------------------------------------------------------ before any work

    def check(self) -> None:
        if not self.config.allow_code_execution:
            raise EvaluationError(OPT_IN.format(task=self.name))
        # Find out now, not after hours of generation, whether programs can run here (and may: `UnconfinedError`).
        from ..sandbox import SandboxError

        try:
            probe = self.sandbox().run("print(6 * 7)")
        except SandboxError as exc:
            raise EvaluationError(str(exc)) from None
        if not probe.ok or probe.stdout.strip() != "42":
            raise EvaluationError(
                f"The code sandbox does not work on this machine ({probe.status}, exit {probe.returncode}): "
                f"{probe.stderr.strip()[-300:]}"
            )

    def sandbox(self):
        if self._sandbox is None:
            from ..sandbox import Sandbox, SandboxLimits

            limits = SandboxLimits(
                timeout=self.config.code_execution_timeout, memory_mb=self.config.code_execution_memory_mb
            )
            self._sandbox = Sandbox(
                limits, workers=self.config.code_execution_workers,
                allow_unconfined=self.config.allow_unconfined_code_execution,
            )
        return self._sandbox

    # ------------------------------------------------------------------ examples and prompts

    def load_examples(self) -> PromptSet:
        # No reference answer: the benchmark's tests judge the programs.
        examples = load_prompt_set(
            self.config, find_answer_column=lambda rows, columns: None, prompt_columns=self.prompt_columns
        )
        return self.attach_problems(examples)

    def problem(self, row: dict) -> CodeProblem:
        raise NotImplementedError

    def check_row(self, row: dict, index: int) -> None:
        """Raise `EvaluationError` for a row that lacks what `problem` needs."""

    def attach_problems(self, examples: PromptSet) -> PromptSet:
        """Build each example's problem; the policy's prompt becomes the benchmark's instruction."""
        self.problems = []
        for example in examples.examples:
            self.check_row(example.row, example.index)
            problem = self.problem(example.row)
            self.problems.append(problem)
            example.messages = [{"role": "user", "content": problem.instruction}]
            example.instruction, example.input = problem.instruction, ""
            if example.row.get("task_id") is not None:
                example.id = str(example.row["task_id"])
        return examples

    def render_prompt(self, tokenizer, example) -> str:
        problem = self.problems[example.index]
        if self.config.code_prompt == "magicoder":
            return magicoder_prompt(problem.instruction, problem.response_prefix)
        return render_policy_prompt(tokenizer, example, self.config.prompt_format) + problem.response_prefix

    def generation_plan(self, examples: PromptSet) -> GenerationPlan:
        return GenerationPlan(self.config.n, bool(self.config.greedy))

    def needs_reward_model(self) -> bool:
        return False

    # ------------------------------------------------------------------ running the programs

    def tests_fingerprint(self) -> str:
        payload = [[p.program_prefix, p.setup, p.checks] for p in self.problems]
        return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]

    def post_process(self, run: ModelRun, examples: PromptSet) -> None:
        from tqdm.auto import tqdm

        config = self.config
        plan = self.generation_plan(examples)
        settings = {
            "generations": run.generations.fingerprint,
            "tests": self.tests_fingerprint(),
            "checker": CHECKER_VERSION,
            "timeout": config.code_execution_timeout,
            "memory_mb": config.code_execution_memory_mb,
            "python": platform.python_version(),
        }
        cache = self.open_cache("execution", run, settings)
        run.extra["execution"] = cache
        samples = list(range(plan.num_samples)) + ([GREEDY] if plan.greedy else [])
        # Identical programs of one problem run once; their verdict is written for every sample.
        programs: dict[tuple[int, str], list[tuple]] = {}
        for i, problem in enumerate(self.problems):
            for j in samples:
                key = (run.name, i, j)
                if key not in cache:
                    response = run.generations.rows[key]["response"]
                    programs.setdefault((i, problem.program(response)), []).append(key)
        if not programs:
            return
        keys = list(programs.values())
        jobs = [CodeJob(program, self.problems[i].setup, self.problems[i].checks) for i, program in programs]
        sandbox = self.sandbox()
        if not self._announced:
            print(
                f"Executing model-written code ({self.benchmark} tests): {sandbox.describe()}.", file=sys.stderr,
                flush=True,
            )
            self._announced = True
        total = sum(len(k) for k in keys)
        pending: list[dict] = []
        last_write = time.monotonic()
        bar = tqdm(total=total, desc=f"run programs {run.name}", unit="program", disable=not config.progress)
        verdicts = run_checks(sandbox, jobs)
        try:
            for index, verdict in verdicts:
                digest = hashlib.sha256(jobs[index].solution.encode()).hexdigest()[:12]
                for model, i, j in keys[index]:
                    row = {"model": model, "prompt_index": i, "sample": j, "passed": verdict["passed"],
                           "status": verdict["status"], "program": digest}
                    if not verdict["passed"] and verdict["detail"]:
                        row["detail"] = verdict["detail"]
                    pending.append(row)
                bar.update(len(keys[index]))
                # Flushed often, so an interruption loses little.
                if len(pending) >= 256 or time.monotonic() - last_write > 2:
                    cache.append(pending)
                    pending, last_write = [], time.monotonic()
        finally:
            # On an error or Ctrl-C, closing the generator kills the programs still running, at once.
            close = getattr(verdicts, "close", None)
            if close is not None:
                close()
            cache.append(pending)
            bar.close()

    # ------------------------------------------------------------------ metrics

    def summarize(self, run: ModelRun, examples: PromptSet) -> dict:
        config = self.config
        plan = self.generation_plan(examples)
        n, num_prompts = plan.num_samples, len(examples.examples)
        rows = run.extra["execution"].rows
        table = [[rows[(run.name, i, j)] for j in range(n)] for i in range(num_prompts)]
        outcomes = Counter(r["status"] for row in table for r in row)
        result = {
            "num_prompts": num_prompts,
            "responses": response_stats(run, [(run.name, i, j) for i in range(num_prompts) for j in range(n)]),
            "pass": metrics.pass_at_k_curve([[r["passed"] for r in row] for row in table], config.code_k_values),
            "outcomes_percent": {status: 100.0 * outcomes[status] / (num_prompts * n) for status, _ in OUTCOMES},
            "unique_programs_percent": 100.0 * sum(len({r["program"] for r in row}) for row in table)
            / (num_prompts * n),
        }
        if plan.greedy:
            result["greedy_pass"] = 100.0 * sum(rows[(run.name, i, GREEDY)]["passed"] for i in range(num_prompts)) / (
                num_prompts
            )
        return result

    def settings(self, examples: PromptSet) -> dict:
        config = self.config
        return {
            **sampling_settings(config),
            "prompts": examples.source, "code_prompt": config.code_prompt, "code_k_values": config.code_k_values,
            "timeout": config.code_execution_timeout, "memory_mb": config.code_execution_memory_mb,
            "checker": CHECKER_VERSION,
        }

    # ------------------------------------------------------------------ reports

    def header(self, summary: dict) -> str:
        settings = summary["settings"]
        prompts = settings["prompts"]
        prompt = "Magicoder's prompt" if settings["code_prompt"] == "magicoder" else "the policy's prompt format"
        return (
            f"# {self.title}\n\n{prompts.get('num_prompts')} problems from `{prompts.get('prompts')}`, "
            f"{sampling_text(settings)}, {prompt}; each program run with the benchmark's tests in the sandbox "
            f"({settings['timeout']:g} s, {settings['memory_mb']} MB).\n"
        )

    def pass_table(self, models: dict, estimator: str) -> str:
        ks = next(iter(models.values()))["pass"]["k"]
        greedy = any("greedy_pass" in m for m in models.values()) and estimator == "unbiased"
        heads = [f"pass@{k}" for k in ks] + (["greedy"] if greedy else [])
        rows = []
        for name, model in models.items():
            values = list(model["pass"][estimator]) + ([model.get("greedy_pass")] if greedy else [])
            rows.append([name, *map(fmt, values)])
        return "\n".join(table_lines(["model", *heads], rows))

    def report_sections(self, summary: dict) -> list:
        models = summary["models"]
        outcomes = [
            (label, [m["outcomes_percent"].get(status) for m in models.values()]) for status, label in OUTCOMES
            if any(m["outcomes_percent"].get(status) for m in models.values()) or status == "passed"
        ]
        outcomes.append(("distinct programs per problem", [m["unique_programs_percent"] for m in models.values()]))
        return [
            (f"{self.benchmark} pass@k, % (unbiased estimator over the n samples; GEM Tables 6 and 9)",
             self.pass_table(models, "unbiased")),
            (f"{self.benchmark} pass@k, % (a passing program among the first k samples)",
             self.pass_table(models, "first_k")),
            ("Programs, % of samples", outcomes),
            ("Responses", response_rows(models)),
        ]

    def plot(self, summary: dict, output_dir: str) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        fig = Figure(figsize=(5.5, 4))
        FigureCanvasAgg(fig)
        axis = fig.subplots()
        ks = []
        for index, (name, model) in enumerate(summary["models"].items()):
            curve = model["pass"]
            ks = curve["k"]
            axis.plot(ks, curve["unbiased"], marker="o", color=f"C{index % 10}", label=name)
            axis.plot(
                ks, curve["first_k"], linestyle="--", color=f"C{index % 10}", alpha=0.5, label=f"{name} (first k)"
            )
        axis.set_xscale("log")
        axis.set_xticks(ks, [str(k) for k in ks])
        axis.minorticks_off()
        axis.set_xlabel("k (samples per problem)")
        axis.set_ylabel("pass@k, %")
        axis.set_title(self.benchmark)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(os.path.join(output_dir, f"{self.name}.png"), dpi=120)


def require_columns(row: dict, columns: tuple[str, ...], task: str, source: str, index: int, schema: str) -> None:
    missing = [c for c in columns if row.get(c) in (None, "")]
    if missing:
        raise EvaluationError(
            f"{source!r} row {index} lacks {missing}: task {task!r} needs the columns of {schema}."
        )
