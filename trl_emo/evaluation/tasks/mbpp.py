"""Task `mbpp`: MBPP pass@k (GEM Tables 6 and 9), the programs run in the sandbox.

Default `evalplus/mbppplus` (378 problems, the set GEM evaluates, with MBPP's own tests in
`test_list`); also `google-research-datasets/mbpp` (`prompts_config: full`, 500 test problems, or
`sanitized`, 257) or a local file of one of these schemas. The instruction is the task and its first
test (Magicoder's text2code.py); the program passes when every assert of `test_list` does, after
`test_imports` and `test_setup_code`. MBPP+'s extra tests (`test`) and MBPP's `challenge_test_list`
are not run.
"""

from __future__ import annotations

from ..errors import EvaluationError
from ..sandbox import mbpp_problem
from ..task_registry import register_task
from .code import CodeProblem, CodeTask

SCHEMAS = "google-research-datasets/mbpp or evalplus/mbppplus (`text` or `prompt`, `test_list`)"


@register_task
class MBPPTask(CodeTask):
    name = "mbpp"
    title = "MBPP: pass@k"
    benchmark = "MBPP"
    defaults = {**CodeTask.defaults, "prompts": "evalplus/mbppplus"}
    prompt_columns = ("text", "prompt")

    def check_row(self, row: dict, index: int) -> None:
        tests = row.get("test_list")
        if not isinstance(tests, (list, tuple)) or not tests or not all(isinstance(t, str) for t in tests):
            raise EvaluationError(
                f"{self.config.prompts!r} row {index} has no `test_list` of asserts: task 'mbpp' needs the columns "
                f"of {SCHEMAS}."
            )

    def problem(self, row: dict) -> CodeProblem:
        try:
            instruction, response_prefix = mbpp_problem(row)
        except ValueError as exc:
            raise EvaluationError(f"{self.config.prompts!r}: {exc} ({SCHEMAS}).") from None
        imports = row.get("test_imports") or []
        setup = "\n".join([*imports, row.get("test_setup_code") or ""]) + "\n"
        return CodeProblem(
            instruction=instruction, response_prefix=response_prefix, program_prefix="", setup=setup,
            checks="\n".join(row["test_list"]) + "\n",
        )
