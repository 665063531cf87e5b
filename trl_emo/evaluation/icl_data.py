"""The few-shot benchmarks of EMO's Section 4.2 (Table 3): data, prompt templates (Appendix A.4), retrieval.

Each classification benchmark is scored the paper's way: for a test input, the `k` most similar
training examples by a dense retriever (cosine similarity of sentence embeddings, most similar
first, as OpenICL's top-k retriever that the authors used), each written with the template and its
gold label, one per line; then one candidate prompt per label (the test input written with that
label), and the label whose whole prompt has the lowest perplexity wins. MMLU uses a fixed 5-shot
prompt (the subject's five `dev` questions, OpenCompass's layout) instead of retrieval.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field

from .errors import EvaluationError
from .prompts import LOCAL_SUFFIXES, read_rows

HUB = "hub"
# Pools at least this large are searched with faiss when it is installed.
FAISS_MIN_POOL = 50_000
MMLU_LETTERS = ("A", "B", "C", "D")


@dataclass(frozen=True)
class IclBenchmark:
    """One benchmark: where its data live, the columns read, and its prompt template.

    `template` holds `{text}` and `{label}`; `labels` maps a label value of the data to the word(s)
    that fill `{label}` (the paper's Table 5). MMLU (`kind="mmlu"`) has its own layout.
    """

    name: str
    title: str
    hub_id: str
    hub_config: str | None
    pool_split: str
    test_split: str
    text_column: str
    label_column: str
    template: str
    labels: dict = field(default_factory=dict)
    kind: str = "classification"

    def verbalizer(self, value) -> str:
        key = _label_key(value)
        if key not in self.labels:
            raise EvaluationError(
                f"{self.name}: label {value!r} is not one of {sorted(self.labels)} (column {self.label_column!r})."
            )
        return self.labels[key]

    def render(self, text: str, label: str) -> str:
        # Plain replacement, not str.format: texts contain braces.
        return self.template.replace("{text}", text.strip()).replace("{label}", label)


def _label_key(value):
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return value


# Templates and label words of the paper's Table 5 (quotes and final period as printed there).
BENCHMARKS: dict[str, IclBenchmark] = {
    b.name: b
    for b in (
        IclBenchmark("tweet_emotion", "TE", "cardiffnlp/tweet_eval", "emotion", "train", "test", "text", "label",
                     'Tweet: "{text}" It is {label}.', {0: "anger", 1: "joy", 2: "optimism", 3: "sadness"}),
        # gpt3mix/sst2 (the authors' copy) labels 0 = positive, 1 = negative.
        IclBenchmark("sst2", "SST-2", "gpt3mix/sst2", None, "train", "test", "text", "label",
                     'Review: "{text}" It is {label}.', {0: "positive", 1: "negative"}),
        IclBenchmark("trec", "TREC", "CogComp/trec", None, "train", "test", "text", "coarse_label",
                     'Question: "{text}" It is about {label}.',
                     {0: "abbreviation", 1: "entity", 2: "description and abstract concept", 3: "human being",
                      4: "location", 5: "numerical value"}),
        IclBenchmark("subj", "Subj", "SetFit/subj", None, "train", "test", "text", "label",
                     '"{text}" It is {label}.', {0: "objective", 1: "subjective"}),
        IclBenchmark("cr", "CR", "SetFit/CR", None, "train", "test", "text", "label",
                     'Review: "{text}" It is {label}.', {0: "negative", 1: "positive"}),
        IclBenchmark("rotten_tomatoes", "RT", "cornell-movie-review-data/rotten_tomatoes", None, "train", "test",
                     "text", "label", 'Review: "{text}" It is {label}.', {0: "negative", 1: "positive"}),
        IclBenchmark("ag_news", "AG", "fancyzhx/ag_news", None, "train", "test", "text", "label",
                     '"{text}" It is about {label}.',
                     {0: "world", 1: "sports", 2: "business", 3: "science and technology"}),
        IclBenchmark("mmlu", "MMLU", "cais/mmlu", "all", "dev", "test", "question", "answer", "", {}, kind="mmlu"),
    )
}
BENCHMARK_NAMES = tuple(BENCHMARKS)


# ---------------------------------------------------------------------------------- data


def _local_split(folder: str, benchmark: str, split: str) -> str | None:
    base = os.path.join(folder, benchmark)
    for suffix in LOCAL_SUFFIXES:
        if os.path.isfile(base + os.sep + split + suffix):
            return base + os.sep + split + suffix
    return base if os.path.isdir(base) and os.path.isfile(os.path.join(base, "dataset_dict.json")) else None


def load_split(benchmark: IclBenchmark, source: str, split: str) -> tuple[list[dict], str]:
    """(rows, where they came from) of one split: the benchmark's Hub dataset, or `<source>/<name>/<split>.*`."""
    if source == HUB:
        return read_rows(benchmark.hub_id, benchmark.hub_config, split), f"{benchmark.hub_id}:{split}"
    path = _local_split(os.path.expanduser(source), benchmark.name, split)
    if path is None:
        raise EvaluationError(
            f"No {split!r} split for {benchmark.name!r} under {source}: expected {source}/{benchmark.name}/{split}.jsonl "
            f"(or .json, .parquet, .csv, or a save_to_disk folder)."
        )
    rows = read_rows(path, None, split if os.path.isdir(path) else None)
    return rows, os.path.abspath(path)


def check_rows(benchmark: IclBenchmark, rows: list[dict], where: str) -> None:
    if not rows:
        raise EvaluationError(f"{benchmark.name}: {where} is empty.")
    needed = [benchmark.text_column, benchmark.label_column] + (["choices", "subject"] if benchmark.kind == "mmlu" else [])
    missing = [c for c in needed if c not in rows[0]]
    if missing:
        raise EvaluationError(f"{benchmark.name}: {where} lacks the column(s) {missing}; it has {list(rows[0])}.")


def fingerprint(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------------- retrieval


def top_k_similar(queries, pool, k: int, use_faiss: bool | None = None) -> list[list[int]]:
    """For each query row, the indices of the `k` pool rows of highest cosine similarity, most similar first.

    Exact search: a chunked matrix product (torch), or faiss's flat inner-product index for large pools
    when faiss is installed (the same neighbours, in less memory). Ties go to the lower pool index.
    """
    import numpy as np

    queries = np.asarray(queries, dtype=np.float32)
    pool = np.asarray(pool, dtype=np.float32)
    queries = queries / np.maximum(np.linalg.norm(queries, axis=1, keepdims=True), 1e-12)
    pool = pool / np.maximum(np.linalg.norm(pool, axis=1, keepdims=True), 1e-12)
    k = min(k, len(pool))
    if use_faiss is None:
        use_faiss = len(pool) >= FAISS_MIN_POOL and _has_faiss()
    if use_faiss:
        import faiss

        index = faiss.IndexFlatIP(pool.shape[1])
        index.add(pool)
        _, found = index.search(queries, k)
        return [[int(i) for i in row] for row in found]
    import torch

    pool_t = torch.from_numpy(pool)
    out = []
    for start in range(0, len(queries), 1024):
        scores = torch.from_numpy(queries[start : start + 1024]) @ pool_t.T
        # A stable sort of the negated scores keeps the lower index first among ties.
        order = torch.sort(-scores, dim=1, stable=True).indices[:, :k]
        out.extend(order.tolist())
    return out


def _has_faiss() -> bool:
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------------- prompts


def mmlu_item(row: dict) -> str:
    choices = list(row["choices"])
    if len(choices) != 4:
        raise EvaluationError(f"mmlu: a question has {len(choices)} choices, expected 4: {row['question'][:80]!r}")
    lines = [str(row["question"]).strip()] + [f"{letter}. {choice}" for letter, choice in zip(MMLU_LETTERS, choices)]
    return "\n".join(lines) + "\nAnswer:"


def mmlu_header(subject: str) -> str:
    return f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"


def candidate_prompts(benchmark: IclBenchmark, test_row: dict, demonstrations: list[dict]) -> tuple[list, list[str]]:
    """(label values in order, one prompt per candidate label) for a test row and its demonstrations."""
    if benchmark.kind == "mmlu":
        shots = "".join(f"{mmlu_item(d)} {MMLU_LETTERS[int(d['answer'])]}\n\n" for d in demonstrations)
        context = mmlu_header(str(test_row["subject"])) + shots + mmlu_item(test_row)
        return list(range(4)), [f"{context} {letter}" for letter in MMLU_LETTERS]
    shots = "".join(
        benchmark.render(str(d[benchmark.text_column]), benchmark.verbalizer(d[benchmark.label_column])) + "\n"
        for d in demonstrations
    )
    labels = list(benchmark.labels)
    return labels, [shots + benchmark.render(str(test_row[benchmark.text_column]), benchmark.labels[v]) for v in labels]
