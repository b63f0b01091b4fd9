#!/usr/bin/env python3
"""The PyTorch peer of a GRPO step (TRL's GRPOTrainer, written out): ../shared/peers/torch_gpt_train.py's GPT
(--norm rms --mlp swiglu, tied, no biases) of configs/grpo-arith.ini's shape (d 128, 4 layers, 4 heads, byte
vocabulary), randomly initialised, as dew's run without init_from: its completions seldom hit EOS, so both sides
generate the full max_completion_length.

One step: 16 prompts of 6 tokens, 8 completions each (128 sequences), generated together with a KV cache
(torch.inference_mode, eval mode: one prefill, then one token per call for every sequence, sampled at temperature 1
from the softmax, as transformers' generate does with do_sample, until every sequence has hit EOS or the limit);
rewards (a cheap function of the tokens), group-normalised advantages (std unbiased + 1e-4); the policy loss
-exp(logp - logp.detach()) * A over the completion tokens (bnpo: one token mean), backward, AdamW (foreach).
Compare with `dew-run train --config configs/grpo-arith.ini --trainer.init_from "" --trainer.eval_every 0` at the
same thread count (its metrics.jsonl step_time_ms). Run under ../shared/peers/peer_env.sh tuned N /usr/bin/python3.
Prints one JSON line: ms_per_step (median), generate_ms and train_ms (medians), completion_tokens.
"""
import argparse
import json
import os
import statistics
import sys
import time

PEERS = os.environ.get("DEW_PEERS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared/peers"))
sys.path.insert(0, PEERS)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import peer_common as pc  # noqa: E402
import torch_gpt_train as gpt  # noqa: E402


def all_logits(model, idx):
    """The logits of every position (GPT.forward returns the last one's without targets)."""
    B, T = idx.shape
    x = model.wte(idx) + model.wpe(torch.arange(T, dtype=torch.long))
    for blk in model.blocks:
        x = blk(x, model.mask)
    return model.lm_head(model.ln_f(x))


def rollout(model, prompts, new, eos, tmax):
    a = model.a
    B, P = prompts.shape
    hd = a.d_model // a.n_heads
    caches = [(torch.empty(B, a.n_heads, tmax, hd), torch.empty(B, a.n_heads, tmax, hd)) for _ in range(a.n_layers)]
    out = torch.full((B, P + new), eos, dtype=torch.long)
    out[:, :P] = prompts
    done = torch.zeros(B, dtype=torch.bool)
    logits, _ = model(prompts, caches=caches, pos=0)
    for i in range(new):
        tok = torch.multinomial(F.softmax(logits[:, -1].float(), dim=-1), 1).squeeze(1)
        tok = torch.where(done, torch.full_like(tok, eos), tok)
        out[:, P + i] = tok
        done = done | (tok == eos)
        if bool(done.all()) or i == new - 1:
            break
        logits, _ = model(out[:, P + i:P + i + 1], caches=caches, pos=P + i)
    return out


def main():
    p = gpt.build_parser(__doc__)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=6)
    p.add_argument("--max-new", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-5)
    p.set_defaults(config="custom", vocab=256, d_model=128, n_layers=4, n_heads=4, seq_len=32, batch=1, norm="rms",
                   mlp="swiglu")
    a = gpt.resolve(p.parse_args())
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = gpt.GPT(a, max_positions=a.prompt_len + a.max_new)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0, foreach=True)
    eos, P, G = a.vocab - 1, a.prompt_len, a.group
    times, gens, trains, tokens = [], [], [], []
    for step in range(a.warmup + a.steps):
        prompts = torch.randint(48, 58, (a.prompts, P)).repeat_interleave(G, 0)  # digits, each prompt G times
        t0 = time.perf_counter()
        model.eval()
        with torch.inference_mode():
            seqs = rollout(model, prompts, a.max_new, eos, P + a.max_new)
        seqs = seqs.clone()  # a normal tensor (inference tensors cannot be saved for backward)
        t1 = time.perf_counter()
        comp = seqs[:, P:]
        ended = (comp == eos).int().cumsum(1)
        mask = ((ended == 0) | ((ended == 1) & (comp == eos))).float()  # up to and including the first EOS
        reward = (comp.remainder(2) == 0).float().mul(mask).sum(1) / mask.sum(1).clamp(min=1)
        grouped = reward.view(-1, G)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4)).view(-1)
        model.train()
        logits = all_logits(model, seqs[:, :-1])[:, P - 1:]
        logp = torch.log_softmax(logits.float(), dim=-1).gather(2, comp.unsqueeze(2)).squeeze(2)
        per_token = -torch.exp(logp - logp.detach()) * adv.unsqueeze(1)
        loss = (per_token * mask).sum() / mask.sum()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t2 = time.perf_counter()
        if step >= a.warmup:
            times.append(t2 - t0)
            gens.append(t1 - t0)
            trains.append(t2 - t1)
            tokens.append(float(mask.sum()))
    print(json.dumps({"bench": "grpo_step", "system": "torch", "torch": torch.__version__, "threads": a.threads,
                      "ms_per_step": 1e3 * statistics.median(times), "generate_ms": 1e3 * statistics.median(gens),
                      "train_ms": 1e3 * statistics.median(trains),
                      "completion_tokens": statistics.mean(tokens), "steps": a.steps,
                      "env": pc.env_record(a.threads)}))


if __name__ == "__main__":
    main()
