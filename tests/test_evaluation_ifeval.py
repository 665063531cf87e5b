"""Task `ifeval`: a local file of google/IFEval's schema, scored by lm-eval's checkers, offline."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import sys

import pytest

pytest.importorskip("lm_eval", reason="the `ifeval` extra (lm-eval[ifeval]) is not installed")
nltk = pytest.importorskip("nltk", reason="the `ifeval` extra (lm-eval[ifeval]) is not installed")

from trl_emo.evaluation import generation  # noqa: E402
from trl_emo.commands.evaluate import run  # noqa: E402
from trl_emo.evaluation.ifeval_checkers import NLTK_DATA_MISSING, accuracies  # noqa: E402

from conftest import save_eval_policy, write_eval_recipe  # noqa: E402
from data_fixtures import write_jsonl  # noqa: E402

# google/IFEval's columns; kwargs as the Hub stores them (every key, None when unused) or trimmed.
ROWS = [
    {"key": 1, "prompt": "Write two sentences in capital letters.",
     "instruction_id_list": ["change_case:english_capital", "length_constraints:number_sentences"],
     "kwargs": [{}, {"num_sentences": 2, "relation": "at least", "keywords": None}]},
    {"key": 2, "prompt": "Answer without commas.", "instruction_id_list": ["punctuation:no_comma"], "kwargs": [{}]},
    {"key": 3, "prompt": "Mention the sea and the sky, in JSON.",
     "instruction_id_list": ["keywords:existence", "detectable_format:json_format"],
     "kwargs": [{"keywords": ["sea", "sky"]}, {}]},
    {"key": 4, "prompt": "Write at least five words.", "instruction_id_list": ["length_constraints:number_words"],
     "kwargs": [{"num_words": 5, "relation": "at least"}]},
]
RESPONSES = {
    "Write two sentences in capital letters.": "THE SEA IS BLUE. THE SKY IS GREY.",  # both followed
    "Answer without commas.": "Sure, here it is:\nno commas at all",  # only loosely (first line dropped)
    "Mention the sea and the sky, in JSON.": "the sea",  # neither
    "Write at least five words.": "one two three four five six",  # followed
}


@pytest.fixture(scope="module")
def punkt_tab(tmp_path_factory):
    """A stand-in for NLTK's punkt_tab download: an English Punkt model with nothing learned (no abbreviations),
    which still splits sentences at `. ` as the checkers need."""
    root = tmp_path_factory.mktemp("nltk_data")
    folder = root / "tokenizers" / "punkt_tab" / "english"
    folder.mkdir(parents=True)
    for name in ("collocations.tab", "sent_starters.txt", "abbrev_types.txt", "ortho_context.tab"):
        (folder / name).write_text("")
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(nltk.data, "path", [str(root)])
        yield root


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("ifeval_assets")
    return {"policy": save_eval_policy(root / "policy"), "prompts": write_jsonl(root / "ifeval.jsonl", ROWS)}


@pytest.fixture
def scripted_policy(monkeypatch):
    calls = {"greedy": 0, "sampled": 0}

    def fake_init(self, path, config, tokenizer):
        self.tokenizer = tokenizer

    def fake_generate(self, prompts, num_samples, seed, greedy=False):
        calls["greedy" if greedy else "sampled"] += 1
        questions = [p.split("<|user|>\n", 1)[1].split("<|end|>", 1)[0] for p in prompts]
        return [[{"text": RESPONSES[q], "num_tokens": 5, "finish_reason": "stop"}] for q in questions]

    monkeypatch.setattr(generation.HFGenerator, "__init__", fake_init)
    monkeypatch.setattr(generation.HFGenerator, "generate", fake_generate)
    monkeypatch.setattr(generation.HFGenerator, "close", lambda self: None)
    return calls


def ifeval_recipe(assets, output_dir, **overrides):
    values = {"task": "ifeval", "policies": {"ce": assets["policy"], "gem": assets["policy"]},
              "prompts": assets["prompts"], "progress": False, "device": "cpu", "output_dir": str(output_dir)}
    return write_eval_recipe(output_dir, values, **overrides)


def test_table_1_numbers_by_hand():
    out = accuracies([[True, True], [False], [False, True]], [[True, True], [True], [False, True]])
    assert out["prompt_level_strict"] == pytest.approx(100 / 3)
    assert out["instruction_level_strict"] == pytest.approx(60.0)
    assert out["prompt_level_loose"] == pytest.approx(200 / 3)
    assert out["instruction_level_loose"] == pytest.approx(80.0)


def test_ifeval_end_to_end_greedy_checked_and_resumed(assets, punkt_tab, scripted_policy, tmp_path, capsys):
    output_dir = tmp_path / "ifeval"
    argv = ["--recipe", ifeval_recipe(assets, output_dir)]
    assert run(argv) == 0
    out = capsys.readouterr().out
    assert "| model | strict, prompt level | strict, instruction level | loose, prompt level |" in out
    assert "| ce | 50.00 | 50.00 | 75.00 | 66.67 | 60.42 |" in out
    # Greedy only: one response per prompt, no sampling call.
    assert scripted_policy == {"greedy": 2, "sampled": 0}
    rows = [json.loads(line) for line in (output_dir / "generations" / "ce.jsonl").read_text().splitlines()]
    assert [r["sample"] for r in rows] == ["greedy"] * 4
    summary = json.loads((output_dir / "summary.json").read_text())
    result = summary["models"]["gem"]["ifeval"]
    assert result["num_instructions"] == 6
    assert result["strict_by_group"]["punctuation"] == 0.0 and result["strict_by_group"]["change_case"] == 100.0
    assert summary["settings"]["decoding"] == "greedy" and summary["settings"]["max_new_tokens"] == 1024
    assert (output_dir / "ifeval.png").read_bytes()[:4] == b"\x89PNG"

    assert run(argv) == 0  # resumed: nothing generated again, same summary
    assert scripted_policy["greedy"] == 2
    assert json.loads((output_dir / "summary.json").read_text()) == summary


def test_missing_nltk_data_is_one_line_before_any_generation(assets, scripted_policy, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "empty")])
    assert run(["--recipe", ifeval_recipe(assets, tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"trl_emo.evaluate: error: {NLTK_DATA_MISSING}" and "python -m nltk.downloader punkt_tab" in err
    assert scripted_policy == {"greedy": 0, "sampled": 0}


def test_ifeval_clear_errors(assets, punkt_tab, tmp_path, capsys, monkeypatch):
    assert run(["--recipe", ifeval_recipe(assets, tmp_path / "a", temperature=0.7)]) == 2
    assert "temperature does not apply to task 'ifeval' (it decodes greedily" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "x", "instruction_id_list": ["no:such_check"], "kwargs": [{}]}) + "\n")
    assert run(["--recipe", ifeval_recipe(assets, tmp_path / "b", prompts=str(bad))]) == 2
    assert "unknown instruction ids ['no:such_check']" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "langdetect", None)
    assert run(["--recipe", ifeval_recipe(assets, tmp_path / "c")]) == 2
    assert "pip install 'trl-emo[ifeval]'" in capsys.readouterr().err
