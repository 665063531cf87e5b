"""The evaluation's metrics, as pure functions of rewards, texts and embeddings.

No model is loaded here; every function can be checked by hand on a few numbers or strings.
Conventions: a "reward matrix" is one list of `n` rewards per prompt, in sample order; rates and
diversities are reported ×100 like the GEM paper.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np

from .final_answers import read_gsm8k, read_number


# --------------------------------------------------------------------------------------------
# Best-of-n and mean-of-n
# --------------------------------------------------------------------------------------------


def _check_k(n: int, k: int) -> None:
    if n < 1:
        raise ValueError("need at least one sample")
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, {n}], got {k}")


def max_of_k_weights(n: int, k: int) -> np.ndarray:
    """Weights w with E[max of a uniform random k-subset] = Σ_i w[i] · r_(i) for r sorted ascending.

    The i-th smallest value (1-based) is the maximum of exactly C(i-1, k-1) of the C(n, k) subsets.
    The ratio is taken between exact integers, which Python divides with correct rounding, so large
    n (where the binomials overflow floats) stays exact.
    """
    _check_k(n, k)
    total = math.comb(n, k)
    return np.array([math.comb(i - 1, k - 1) / total if i >= k else 0.0 for i in range(1, n + 1)])


def bon_unbiased(values: Sequence[float], k: int) -> float:
    """Expected best of `k` samples drawn without replacement from `values` (all k-subsets averaged)."""
    ordered = np.sort(np.asarray(values, dtype=float))
    return float(max_of_k_weights(len(ordered), k) @ ordered)


def bon_first_k(values: Sequence[float], k: int) -> float:
    """Best of the first `k` samples (the reference code's estimator: unbiased too, but noisier)."""
    _check_k(len(values), k)
    return float(max(values[:k]))


def mean_unbiased(values: Sequence[float], k: int) -> float:
    """Expected mean of a random k-subset: the mean of all samples, whatever `k`."""
    _check_k(len(values), k)
    return float(np.mean(values))


def mean_first_k(values: Sequence[float], k: int) -> float:
    """Mean of the first `k` samples."""
    _check_k(len(values), k)
    return float(np.mean(values[:k]))


def _average_over_prompts(matrix: Sequence[Sequence[float]], ks: Sequence[int], fn) -> list[float]:
    if not matrix:
        raise ValueError("no prompts")
    return [float(np.mean([fn(row, k) for row in matrix])) for k in ks]


def bon_curve(matrix: Sequence[Sequence[float]], ks: Sequence[int]) -> dict:
    """BoN@k for each k, averaged over prompts, with both estimators."""
    return {
        "k": list(ks),
        "unbiased": _average_over_prompts(matrix, ks, bon_unbiased),
        "first_k": _average_over_prompts(matrix, ks, bon_first_k),
    }


def mean_curve(matrix: Sequence[Sequence[float]], ks: Sequence[int]) -> dict:
    """mean@k for each k, averaged over prompts, with both estimators."""
    return {
        "k": list(ks),
        "unbiased": _average_over_prompts(matrix, ks, mean_unbiased),
        "first_k": _average_over_prompts(matrix, ks, mean_first_k),
    }


def sigmoid(x: float) -> float:
    # Split by sign so exp never overflows for large reward gaps.
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def win_rate_curve(matrix: Sequence[Sequence[float]], reference: Sequence[float], ks: Sequence[int]) -> dict:
    """Bradley–Terry win rate (×100) of the best-of-k response against the reference response.

    P(win) = sigmoid(r(x, y) − r(x, y_ref)). The sigmoid is increasing, so the best-of-k response by
    reward is also the one with the highest win probability and the BoN estimators apply to the
    per-sample win probabilities unchanged. k = 1 with the unbiased estimator is the mean win rate
    over all samples.
    """
    if len(matrix) != len(reference):
        raise ValueError(f"{len(matrix)} prompts but {len(reference)} reference rewards")
    probs = [[sigmoid(r - ref) for r in row] for row, ref in zip(matrix, reference)]
    curve = bon_curve(probs, ks)
    return {key: curve["k"] if key == "k" else [100 * v for v in curve[key]] for key in ("k", "unbiased", "first_k")}


# --------------------------------------------------------------------------------------------
# Diversity
# --------------------------------------------------------------------------------------------

# Words (letters/digits/underscore runs) and single punctuation marks, case kept. Needs no
# downloaded data, unlike nltk's tokenizers.
_WORD = re.compile(r"\w+|[^\w\s]")


def words(text: str) -> list[str]:
    return _WORD.findall(text)


def ngrams(tokens: Sequence[str], order: int) -> list[tuple[str, ...]]:
    return [tuple(tokens[i : i + order]) for i in range(len(tokens) - order + 1)]


def distinct_n(texts: Sequence[str], order: int) -> float:
    """Distinct n-grams / all n-grams, pooled over `texts`, ×100 (0 when there is no n-gram at all)."""
    pooled = [gram for text in texts for gram in ngrams(words(text), order)]
    return 100.0 * len(set(pooled)) / len(pooled) if pooled else 0.0


def ngram_diversity(texts: Sequence[str], orders: Sequence[int] = (1, 2, 3)) -> float:
    """The GEM paper's n-gram diversity: `distinct_n` averaged over n = 1, 2, 3 (×100)."""
    return float(np.mean([distinct_n(texts, order) for order in orders]))


def cross_sample_distinct_n(texts: Sequence[str], order: int) -> float:
    """How much the samples' n-gram sets differ from each other, ×100: 0 = identical, 100 = disjoint.

    With G_i the set of distinct n-grams of sample i: (|∪ G_i| − max |G_i|) / (Σ |G_i| − max |G_i|).
    Unlike pooled distinct-n, it ignores repetition inside one response and is exactly 0 when all
    samples are the same. `None` when it is undefined (fewer than two samples with n-grams).
    """
    sets = [set(ngrams(words(text), order)) for text in texts]
    largest = max((len(s) for s in sets), default=0)
    room = sum(len(s) for s in sets) - largest
    if room == 0:
        # Every sample but one is empty: nothing to compare. Identical non-empty samples have room > 0.
        return None
    return 100.0 * (len(set().union(*sets)) - largest) / room


def cross_sample_ngram_diversity(texts: Sequence[str], orders: Sequence[int] = (1, 2, 3)) -> float | None:
    values = [cross_sample_distinct_n(texts, order) for order in orders]
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else None


_BLEU = None


def _bleu():
    # Effective order: responses shorter than four tokens still get a meaningful score instead of
    # a 0 caused by an empty 4-gram count.
    global _BLEU
    if _BLEU is None:
        from sacrebleu.metrics import BLEU

        _BLEU = BLEU(effective_order=True)
    return _BLEU


def self_bleu(texts: Sequence[str]) -> float | None:
    """Mean over i of sentence BLEU(texts[i], references = all other texts), 0–100.

    `BLEU.sentence_score(hyp, refs)` scores one hypothesis against every reference in `refs`
    (sacrebleu builds the multi-reference streams `[[r] for r in refs]`), with effective order.
    `None` with fewer than two texts.
    """
    if len(texts) < 2:
        return None
    bleu = _bleu()
    scores = [bleu.sentence_score(hyp, list(texts[:i]) + list(texts[i + 1 :])).score for i, hyp in enumerate(texts)]
    return float(min(100.0, np.mean(scores)))


def self_bleu_diversity(texts: Sequence[str]) -> float | None:
    """100 − self-BLEU: 0 when all samples are identical."""
    score = self_bleu(texts)
    return None if score is None else max(0.0, 100.0 - score)


def embedding_diversity(embeddings) -> float | None:
    """100 × (1 − mean pairwise cosine similarity) over the rows of `embeddings` (i < j pairs)."""
    matrix = np.asarray(embeddings, dtype=np.float64)
    count = matrix.shape[0]
    if count < 2:
        return None
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    unit = matrix / np.clip(norms, 1e-12, None)
    cosine = unit @ unit.T
    upper = cosine[np.triu_indices(count, k=1)]
    return float(max(0.0, 100.0 * (1.0 - upper.mean())))


def mean_ignoring_none(values) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


# --------------------------------------------------------------------------------------------
# GSM8K
# --------------------------------------------------------------------------------------------

def parse_number(text: str) -> str | None:
    """The number `text` holds as its one answer, canonical (`"1,234"` → `"1234"`, `"-7"`, `"3/4"`, `"2.5"` →
    `"5/2"`, `"\\frac{1}{2}"` → `"1/2"`), or None (no number, or more than one: `"10, 20"`): `final_answers`."""
    return read_number(text)


def extract_answer(text: str) -> str | None:
    """Final answer of a GSM8K/MetaMath-style response, canonical, or None.

    The number of the last `The answer is` (any case) or `####` statement, when that statement holds exactly one
    answer (a hedge such as `20 or 18` is none), nothing but closing words follows it and no earlier statement reads
    another number (`final_answers.read_gsm8k`, whose docstring lists the accepted forms). `18`, `18.0`, `36/2` and
    `\\frac{36}{2}` are the same answer; `1,0720` is no number.
    """
    return read_gsm8k(text).number


def majority_vote(answers: Sequence[str | None]) -> str | None:
    """Most frequent non-None answer; ties go to the answer seen first."""
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    best = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == best)


def pass_at_k_unbiased(num_samples: int, num_correct: int, k: int) -> float:
    """1 − C(n−c, k) / C(n, k): the chance that a random k-subset holds a correct sample.

    Computed as (C(n, k) − C(n−c, k)) / C(n, k) between exact integers, so the result is the exact value
    correctly rounded once (no cancellation in `1 − x`, no overflow for n = 200 and any k).
    """
    _check_k(num_samples, k)
    if not 0 <= num_correct <= num_samples:
        raise ValueError(f"num_correct must be in [0, {num_samples}], got {num_correct}")
    total = math.comb(num_samples, k)
    return (total - math.comb(num_samples - num_correct, k)) / total


def pass_at_k_curve(correct: Sequence[Sequence[bool]], ks: Sequence[int]) -> dict:
    """pass@k ×100 for each k, averaged over problems: `unbiased` (all k-subsets of the n samples, the
    estimator of Chen et al. 2021) and `first_k` (a correct sample among the first k)."""
    if not correct:
        raise ValueError("no problem to score")
    return {
        "k": list(ks),
        "unbiased": [
            100.0 * float(np.mean([pass_at_k_unbiased(len(row), sum(map(bool, row)), k) for row in correct]))
            for k in ks
        ],
        "first_k": [100.0 * float(np.mean([any(row[:k]) for row in correct])) for k in ks],
    }


def majority_vote_subset_average(
    labels: Sequence, correct: dict, k: int, draws: int = 1000, seed: int = 0
) -> float:
    """Chance that the majority answer of a random k-subset of the samples is correct.

    `labels[j]` is sample j's answer (a hashable; None = no answer, which does not vote) and
    `correct[label]` whether that answer is right. A tie between answers is split evenly (for
    answers with equal counts, the first seen in a random order is each one with equal chance).
    Exact for k = 1 and k = n; otherwise the average over `draws` random k-subsets (seeded, so the
    same inputs give the same number).
    """
    n = len(labels)
    _check_k(n, k)
    if k == 1:
        return float(np.mean([label is not None and bool(correct[label]) for label in labels]))
    ids = list(dict.fromkeys(label for label in labels if label is not None))
    if not ids:
        return 0.0
    position = {label: i for i, label in enumerate(ids)}
    onehot = np.zeros((n, len(ids)))
    for j, label in enumerate(labels):
        if label is not None:
            onehot[j, position[label]] = 1.0
    right = np.array([bool(correct[label]) for label in ids], dtype=float)
    if k == n:
        subsets = np.arange(n)[None, :]
    else:
        subsets = np.argsort(np.random.default_rng(seed).random((draws, n)), axis=1)[:, :k]
    counts = onehot[subsets].sum(axis=1)
    top = counts.max(axis=1, keepdims=True)
    winners = (counts == top) & (top > 0)
    share = winners / np.maximum(winners.sum(axis=1, keepdims=True), 1)
    return float((share @ right).mean())


def bon_correct_unbiased(rewards: Sequence[float], correct: Sequence[bool], k: int) -> float:
    """Chance that the highest-reward sample of a random k-subset is correct (best-of-k with a reward model).

    The weights of `bon_unbiased` applied to correctness sorted by reward; samples with equal rewards
    share their average correctness (a tie is broken at random).
    """
    _check_k(len(rewards), k)
    order = np.argsort(np.asarray(rewards, dtype=float), kind="stable")
    sorted_rewards = np.asarray(rewards, dtype=float)[order]
    values = np.asarray(correct, dtype=float)[order]
    for reward in np.unique(sorted_rewards):
        tied = sorted_rewards == reward
        values[tied] = values[tied].mean()
    return float(max_of_k_weights(len(values), k) @ values)


def bon_correct_first_k(rewards: Sequence[float], correct: Sequence[bool], k: int) -> float:
    """Whether the highest-reward sample among the first k is correct (first one on ties)."""
    _check_k(len(rewards), k)
    best = int(np.argmax(np.asarray(rewards[:k], dtype=float)))
    return float(bool(correct[best]))


def answer_metrics(
    correct: Sequence[Sequence[bool]],
    labels: Sequence[Sequence],
    label_correct: Sequence[dict],
    ks: Sequence[int],
    greedy: Sequence[bool] | None = None,
    rewards: Sequence[Sequence[float]] | None = None,
) -> dict:
    """Accuracy metrics of n sampled answers per problem, ×100, averaged over problems.

    `correct[i][j]`: sample j of problem i is right; `labels[i][j]`: its answer (equal labels =
    the same answer; None = none) and `label_correct[i][label]` whether that answer is right;
    `greedy[i]`: the greedy answer is right; `rewards[i][j]`: reward-model scores of the samples.
    Returns `greedy_accuracy`, `sample_accuracy`, and per k: `mv` (majority of the first k),
    `mv_subsets` (majority of a random k-subset), `pass_first_k` / `pass_unbiased` (a right answer
    among k: the oracle best-of-k), and with rewards `bon_first_k` / `bon_unbiased` (the sample
    the reward model ranks first among k is right).
    """
    if not correct:
        raise ValueError("no problem to score")
    out = {"k": list(ks), "num_prompts": len(correct)}
    if greedy is not None:
        out["greedy_accuracy"] = 100.0 * float(np.mean([bool(g) for g in greedy]))

    def mean(fn):
        return [100.0 * float(np.mean([fn(i, k) for i in range(len(correct))])) for k in ks]

    out["mv"] = mean(lambda i, k: bool(label_correct[i].get(majority_vote(labels[i][:k]), False)))
    out["mv_subsets"] = mean(lambda i, k: majority_vote_subset_average(labels[i], label_correct[i], k))
    out["pass_first_k"] = mean(lambda i, k: any(correct[i][:k]))
    out["pass_unbiased"] = mean(lambda i, k: pass_at_k_unbiased(len(correct[i]), sum(map(bool, correct[i])), k))
    if rewards is not None:
        out["bon_first_k"] = mean(lambda i, k: bon_correct_first_k(rewards[i], correct[i], k))
        out["bon_unbiased"] = mean(lambda i, k: bon_correct_unbiased(rewards[i], correct[i], k))
    out["sample_accuracy"] = 100.0 * float(np.mean([np.mean([bool(c) for c in row]) for row in correct]))
    return out


def gsm8k_metrics(
    answers: Sequence[Sequence[str | None]],
    gold: Sequence[str | None],
    ks: Sequence[int],
    greedy: Sequence[str | None] | None = None,
    rewards: Sequence[Sequence[float]] | None = None,
) -> dict:
    """Greedy accuracy, MV@k, pass@k (first-k and unbiased) and, with rewards, BoN@k, ×100, over prompts with a
    gold answer (see `answer_metrics`). Answers are canonical strings: equal strings are the same answer."""
    kept = [i for i, g in enumerate(gold) if g is not None]
    if not kept:
        raise ValueError("no prompt has a gold answer")
    correct = [[a is not None and a == gold[i] for a in answers[i]] for i in kept]
    labels = [list(answers[i]) for i in kept]
    label_correct = [{a: a == gold[i] for a in answers[i] if a is not None} for i in kept]
    greedy_correct = None if greedy is None else [greedy[i] == gold[i] for i in kept]
    kept_rewards = None if rewards is None else [rewards[i] for i in kept]
    return answer_metrics(correct, labels, label_correct, ks, greedy=greedy_correct, rewards=kept_rewards)
