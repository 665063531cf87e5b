"""The code sandbox: running untrusted, model-written Python programs, and checking them against a benchmark's tests.

A security boundary, kept in one folder so that it can be reviewed whole: everything that runs model-written code is
here and nothing else is. This module is its public face, the only one callers import (the code tasks,
`trl_emo.evaluation.tasks.code`, `humaneval` and `mbpp`; `benchmarks/sandbox_bench.py`; a user's own code, as in
docs/evaluation.md). The modules behind it are private, named with a leading underscore; the import contract
`sandbox-private` (`pyproject.toml`, checked by `tests/test_architecture.py`) keeps every module outside this package
from importing them:

- `_sandbox`: `Sandbox` (runs a program, or many `workers` at a time), `SandboxLimits`, `SandboxResult`,
  `confinement()` (which layers this machine can apply) and the refusal when none keeps a program from the
  evaluator's files; its docstring lists what every program gets;
- `_bootstrap`: the child side, run as `python -s -S -P -c BOOTSTRAP` (a string, never a file path): Landlock, the
  network namespace, the privilege drop and the resource limits, put in place before the program runs;
- `_interpreter`: what the sandboxed interpreter may read; the standard library's copy for a dropped uid;
- `_uids`: the unprivileged uids of the privilege drop, one leased per running program;
- `_bubblewrap`: bwrap's command line (an extra layer where it is installed);
- `_processes`: finding and killing what a program left running; `_files`: its input, its directory, what its uid
  left behind; `_errors`: `SandboxError`, `UnconfinedError`;
- `_code_execution`: the code benchmarks on top of the sandbox (the Magicoder prompt, extracting and sanitizing the
  program, `run_checks` and its verdicts); `_code_runner.py`: the checking program run inside the sandbox (read as
  text by `_code_execution`, never imported).

What each layer stops and where it is tested: docs/evaluation.md, "Running model-written code: the sandbox".
`tests/test_evaluation_sandbox.py` runs hostile programs with every layer the machine has,
`tests/test_evaluation_sandbox_drop.py` with the privilege drop alone (and the refusal, the standard library's copy,
bubblewrap), `tests/test_evaluation_code.py` the prompts, extraction, the verdict guard and the tasks end to end.
"""

from ._code_execution import (
    CHECKER_VERSION,
    MAGICODER_PROMPT,
    CodeJob,
    extract_code,
    humaneval_problem,
    magicoder_prompt,
    mbpp_problem,
    run_checks,
    sanitize,
)
from ._sandbox import (
    MARKER_VARIABLE,
    SETUP_FAILED,
    UNPRIVILEGED_UIDS,
    Sandbox,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    UnconfinedError,
    bubblewrap_argv,
    confinement,
    interpreter_view,
    landlock_abi,
)

__all__ = [
    # the sandbox
    "MARKER_VARIABLE", "SETUP_FAILED", "UNPRIVILEGED_UIDS", "Sandbox", "SandboxError", "SandboxLimits",
    "SandboxResult", "UnconfinedError", "bubblewrap_argv", "confinement", "interpreter_view", "landlock_abi",
    # the code benchmarks on top of it
    "CHECKER_VERSION", "MAGICODER_PROMPT", "CodeJob", "extract_code", "humaneval_problem", "magicoder_prompt",
    "mbpp_problem", "run_checks", "sanitize",
]
