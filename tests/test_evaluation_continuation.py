"""Task `continuation` (EMO Table 1): prefixes, Table 4 lengths, MAUVE, held-out perplexity, distinct-n, rep-n."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json
import math
import shutil
import sys

import pytest

from conftest import EVAL_TINY as TINY
from data_fixtures import fixture_rows
from trl_emo.core.errors import ConfigError
from trl_emo.evaluation import generation
from trl_emo.commands.evaluate import run
from trl_emo.evaluation.config import EvalConfig
from trl_emo.evaluation.tasks.continuation import ContinuationTask, join_continuation, repetition_rate, text_metrics

PREFIX, LENGTH, N = 5, 12, 3


def test_table_4_lengths_follow_the_corpus_and_bad_values_are_clear_errors():
    config = EvalConfig(task="continuation", policies=["a=/x"])
    assert (config.prompts, config.prompts_config) == ("Salesforce/wikitext", "wikitext-103-raw-v1")
    assert (config.n, config.temperature, config.top_k, config.top_p) == (5, 1.0, 0, 1.0)  # ancestral sampling
    assert (config.continuation_prefix_words, config.max_new_tokens, config.min_new_tokens) == (20, 80, 80)
    ptb = EvalConfig(task="continuation", policies=["a=/x"], prompts="ptb_text_only", prompts_config="penn_treebank")
    assert (ptb.continuation_prefix_words, ptb.max_new_tokens) == (5, 25)
    ag = EvalConfig(task="continuation", policies=["a=/x"], prompts="data/mine.jsonl", continuation_corpus="ag_news")
    assert (ag.continuation_prefix_words, ag.max_new_tokens) == (10, 30)
    with pytest.raises(ConfigError, match="Unknown corpus 'wikitext'"):
        EvalConfig(task="continuation", policies=["a=/x"], continuation_corpus="wikitext")
    with pytest.raises(ConfigError, match="min_new_tokens"):
        EvalConfig(task="continuation", policies=["a=/x"], min_new_tokens=90)
    with pytest.raises(ConfigError, match="reward_model does not apply to task 'continuation'"):
        EvalConfig(task="continuation", policies=["a=/x"], reward_model="rm")
    with pytest.raises(ConfigError, match="mauve_featurizer belongs to task 'continuation'"):
        EvalConfig(policies=["a=/x"], prompts="p.jsonl", mauve_featurizer="gpt2")


def test_text_metrics():
    assert repetition_rate("a b a b a b", 2) == pytest.approx(100 * (1 - 2 / 5))
    assert repetition_rate("one", 2) == 0.0
    values = text_metrics([["a b c", "a b d"], ["x y z", "x y z"]])
    # distinct-1: repeat 0 has 4 of 6 unigrams distinct, repeat 1 3 of 6.
    assert values["distinct_1"] == pytest.approx(100 * (4 / 6 + 3 / 6) / 2)
    assert values["rep_2"] == 0.0
    assert join_continuation("The cat", " sat.") == "The cat sat." and join_continuation("The cat", "sat.") == "The cat sat."


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from transformers import GPT2Config, GPT2Model

    from trl_emo.models.tiny import save_tiny_causal_lm, train_tokenizer

    root = tmp_path_factory.mktemp("continuation")
    rows = fixture_rows("plain_text", 28, split="test")  # 4 WikiText-like articles, 8 paragraphs
    corpus = root / "wikitext-103" / "test.jsonl"
    corpus.parent.mkdir()
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [r["text"] for r in rows if r["text"].strip()]
    policy = save_tiny_causal_lm(texts, output_dir=root / "mle", vocab_size=300, chat_template=False, **TINY)
    shutil.copytree(policy, root / "emo")
    # A tiny GPT-2 featurizer built from a config: MAUVE's own featurizer family, offline.
    tokenizer = train_tokenizer(texts, vocab_size=280, chat_template=False)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=2, n_positions=128,
                        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    GPT2Model(config).save_pretrained(root / "featurizer")
    tokenizer.save_pretrained(root / "featurizer")
    human = {}
    for row in rows:
        words = row["text"].split()
        if len(words) >= PREFIX + LENGTH and not row["text"].startswith(" ="):
            human[" ".join(words[:PREFIX])] = " ".join(words[PREFIX : PREFIX + LENGTH])
    return {"root": root, "corpus": str(corpus), "mle": policy, "emo": str(root / "emo"),
            "featurizer": str(root / "featurizer"), "human": human}


def argv(assets, output_dir, *extra):
    return ["--task", "continuation", "--policies", f"copy={assets['mle']}", f"loop={assets['emo']}",
            "--prompts", assets["corpus"], "--continuation_prefix_words", str(PREFIX), "--max_new_tokens", str(LENGTH),
            "--n", str(N), "--mauve_featurizer", assets["featurizer"], "--continuation_block_size", "32",
            "--output_dir", str(output_dir), "--progress", "false", "--device", "cpu", *extra]


@pytest.fixture
def scripted(monkeypatch, assets):
    """`copy` continues every prefix with the human continuation; `loop` repeats one word."""
    calls = {"generate": 0}

    def fake_init(self, path, config, tokenizer):
        self.path = path

    def fake_generate(self, prompts, num_samples, seed, greedy=False):
        calls["generate"] += 1
        out = []
        for prompt in prompts:
            if os.path.basename(self.path) == "mle":
                text = " " + assets["human"][prompt]
            else:
                text = " runs" * LENGTH
            out.append([{"text": text, "num_tokens": LENGTH, "finish_reason": "length"}] * num_samples)
        return out

    monkeypatch.setattr(generation.HFGenerator, "__init__", fake_init)
    monkeypatch.setattr(generation.HFGenerator, "generate", fake_generate)
    monkeypatch.setattr(generation.HFGenerator, "close", lambda self: None)
    return calls


def test_continuation_end_to_end_and_resume(assets, tmp_path, scripted, monkeypatch, capsys):
    pytest.importorskip("mauve", reason="the `mauve` extra (mauve-text) is not installed")
    from trl_emo.evaluation import likelihood, mauve_score

    out = tmp_path / "out"
    assert run(argv(assets, out)) == 0
    table = capsys.readouterr().out
    assert "| human continuations | – | – |" in table and "MAUVE (mean ± std, 3 samples)" in table
    summary = json.loads((out / "summary.json").read_text())
    copy, loop = summary["models"]["copy"], summary["models"]["loop"]
    assert summary["settings"]["prompts"]["num_prompts"] == len(assets["human"]) == 8
    # The human continuations themselves: distinct-n and rep-n equal the human ones.
    for key, value in summary["settings"]["human"].items():
        assert copy["continuation"][key] == pytest.approx(value), key
    # MAUVE is mauve-text's score of features computed one text at a time (last hidden state, last token).
    import mauve
    import numpy as np
    import torch
    from transformers import AutoModel, AutoTokenizer

    featurizer = AutoModel.from_pretrained(assets["featurizer"]).eval()
    feat_tokenizer = AutoTokenizer.from_pretrained(assets["featurizer"])

    def features(texts):
        with torch.no_grad():
            return np.stack([featurizer(**feat_tokenizer(t, return_tensors="pt")).last_hidden_state[0, -1].numpy()
                             for t in texts])

    prefixes = list(assets["human"])
    human = features([f"{p} {assets['human'][p]}" for p in prefixes])
    looped = features([p + " runs" * LENGTH for p in prefixes])
    expected = 100 * mauve.compute_mauve(p_features=human, q_features=looped).mauve
    assert loop["mauve"]["per_sample"] == pytest.approx([expected] * N, abs=1e-6)
    assert 100 * mauve.compute_mauve(p_features=human, q_features=human).mauve == pytest.approx(copy["mauve"]["mean"])
    # One word repeated: far from human text, maximal repetition.
    assert loop["mauve"]["mean"] < copy["mauve"]["mean"] - 1
    assert loop["continuation"]["rep_2"] == pytest.approx(100 * (1 - 1 / (LENGTH - 1)))
    assert loop["continuation"]["distinct_1"] < copy["continuation"]["distinct_1"]

    # Held-out perplexity: the split's articles + EOS, cut into 32-token blocks, scored by the tiny model.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trl_emo.data.plain_text import documents_from_rows

    tokenizer = AutoTokenizer.from_pretrained(assets["mle"])
    model = AutoModelForCausalLM.from_pretrained(assets["mle"]).eval()
    rows = [json.loads(line)["text"] for line in open(assets["corpus"])]
    stream = [t for doc in documents_from_rows(rows, "wikitext") for t in tokenizer(doc + tokenizer.eos_token)["input_ids"]]
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(stream), 32):
            block = torch.tensor([stream[start : start + 32]])
            if block.shape[1] < 2:
                continue
            loss = model(input_ids=block, labels=block).loss.item()
            total, count = total + loss * (block.shape[1] - 1), count + block.shape[1] - 1
    assert copy["perplexity"]["tokens"] == count
    assert copy["perplexity"]["perplexity"] == pytest.approx(math.exp(total / count), rel=1e-4)
    assert loop["perplexity"]["perplexity"] == pytest.approx(copy["perplexity"]["perplexity"], rel=1e-6)  # same weights

    # Resume: nothing generated, featurized or scored again; the same summary.
    counts = {"featurize": 0, "load": 0}
    original_featurize, original_load = mauve_score.Featurizer._featurize, likelihood.load_causal_lm

    def featurize(self, *args, **kwargs):
        counts["featurize"] += 1
        return original_featurize(self, *args, **kwargs)

    def load(*args, **kwargs):
        counts["load"] += 1
        return original_load(*args, **kwargs)

    monkeypatch.setattr(mauve_score.Featurizer, "_featurize", featurize)
    monkeypatch.setattr(likelihood, "load_causal_lm", load)
    before = scripted["generate"]
    assert run(argv(assets, out)) == 0
    assert scripted["generate"] == before and counts == {"featurize": 0, "load": 0}
    assert json.loads((out / "summary.json").read_text()) == summary


def test_ancestral_sampling_gives_continuations_of_exactly_the_generation_length(assets, tmp_path):
    """The real HF path: top-k 0, top-p 1, temperature 1, EOS suppressed until max_new_tokens (min_new_tokens)."""
    out = tmp_path / "real"
    args = argv(assets, out, "--mauve", "false", "--continuation_perplexity", "false", "--max_prompts", "3", "--n", "2")
    args[args.index("--policies") + 1 : args.index("--policies") + 3] = [f"mle={assets['mle']}"]
    assert run(args) == 0
    rows = [json.loads(line) for line in (out / "generations" / "mle.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 and all(r["num_tokens"] == LENGTH for r in rows)
    assert len({r["response"] for r in rows}) > 1  # sampled, not greedy
    assert rows[0]["prompt"] == " ".join(rows[0]["prompt"].split()[:PREFIX])  # the raw prefix, no template
    settings = json.loads((out / "generations" / "mle.settings.json").read_text())["settings"]
    assert (settings["top_k"], settings["top_p"], settings["temperature"], settings["min_new_tokens"]) == (0, 1.0, 1.0, LENGTH)
    summary = json.loads((out / "summary.json").read_text())
    assert "mauve" not in summary["models"]["mle"] and "perplexity" not in summary["models"]["mle"]


def test_clear_errors(assets, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "mauve", None)
    assert run(argv(assets, tmp_path / "e1")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "pip install 'trl-emo[mauve]'" in err
    assert run(argv(assets, tmp_path / "e2", "--mauve", "false", "--continuation_prefix_words", "500")) == 2
    assert "has the 500 + 12 words" in capsys.readouterr().err
    short = ContinuationTask(EvalConfig(task="continuation", policies=["a=/x"], prompts=assets["corpus"], mauve=False,
                                        continuation_prefix_words=PREFIX, max_new_tokens=LENGTH, max_prompts=2))
    assert [e.instruction for e in short.load_examples().examples] == list(assets["human"])[:2]
    monkeypatch.delitem(sys.modules, "mauve")
    pytest.importorskip("mauve", reason="the `mauve` extra (mauve-text) is not installed")
    # An unreachable featurizer fails before anything is sampled, not after.
    assert run(argv(assets, tmp_path / "e3", "--mauve_featurizer", "nobody/not-a-cached-featurizer")) == 2
    assert "mauve_featurizer: 'nobody/not-a-cached-featurizer' is no local folder" in capsys.readouterr().err
    assert not (tmp_path / "e3" / "generations").exists()
