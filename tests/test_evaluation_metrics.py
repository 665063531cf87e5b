"""The evaluation's metric functions, on cases that can be checked by hand or by brute force."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import itertools
import math
import random
import statistics

import numpy as np
import pytest

from conftest import require_minilm

from trl_emo.evaluation import metrics


# ---------------------------------------------------------------- best-of-n / mean-of-n


def brute_force_bon(values, k):
    return statistics.mean(max(subset) for subset in itertools.combinations(values, k))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_unbiased_bon_equals_average_over_all_k_subsets(n):
    rng = random.Random(n)
    for trial in range(5):
        values = [rng.gauss(0, 1) for _ in range(n)]
        if trial == 0 and n > 2:
            values[1] = values[0]  # ties
        for k in range(1, n + 1):
            assert metrics.bon_unbiased(values, k) == pytest.approx(brute_force_bon(values, k), abs=1e-12)


def test_max_of_k_weights_by_hand():
    # n = 4, k = 2: the 2nd smallest is the max of 1 of the 6 pairs, the 3rd of 2, the 4th of 3.
    assert metrics.max_of_k_weights(4, 2).tolist() == pytest.approx([0, 1 / 6, 2 / 6, 3 / 6])
    assert metrics.bon_unbiased([4.0, 1.0, 3.0, 2.0], 2) == pytest.approx((2 + 2 * 3 + 3 * 4) / 6)


def test_max_of_k_weights_stay_exact_for_large_n():
    # C(1000, 500) overflows a float; the weights must still be finite and sum to 1.
    weights = metrics.max_of_k_weights(1000, 500)
    assert np.isfinite(weights).all()
    assert weights.sum() == pytest.approx(1.0, abs=1e-12)
    assert weights[:499].sum() == 0.0
    assert weights[-1] == pytest.approx(500 / 1000)  # the maximum is in half of the subsets


def test_bon_is_non_decreasing_in_k_and_ends_at_the_max():
    rng = np.random.default_rng(0)
    matrix = rng.normal(size=(6, 8)).tolist()
    ks = [1, 2, 3, 4, 5, 6, 7, 8]
    curve = metrics.bon_curve(matrix, ks)
    assert all(a <= b + 1e-12 for a, b in zip(curve["unbiased"], curve["unbiased"][1:]))
    assert all(a <= b + 1e-12 for a, b in zip(curve["first_k"], curve["first_k"][1:]))
    assert curve["unbiased"][-1] == pytest.approx(np.max(matrix, axis=1).mean())
    assert curve["first_k"][-1] == pytest.approx(np.max(matrix, axis=1).mean())
    # BoN@1 is the mean reward.
    assert curve["unbiased"][0] == pytest.approx(np.mean(matrix))


def test_first_k_estimators_by_hand():
    values = [1.0, 5.0, 2.0, 8.0]
    assert [metrics.bon_first_k(values, k) for k in (1, 2, 3, 4)] == [1.0, 5.0, 5.0, 8.0]
    assert [metrics.mean_first_k(values, k) for k in (1, 2, 4)] == [1.0, 3.0, 4.0]


def test_mean_at_k_expectation_does_not_depend_on_k():
    values = [0.3, -1.2, 2.5, 0.0, 4.1]
    overall = statistics.mean(values)
    for k in range(1, 6):
        # The unbiased estimator is the plain mean whatever k...
        assert metrics.mean_unbiased(values, k) == pytest.approx(overall)
        # ...because the average of subset means over all k-subsets is the mean,
        subsets = [statistics.mean(s) for s in itertools.combinations(values, k)]
        assert statistics.mean(subsets) == pytest.approx(overall)
        # and the first-k estimator averaged over all sample orders is too.
        orders = [metrics.mean_first_k(list(p), k) for p in itertools.permutations(values)]
        assert statistics.mean(orders) == pytest.approx(overall)
    curve = metrics.mean_curve([values, values[::-1]], [1, 2, 5])
    assert curve["unbiased"] == pytest.approx([overall] * 3)


def test_k_outside_one_to_n_is_rejected():
    with pytest.raises(ValueError):
        metrics.bon_unbiased([1.0, 2.0], 3)
    with pytest.raises(ValueError):
        metrics.bon_first_k([1.0, 2.0], 0)


# ---------------------------------------------------------------- win rate


def test_bradley_terry_win_rate_by_hand():
    # Equal rewards: a coin flip. A gap of log(3): P(win) = 3 / (1 + 3) = 0.75.
    curve = metrics.win_rate_curve([[0.0, 0.0], [math.log(3), math.log(3)]], [0.0, 0.0], [1, 2])
    assert curve["unbiased"] == pytest.approx([62.5, 62.5])
    # Best of 2 picks the higher reward, so the win rate is the better sample's.
    curve = metrics.win_rate_curve([[0.0, math.log(3)]], [0.0], [1, 2])
    assert curve["unbiased"] == pytest.approx([62.5, 75.0])
    assert curve["first_k"] == pytest.approx([50.0, 75.0])


def test_win_rate_does_not_overflow_on_large_reward_gaps():
    curve = metrics.win_rate_curve([[1e4, -1e4]], [0.0], [1, 2])
    assert curve["unbiased"] == pytest.approx([50.0, 100.0])


# ---------------------------------------------------------------- n-gram diversity


def test_distinct_n_by_hand():
    texts = ["a b a b"]
    assert metrics.distinct_n(texts, 1) == pytest.approx(100 * 2 / 4)
    assert metrics.distinct_n(texts, 2) == pytest.approx(100 * 2 / 3)  # (a,b) (b,a) (a,b)
    assert metrics.distinct_n(texts, 3) == pytest.approx(100 * 2 / 2)
    assert metrics.ngram_diversity(texts) == pytest.approx(100 * (2 / 4 + 2 / 3 + 1) / 3)
    # Pooled over responses: "x y" and "x z" hold 3 distinct unigrams out of 4.
    assert metrics.distinct_n(["x y", "x z"], 1) == pytest.approx(75.0)
    # Punctuation is a token of its own; case is kept.
    assert metrics.words("Hi, hi!") == ["Hi", ",", "hi", "!"]


def test_ngram_diversity_of_identical_samples():
    one = "the cat sat on the mat"
    same = [one] * 4
    # The pooled ratio (GEM paper's definition) falls to 1/4 of one sample's own ratio...
    for order in (1, 2, 3):
        assert metrics.distinct_n(same, order) == pytest.approx(metrics.distinct_n([one], order) / 4)
    # ...and the cross-sample version, which ignores repetition inside a response, is exactly 0.
    assert metrics.cross_sample_ngram_diversity(same) == 0.0
    assert metrics.cross_sample_ngram_diversity(["a b c", "d e f"]) == pytest.approx(100.0)
    # Half the unigrams shared: union 3, largest 2, total 4 -> (3 - 2) / (4 - 2).
    assert metrics.cross_sample_distinct_n(["a b", "a c"], 1) == pytest.approx(50.0)


# ---------------------------------------------------------------- self-BLEU


def test_self_bleu_is_zero_diversity_for_identical_samples():
    assert metrics.self_bleu_diversity(["the cat sat on the mat today"] * 3) == pytest.approx(0.0, abs=1e-9)
    assert metrics.self_bleu_diversity(["only one"]) is None


def test_self_bleu_uses_every_other_sample_as_a_reference():
    a = "the quick brown fox jumps over the lazy dog"
    b = "a completely different sentence about purple elephants dancing"
    texts = [a, b, a]
    diversity = metrics.self_bleu_diversity(texts)
    # With all other samples as references, samples 0 and 2 each find their twin: BLEU 100.
    # So the mean BLEU is at least 200 / 3 and the diversity at most 100 / 3.
    assert diversity <= 100 / 3 + 1e-9

    # The one-reference mistake (only the first other sample as reference) scores sample 0 against b
    # and so reports far more diversity.
    from sacrebleu.metrics import BLEU

    bleu = BLEU(effective_order=True)
    others = [[t for j, t in enumerate(texts) if j != i] for i in range(len(texts))]
    one_reference = 100 - statistics.mean(bleu.sentence_score(h, refs[:1]).score for h, refs in zip(texts, others))
    assert one_reference > 60
    assert abs(one_reference - diversity) > 25

    # Fully different samples are diverse.
    assert metrics.self_bleu_diversity([a, b]) > 90


# ---------------------------------------------------------------- embedding diversity


def test_embedding_diversity_by_hand():
    assert metrics.embedding_diversity([[1.0, 0.0], [0.0, 1.0]]) == pytest.approx(100.0)
    assert metrics.embedding_diversity([[1.0, 0.0], [1.0, 1.0]]) == pytest.approx(100 * (1 - 1 / math.sqrt(2)))
    # Three vectors: pairs (0,1) cos 1, (0,2) cos 0, (1,2) cos 0 -> mean 1/3.
    assert metrics.embedding_diversity([[1.0, 0.0], [2.0, 0.0], [0.0, 3.0]]) == pytest.approx(100 * 2 / 3)
    assert metrics.embedding_diversity([[0.3, 0.4]] * 5) == pytest.approx(0.0, abs=1e-9)
    assert metrics.embedding_diversity([[1.0, 2.0]]) is None


def test_embedding_diversity_with_the_packaged_minilm():
    require_minilm()
    from trl_emo.evaluation.embeddings import embed

    same = embed(["The weather is lovely today."] * 3, device="cpu")
    assert same.shape == (3, 384)  # all-MiniLM-L6-v2's width
    assert metrics.embedding_diversity(same) == pytest.approx(0.0, abs=1e-4)

    close = embed(["The weather is lovely today.", "Today the weather is really nice."], device="cpu")
    far = embed(["The weather is lovely today.", "Quarterly tax filings are due in April."], device="cpu")
    assert 0 < metrics.embedding_diversity(close) < metrics.embedding_diversity(far)


# ---------------------------------------------------------------- GSM8K


@pytest.mark.parametrize(
    "text, expected",
    [
        ("She has 3 apples. The answer is 18.", "18"),
        ("The answer is: 1,234,567", "1234567"),
        ("The answer is -5.", "-5"),
        ("The answer is −12", "-12"),  # unicode minus
        ("The answer is 3/4 of a cup", "3/4"),
        ("The answer is 0.5", "1/2"),
        ("The answer is $18.00.", "18"),
        ("the answer is -2.5 degrees", "-5/2"),
        ("First try: The answer is 3. Wait, no. The answer is 7.", None),  # two different final answers: none
        ("The answer is 7 and that is final", None),  # more than one answer and its units: not one answer
        ("The answer is 7.\n#### 7", "7"),  # the same answer stated twice
        ("12 + 30 = 42, so the total is 42.", None),  # no `The answer is`: no answer
        ("The answer is unknown, 42 was a guess.", None),  # a number inside a sentence is not the stated answer
        ("The answer is unclear.", None),
        ("Natalia sold 48/2 = 24 clips.\n#### 72", "72"),  # gold format
        ("#### 1,000", "1000"),
        ("The answer is 10, 20 or 30", None),  # alternatives (and a comma list is not a thousands separator)
        ("The answer is 1,0720", None),  # invalid thousands groups: no number, not 10720
        ("The answer is \\frac{1}{2}", "1/2"),  # LaTeX fractions are numbers
        ("The answer is 18.\nCheck: 3 * 6 = 18.", None),  # more work after the answer
        ("", None),
    ],
)
def test_extract_answer(text, expected):
    assert metrics.extract_answer(text) == expected


def test_equal_values_are_the_same_answer():
    assert metrics.extract_answer("The answer is 18.0") == metrics.extract_answer("#### 18")
    assert metrics.extract_answer("The answer is 36/2") == metrics.extract_answer("The answer is 18")


def test_majority_vote_ignores_missing_answers_and_breaks_ties_by_first_seen():
    assert metrics.majority_vote(["3", None, "4", "4", None, None]) == "4"
    assert metrics.majority_vote(["5", "6", "6", "5"]) == "5"
    assert metrics.majority_vote([None, None]) is None


def test_pass_at_k_unbiased_matches_brute_force():
    correct = [True, False, False, True, False]
    for k in range(1, 6):
        brute = statistics.mean(any(s) for s in itertools.combinations(correct, k))
        assert metrics.pass_at_k_unbiased(5, 2, k) == pytest.approx(brute)


def test_gsm8k_metrics_by_hand():
    answers = [
        ["1", "2", "2", "2"],  # gold 2: wrong first, majority right
        ["7", None, "7", "8"],  # gold 8: right only in the 4th
        [None, None, None, None],  # gold 3: never answered
    ]
    gold = ["2", "8", "3"]
    out = metrics.gsm8k_metrics(answers, gold, [1, 2, 4], greedy=["2", "7", None])
    assert out["greedy_accuracy"] == pytest.approx(100 / 3)
    assert out["mv"] == pytest.approx([0.0, 0.0, 100 / 3])  # MV@2 of ["1","2"] is the tie winner "1"
    assert out["pass_first_k"] == pytest.approx([0.0, 100 / 3, 200 / 3])
    assert out["sample_accuracy"] == pytest.approx(100 * (3 / 4 + 1 / 4 + 0) / 3)
    assert out["pass_unbiased"][-1] == pytest.approx(200 / 3)
    # Prompts without a gold answer are left out.
    assert metrics.gsm8k_metrics([["1"], ["2"]], ["1", None], [1])["num_prompts"] == 1
