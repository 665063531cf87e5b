"""Task `humaneval`: HumanEval pass@k (GEM Tables 6 and 9), the programs run in the sandbox.

164 problems of `openai/openai_humaneval` (default) or a local file of its schema (`task_id`,
`prompt`, `test`, `entry_point`). The answer starts as the problem's code (signature and docstring),
so the model writes the body; the program is that code plus the body, and it passes when the
benchmark's `check(entry_point)` does.
"""

from __future__ import annotations

from ..sandbox import humaneval_problem
from ..task_registry import register_task
from .code import CodeProblem, CodeTask, require_columns

COLUMNS = ("prompt", "test", "entry_point")


@register_task
class HumanEvalTask(CodeTask):
    name = "humaneval"
    title = "HumanEval: pass@k"
    benchmark = "HumanEval"
    defaults = {**CodeTask.defaults, "prompts": "openai/openai_humaneval"}
    prompt_columns = ("prompt",)

    def check_row(self, row: dict, index: int) -> None:
        schema = "openai/openai_humaneval (prompt, test, entry_point)"
        require_columns(row, COLUMNS, self.name, self.config.prompts, index, schema)

    def problem(self, row: dict) -> CodeProblem:
        instruction, response_prefix = humaneval_problem(row["prompt"])
        return CodeProblem(
            instruction=instruction, response_prefix=response_prefix, program_prefix=row["prompt"].strip(),
            setup=row["test"], checks=f"check({row['entry_point']})\n",
        )
