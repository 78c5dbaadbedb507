#!/usr/bin/env python
"""Check a tiny model's PyTorch twin against vLLM's own computation (prompt logprobs).

Run with the farm's vLLM CPU build::

    <engine build>/bin/python models/check_vllm.py models/tiny-step [--no-window]
    <engine build>/bin/python models/check_vllm.py models/tiny-hybrid

Prints the largest difference of the prompt tokens' log-probabilities between the
training code and vLLM (eager) over a few held-out prompts with their reference
completions; exits 1 above ``--tolerance``. The training script is chosen by the
model's ``architectures``: ``Step3p5ForCausalLM`` runs fp32 in vLLM;
``Qwen3NextForCausalLM`` (tiny-hybrid) runs bf16, the only dtype vLLM's CPU GDN kernels
take ("CPU GDN attention requires BF16"), against the fp32 twin of the shipped bf16
weights, so its difference is bf16 rounding of activations, not a tolerance of 1e-3.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# architecture -> (training module, vLLM dtype, default tolerance)
TWINS = {
    "Step3p5ForCausalLM": ("train_tiny_step", "float32", 1e-3),
    "Qwen3NextForCausalLM": ("train_tiny_hybrid", "bfloat16", 0.25),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--no-window", action="store_true", help="serve with the window off")
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tolerance", type=float, help="default: per architecture (TWINS)")
    args = ap.parse_args()
    arch = json.loads((args.model / "config.json").read_text())["architectures"][0]
    if arch not in TWINS:
        ap.error(f"{args.model}: no training twin for architecture {arch} (known: {list(TWINS)})")
    module, dtype, tolerance = TWINS[arch]
    tolerance = args.tolerance if args.tolerance is not None else tolerance
    twin = importlib.import_module(module)
    base = twin.base
    from vllm import LLM, SamplingParams

    tok = base.build_tokenizer()
    seqs = []
    for problem in twin.held_out_problems()[: args.n]:
        prompt, completion = base.encode_example(tok, problem, thinking=True)
        seqs.append(prompt + completion)
    overrides = {"sliding_window": None} if args.no_window else {}
    llm = LLM(
        model=str(args.model),
        dtype=dtype,
        enforce_eager=True,
        max_model_len=512,
        hf_overrides=overrides,
    )
    outs = llm.generate(
        [{"prompt_token_ids": s} for s in seqs],
        SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0),
    )
    model = twin.load(args.model)
    worst, agree, total = 0.0, 0, 0
    with torch.no_grad():
        for s, out in zip(seqs, outs, strict=True):
            ids = torch.tensor([s])
            lp = torch.log_softmax(model.logits(model.target(ids, not args.no_window)), -1)[0]
            ours = [float(lp[i - 1, s[i]]) for i in range(1, len(s))]
            theirs = [
                next(iter(d.values())).logprob if len(d) == 1 else d[s[i]].logprob
                for i, d in zip(range(1, len(s)), out.prompt_logprobs[1:], strict=True)
            ]
            # Is the reference token each side's argmax? (vLLM reports its rank.)
            for i, d in zip(range(1, len(s)), out.prompt_logprobs[1:], strict=True):
                total += 1
                agree += int((d[s[i]].rank == 1) == (int(lp[i - 1].argmax()) == s[i]))
            diff = max(abs(a - b) for a, b in zip(ours, theirs, strict=True))
            worst = max(worst, diff)
            print(f"{len(s)} tokens: max |logprob diff| {diff:.2e}")
    print(f"reference token is the argmax on both sides or neither: {agree}/{total}")
    print(f"worst {worst:.2e} (tolerance {tolerance})")
    return 0 if worst <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
