"""The studies' hand-written reports against their committed results (`benchmarks/study_prose.py`).

docs/sft_then_rl_study.md is rendered from its template and the committed JSON: it must be exactly what rendering
gives, and the template's own numbers (outside its fields) must be settings or named below with their reason. The
real-model and oracle reports and the README's paragraphs about the studies are written by hand: every number in
their prose must be one their results give, rounded as written, or named below with its reason. (A check of
presence: about 60-80 % of the numbers a wrong figure could take are absent from a study's results, so most wrong
figures fail it; a figure under the wrong name can pass, which is why the report whose figures were found wrong is
rendered.)"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import sft_then_rl_study as rl_study  # noqa: E402
from benchmarks import study_prose as prose  # noqa: E402
from benchmarks.real_model import report as real_model_report  # noqa: E402
from benchmarks.real_model import sft_then_rl_doc  # noqa: E402

DOCS = ROOT / "docs"

# Numbers the SFT -> RL template writes itself that its results' settings do not hold.
RL_TEMPLATE_NUMBERS = {
    "2.06": "SED-SFT's paper: +2.06 points after RL",
    "95": "the intervals' level, 95 %",
    "80": "the power of the sample sizes, 80 %",
    "256": "the first study's RL size (256 completions), from its report",
    "32": "the first study's RL prompts (32), from its report",
    "20": "EKSFT's default share of selected tokens, 20 % (docs/losses.md)",
    "0.05": "EKSFT's default λ, 0.05 / 0.05 (docs/losses.md)",
    "3.9": "the two invocations' wall time, hours, from the study's log (not in the JSON)",
    "2026": "a year: the 2026 objectives",
    "0.8": "PSFT's clip range, 1 - 0.2 (psft_clip_low)", "1.28": "PSFT's clip range, 1 + 0.28 (psft_clip_high)",
    "49,152": "SmolLM2's vocabulary (CurioSFT's top-512 of it)",
    "5.0": "CurioSFT's paper: +5.0 points after RL", "19": "the first round's tested comparisons (its report)",
}
REAL_MODEL_NUMBERS = {
    "576": "the model's hidden size", "49,152": "the model's vocabulary", "256": "the maximum length",
    "0.4645": "the learning-rate sweep of 2026-11-25, whose file was lost (the report says so)",
    "0.2283": "the same sweep", "17": "the sweep's minutes", "200": "the prompt's word limit",
}
ORACLE_NUMBERS = {
    "1,000": "the held-out sequences (configuration)", "255": "the vocabulary's last id", "500": "pre-training steps",
    "8,000": "the exploratory run's pre-training sequences", "2,000": "the exploratory run's fine-tuning sequences",
    "100": "the diversity scale, ×100", "2.13": "torch's version", "5.23": "transformers' version",
    "144": "an exploratory run's seconds on the oracle", "1,024": "target tokens per step (32 × 32)",
    "79": "the EMO paper's Table 2 (MixCE)", "3.16": "the GEM paper's evaluation perplexity",
    "3.48": "the GEM paper's CE perplexity",
}


@pytest.fixture(scope="module")
def rl_results():
    results = json.loads((DOCS / "sft_then_rl_study.json").read_text())
    committed = results["analysis"]
    results["analysis"] = rl_study.analyse(results)
    return results, committed


def test_the_sft_then_rl_report_is_rendered_from_its_results(rl_results):
    results, committed = rl_results
    # The analysis (every verdict) recomputes to what is committed: the bootstrap is seeded.
    assert json.loads(json.dumps(results["analysis"])) == committed
    assert sft_then_rl_doc.render(results) == (DOCS / "sft_then_rl_study.md").read_text()
    assert rl_study.report_markdown(results) == (DOCS / "sft_then_rl_study_results.md").read_text()


def test_the_sft_then_rl_templates_own_numbers_are_settings_or_named(rl_results):
    results, _ = rl_results
    template = sft_then_rl_doc.TEMPLATE.read_text()
    literal = prose.FIELD.sub(" ", template)
    assert prose.unmatched(literal, prose.pool(results["settings"]), RL_TEMPLATE_NUMBERS) == []
    # The known wrong figures of the first report are not in it any more (issue 46).
    text = " ".join((DOCS / "sft_then_rl_study.md").read_text().split())
    assert "6.2 % greedy after SFT, 8.6 % after RL" in text  # EKSFT (the first report: 8.6 after SFT)
    assert "(seeds +2.0 / +2.3)" in text and "(+1.8 / +2.1 against +0.8 / +0.8)" in text  # from the exact ends
    # No one-standard-error verdict left: the labels are the tests'.
    assert not re.search(r"\*\*(holds|partly|does not hold)\*\*", text)
    assert set(re.findall(r"\| \*\*([a-z ]+)\*\* \|", text)) == {"worse", "cannot tell"}  # no start is better


def test_a_template_field_names_a_figure_or_fails():
    assert prose.render("[[a|+.1f]] and [[a - b|.0f]] %, [[c*100|.0f]]", {"a": -1.25, "b": 2.0, "c": 0.5}) == \
        "−1.2 and −3 %, 50"
    with pytest.raises(KeyError, match="no figure 'missing'"):
        prose.render("[[missing]]", {})
    with pytest.raises(ValueError, match="no value"):
        prose.render("[[a]]", {"a": None})


def test_the_number_check_reads_prose_as_written():
    found = prose.numbers("GEM −7.8 [−12.1, −3.3] on 64 problems, 2e-6, SmolLM2-135M, Llama-3.2-3B, 1,024 tokens, "
                          "torch 2.13.0, 2026-11-27 07:30, issue 46, 0.5-2 points, `code 99`")
    assert [written for written, _, _ in found] == ["−7.8", "−12.1", "−3.3", "64", "1,024", "0.5", "2"]
    # 0.74 is 0.7 as written; 2.148 (a gain from exact ends) is 2.1, not the 2.2 of rounded ends (14.5 − 12.3).
    assert prose.unmatched("a gain of +2.2 and of 0.7", [2.148, 0.74]) == ["+2.2"]
    assert prose.unmatched("+2.2 <!-- prose-check: off (why) --> 9.9 <!-- prose-check: on -->", [2.2]) == []


def _unmatched_in(text: str, allowed: dict, *sources) -> list[str]:
    return prose.unmatched(text, prose.pool(*sources), allowed)


def test_the_real_model_report_quotes_only_its_results():
    results = json.loads((DOCS / "real_model_study.json").read_text())
    tables = (DOCS / "real_model_study_results.md").read_text()
    assert real_model_report.markdown(results) + "\n" == tables  # the generated tables are the JSON's
    assert _unmatched_in((DOCS / "real_model_study.md").read_text(), REAL_MODEL_NUMBERS, results, tables) == []


def test_the_oracle_report_quotes_only_its_results():
    sources = [(DOCS / "oracle" / name).read_text() for name in ("results.md", "gem_target_3.8_results.md",
                                                                  "verdicts.md")]
    assert _unmatched_in((DOCS / "oracle_study.md").read_text(), ORACLE_NUMBERS, *sources) == []


def test_the_readme_paragraphs_on_the_studies_quote_only_their_results():
    readme = (ROOT / "README.md").read_text()
    start = readme.index("**Which SFT objective gives RL the best start?**")
    section = readme.index("## Does it do what the papers say?")
    text = readme[start:readme.index("\n\n", start)] + "\n\n" + readme[section:readme.index("\n## ", section + 3)]
    sources = [json.loads((DOCS / f"{name}.json").read_text()) for name in ("sft_then_rl_study", "real_model_study")]
    sources += [(DOCS / name).read_text() for name in ("sft_then_rl_study_results.md", "real_model_study_results.md",
                                                       "oracle/results.md", "oracle/verdicts.md")]
    assert _unmatched_in(text, {"384": "completions per RL run, 24 steps x 4 prompts x 4", "2026": "a year: the 2026 objectives"}, *sources) == []
    assert '"holds"' not in text.replace('"holds, narrowly" was a one-standard-error rule', "")
