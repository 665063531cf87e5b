"""Task `math` and the math-verify equivalence (also used for GSM8K): extraction, metrics, end to end."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import itertools
import json

import pytest

pytest.importorskip("math_verify", reason="the `math` extra (math-verify) is not installed")

from trl_emo.evaluation import generation, metrics  # noqa: E402
from trl_emo.commands.evaluate import run  # noqa: E402
from trl_emo.evaluation.math_answers import (  # noqa: E402
    Equivalence, cluster_answers, extract_math_answer, final_line, last_boxed, math_gold,
)
from trl_emo.evaluation.tasks.bon import gsm8k_answers, gsm8k_equivalence  # noqa: E402

from conftest import save_eval_policy, save_eval_reward_model, write_eval_recipe  # noqa: E402
from data_fixtures import write_jsonl  # noqa: E402

# MATH-500's schema (`answer`) and hendrycks_math's (`solution` with a boxed answer) in one local file.
PROBLEMS = [
    {"problem": "What is 1/2 as a decimal?", "answer": "0.5", "subject": "Prealgebra", "level": 1},
    {"problem": "Simplify 6/8.", "solution": "Divide by 2: $\\boxed{\\frac{3}{4}}$.", "level": 2},
    {"problem": "Solve x+1=3.", "answer": "2"},
]
# Scripted responses, n = 4 per problem, and the greedy one. Only an equivalence checker gets the
# first two problems right: `\frac{1}{2}` vs 0.5, `\dfrac{3}{4}` vs `\frac{3}{4}`, `0.75` vs `\frac{3}{4}`.
SCRIPT = {
    "What is 1/2 as a decimal?": (
        ["So $\\boxed{\\frac{1}{2}}$.", "It is \\boxed{0.5}", "\\boxed{2}", "The answer is: 1/2"],
        "The answer is: \\frac12",
    ),
    "Simplify 6/8.": (
        ["\\boxed{\\dfrac{3}{4}}", "\\boxed{0.75}", "\\boxed{\\frac{4}{3}}", "\\boxed{\\frac{4}{3}}"],
        "\\boxed{\\frac{4}{3}}",
    ),
    "Solve x+1=3.": (["x = \\boxed{2}", "\\boxed{3}", "\\boxed{3}", "no idea"], "The answer is 2."),
}


# ---------------------------------------------------------------- extraction and equivalence


def test_boxed_answers_with_nested_braces_and_the_last_line_fallback():
    assert last_boxed("first \\boxed{1} then \\boxed{\\frac{\\sqrt{3}}{2}} done") == "\\frac{\\sqrt{3}}{2}"
    assert last_boxed("\\fbox{x^{2}}") == "x^{2}"
    assert last_boxed("unbalanced \\boxed{\\frac{1}{2}") is None
    assert final_line("Work.\n\nThe answer is: \\frac{1}{2}.\n") == "\\frac{1}{2}"
    assert final_line("Final Answer: 7") == "7"
    assert final_line("Hope this helps!") is None and final_line("Answer: yes") == "yes"
    assert extract_math_answer("\\boxed{5}\nThe answer is: 5") == "5"  # MetaMath's closing statement repeats the box
    assert extract_math_answer("\\boxed{5}\nThe answer is: 6") is None  # two different final answers: none
    assert extract_math_answer("   ") is None
    assert math_gold("We get $\\boxed{\\{1,2\\}}$.") == "\\{1,2\\}" and math_gold("0.5") == "0.5"


@pytest.mark.parametrize(
    "gold, answer, same",
    [
        ("0.5", "\\frac{1}{2}", True),
        ("\\frac{3}{4}", "\\dfrac{3}{4}", True),
        ("\\frac{3}{4}", "0.75", True),
        ("1024", "2^{10}", True),
        ("(1,2]", "(1, 2]", True),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", True),
        ("2", "x = 2", True),
        ("\\frac{3}{4}", "\\frac{4}{3}", False),
        ("(1,2]", "[1,2]", False),
        ("2", None, False),
    ],
)
def test_equivalence_gets_right_what_string_matching_gets_wrong(gold, answer, same):
    assert Equivalence()(gold, answer) is same
    if same and answer is not None:
        assert gold != answer  # exact matching would have called it wrong


def test_equivalent_answers_are_one_vote():
    labels = cluster_answers(["\\frac{1}{2}", "0.5", None, "2", "1/2", "2.0"], Equivalence())
    assert labels == [0, 0, None, 1, 0, 1]


# ---------------------------------------------------------------- estimators


def brute_force_mv(labels, correct, k):
    total = 0.0
    subsets = list(itertools.combinations(range(len(labels)), k))
    for subset in subsets:
        counts = {}
        for j in subset:
            if labels[j] is not None:
                counts[labels[j]] = counts.get(labels[j], 0) + 1
        if counts:
            top = max(counts.values())
            winners = [label for label, count in counts.items() if count == top]
            total += sum(correct[w] for w in winners) / len(winners)
    return total / len(subsets)


def test_majority_vote_over_subsets_matches_brute_force():
    labels = [0, 1, 1, None, 2, 0, 1, 0]
    correct = {0: True, 1: False, 2: False}
    for k in (1, 3, 5, 8):
        exact = brute_force_mv(labels, correct, k)
        estimate = metrics.majority_vote_subset_average(labels, correct, k)
        assert estimate == pytest.approx(exact, abs=0.0 if k in (1, 8) else 0.04), k
    assert metrics.majority_vote_subset_average([None, None], {}, 2) == 0.0


def test_bon_with_a_reward_model_matches_brute_force_including_ties():
    rewards = [0.3, 1.2, -0.5, 1.2, 0.9, 0.1]
    correct = [True, False, False, True, True, False]
    for k in range(1, 7):
        subsets = list(itertools.combinations(range(6), k))
        expected = 0.0
        for subset in subsets:
            top = max(rewards[j] for j in subset)
            tied = [j for j in subset if rewards[j] == top]
            expected += sum(correct[j] for j in tied) / len(tied)
        assert metrics.bon_correct_unbiased(rewards, correct, k) == pytest.approx(expected / len(subsets))
    assert metrics.bon_correct_first_k(rewards, correct, 2) == 0.0  # 1.2 (wrong) beats 0.3
    assert metrics.bon_correct_first_k(rewards, correct, 1) == 1.0


# ---------------------------------------------------------------- GSM8K with the same equivalence

# A GSM8K fixture of response styles, gold answers 0.5 (as GSM8K writes it: "1/2" canonical) and 1024.
GSM8K_RESPONSES = [
    ("1/2", "The answer is: \\frac{1}{2}"),  # read exactly: \\frac is a number form (it was read as 1 before)
    ("1/2", "The answer is \\dfrac{1}{2}."),  # same
    ("1024", "The answer is 2^{10}."),  # one LaTeX expression, not a number: only the equivalence gets it right
    ("1/2", "The answer is 0.5"),  # both right
    ("1/2", "The answer is 1/2"),  # both right
    ("1024", "The answer is 1,024"),  # both right
    ("1024", "The answer is $1,024.00"),  # both right
    ("1/2", "The answer is \\frac{1}{3}"),  # both wrong
    ("1024", "The answer is 1000 + 24"),  # both wrong: work, not one simplified answer (no LaTeX: no math-verify)
    ("1024", "#### 1024"),  # both right
    ("1/2", "I think one half"),  # no answer
    ("1024", "The answer is 2^{10} apples"),  # only the equivalence
]


def test_gsm8k_verdicts_changed_by_the_equivalence_on_a_fixture():
    equivalence = gsm8k_equivalence()
    changed_total = 0
    verdicts = []
    for gold, text in GSM8K_RESPONSES:
        (answer,), changed = gsm8k_answers([text], gold, equivalence)
        exact = metrics.extract_answer(text) == gold
        verdicts.append((exact, answer == gold))
        changed_total += changed
        assert changed == int(exact != (answer == gold))
        assert not (exact and answer != gold)  # the equivalence never turns a right answer wrong
    assert changed_total == 2  # 2 of the 12 responses (the `2^{10}` ones); docs/evaluation.md quotes this
    assert sum(v for _, v in verdicts) == 9 and sum(e for e, _ in verdicts) == 7


# ---------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("math_assets")
    return {
        "root": root, "policy": save_eval_policy(root / "policy"), "rm": save_eval_reward_model(root / "rm"),
        "prompts": write_jsonl(root / "math.jsonl", PROBLEMS),
    }


@pytest.fixture
def scripted_policy(monkeypatch):
    calls = {"generate": 0}

    def fake_init(self, path, config, tokenizer):
        self.tokenizer = tokenizer

    def fake_generate(self, prompts, num_samples, seed, greedy=False):
        calls["generate"] += 1
        questions = [p.split("<|user|>\n", 1)[1].split("<|end|>", 1)[0] for p in prompts]
        if greedy:
            return [[{"text": SCRIPT[q][1], "num_tokens": 3, "finish_reason": "stop"}] for q in questions]
        return [
            [{"text": t, "num_tokens": 3, "finish_reason": "stop"} for t in SCRIPT[q][0][:num_samples]]
            for q in questions
        ]

    monkeypatch.setattr(generation.HFGenerator, "__init__", fake_init)
    monkeypatch.setattr(generation.HFGenerator, "generate", fake_generate)
    monkeypatch.setattr(generation.HFGenerator, "close", lambda self: None)
    return calls


def math_recipe(assets, output_dir, **overrides):
    values = {
        "task": "math", "policies": {"a": assets["policy"]}, "reward_model": assets["rm"],
        "prompts": assets["prompts"], "n": 4, "math_k_values": [1, 2, 4], "generation_batch_size": 8,
        "embedding_diversity": False, "progress": False, "device": "cpu", "output_dir": str(output_dir),
    }
    return write_eval_recipe(output_dir, values, **overrides)


def test_math_task_end_to_end_and_resume(assets, tmp_path, scripted_policy, monkeypatch, capsys):
    output_dir = tmp_path / "math"
    argv = ["--recipe", math_recipe(assets, output_dir)]
    assert run(argv) == 0
    table = capsys.readouterr().out
    assert "GEM Figure 3" in table and "| MV@4 |" in table and "| BoN (reward model)@4 |" in table
    summary = json.loads((output_dir / "summary.json").read_text())
    result = summary["models"]["a"]["math"]
    # Greedy: \frac12 = 0.5 right, 4/3 wrong, 2 right.
    assert result["greedy_accuracy"] == pytest.approx(200 / 3)
    # Samples right: problem 0: 3 of 4 (\frac{1}{2}, 0.5, 1/2); problem 1: 2 of 4; problem 2: 1 of 4.
    assert result["sample_accuracy"] == pytest.approx(100 * (3 / 4 + 2 / 4 + 1 / 4) / 3)
    # MV@4: problem 0 the 1/2-cluster (3 votes) right; problem 1 3/4-cluster (2) ties 4/3 (2), first seen
    # is right; problem 2: 3 (2 votes) beats 2 (1 vote): wrong.
    assert result["mv"][-1] == pytest.approx(200 / 3)
    assert result["pass_first_k"] == pytest.approx([100 * 3 / 3, 100, 100])
    assert result["no_answer_percent"] == pytest.approx(100 / 12)  # "no idea" is no answer
    assert result["pass_unbiased"][0] == pytest.approx(result["sample_accuracy"])
    # The tie on problem 1 is split evenly over subsets: MV over all 4 samples = (1 + 0.5 + 0) / 3.
    assert result["mv_subsets"][-1] == pytest.approx(100 * 1.5 / 3)
    # BoN with the reward model agrees with the cached rewards and verdicts.
    rewards = {}
    for line in (output_dir / "rewards" / "a.jsonl").read_text().splitlines():
        row = json.loads(line)
        rewards[(row["prompt_index"], row["sample"])] = row["reward"]
    verdicts = {}
    for line in (output_dir / "verdicts" / "a.jsonl").read_text().splitlines():
        row = json.loads(line)
        verdicts[(row["prompt_index"], row["sample"])] = row["correct"]
    best = [max(range(4), key=lambda j: rewards[(i, j)]) for i in range(3)]
    assert result["bon_unbiased"][-1] == pytest.approx(100 * sum(verdicts[(i, best[i])] for i in range(3)) / 3)
    assert (output_dir / "math.png").read_bytes()[:4] == b"\x89PNG"

    # Resume: nothing is generated or checked again, and the summary is the same.
    calls = {"check": 0}
    original = Equivalence.__call__

    def counting(self, gold, answer):
        calls["check"] += 1
        return original(self, gold, answer)

    monkeypatch.setattr(Equivalence, "__call__", counting)
    before = scripted_policy["generate"]
    assert run(argv) == 0
    assert scripted_policy["generate"] == before and calls["check"] == 0
    assert json.loads((output_dir / "summary.json").read_text()) == summary


def test_math_task_clear_errors(assets, tmp_path, capsys, monkeypatch):
    no_gold = tmp_path / "nogold.jsonl"
    no_gold.write_text(json.dumps({"problem": "1+1?"}) + "\n")
    assert run(["--recipe", math_recipe(assets, tmp_path / "e1", prompts=str(no_gold))]) == 2
    assert "needs an `answer` or `solution` column" in capsys.readouterr().err
    assert run(["--recipe", math_recipe(assets, tmp_path / "e2", k_values=[1, 2])]) == 2
    assert "k_values does not apply to task 'math' (its k are `math_k_values`)" in capsys.readouterr().err
    import sys

    monkeypatch.setitem(sys.modules, "math_verify", None)
    assert run(["--recipe", math_recipe(assets, tmp_path / "e3")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'trl-emo[math]'" in err
