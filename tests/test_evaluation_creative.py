"""Task `creative`: titles to prompts, GEM Table 2's diversities (Sentence-BERT as defined), resume."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json

import numpy as np
import pytest
import yaml

from trl_emo.evaluation import generation, metrics
from trl_emo.commands.evaluate import run

from conftest import require_minilm, save_eval_policy
from data_fixtures import write_jsonl

TITLES = [{"title": "The Sea"}, {"title": "  "}, {"title": "Autumn  Leaves"}]
# Per title, n = 3 samples: identical poems for the sea, three different ones for autumn.
SCRIPT = {
    "The Sea": ["Waves roll in and out.", "Waves roll in and out.", "Waves roll in and out."],
    "Autumn Leaves": ["Red leaves fall slowly.", "The wind is cold tonight.", "Golden trees stand still."],
}


def sentence_bert_diversity(vectors):
    """The rlfh-gen-div definition, spelled out: 1 − the mean of the cosine similarities of all pairs, × 100."""
    similarities = []
    for i in range(len(vectors)):
        for j in range(i):
            a, b = np.asarray(vectors[i], float), np.asarray(vectors[j], float)
            similarities.append(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return 100 * (1 - np.mean(similarities))


def test_embedding_diversity_is_the_papers_sentence_bert_diversity():
    rng = np.random.default_rng(0)
    for count in (2, 5, 16):
        vectors = rng.normal(size=(count, 12))
        assert metrics.embedding_diversity(vectors) == pytest.approx(sentence_bert_diversity(vectors), abs=1e-9)


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    root = tmp_path_factory.mktemp("creative_assets")
    return {"policy": save_eval_policy(root / "policy"), "titles": write_jsonl(root / "titles.jsonl", TITLES)}


def test_creative_task_end_to_end_and_resume(assets, tmp_path, monkeypatch, capsys):
    require_minilm()
    calls = {"generate": 0, "prompts": []}

    def fake_generate(self, prompts, num_samples, seed, greedy=False):
        assert not greedy
        calls["generate"] += 1
        calls["prompts"] += prompts
        titles = [next(t for t in SCRIPT if f"titled '{t}'" in p) for p in prompts]
        return [[{"text": s, "num_tokens": 5, "finish_reason": "stop"} for s in SCRIPT[t][:num_samples]] for t in titles]

    monkeypatch.setattr(generation.HFGenerator, "__init__", lambda self, path, config, tokenizer: None)
    monkeypatch.setattr(generation.HFGenerator, "generate", fake_generate)
    monkeypatch.setattr(generation.HFGenerator, "close", lambda self: None)
    output_dir = tmp_path / "poem"
    recipe = tmp_path / "poem.yaml"
    recipe.write_text(yaml.safe_dump({
        "task": "creative", "policies": {"a": assets["policy"]}, "prompts": assets["titles"], "n": 3,
        "progress": False, "device": "cpu", "output_dir": str(output_dir),
    }))
    assert run(["--recipe", str(recipe)]) == 0
    out = capsys.readouterr().out
    assert "| model | N-gram | Self-BLEU | Sentence-BERT |" in out
    # GEM's poem prompt as the user turn of the chat template; the blank title is skipped, spaces collapsed.
    assert len(calls["prompts"]) == 2
    assert "<|user|>\nWrite a poem titled 'The Sea' with no more than 200 words<|end|>" in calls["prompts"][0]
    assert "titled 'Autumn Leaves'" in calls["prompts"][1]
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["settings"]["prompts"]["rows_without_title"] == 1
    diversity = summary["models"]["a"]["diversity"]
    # The sea's identical samples have no diversity; the title average halves autumn's.
    autumn = list(SCRIPT["Autumn Leaves"])
    assert diversity["self_bleu"] == pytest.approx(metrics.self_bleu_diversity(autumn) / 2)
    from trl_emo.evaluation.embeddings import embed

    vectors = embed(autumn)
    assert diversity["embedding"] == pytest.approx(sentence_bert_diversity(vectors) / 2, abs=1e-4)
    assert diversity["distinct_n"] == pytest.approx(
        (metrics.ngram_diversity(SCRIPT["The Sea"]) + metrics.ngram_diversity(autumn)) / 2
    )
    assert (output_dir / "creative.png").read_bytes()[:4] == b"\x89PNG"

    # Resume: nothing is generated again.
    assert run(["--recipe", str(recipe)]) == 0
    assert calls["generate"] == 1
    assert json.loads((output_dir / "summary.json").read_text()) == summary

    # A title column that does not exist is a clear error.
    recipe.write_text(yaml.safe_dump({
        "task": "creative", "policies": {"a": assets["policy"]}, "prompts": assets["titles"], "n": 3,
        "prompt_column": "missing", "progress": False, "output_dir": str(tmp_path / "story"),
        "creative_template": "Write a story titled '{title}' with no more than 200 words",
    }))
    assert run(["--recipe", str(recipe)]) == 2
    assert "No title column" in capsys.readouterr().err

