"""How far the authors' code of SED-SFT and EKSFT is from the objectives their papers state, in numbers, on a real model.

    python benchmarks/authors_vs_paper.py            # SmolLM2-135M-Instruct, the real-model study's problems (~3 min)
    python benchmarks/authors_vs_paper.py --quick    # fewer rows and steps (~1 min)

Offline: the model is the dev install's SmolLM2-135M-Instruct (`trl_emo.models.real_model`), the data the arithmetic
word problems of `benchmarks/real_model_study.py`. Measured, for `docs/losses.md`:

- SED: the threshold `τ` the authors' calibration gives (70 % of the positions' top-10 mass reach it, over every
  position of the first rows) and the share of the *answer* tokens then penalized by the top-2 mask, against the 30 %
  the ratio suggests (the calibration reads the top-10 mass, the loss the top-2 mass).
- EKSFT, at the first step (policy = reference) and after a short cross-entropy run (policy ≠ reference): the KL term
  of each formula (the authors' `Σ p (p − log q)` against the true `KL(p ‖ q)`), the λs of the authors' rule, how many
  of the dropped tokens differ between the aligned selection (paper) and the authors' one position later, and the
  cosine and norm ratio between the two formulas' gradients with respect to the logits.

Writes `docs/authors_vs_paper.json` (`--out`) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def _batch(tokenizer, rows, max_length=256):
    import torch

    from trl_emo.training.heldout import pad_batch, prepare_rows

    examples = prepare_rows(rows, tokenizer, schema="metamath", prompt_format="chat_template", max_length=max_length)
    del torch
    return pad_batch(examples, tokenizer.pad_token_id or 0)


def eksft_numbers(policy, reference, batch) -> dict:
    """The two formulas on one micro-batch, from the full logits (the logits path)."""
    import torch

    from trl_emo.losses import get_loss
    from trl_emo.losses._common import select_label_rows, select_targets
    from trl_emo.losses.eksft import _lambda, log_vocab, plan_rows, row_statistics

    spec = get_loss("eksft")
    labels = batch["labels"]
    with torch.no_grad():
        ref_logits = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    logits = policy(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.float()
    out = {}
    grads = {}
    dropped = {}
    for formula in ("paper", "authors"):
        hp = {**spec.defaults, "formula": formula}
        if formula == "authors":
            rows, targets, roles = select_label_rows(labels)
        else:
            shifted, mask = select_targets(labels)
            rows = torch.cat([mask, torch.zeros_like(mask[:, :1])], dim=1)
            targets, roles = shifted[mask], None
        z = logits.detach()[rows].double().requires_grad_(True)
        zr = ref_logits[rows].double()
        stats = row_statistics(z.detach(), zr, formula)
        weights = plan_rows(stats, hp, z.shape[-1], roles)
        loss = spec.per_token(z, targets, **hp, reference=zr, **({"roles": roles} if roles else {})).sum()
        count = int(roles["target"].sum()) if roles else int(targets.numel())
        loss = loss / count
        (grad,) = torch.autograd.grad(loss, z)
        # The gradient per target position: the authors' rows include the label rows after each target.
        full = torch.zeros(*labels.shape, z.shape[-1], dtype=torch.float64)
        full[rows] = grad
        grads[formula] = full
        selected = weights["w_kl"] > 0  # the rows the KL penalty falls on
        target_rows = roles["target"].bool() if roles else torch.ones_like(selected)
        out[formula] = {
            "loss": float(loss.detach()),
            # The formula's KL term and the true KL(p || q), both on the rows the penalty falls on.
            "kl_term_on_selected": float((stats["kl_term"][selected]).mean()) if selected.any() else 0.0,
            "true_kl_on_selected": float((stats["kl"][selected]).mean()) if selected.any() else 0.0,
            "dropped_share": float(weights["eksft_dropped"][target_rows].mean()),
        }
        drop = torch.zeros(labels.shape, dtype=torch.bool)
        # Dropped target positions (position t predicts labels[t + 1]).
        positions = rows.nonzero()[target_rows]
        drop[positions[:, 0], positions[:, 1]] = weights["eksft_dropped"][target_rows] > 0
        dropped[formula] = drop
        if formula == "authors":
            # The authors' rule, on this micro-batch's terms (the selected label rows are where w_h / w_kl > 0).
            k = int((weights["w_h"] > 0).sum())
            entropy_term = float((stats["h_term"] * (weights["w_h"] > 0)).sum()) / log_vocab(z.shape[-1], formula) / k
            kl_term = float((stats["kl_term"] * (weights["w_kl"] > 0)).sum()) / k
            out[formula]["entropy_term"] = entropy_term
            out[formula]["lambda_entropy"] = _lambda(hp["lambda_entropy"], entropy_term, hp["target_entropy"], False)
            out[formula]["lambda_kl"] = _lambda(hp["lambda_kl"], kl_term, hp["target_kl"], True)
    a, p = grads["authors"].flatten(), grads["paper"].flatten()
    union = (dropped["paper"] | dropped["authors"]).sum()
    out["dropped_positions_differing"] = float((dropped["paper"] ^ dropped["authors"]).sum() / union.clamp(min=1))
    out["gradient_cosine"] = float(a @ p / (a.norm() * p.norm()))
    out["gradient_norm_ratio"] = float(a.norm() / p.norm())
    return out


def sed_numbers(model, tokenizer, rows, batch) -> dict:
    import torch

    from trl_emo.losses.sed import threshold_from_masses

    masses10 = []
    with torch.no_grad():
        for example in rows:
            text = tokenizer.apply_chat_template(
                [{"role": "user", "content": example["query"]}, {"role": "assistant", "content": example["response"]}],
                tokenize=False)
            ids = torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])
            probs = model(input_ids=ids).logits[0].float().softmax(-1)
            masses10.append(probs.topk(10, -1).values.sum(-1))
        tau = threshold_from_masses(torch.cat(masses10), 0.7)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1].float()
        mask = batch["labels"][:, 1:] != -100
        top2 = logits[mask].softmax(-1).topk(2, -1).values.sum(-1)
        top10 = logits[mask].softmax(-1).topk(10, -1).values.sum(-1)
    return {
        "tau": tau,
        "answer_tokens_penalized_top2": float((top2 < tau).float().mean()),
        "answer_tokens_below_tau_top10": float((top10 < tau).float().mean()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="cross-entropy steps before the second EKSFT measure")
    parser.add_argument("--out", default=str(ROOT / "docs" / "authors_vs_paper.json"))
    args = parser.parse_args(argv)
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from real_model.problems import make_splits
    from trl_emo.core.noise import quiet_optional_packages
    from trl_emo.models.real_model import smollm2_instruct

    quiet_optional_packages()
    torch.manual_seed(0)
    started = time.time()
    path = smollm2_instruct()
    tokenizer = AutoTokenizer.from_pretrained(path)
    reference = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    splits = make_splits({"train": 32 if args.quick else 100, "validation": 8}, seed=0)
    rows = splits["train"]
    batch = _batch(tokenizer, splits["validation"])
    steps = args.steps if args.steps is not None else (5 if args.quick else 20)
    result = {"model": "SmolLM2-135M-Instruct", "date": date.today().isoformat(), "machine": platform.processor() or
              platform.machine(), "rows_for_tau": len(rows), "sft_steps": steps}
    result["sed"] = sed_numbers(reference, tokenizer, rows, batch)
    policy = copy.deepcopy(reference)
    result["eksft_start"] = eksft_numbers(policy, reference, batch)
    train_batch = _batch(tokenizer, rows[:32])
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4)
    policy.train()
    for step in range(steps):
        sl = slice((step * 8) % 32, (step * 8) % 32 + 8)
        out = policy(input_ids=train_batch["input_ids"][sl], attention_mask=train_batch["attention_mask"][sl],
                     labels=train_batch["labels"][sl])
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    policy.eval()
    result["eksft_after_sft"] = eksft_numbers(policy, reference, batch)
    result["seconds"] = round(time.time() - started, 1)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
