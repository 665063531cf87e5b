"""The oracle study (`benchmarks/oracle_study.py`): its exact metrics on hand-checkable cases, and
`--quick` end to end through `trl_emo.SFTTrainer`."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.oracle import lm  # noqa: E402
from benchmarks.oracle.evaluate import diversity, prompts_from  # noqa: E402
from benchmarks.oracle.metrics import (  # noqa: E402
    Accumulator,
    entropy,
    forward_kl,
    ids_to_text,
    kl_divergence,
    mean_std,
    perplexity,
    reverse_kl,
    token_nll,
)
from benchmarks.oracle.report import markdown_table, paired_differences, summarize  # noqa: E402


def logs(*rows):
    return torch.tensor(rows, dtype=torch.float64).log()


# ---------------------------------------------------------------------------------------------
# Pure metric functions
# ---------------------------------------------------------------------------------------------


def test_kl_of_identical_distributions_is_zero():
    lp = torch.log_softmax(torch.randn(3, 5, 17, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert torch.equal(kl_divergence(lp, lp), torch.zeros(3, 5, dtype=torch.float64))


def test_kl_between_two_known_categoricals():
    p, q = logs([0.5, 0.5]), logs([0.25, 0.75])
    expected_pq = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    expected_qp = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    assert kl_divergence(p, q).item() == pytest.approx(expected_pq, abs=1e-12)
    assert kl_divergence(q, p).item() == pytest.approx(expected_qp, abs=1e-12)
    # The direction conventions: forward = KL(oracle ‖ student), reverse = KL(student ‖ oracle).
    assert forward_kl(p, q).item() == pytest.approx(expected_pq, abs=1e-12)
    assert reverse_kl(p, q).item() == pytest.approx(expected_qp, abs=1e-12)


def test_kl_zero_probabilities():
    # p puts no mass on the second token: its term is 0, not nan.
    assert kl_divergence(logs([1.0, 0.0]), logs([0.5, 0.5])).item() == pytest.approx(math.log(2), abs=1e-12)
    # q puts no mass where p does: infinite.
    assert math.isinf(kl_divergence(logs([0.5, 0.5]), logs([1.0, 0.0])).item())


def test_kl_is_non_negative_on_random_distributions():
    g = torch.Generator().manual_seed(1)
    p = torch.log_softmax(3 * torch.randn(200, 50, generator=g), -1)
    q = torch.log_softmax(3 * torch.randn(200, 50, generator=g), -1)
    assert (kl_divergence(p, q) >= 0).all() and (kl_divergence(p, q) > 0).all()


def test_entropy_uniform_and_one_hot():
    assert entropy(logs([0.25] * 4)).item() == pytest.approx(math.log(4), abs=1e-12)
    assert entropy(logs([1.0, 0.0, 0.0])).item() == 0.0
    assert entropy(logs([0.5, 0.25, 0.25])).item() == pytest.approx(1.5 * math.log(2), abs=1e-12)


def test_token_nll_and_perplexity():
    lp = logs([0.5, 0.25, 0.25], [0.1, 0.1, 0.8])
    nll = token_nll(lp, torch.tensor([1, 2]))
    assert nll.tolist() == pytest.approx([math.log(4), -math.log(0.8)])
    assert perplexity(0.0) == 1.0
    assert perplexity(math.log(4)) == pytest.approx(4.0)
    assert perplexity(float("inf")) == math.inf
    # A uniform model over V tokens has perplexity V on any text.
    uniform = torch.full((7, 32), -math.log(32), dtype=torch.float64)
    assert perplexity(token_nll(uniform, torch.arange(7)).mean().item()) == pytest.approx(32.0)


def test_mean_std_and_accumulator():
    assert mean_std([1.0, 2.0, 3.0]) == pytest.approx((2.0, 1.0))
    assert mean_std([5.0]) == (5.0, 0.0)
    with pytest.raises(ValueError):
        mean_std([])
    acc = Accumulator()
    acc.add(2, nll=3.0)
    acc.add(4, nll=3.0)
    assert acc.means() == {"nll": 1.0}


def test_ids_to_text_and_diversity():
    assert ids_to_text([3, 14, 159]) == "3 14 159"
    same = torch.tensor([[5, 6, 7, 8]] * 4)
    different = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]])
    low = diversity(torch.cat([same, same]), samples_per_prompt=4)
    high = diversity(torch.cat([different, different]), samples_per_prompt=4)
    assert low["self_bleu"] == pytest.approx(100.0) and high["self_bleu"] < 1.0
    assert low["distinct_1"] == pytest.approx(25.0) and high["distinct_1"] == pytest.approx(100.0)
    assert high["ngram_diversity"] == pytest.approx(100.0)


def test_prompts_repeat_each_prefix():
    heldout = torch.arange(40).view(5, 8)
    prompts = prompts_from(heldout, num_prompts=2, prefix_len=3, samples_per_prompt=3)
    assert prompts.tolist() == [[0, 1, 2]] * 3 + [[8, 9, 10]] * 3


def test_summary_and_paired_differences():
    runs = [
        {"student": "nll", "seed": 0, "metrics": {"recall_ppl": 10.0}},
        {"student": "nll", "seed": 1, "metrics": {"recall_ppl": 12.0}},
        {"student": "emo", "seed": 0, "metrics": {"recall_ppl": 9.0}},
        {"student": "emo", "seed": 1, "metrics": {"recall_ppl": 13.0}},
    ]
    summary = summarize(runs)
    assert summary["nll"]["recall_ppl"] == {"mean": 11.0, "std": pytest.approx(math.sqrt(2)), "n": 2}
    diff = paired_differences(runs)["emo"]["recall_ppl"]
    assert diff["mean"] == pytest.approx(0.0) and diff["lower"] == 1 and diff["n"] == 2
    table = markdown_table(summary)
    assert "| emo |" in table and "11.00 ± 1.41" in table


# ---------------------------------------------------------------------------------------------
# Models: exact comparison, sampling, oracle calibration
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_pair():
    from trl_emo.models.tiny import build_tiny_model

    tokenizer = lm.make_tokenizer(24)
    config = lm.model_config(hidden_size=16, num_layers=1, num_heads=2, seq_len=8)
    first = build_tiny_model(tokenizer, seed=0, **config).eval()
    second = build_tiny_model(tokenizer, seed=1, **config).eval()
    with torch.no_grad():
        first.lm_head.weight.mul_(20)
        second.lm_head.weight.mul_(20)
    return tokenizer, first, second


def test_tokenizer_vocabulary_is_the_token_ids():
    tokenizer = lm.make_tokenizer(40)
    assert len(tokenizer) == 40
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, lm.BOS_ID, 2)
    assert tokenizer.convert_tokens_to_ids("t39") == 39


def test_exact_comparison_of_a_model_with_itself(tiny_pair):
    _, model, _ = tiny_pair
    sequences = lm.sample_sequences(model, 6, 8, torch.Generator().manual_seed(0))
    result = lm.compare_on_text(model, model, sequences)
    assert result["forward_kl"] == 0.0 and result["reverse_kl"] == 0.0
    assert result["student_ppl"] == result["oracle_ppl"]
    assert result["student_entropy"] == pytest.approx(result["oracle_entropy"])


def test_exact_comparison_matches_a_direct_computation(tiny_pair):
    _, student, oracle = tiny_pair
    sequences = lm.sample_sequences(oracle, 5, 8, torch.Generator().manual_seed(1))
    result = lm.compare_on_text(student, oracle, sequences, first_target=3, batch_size=2)
    with torch.no_grad():
        ls = torch.log_softmax(student(input_ids=sequences).logits.double(), -1)[:, 2:-1]
        lo = torch.log_softmax(oracle(input_ids=sequences).logits.double(), -1)[:, 2:-1]
    ps, po = ls.exp(), lo.exp()
    targets = sequences[:, 3:]
    assert result["forward_kl"] == pytest.approx((po * (lo - ls)).sum(-1).mean().item(), rel=1e-9)
    assert result["reverse_kl"] == pytest.approx((ps * (ls - lo)).sum(-1).mean().item(), rel=1e-9)
    assert result["student_entropy"] == pytest.approx(-(ps * ls).sum(-1).mean().item(), rel=1e-9)
    nll = -ls.gather(-1, targets[..., None]).mean().item()
    assert result["student_nll"] == pytest.approx(nll, rel=1e-9)
    assert result["student_ppl"] == pytest.approx(math.exp(nll), rel=1e-9)
    assert result["forward_kl"] > 0 and result["reverse_kl"] > 0


def test_cached_sampling_equals_sampling_with_full_forwards(tiny_pair):
    _, model, _ = tiny_pair
    prefixes = torch.tensor([[lm.BOS_ID, 7, 9]] * 4)
    cached = lm.sample(model, prefixes, 6, torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(3)
    x = prefixes
    with torch.no_grad():
        for _ in range(6):
            probs = torch.softmax(model(input_ids=x).logits[:, -1].float(), -1)
            x = torch.cat([x, torch.multinomial(probs, 1, generator=g)], 1)
    assert torch.equal(cached, x)
    assert torch.equal(cached[:, :3], prefixes)


def test_head_calibration_reaches_the_target_entropy():
    from trl_emo.models.tiny import build_tiny_model

    tokenizer = lm.make_tokenizer(48)
    model = build_tiny_model(tokenizer, seed=0, **lm.model_config(16, 1, 2, 8)).eval()
    scale = lm.calibrate_head_scale(model, target_entropy=2.0, length=8, seed=0, n=16)
    assert scale > 1
    assert lm.mean_entropy_on_own_samples(model, 16, 8, seed=0) == pytest.approx(2.0, abs=0.05)


# ---------------------------------------------------------------------------------------------
# --quick, end to end
# ---------------------------------------------------------------------------------------------

DEFAULT_STUDENTS = ("nll", "gem-linear", "gem-logsigmoid", "gem-target", "emo", "tailr", "tailr-floor", "tailr-authors",
                    "mixce")


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    from benchmarks.oracle_study import main

    out = tmp_path_factory.mktemp("oracle_quick")
    results = main(["--quick", "--output_dir", str(out)])
    return out, results


def test_quick_writes_every_output(quick):
    out, results = quick
    for name in ("results.json", "results.md", "oracle_study.png"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0, name
    assert (out / "oracle_study.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "results.json").read_text())["config"]["quick"] is True
    # The working folder (checkpoints) is removed.
    assert sorted(p.name for p in out.iterdir()) == ["oracle_study.png", "results.json", "results.md"]
    md = (out / "results.md").read_text()
    for student in ("oracle", "start", *DEFAULT_STUDENTS):
        assert f"| {student} |" in md
    assert "±" in md and "'limited' regime" in md and "'ample' regime" in md
    assert results["command"].startswith("python benchmarks/oracle_study.py --quick")
    # The verdicts, from each seed's difference (two seeds: Student's t with one degree of freedom).
    assert "## Verdicts" in md and "comparisons in this table" in md and "| t over 2 paired seeds |" in md


def test_quick_numbers_are_sane(quick):
    _, results = quick
    seeds = results["config"]["seeds"]
    assert len(seeds) >= 2
    assert set(results["summary"]) == {"ample", "limited"}
    for regime, summary in results["summary"].items():
        frontier = {f"nll@T={t:g}" for t in results["config"]["nll_temperatures"]}
        assert set(summary) == {"oracle", "oracle@T=1/0.7", "start", *DEFAULT_STUDENTS, *frontier}, regime
        for student, metrics in summary.items():
            for key, stats in metrics.items():
                assert math.isfinite(stats["mean"]) and math.isfinite(stats["std"]), (regime, student, key)
            expected_n = 1 if student.startswith("oracle") else len(seeds)
            assert metrics["recall_ppl"]["n"] == expected_n
    for row in results["runs"]:
        m = row["metrics"]
        assert m["forward_kl"] >= 0 and m["reverse_kl"] >= 0 and m["reverse_kl_on_samples"] >= 0, row
        assert m["precision_ppl"] >= 1 and m["recall_ppl"] >= 1 and m["self_ppl"] >= 1, row
        assert 0 <= m["entropy"] <= math.log(results["config"]["vocab_size"]) + 1e-9, row
        assert 0 <= m["self_bleu"] <= 100 and 0 <= m["ngram_diversity"] <= 100, row
    # The oracle against itself: exact zeros, and its perplexity on its own text is about e^entropy.
    oracle = next(row["metrics"] for row in results["runs"] if row["student"] == "oracle")
    assert oracle["forward_kl"] == 0 and oracle["reverse_kl"] == 0 and oracle["reverse_kl_on_samples"] == 0
    assert math.log(oracle["recall_ppl"]) == pytest.approx(oracle["entropy"], abs=0.15)
    assert abs(results["oracle"]["entropy_on_heldout"] - results["config"]["oracle_entropy"]) < 0.2
    # Temperature moves entropy monotonically: the oracle at T = 1/0.7 and nll at T > 1 are flatter.
    summary = results["summary"]["ample"]
    assert summary["oracle@T=1/0.7"]["entropy"]["mean"] > summary["oracle"]["entropy"]["mean"]
    assert summary["oracle@T=1/0.7"]["forward_kl"]["mean"] > 0
    curve = sorted(results["config"]["nll_temperatures"] + [1.0])
    entropies = [summary["nll" if t == 1.0 else f"nll@T={t:g}"]["entropy"]["mean"] for t in curve]
    assert entropies == sorted(entropies) and len(set(entropies)) == len(entropies)


def test_quick_nll_student_learns_from_the_oracle(quick):
    """Fine-tuning with nll on oracle text brings every seed's student closer to the oracle than its start."""
    _, results = quick
    by = {(row["regime"], row["student"], row["seed"]): row["metrics"] for row in results["runs"]}
    for seed in results["config"]["seeds"]:
        start, nll = by[("ample", "start", seed)], by[("ample", "nll", seed)]
        assert nll["recall_ppl"] < start["recall_ppl"], seed
        assert nll["forward_kl"] < start["forward_kl"], seed
        # Every student is far from the oracle at this size, but all are better than uniform.
        for student in DEFAULT_STUDENTS:
            assert by[("ample", student, seed)]["recall_ppl"] < results["config"]["vocab_size"]
    # Training went through the trainer with the requested number of steps for every student.
    steps = {row["steps"] for row in results["training"] if row["regime"] == "ample"}
    assert len(steps) == 1 and steps.pop() > 0


def test_quick_gem_target_follows_its_schedule_toward_the_oracle_entropy(quick):
    """gem-target's beta starts at gem-linear's, moves after every step by the documented rule
    `log beta <- clip(log beta - step * (target - entropy), log beta_min, 0)` with the step's logged training
    entropy, and its target is the oracle's entropy on the very tokens it trains on."""
    from trl_emo import SFTConfig

    _, results = quick
    defaults = SFTConfig(output_dir="unused", loss_type="gem")
    paths = [row for row in results["training"] if row["student"] == "gem-target"]
    assert len(paths) == 2 * len(results["config"]["seeds"])
    for row in paths:
        path = row["gem_beta"]
        target = results["oracle"]["entropy_on_finetune"][row["regime"]]
        assert path["target_entropy"] == target
        assert abs(target - results["oracle"]["entropy_on_heldout"]) < 0.15
        assert path["start"] == defaults.gem_beta and len(path["path"]) == row["steps"] > 0
        beta = path["start"]
        for logged, entropy in zip(path["path"], path["train_entropy"]):
            expected = math.exp(min(0.0, max(math.log(defaults.gem_beta_min),
                                             math.log(beta) - defaults.gem_beta_step * (target - entropy))))
            assert logged == pytest.approx(expected, rel=1e-12)
            beta = logged
        # The tiny students are far more entropic than the oracle: beta rises, here to its bound.
        assert path["train_entropy_first"] > target and path["end"] > path["start"]
    comparison = results["target_entropy"]["ample"]["gem-target"]
    assert {"gem-target", "gem-linear", "nll", "nll at gem-target's entropy"} <= set(comparison["rows"])
    assert comparison["comparisons"]["gem-linear"]["n"] == len(results["config"]["seeds"])
    md = (quick[0] / "results.md").read_text()
    assert "GEM with a target entropy (gem-target" in md and "beta: start 0.7" in md


def test_quick_tailr_variants_are_three_different_losses(quick):
    """The paper's TaiLr, its floored weight and the EMO authors' nll-mixed baseline train different students."""
    _, results = quick
    by = {(row["regime"], row["student"], row["seed"]): row["metrics"] for row in results["runs"]}
    seed = results["config"]["seeds"][0]
    recalls = {name: by[("limited", name, seed)]["recall_ppl"] for name in ("tailr", "tailr-floor", "tailr-authors")}
    assert len(set(recalls.values())) == 3, recalls


def test_curve_at_entropy_interpolates_the_temperature_too():
    from benchmarks.oracle.report import MATCHED_KEYS, curve_at_entropy

    def metrics(entropy, recall):
        return {key: 1.0 for key in MATCHED_KEYS} | {"entropy": entropy, "recall_ppl": recall}

    seed = {"nll@T=0.8": metrics(2.0, 10.0), "nll": metrics(3.0, 10.0), "nll@T=1.2": metrics(4.0, 40.0),
            "gem": metrics(3.5, 1.0)}
    at = curve_at_entropy(seed, 3.5)
    assert at["temperature"] == pytest.approx(1.1) and at["recall_ppl"] == pytest.approx(20.0)
    assert at["entropy"] == 3.5
    assert curve_at_entropy(seed, 4.5) is None and curve_at_entropy({"nll": metrics(3.0, 1.0)}, 3.0) is None


def test_optional_students_run(tmp_path):
    """The non-default students (EMO with the oracle's head as its cost, CE + entropy) run too."""
    from benchmarks.oracle_study import main

    results = main([
        "--quick", "--seeds", "0", "--regimes", "limited", "--losses", "emo-oracle-cost", "ce_entropy",
        "--pretrain_sequences", "128", "--heldout_sequences", "32", "--output_dir", str(tmp_path),
    ])
    assert set(results["summary"]["limited"]) == {"oracle", "start", "emo-oracle-cost", "ce_entropy"}
    assert results["paired_differences_vs_nll"] == {}
    assert (tmp_path / "results.md").is_file()


def test_bad_arguments_are_rejected():
    from benchmarks.oracle_study import parse_args

    with pytest.raises(SystemExit):
        parse_args(["--losses", "not-a-loss"])
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--samples_per_prompt", "1"])
    with pytest.raises(SystemExit):
        parse_args(["--quick", "--gem_target_entropy", "5.0"])  # above ln 64
    with pytest.raises(SystemExit):
        parse_args(["--gem_beta_step", "0"])
    args = parse_args(["--quick", "--seeds", "3", "4", "--learning_rate", "0.5"])
    assert args.seeds == [3, 4] and args.learning_rate == 0.5 and args.vocab_size == 64


def test_with_temperature_divides_the_logits_even_after_a_forward_patch(tiny_pair):
    """A trainer patches `forward` with a closure over the original model (so `copy.deepcopy` would keep
    running the original's weights); `with_temperature` must build an independent model."""
    import types

    _, model, _ = tiny_pair
    x = torch.tensor([[lm.BOS_ID, 4, 5, 6]])
    with torch.no_grad():
        reference = model(input_ids=x).logits
    patched = lm.with_temperature(model, 1.0)
    original_forward = patched.forward
    patched.forward = types.MethodType(lambda self, *a, **k: original_forward(*a, **k), patched)
    tempered = lm.with_temperature(patched, 0.5)
    with torch.no_grad():
        assert torch.allclose(tempered(input_ids=x).logits, 2 * reference, atol=1e-5)
        assert torch.allclose(patched(input_ids=x).logits, reference)


def test_interpolate():
    from benchmarks.oracle.metrics import interpolate

    assert interpolate([0, 2, 1], [0, 20, 10], 1.5) == pytest.approx(15.0)
    assert interpolate([0, 1], [5, 7], 0) == 5 and interpolate([0, 1], [5, 7], 1) == 7
    assert interpolate([0, 1], [5, 7], 1.01) is None and interpolate([], [], 0) is None
    # In log space: halfway between perplexities 4 and 16 is 8 (halfway in cross-entropy).
    assert interpolate([0, 1], [4, 16], 0.5, log=True) == pytest.approx(8.0)


def test_matched_entropy_differences():
    from benchmarks.oracle.report import matched_entropy_differences

    def metrics(entropy, recall):
        from benchmarks.oracle.report import MATCHED_KEYS

        return {key: 0.0 for key in MATCHED_KEYS} | {"entropy": entropy, "recall_ppl": recall, "precision_ppl": 1.0}

    runs = [
        {"student": "nll@T=0.8", "seed": 0, "metrics": metrics(2.0, 10.0)},
        {"student": "nll", "seed": 0, "metrics": metrics(3.0, 10.0)},
        {"student": "nll@T=1.2", "seed": 0, "metrics": metrics(4.0, 40.0)},
        {"student": "gem", "seed": 0, "metrics": metrics(3.5, 19.0)},  # nll at entropy 3.5: 20
        {"student": "flat", "seed": 0, "metrics": metrics(5.0, 1.0)},  # outside the curve
        {"student": "start", "seed": 0, "metrics": metrics(3.0, 11.0)},  # a reference: not compared
    ]
    out = matched_entropy_differences(runs)
    assert set(out) == {"gem", "flat"}
    assert out["gem"]["recall_ppl"]["mean"] == pytest.approx(-1.0) and out["gem"]["recall_ppl"]["lower"] == 1
    assert out["flat"] == {"outside": 1}


def test_outputs_can_be_rewritten_from_results_json(quick, tmp_path):
    from benchmarks.oracle_study import main

    out, _ = quick
    main(["--from_results", str(out / "results.json"), "--output_dir", str(tmp_path)])
    assert (tmp_path / "results.md").read_text() == (out / "results.md").read_text()
    assert (tmp_path / "oracle_study.png").stat().st_size > 0


def test_verdicts_read_the_committed_tables_rounding_and_all(tmp_path):
    from benchmarks.oracle import verdicts

    text = (ROOT / "docs" / "oracle" / "results.md").read_text()
    differences = verdicts.differences_from_markdown(text)
    emo = differences["ample"]["nll"]["emo"]["precision_ppl"]  # "-13.12 ± 1.91 (3/3 lower)"
    assert emo == {"mean": -13.12, "std": 1.91, "n": 3, "lower": 3, "rounding": 0.005}
    target = differences["limited"]["gem-linear"]["gem-target"]["reverse_kl_on_samples"]  # "-0.2906 ± 0.0011"
    assert target["mean"] == -0.2906 and target["rounding"] == 0.00005
    assert set(differences["ample"][verdicts.EQUAL_ENTROPY]) >= {"emo", "gem-linear", "mixce", "tailr-authors"}
    # The committed verdicts.md is what the committed tables give.
    committed = ROOT / "docs" / "oracle" / "verdicts.md"
    written = verdicts.write_from_markdown([ROOT / "docs" / "oracle" / "results.md",
                                            ROOT / "docs" / "oracle" / "gem_target_3.8_results.md"], tmp_path)
    assert written.read_text() == committed.read_text()
    # Exact per-seed differences give the same test as their mean ± std, without the rounding's widening.
    exact = verdicts.effect({"mean": 2.0, "std": 1.0, "n": 3, "values": [1.0, 2.0, 3.0]})
    assert exact.low == pytest.approx(verdicts.effect({"mean": 2.0, "std": 1.0, "n": 3}).low)
    assert verdicts.effect({"mean": 2.0, "std": 1.0, "n": 3, "rounding": 0.05}).low < exact.low


def test_the_study_leaves_library_logging_as_it_found_it():
    import datasets
    import transformers

    from benchmarks.oracle_study import _quiet

    tf_logging = transformers.utils.logging
    before = (tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled(), datasets.is_progress_bar_enabled())
    tf_logging.set_verbosity_info()
    try:
        with _quiet():
            assert tf_logging.get_verbosity() == tf_logging.ERROR
            assert not tf_logging.is_progress_bar_enabled() and not datasets.is_progress_bar_enabled()
        assert tf_logging.get_verbosity() == tf_logging.INFO
        assert tf_logging.is_progress_bar_enabled() == before[1]
        assert datasets.is_progress_bar_enabled() == before[2]
    finally:
        tf_logging.set_verbosity(before[0])
