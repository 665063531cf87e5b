"""Everything measured on one student, against the oracle.

- precision: the oracle's perplexity of the student's samples (ancestral sampling at T=1 from
  held-out prefixes), the EMO paper's PPL_oracle;
- recall: the student's perplexity on held-out oracle text;
- exact forward KL(oracle ‖ student), reverse KL(student ‖ oracle) and the student's entropy,
  averaged over every position of the held-out oracle text; and the exact reverse KL averaged over
  the positions of the student's own samples (the sequence-level `KL(Q ‖ P)` per token);
- the student's perplexity on (part of) its fine-tuning data, for the generalization gap;
- diversity of the samples: distinct-1/2/3, the GEM paper's n-gram diversity (their mean) and
  self-BLEU, each within the `k` samples of one prefix (the GEM paper's protocol: several
  samples per prompt) and averaged over prefixes. Token ids are the words.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from trl_emo.evaluation.metrics import distinct_n, ngram_diversity, self_bleu

from . import lm
from .metrics import ids_to_text


def diversity(continuations: torch.Tensor, samples_per_prompt: int) -> dict:
    """Diversity of `[num_prompts * k, G]` continuations, grouped `k` by `k` (one group per prefix)."""
    groups = continuations.view(-1, samples_per_prompt, continuations.shape[-1])
    rows = {"distinct_1": [], "distinct_2": [], "distinct_3": [], "ngram_diversity": [], "self_bleu": []}
    for group in groups:
        texts = [ids_to_text(seq.tolist()) for seq in group]
        for order in (1, 2, 3):
            rows[f"distinct_{order}"].append(distinct_n(texts, order))
        rows["ngram_diversity"].append(ngram_diversity(texts))
        rows["self_bleu"].append(self_bleu(texts))
    return {key: float(np.mean(values)) for key, values in rows.items()}


def prompts_from(heldout: torch.Tensor, num_prompts: int, prefix_len: int, samples_per_prompt: int) -> torch.Tensor:
    """The first `prefix_len` tokens (BOS included) of the first `num_prompts` held-out sequences,
    each repeated `samples_per_prompt` times: `[num_prompts * k, prefix_len]`."""
    if num_prompts > heldout.shape[0]:
        raise ValueError(f"num_prompts={num_prompts} exceeds the {heldout.shape[0]} held-out sequences")
    return heldout[:num_prompts, :prefix_len].repeat_interleave(samples_per_prompt, dim=0)


@torch.no_grad()
def evaluate(student, oracle, *, heldout: torch.Tensor, train_subset: torch.Tensor, prompts: torch.Tensor,
             samples_per_prompt: int, new_tokens: int, seed: int) -> dict:
    """All metrics of `student` (see the module docstring). `seed` fixes the sampling: using the same
    seed for every student of a run gives them common random numbers."""
    prefix_len = prompts.shape[1]
    samples = lm.sample(student, prompts, new_tokens, torch.Generator().manual_seed(seed))
    on_samples = lm.compare_on_text(student, oracle, samples, first_target=prefix_len)
    exact = lm.compare_on_text(student, oracle, heldout)
    train = lm.compare_on_text(student, oracle, train_subset)
    result = {
        "precision_ppl": on_samples["oracle_ppl"],
        "recall_ppl": exact["student_ppl"],
        "forward_kl": exact["forward_kl"],
        "reverse_kl": exact["reverse_kl"],
        "entropy": exact["student_entropy"],
        # Along the student's own samples: the sequence-level reverse KL per token, and the
        # student's perplexity of its own samples (its entropy rate on its own trajectories).
        "reverse_kl_on_samples": on_samples["reverse_kl"],
        "self_ppl": on_samples["student_ppl"],
        "heldout_nll": exact["student_nll"],
        "train_nll": train["student_nll"],
        "train_ppl": train["student_ppl"],
        "generalization_gap": exact["student_nll"] - train["student_nll"],
    }
    result.update(diversity(samples[:, prefix_len:], samples_per_prompt))
    bad = [key for key, value in result.items() if not math.isfinite(value)]
    if bad:
        raise FloatingPointError(f"non-finite metrics: {bad}")
    return result
