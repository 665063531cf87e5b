"""Code benchmarks (HumanEval, MBPP): the Magicoder prompt, extracting the program, running its tests in the sandbox.

Pure functions and one entry point, `run_checks`, which hands `(solution, tests)` jobs to a
`Sandbox` (`_sandbox`) and turns each `SandboxResult` into a verdict. The program run in the sandbox is
`_code_runner.py` (see its docstring for how the verdict resists shortcuts).
"""

from __future__ import annotations

import ast
import re
import secrets
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ._sandbox import Sandbox, SandboxResult

# Magicoder's prompt template (Wei et al., "Magicoder: Empowering Code Generation with OSS-Instruct",
# ICML 2024; `MAGICODER_PROMPT` in src/magicoder/prompt_template.py of github.com/ise-uiuc/magicoder). GEM's
# Appendix D evaluates HumanEval and MBPP with "the prompt from [Magicoder]" and Magicoder's
# experiments/text2code.py, which fills `{response}` with the start of the answer (an opened code block).
MAGICODER_PROMPT = (
    "You are an exceptionally intelligent coding assistant that consistently delivers accurate and reliable "
    "responses to user instructions.\n\n@@ Instruction\n{instruction}\n\n@@ Response\n{response}"
)
# The instructions of text2code.py: HumanEval shows the function's signature and docstring and pre-fills them
# in the answer, so the model writes the body; MBPP gives the task and its first test.
HUMANEVAL_INSTRUCTION = "Write a solution to the following problem:\n```python\n{prompt}\n```"
MBPP_INSTRUCTION = "{description} Your code should satisfy the following assertion:\n```python\n{assertion}\n```"
CODE_FENCE = "```"
# Part of the execution cache's settings: bump when extraction, sanitizing or the runner change verdicts.
CHECKER_VERSION = "magicoder-first-fence/sanitize-v1/runner-v1"

_RUNNER = None


def runner_source() -> str:
    global _RUNNER
    if _RUNNER is None:
        _RUNNER = (Path(__file__).with_name("_code_runner.py")).read_text(encoding="utf-8")
    return _RUNNER


# ------------------------------------------------------------------------------------------ prompts


def magicoder_prompt(instruction: str, response_prefix: str) -> str:
    return MAGICODER_PROMPT.format(instruction=instruction, response=response_prefix)


def humaneval_problem(prompt: str) -> tuple[str, str]:
    """(instruction, response prefix) of a HumanEval problem: the answer starts as the prompt's code."""
    code = prompt.strip()
    return HUMANEVAL_INSTRUCTION.format(prompt=code), f"{CODE_FENCE}python\n{code}"


def mbpp_description(row: dict) -> tuple[str, str]:
    """(task description, first assertion) of an MBPP row: `text` (full config), `prompt` (sanitized, MBPP+), or
    an EvalPlus-style prompt whose docstring holds the description followed by the assertion."""
    text = row.get("text") if isinstance(row.get("text"), str) else row.get("prompt")
    if not isinstance(text, str):
        raise ValueError("an MBPP row needs a `text` (full) or `prompt` (sanitized, MBPP+) column")
    tests = list(row.get("test_list") or [])
    if '"""' in text:  # EvalPlus's own files: the docstring holds the description, then the assertion
        inner = text[text.index('"""') + 3 : text.rindex('"""')]
        if "assert" in inner:
            return inner[: inner.index("assert")].strip(), inner[inner.index("assert") :].strip()
        text = inner
    if not tests:
        raise ValueError("an MBPP row needs a non-empty `test_list`")
    return text.strip(), tests[0].strip()


def mbpp_problem(row: dict) -> tuple[str, str]:
    """(instruction, response prefix) of an MBPP problem, as text2code.py builds them."""
    description, assertion = mbpp_description(row)
    if not description.endswith("."):
        description += "."
    return MBPP_INSTRUCTION.format(description=description, assertion=assertion), f"{CODE_FENCE}python"


# ------------------------------------------------------------------------------------------ extracting the program


def extract_code(response: str) -> str:
    """The code a response to a prompt that opened a code block (the response prefix) contains.

    Magicoder's rule: everything up to the first ``` (the block the prompt opened ends there); without one
    (cut by `max_new_tokens`), the whole response. One repair: when the model closes the opened block at once
    and writes its code in the next fenced block, that block is taken.
    """
    end = response.find(CODE_FENCE)
    if end == -1:
        return response
    if response[:end].strip():
        return response[:end]
    rest = response[end + len(CODE_FENCE) :]
    opening = rest.find(CODE_FENCE)
    if opening == -1:
        return ""
    header_end = rest.find("\n", opening)
    if header_end == -1:
        return ""
    body = rest[header_end + 1 :]
    closing = body.find(CODE_FENCE)
    return body if closing == -1 else body[:closing]


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError):
        return False
    return True


def longest_parsable_prefix(code: str) -> str:
    """`code`, or its longest prefix of whole lines that parses (a response cut mid-statement loses its last,
    unfinished lines); the original when no prefix parses."""
    if _parses(code):
        return code
    lines = code.splitlines(keepends=True)
    for end in range(len(lines) - 1, 0, -1):
        candidate = "".join(lines[:end])
        if _parses(candidate):
            return candidate
    return code


def _kept(node: ast.stmt) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return True
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        return True
    if isinstance(node, ast.Try):  # try: import x / except ImportError: ...
        return all(isinstance(n, (ast.Import, ast.ImportFrom)) for n in node.body)
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        # Deep recursive solutions raise the limit at the top of the file.
        return isinstance(func, ast.Attribute) and func.attr == "setrecursionlimit"
    return False


def sanitize(code: str) -> str:
    """The program without what a model writes around its solution: top-level calls and prints, its own asserts,
    loops and `if __name__ == "__main__":` blocks are dropped; imports, functions, classes and assignments kept.

    Model-written example usage would otherwise run before the tests (printing, reading stdin, failing its own
    wrong asserts). Code that does not parse even after dropping unfinished last lines is returned unchanged
    (and fails with its SyntaxError).
    """
    code = longest_parsable_prefix(code)
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    lines = code.splitlines(keepends=True)
    kept = []
    for node in tree.body:
        if _kept(node):
            start = node.lineno - 1
            if getattr(node, "decorator_list", None):
                start = min(d.lineno for d in node.decorator_list) - 1
            kept.append("".join(lines[start : node.end_lineno]))
    return "".join(part if part.endswith("\n") else part + "\n" for part in kept)


# ------------------------------------------------------------------------------------------ running the checks


@dataclass(frozen=True)
class CodeJob:
    """One program to check: the solution, the test setup (definitions) and the checks that use them."""

    solution: str
    setup: str
    checks: str


def encode_fields(*fields: str) -> bytes:
    """Length-prefixed UTF-8 fields, read back by `_code_runner._fields`."""
    out = []
    for text in fields:
        data = text.encode("utf-8", "replace")
        out.append(str(len(data)).encode() + b"\n" + data)
    return b"".join(out)


_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def verdict(result: SandboxResult, token: str) -> dict:
    """`passed` and how the program ended: passed, failed (an assertion), error (another exception), memory,
    timeout, output_limit, exited_early (status 0 without reaching the end of the checks), untrusted_result,
    killed (by a limit's signal)."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    passed = result.ok and f"\n{token}\n" in result.stdout
    if passed:
        status = "passed"
    elif result.status in ("timeout", "output_limit"):
        status = result.status
    elif result.status == "signaled":
        status = "killed"
    elif result.returncode == 0:
        status = "exited_early"
    else:
        match = _EXCEPTION.match(last)
        name = match.group(1).rsplit(".", 1)[-1] if match else ""
        status = {
            "AssertionError": "failed", "MemoryError": "memory", "UntrustedResult": "untrusted_result",
        }.get(name, "error")
    return {"passed": passed, "status": status, "detail": last[:300]}


def run_checks(sandbox: Sandbox, jobs: Iterable[CodeJob]) -> Iterator[tuple[int, dict]]:
    """Check every job in the sandbox, several at a time; yield `(job index, verdict)` as they finish."""
    runner = runner_source()
    tokens = []

    def payloads():
        for job in jobs:
            # Drawn now, after the solution was written, and never part of the program's text.
            token = secrets.token_hex(16)
            tokens.append(token)
            yield runner, encode_fields(token, job.solution, job.setup, job.checks)

    for index, result in sandbox.map(payloads()):
        yield index, verdict(result, tokens[index])
