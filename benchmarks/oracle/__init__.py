"""Helpers of the oracle study (`benchmarks/oracle_study.py`).

- `metrics`: the exact math, as small pure functions (perplexities, exact KLs, entropies, mean ± std).
- `lm`: the oracle language model, token vocabulary, ancestral sampling and exact scoring of a model pair.
- `students`: pre-training the common starting point and fine-tuning each loss through `trl_emo.SFTTrainer`.
- `report`: aggregation over seeds, the Markdown table and the plot.
"""
