"""Task `icl` (EMO Table 3): templates, dense retrieval, per-candidate perplexity, accuracy, resume."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json

import numpy as np
import pytest

from conftest import EVAL_TEXTS, EVAL_TINY as TINY, require_minilm
from trl_emo.core.errors import ConfigError
from trl_emo.evaluation import icl_data, likelihood
from trl_emo.commands.evaluate import run
from trl_emo.evaluation.config import EvalConfig
from trl_emo.evaluation.icl_data import BENCHMARKS, candidate_prompts, top_k_similar

POSITIVE = ["a great and moving film", "wonderful acting, I loved it", "a delight from start to end", "brilliant and funny"]
NEGATIVE = ["a dull and boring mess", "terrible acting, I hated it", "a waste of two hours", "awful and tedious"]
SST2_TEST = [("a moving, wonderful film", 0), ("boring, a real mess", 1), ("I loved the acting", 0), ("tedious", 1)]


def mmlu_row(question, answer, subject="elementary_mathematics", choices=("1", "2", "3", "4")):
    return {"question": question, "subject": subject, "choices": list(choices), "answer": answer}


def test_the_papers_templates_and_mmlus_5_shot_layout():
    labels, prompts = candidate_prompts(BENCHMARKS["sst2"], {"text": " so good ", "label": 0},
                                        [{"text": "bad {x}", "label": 1}])
    assert labels == [0, 1]
    assert prompts == ['Review: "bad {x}" It is negative.\nReview: "so good" It is positive.',
                       'Review: "bad {x}" It is negative.\nReview: "so good" It is negative.']
    _, prompts = candidate_prompts(BENCHMARKS["trec"], {"text": "Who?", "coarse_label": 3}, [])
    assert prompts[3] == 'Question: "Who?" It is about human being.' and len(prompts) == 6
    _, prompts = candidate_prompts(BENCHMARKS["ag_news"], {"text": "Chips", "label": 3}, [])
    assert prompts[3] == '"Chips" It is about science and technology.'
    _, prompts = candidate_prompts(BENCHMARKS["tweet_emotion"], {"text": "yay", "label": 1}, [])
    assert prompts == [f'Tweet: "yay" It is {w}.' for w in ("anger", "joy", "optimism", "sadness")]
    labels, prompts = candidate_prompts(BENCHMARKS["mmlu"], mmlu_row("What is 7+1?", 0, choices=("8", "7", "9", "6")),
                                        [mmlu_row("What is 1+1?", 1)])
    assert labels == [0, 1, 2, 3]
    assert prompts[2] == (
        "The following are multiple choice questions (with answers) about elementary mathematics.\n\n"
        "What is 1+1?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n"
        "What is 7+1?\nA. 8\nB. 7\nC. 9\nD. 6\nAnswer: C"
    )


def test_exact_top_k_retrieval_most_similar_first_and_faiss_agrees():
    rng = np.random.default_rng(0)
    pool, queries = rng.normal(size=(40, 8)), rng.normal(size=(5, 8))
    found = top_k_similar(queries, pool, 3, use_faiss=False)
    normed = pool / np.linalg.norm(pool, axis=1, keepdims=True)
    for query, near in zip(queries, found):
        cosine = normed @ (query / np.linalg.norm(query))
        assert near == list(np.argsort(-cosine)[:3])
    assert top_k_similar([[1.0, 0.0]], [[2.0, 0.0], [1.0, 0.0], [0.0, 1.0]], 2, use_faiss=False) == [[0, 1]]  # tie: lower index
    pytest.importorskip("faiss", reason="faiss is optional")
    assert top_k_similar(queries, pool, 3, use_faiss=True) == found


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    from trl_emo.models.tiny import save_tiny_causal_lm

    root = tmp_path_factory.mktemp("icl")
    data = root / "data"

    def write(path, rows):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    write(data / "sst2" / "train.jsonl", [{"text": t, "label": 0} for t in POSITIVE] + [{"text": t, "label": 1} for t in NEGATIVE])
    write(data / "sst2" / "test.jsonl", [{"text": t, "label": y} for t, y in SST2_TEST])
    write(data / "mmlu" / "dev.jsonl", [mmlu_row(f"What is {i}+1?", i % 4) for i in range(5)]
          + [mmlu_row(f"Capital {i}?", 0, subject="geography", choices=("a", "b", "c", "d")) for i in range(5)])
    write(data / "mmlu" / "test.jsonl", [mmlu_row("What is 7+1?", 0), mmlu_row("Capital x?", 2, subject="geography")])
    texts = EVAL_TEXTS + POSITIVE + NEGATIVE
    policy = save_tiny_causal_lm(texts, output_dir=root / "policy", vocab_size=300, chat_template=False, **TINY)
    # The same model family with room for 230 tokens (MMLU: three shots, not five): the demonstrations must be cut to fit.
    short = save_tiny_causal_lm(texts, output_dir=root / "short", vocab_size=300, chat_template=False,
                                max_position_embeddings=230, **TINY)
    return {"data": str(data), "policy": policy, "short": short}


def icl_argv(assets, output_dir, *extra):
    return ["--task", "icl", "--policies", f"tiny={assets['policy']}", f"short={assets['short']}",
            "--prompts", assets["data"], "--icl_benchmarks", "sst2", "mmlu", "--icl_num_demonstrations", "3",
            "--scoring_batch_size", "4", "--output_dir", str(output_dir), "--progress", "false", "--device", "cpu",
            *extra]


def test_icl_end_to_end_scores_retrieval_and_resume(assets, tmp_path, monkeypatch, capsys):
    require_minilm()
    out = tmp_path / "out"
    assert run(icl_argv(assets, out)) == 0
    table = capsys.readouterr().out
    assert "| model | SST-2 | MMLU | average |" in table and "EMO Table 3" in table
    summary = json.loads((out / "summary.json").read_text())

    # The dense retriever picks demonstrations of the test input's sentiment (MiniLM, offline).
    demos = [json.loads(line)["demonstrations"] for line in (out / "icl_demonstrations" / "sst2.jsonl").read_text().splitlines()]
    for (_, label), near in zip(SST2_TEST[:2], demos[:2]):
        assert sum((j < 4) == (label == 0) for j in near) >= 2, near

    # Every cached score is the policy's mean token NLL of that candidate prompt, scored alone (no padding).
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(assets["policy"]).eval()
    tokenizer = AutoTokenizer.from_pretrained(assets["policy"])
    pool = [json.loads(line) for line in open(os.path.join(assets["data"], "sst2", "train.jsonl"))]
    correct = 0
    for line, (text, label), near in zip((out / "icl" / "sst2" / "tiny.jsonl").read_text().splitlines(), SST2_TEST, demos):
        row = json.loads(line)
        labels, prompts = candidate_prompts(BENCHMARKS["sst2"], {"text": text, "label": label}, [pool[j] for j in near])
        means = []
        for prompt, nll, tokens in zip(prompts, row["nll"], row["tokens"]):
            ids = torch.tensor([tokenizer(prompt)["input_ids"]])
            with torch.no_grad():
                loss = model(input_ids=ids, labels=ids).loss.item()
            assert tokens == ids.shape[1] - 1 and nll / tokens == pytest.approx(loss, rel=1e-4)
            means.append(loss)
        correct += labels[int(np.argmin(means))] == label
    tiny = summary["models"]["tiny"]
    assert tiny["icl"]["sst2"]["accuracy"] == pytest.approx(100 * correct / len(SST2_TEST))
    assert tiny["icl"]["sst2"]["mean_demonstrations"] == 3 and tiny["icl"]["mmlu"]["mean_demonstrations"] == 5
    assert tiny["average"]["accuracy"] == pytest.approx((tiny["icl"]["sst2"]["accuracy"] + tiny["icl"]["mmlu"]["accuracy"]) / 2)
    # The short model cannot hold five MMLU shots: the last ones are dropped until the prompt fits.
    assert summary["models"]["short"]["icl"]["mmlu"]["mean_demonstrations"] < 5

    # Resume: no model loaded, nothing scored or retrieved again.
    from trl_emo.evaluation import embeddings

    calls = {"load": 0, "embed": 0}
    monkeypatch.setattr(likelihood, "load_causal_lm", lambda *a, **k: calls.__setitem__("load", calls["load"] + 1))
    monkeypatch.setattr(embeddings, "embed", lambda *a, **k: calls.__setitem__("embed", calls["embed"] + 1))
    assert run(icl_argv(assets, out)) == 0
    assert calls == {"load": 0, "embed": 0}
    assert json.loads((out / "summary.json").read_text()) == summary


def test_icl_clear_errors(assets, tmp_path, capsys):
    with pytest.raises(ConfigError, match="unknown benchmark 'sst'. Did you mean 'sst2'"):
        EvalConfig(task="icl", policies=["a=/x"], icl_benchmarks=["sst"])
    with pytest.raises(ConfigError, match="prompts_split does not apply to task 'icl'"):
        EvalConfig(task="icl", policies=["a=/x"], prompts_split="test")
    with pytest.raises(ConfigError, match="n does not apply to task 'icl'"):
        EvalConfig(task="icl", policies=["a=/x"], n=4)
    assert run(icl_argv(assets, tmp_path / "e1", "--icl_benchmarks", "trec")) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "No 'train' split for 'trec'" in err
    bad = tmp_path / "bad"
    (bad / "sst2").mkdir(parents=True)
    (bad / "sst2" / "train.jsonl").write_text(json.dumps({"text": "x", "label": 7}) + "\n")
    (bad / "sst2" / "test.jsonl").write_text(json.dumps({"text": "y", "label": 0}) + "\n")
    args = icl_argv(assets, tmp_path / "e2", "--icl_benchmarks", "sst2")
    args[args.index("--prompts") + 1] = str(bad)
    assert run(args) == 2
    assert "sst2: label 7 is not one of [0, 1]" in capsys.readouterr().err
    assert icl_data.BENCHMARK_NAMES == ("tweet_emotion", "sst2", "trec", "subj", "cr", "rotten_tomatoes", "ag_news", "mmlu")
