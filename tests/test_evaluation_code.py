"""Tasks `humaneval` and `mbpp`: pass@k, the Magicoder prompt, extracting programs, the verdict guard, end to end."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import itertools
import json
import sys
from fractions import Fraction

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the code sandbox targets Linux")

from trl_emo.evaluation import generation, metrics  # noqa: E402
from trl_emo.commands.evaluate import run  # noqa: E402
from trl_emo.evaluation.sandbox import (  # noqa: E402
    MAGICODER_PROMPT, CodeJob, Sandbox, SandboxLimits, extract_code, humaneval_problem, mbpp_problem, run_checks,
    sanitize,
)

from conftest import save_eval_policy, write_eval_recipe  # noqa: E402
from data_fixtures import write_jsonl  # noqa: E402

# ---------------------------------------------------------------- pass@k


def test_pass_at_k_is_exact_against_brute_force_enumeration():
    n = 8
    for c in range(n + 1):
        outcomes = [True] * c + [False] * (n - c)
        for k in range(1, n + 1):
            subsets = list(itertools.combinations(outcomes, k))
            exact = Fraction(sum(any(s) for s in subsets), len(subsets))
            assert metrics.pass_at_k_unbiased(n, c, k) == float(exact), (c, k)  # correctly rounded, not approx
    # n = 200 (GEM): C(200, 100) overflows a float, the integer ratio does not.
    for c, k in ((1, 1), (3, 100), (17, 50), (199, 100), (0, 20)):
        exact = 1 - Fraction(__import__("math").comb(200 - c, k), __import__("math").comb(200, k))
        assert metrics.pass_at_k_unbiased(200, c, k) == float(exact)
    with pytest.raises(ValueError):
        metrics.pass_at_k_unbiased(4, 5, 1)


def test_pass_at_k_curve_both_estimators():
    correct = [[False, True, False, False], [False, False, False, False], [True, True, True, True]]
    curve = metrics.pass_at_k_curve(correct, [1, 2, 4])
    assert curve["first_k"] == pytest.approx([100 / 3, 200 / 3, 200 / 3])
    # Problem 0: 1 of 4 right: pass@1 = 1/4, pass@2 = 1 - C(3,2)/C(4,2) = 1/2, pass@4 = 1.
    assert curve["unbiased"] == pytest.approx([100 * (0.25 + 0 + 1) / 3, 100 * (0.5 + 0 + 1) / 3, 200 / 3])


# ---------------------------------------------------------------- prompts and programs

HUMANEVAL_ROW = {
    "task_id": "HumanEval/0",
    "prompt": 'def square(x: int) -> int:\n    """Return x squared."""\n',
    "entry_point": "square",
    "test": "METADATA = {}\n\ndef check(candidate):\n    assert candidate(3) == 9\n    assert candidate(-2) == 4\n",
}


def test_magicoder_prompts_as_text2code_builds_them():
    instruction, prefix = humaneval_problem(HUMANEVAL_ROW["prompt"])
    assert instruction == (
        'Write a solution to the following problem:\n```python\ndef square(x: int) -> int:\n    """Return x squared."""\n```'
    )
    assert prefix == '```python\ndef square(x: int) -> int:\n    """Return x squared."""'
    text = MAGICODER_PROMPT.format(instruction=instruction, response=prefix)
    assert text.startswith("You are an exceptionally intelligent coding assistant")
    assert "\n\n@@ Instruction\nWrite a solution" in text and text.endswith('@@ Response\n' + prefix)
    tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]
    expected = "Add two numbers. Your code should satisfy the following assertion:\n```python\nassert add(1, 2) == 3\n```"
    for row in (
        {"text": "Add two numbers", "test_list": tests},  # google-research-datasets/mbpp, full
        {"prompt": "Add two numbers.", "test_list": tests},  # sanitized, evalplus/mbppplus
        {"prompt": '"""\nAdd two numbers\nassert add(1, 2) == 3\n"""\n', "test_list": tests},  # EvalPlus files
    ):
        assert mbpp_problem(row) == (expected, "```python")


def test_extract_code_up_to_the_first_fence_and_sanitize():
    assert extract_code("\n    return x * x\n```\nThis squares x.\n```python\nprint(1)\n```") == "\n    return x * x\n"
    assert extract_code("\n    return x * x") == "\n    return x * x"  # cut by max_new_tokens: all of it
    # The model closed the opened block at once and wrote its code in the next one.
    assert extract_code("\n```\nHere:\n```python\ndef f():\n    return 1\n```") == "def f():\n    return 1\n"
    program = (
        "import math\nfrom typing import List\n\nLIMIT = 10\n\n@staticmethod\ndef helper(x):\n    return x\n\n"
        "def square(x):\n    return x * x\n\nprint(square(3))\nassert square(2) == 5\n"
        "if __name__ == '__main__':\n    square(input())\nfor i in range(3):\n    print(i)\n"
        "import sys\nsys.setrecursionlimit(5000)\nx = [1,\n"
    )
    assert sanitize(program) == (
        "import math\nfrom typing import List\nLIMIT = 10\n@staticmethod\ndef helper(x):\n    return x\n"
        "def square(x):\n    return x * x\nimport sys\nsys.setrecursionlimit(5000)\n"
    )
    assert sanitize("def f(:\n") == "def f(:\n"  # never parses: left to fail with its SyntaxError


# ---------------------------------------------------------------- the verdict guard


def test_the_checks_compare_plain_values_only():
    setup = (
        "from collections import Counter, namedtuple\n"
        "class Node:\n"
        "    def __init__(self, v): self.v = v\n"
        "    def __eq__(self, other): return isinstance(other, Node) and other.v == self.v\n"
    )
    cases = {
        # (solution, checks, passes)
        "Counter for a dict": ("from collections import Counter\ndef f(x):\n    return Counter(x)\n",
                               "assert f('aab') == {'a': 2, 'b': 1}\n", True),
        "namedtuple for a tuple": ("from collections import namedtuple\nP = namedtuple('P', 'a b')\n"
                                   "def f():\n    return P(1, 2)\n", "assert f() == (1, 2)\n", True),
        "generator, listed by the checks": ("def f(n):\n    yield from range(n)\n", "assert list(f(3)) == [0, 1, 2]\n", True),
        "float subclass, right value": ("class F(float):\n    pass\ndef f():\n    return F(0.5)\n",
                                        "assert abs(f() - 0.5) < 1e-9\n", True),
        "instance of a class the tests define": ("def f():\n    return Node(3)\n", "assert f() == Node(3)\n", True),
        "deep recursion keeps its depth": ("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n",
                                           "assert f(900) == 900\n", True),
        "prints a lot and is right": ("def f():\n    print('passed\\n' * 1000)\n    return 1\n", "assert f() == 1\n", True),
        "str subclass with a lying __eq__": ("class S(str):\n    def __eq__(self, o): return True\n"
                                             "def f():\n    return S('no')\n", "assert f() == 'yes'\n", False),
        "lying __sub__ and __abs__": ("class A:\n    def __sub__(self, o): return 0.0\n    def __abs__(self): return 0.0\n"
                                      "def f():\n    return A()\n", "assert abs(f() - 0.5) < 1e-9\n", False),
        "always-true object behind a caught error": (
            "class A:\n    def __eq__(self, o): return True\ndef f():\n    return A()\n",
            "try:\n    assert f() == 1\nexcept Exception:\n    pass\n", False),
        "lying __bool__": ("class B:\n    def __bool__(self): return True\ndef f():\n    return B()\n",
                           "assert f()\n", False),
    }
    sandbox = Sandbox(SandboxLimits(timeout=10), workers=2)
    jobs = [CodeJob(solution, setup, checks) for solution, checks, _ in cases.values()]
    verdicts = dict(run_checks(sandbox, jobs))
    for index, (name, (_, _, passes)) in enumerate(cases.items()):
        assert verdicts[index]["passed"] is passes, (name, verdicts[index])
    assert verdicts[len(cases) - 2]["status"] == "untrusted_result"


# ---------------------------------------------------------------- end to end

# Two HumanEval-style problems; the responses continue the opened code block (Magicoder's prefill).
PROBLEMS = [
    HUMANEVAL_ROW,
    {
        "task_id": "HumanEval/1",
        "prompt": 'def add(a, b):\n    """Return a + b."""\n',
        "entry_point": "add",
        "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n    assert candidate(-1, 1) == 0\n",
    },
]
SCRIPT = {
    "square": (
        [
            "\n    return x * x\n```\nDone.",  # right
            "\n    return x * x\n```\nDone.",  # right, the same program: run once
            "\n    return x + x\n```",  # wrong
            "\n    import sys\n    sys.exit(0)\n```",  # exits inside the check: no token
        ],
        "\n    return x ** 2\n```",
    ),
    "add": (
        [
            "\n    while True:\n        pass\n```",  # timeout
            "\n    return a + c\n```",  # NameError
            "\n    return a + b\n```",  # right
            "\n    return a - b\n```",  # wrong
        ],
        "\n    return a - b\n```",
    ),
}

# MBPP answers are whole programs (the prompt only opens the code block).
MBPP_SCRIPT = {
    "add": (["\ndef add(a, b):\n    return a - b\n```", "\ndef add(a, b):\n    return a +\n```"], None),
    "square": (["\ndef square(x):\n    return x * x\n```", "\nimport math\ndef square(x):\n    return x ** 2\n```"], None),
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("code_assets")
    mbpp = [
        {"source_file": "x", "task_id": 2, "prompt": "Write a function to add two numbers.",
         "code": "def add(a, b):\n    return a + b", "test_imports": ["import math"],
         "test_list": ["assert add(1, 2) == 3", "assert math.isclose(add(0.5, 0.25), 0.75)"]},
        {"source_file": "x", "task_id": 3, "prompt": "Write a function to square a number.",
         "code": "def square(x):\n    return x * x", "test_imports": [],
         "test_list": ["assert square(3) == 9", "assert square(-2) == 4"]},
    ]
    return {
        "root": root, "policy": save_eval_policy(root / "policy"),
        "humaneval": write_jsonl(root / "humaneval.jsonl", PROBLEMS), "mbpp": write_jsonl(root / "mbpp.jsonl", mbpp),
    }


@pytest.fixture
def scripted_policy(monkeypatch):
    calls = {"generate": 0, "prompts": []}

    def fake_init(self, path, config, tokenizer):
        self.tokenizer = tokenizer

    def fake_generate(self, prompts, num_samples, seed, greedy=False):
        calls["generate"] += 1
        calls["prompts"] += prompts
        out = []
        for prompt in prompts:
            name = "square" if "square" in prompt else "add"
            script = SCRIPT if "Write a solution" in prompt else MBPP_SCRIPT
            texts = [script[name][1]] if greedy else script[name][0][:num_samples]
            out.append([{"text": t, "num_tokens": 5, "finish_reason": "stop"} for t in texts])
        return out

    monkeypatch.setattr(generation.HFGenerator, "__init__", fake_init)
    monkeypatch.setattr(generation.HFGenerator, "generate", fake_generate)
    monkeypatch.setattr(generation.HFGenerator, "close", lambda self: None)
    return calls


@pytest.fixture
def counted_runs(monkeypatch):
    calls = {"programs": 0}
    original = run_checks

    def counting(sandbox, jobs):
        jobs = list(jobs)
        calls["programs"] += len(jobs)
        return original(sandbox, jobs)

    monkeypatch.setattr("trl_emo.evaluation.tasks.code.run_checks", counting)
    return calls


def code_recipe(assets, output_dir, task="humaneval", **overrides):
    values = {
        "task": task, "policies": {"a": assets["policy"]}, "prompts": assets[task], "n": 4,
        "code_k_values": [1, 2, 4], "code_execution_timeout": 2, "generation_batch_size": 8, "progress": False,
        "device": "cpu", "output_dir": str(output_dir),
    }
    return write_eval_recipe(output_dir, values, **overrides)


def test_humaneval_end_to_end_and_resume(assets, tmp_path, scripted_policy, counted_runs, capsys):
    output_dir = tmp_path / "he"
    argv = ["--recipe", code_recipe(assets, output_dir, greedy=True), "--allow_code_execution", "true"]
    assert run(argv) == 0
    captured = capsys.readouterr()
    assert captured.err.count("Executing model-written code (HumanEval tests): each program in its own") == 1
    assert "| model | pass@1 | pass@2 | pass@4 | greedy |" in captured.out
    # Magicoder's prompt, the answer's code block opened with the problem's code.
    assert scripted_policy["prompts"][0].startswith("You are an exceptionally intelligent coding assistant")
    assert scripted_policy["prompts"][0].endswith('@@ Response\n```python\ndef square(x: int) -> int:\n    """Return x squared."""')
    result = json.loads((output_dir / "summary.json").read_text())["models"]["a"]
    # square: 2 of 4 right; add: 1 of 4 right (first right is sample 2).
    assert result["pass"]["unbiased"] == pytest.approx(
        [100 * (2 / 4 + 1 / 4) / 2, 100 * ((1 - 1 / 6) + (1 - 3 / 6)) / 2, 100.0]
    )
    assert result["pass"]["first_k"] == pytest.approx([50.0, 50.0, 100.0])
    assert result["greedy_pass"] == 50.0  # x ** 2 right, a - b wrong
    assert result["outcomes_percent"] == pytest.approx(
        {"passed": 37.5, "failed": 25.0, "error": 12.5, "timeout": 12.5, "memory": 0.0, "output_limit": 0.0,
         "exited_early": 12.5, "untrusted_result": 0.0, "killed": 0.0}
    )
    assert counted_runs["programs"] == 8  # 8 samples + 2 greedy; a duplicate and a greedy twin run once
    rows = [json.loads(line) for line in (output_dir / "execution" / "a.jsonl").read_text().splitlines()]
    assert len(rows) == 10 and {r["status"] for r in rows if r["prompt_index"] == 1 and r["sample"] == 0} == {"timeout"}
    assert (output_dir / "humaneval.png").read_bytes()[:4] == b"\x89PNG"

    # Resume: nothing generated, nothing executed, the same summary.
    before = scripted_policy["generate"]
    summary = json.loads((output_dir / "summary.json").read_text())
    assert run(argv) == 0
    assert scripted_policy["generate"] == before and counted_runs["programs"] == 8
    assert "Executing model-written code" not in capsys.readouterr().err
    assert json.loads((output_dir / "summary.json").read_text()) == summary


class Interrupted(Exception):
    pass


def test_mbpp_resumes_an_interrupted_execution_and_the_policy_prompt(
    assets, tmp_path, scripted_policy, monkeypatch, capsys
):
    output_dir = tmp_path / "mbpp"
    argv = ["--recipe", code_recipe(assets, output_dir, task="mbpp", n=2, code_k_values=[1, 2], code_prompt="policy"),
            "--allow_code_execution", "true"]
    original = run_checks
    executed = []

    def interrupted(sandbox, jobs):
        jobs = list(jobs)
        for count, (index, verdict) in enumerate(original(sandbox, jobs)):
            if count == 2:
                raise Interrupted("Ctrl-C")
            executed.append(jobs[index].solution)
            yield index, verdict

    monkeypatch.setattr("trl_emo.evaluation.tasks.code.run_checks", interrupted)
    with pytest.raises(Interrupted):
        run(argv)
    assert len((output_dir / "execution" / "a.jsonl").read_text().splitlines()) == 2  # finished verdicts kept

    monkeypatch.setattr("trl_emo.evaluation.tasks.code.run_checks", original)
    runs = []
    monkeypatch.setattr(
        "trl_emo.evaluation.tasks.code.run_checks", lambda sandbox, jobs: (runs.extend(jobs), original(sandbox, runs))[1]
    )
    assert run(argv) == 0
    # Only the programs not checked before the interruption run again.
    assert len(runs) == 2 and not {job.solution for job in runs} & set(executed)
    # The policy's chat template around MBPP's instruction, then the opened code block.
    prompt = scripted_policy["prompts"][0]
    assert "<|user|>\nWrite a function to add two numbers. Your code should satisfy the following assertion:" in prompt
    assert prompt.endswith("<|assistant|>\n```python")
    result = json.loads((output_dir / "summary.json").read_text())["models"]["a"]
    # add: wrong, syntax error; square: right twice (two different programs).
    assert result["pass"]["unbiased"] == pytest.approx([50.0, 50.0])


def test_code_tasks_refuse_to_execute_without_the_opt_in_and_check_their_data(assets, tmp_path, scripted_policy, capsys):
    output_dir = tmp_path / "refused"
    assert run(["--recipe", code_recipe(assets, output_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow_code_execution true" in err
    assert scripted_policy["generate"] == 0 and not (output_dir / "generations").exists()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "def f():\n", "entry_point": "f"}) + "\n")
    assert run(["--recipe", code_recipe(assets, tmp_path / "bad", prompts=str(bad)), "--allow_code_execution", "true"]) == 2
    assert "needs the columns of openai/openai_humaneval" in capsys.readouterr().err


def test_code_tasks_refuse_without_landlock_or_privilege_drop_unless_the_risk_is_accepted(
    assets, tmp_path, scripted_policy, capsys, monkeypatch
):
    # A kernel without Landlock and an evaluator that is not root: nothing would keep the programs from its files.
    from trl_emo.evaluation.sandbox import _sandbox as sandbox

    monkeypatch.setattr(sandbox, "_CONFINEMENT", {"landlock": 0, "network": False, "drop": False, "bubblewrap": None})
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    output_dir = tmp_path / "unconfined"
    assert run(["--recipe", code_recipe(assets, output_dir), "--allow_code_execution", "true"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--allow_unconfined_code_execution true" in err and "Landlock" in err
    assert scripted_policy["generate"] == 0 and not (output_dir / "generations").exists()
    argv = ["--recipe", code_recipe(assets, output_dir), "--allow_code_execution", "true",
            "--allow_unconfined_code_execution", "true"]
    assert run(argv) == 0
    assert "NO filesystem confinement" in capsys.readouterr().err
