"""How much a bf16 head-gradient accumulator costs in accuracy, at the full token count and vocabulary.

    python benchmarks/accumulation_error.py --tokens 16384 --vocab 128256 --hidden 64

The GPU path of the fused loss accumulates `∂W += (∂ℓ/∂y)^T h` chunk by chunk. For a bf16 head it
accumulates in bf16 (one rounding of the running sum per chunk, as Liger and TRL do) because a
float32 accumulator would cost twice the head's size (2 GiB at Llama-3's 128,256 x 4,096). This
script replays that arithmetic on the CPU, exactly as the GPU does it: bf16 inputs, logits
rounded to bf16 (the chunk's GEMM output), `∂ℓ/∂y` rounded to bf16 (the kernel's store), each
chunk's product formed in float32 and added to a bf16 running sum with one rounding (cuBLAS's
`beta = 1` epilogue), and compares it with a float32 accumulator and with float64 from the same
rounded inputs. A third column keeps the chunk's logits in float32 (trl_emo 0.1's path, 3x slower
on an H100) to separate the rounding of the logits from that of the accumulator. The accumulator's
share grows with the number of chunks; all of it hardly depends on the hidden size, so `--hidden`
can be small. The head is initialised like `loss_bench.py`'s (`randn / sqrt(hidden)`).
"""

from __future__ import annotations

import argparse
import json

import torch


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=16_384)
    parser.add_argument("--vocab", type=int, default=128_256)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--chunks", type=int, nargs="+", default=[256, 512, 1024, 2048], help="rows per chunk")
    parser.add_argument("--logit-std", type=float, default=1.0, help="spread of the logits (head scale)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    gen = torch.Generator().manual_seed(0)
    n, v, d = args.tokens, args.vocab, args.hidden
    h = torch.randn(n, d, generator=gen).bfloat16()
    w = (torch.randn(v, d, generator=gen) * (args.logit_std / d**0.5)).bfloat16()
    y = torch.randint(0, v, (n,), generator=gen)

    # float64 reference from the same rounded inputs, chunked to bound memory.
    reference = torch.zeros(v, d, dtype=torch.float64)
    for s in range(0, n, 1024):
        z = h[s : s + 1024].double() @ w.double().t()
        g = torch.softmax(z, -1)
        g[torch.arange(g.shape[0]), y[s : s + 1024]] -= 1.0
        reference += g.t() @ h[s : s + 1024].double() / n

    rows = []
    for chunk in args.chunks:
        acc_bf16 = torch.zeros(v, d, dtype=torch.bfloat16)
        acc_fp32 = torch.zeros(v, d, dtype=torch.float32)
        acc_fp32_logits = torch.zeros(v, d, dtype=torch.float32)
        for s in range(0, n, chunk):
            hc = h[s : s + chunk].float()
            rows_ = torch.arange(hc.shape[0])
            z32 = hc @ w.float().t()
            for logits, accumulators in ((z32.bfloat16().float(), ("bf16", "fp32")), (z32, ("fp32_logits",))):
                g = torch.softmax(logits, -1)
                g[rows_, y[s : s + chunk]] -= 1.0
                g = (g / n).bfloat16().float()  # ∂ℓ/∂y is stored in bf16 before the products
                contribution = g.t() @ hc
                for name in accumulators:
                    if name == "bf16":
                        acc_bf16 = (acc_bf16.float() + contribution).bfloat16()
                    elif name == "fp32":
                        acc_fp32 += contribution
                    else:
                        acc_fp32_logits += contribution
        rows.append({
            "rows_per_chunk": chunk,
            "chunks": -(-n // chunk),
            "bf16_logits_bf16_accumulator": relative(acc_bf16, reference),
            "bf16_logits_fp32_accumulator": relative(acc_fp32.bfloat16(), reference),
            "fp32_logits_fp32_accumulator": relative(acc_fp32_logits.bfloat16(), reference),
        })
        print(json.dumps(rows[-1]), flush=True)

    print(f"\n{n:,} tokens x {v:,} vocab x {d} hidden (bf16 inputs); relative error of ∂W (Frobenius) against float64:\n")
    print("| rows per chunk | chunks | bf16 logits, bf16 accumulator (GPU path) | bf16 logits, float32 accumulator | "
          "float32 logits, float32 accumulator |")
    print("|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['rows_per_chunk']:,} | {r['chunks']} | {r['bf16_logits_bf16_accumulator']:.2e} | "
              f"{r['bf16_logits_fp32_accumulator']:.2e} | {r['fp32_logits_fp32_accumulator']:.2e} |")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"tokens": n, "vocab": v, "hidden": d, "results": rows}, handle, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
