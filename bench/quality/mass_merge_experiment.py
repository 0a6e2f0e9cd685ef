#!/usr/bin/env python3
"""Experiment (issue 15): would a merge that preserves the evicted tokens' attention mass help at
budget 0.1, where plain eviction and Elastic Cache's mean-merge do not?

winnow's kernels have no per-slot logit bias, so this runs outside the engine: transformers
(float32, the GGUF dequantised) with an attention function that adds a bias per (layer, KV head,
slot). The selection is the same for every variant, close to winnowkv_docs: per query head the
window rows' and every prompt row's attention (each normalised to sum 1) added, times ||v|| of the
key, averaged over the KV head's query heads; the first 30% of the per-layer budget (sinks) and
the last 32 tokens always kept; the same count in every layer; per-KV-head top-k. The variants
differ only in what becomes of the evicted tokens:

  evict      dropped (what every winnow policy does);
  keepkv     each evicted token joins the kept scored token whose key is most similar (cosine);
             the anchor keeps its key, its value becomes the group's values weighted by the
             window's attention w, and its logit gains log(sum of the group's w / the anchor's w),
             so the group's observed attention mass and output are preserved (KeepKV-style);
  value      the same groups, the weighted value only (no bias);
  bias       the same groups, the bias only (the anchor's value unchanged);
  position   as keepkv, but each evicted token joins the nearest kept scored token by position;
  adaptive   evicted as in evict, but the layer's scored budget is shared across its KV heads
             (AdaKV-style): every head keeps its sinks and at least ADAPTIVE_FLOOR of an even
             share, the rest goes to the highest scores of any head (each head's scores summed
             to 1, so a head whose attention is concentrated gives its share to a diffuse one).
             A tensor holds one count per layer, so heads that keep fewer are padded with
             slots masked out by a -inf bias.

For each of the short documents of documents.py (plain layout): greedy 32 tokens with the full
cache, then per variant the first divergence (free run) and the teacher-forced mean KL(full ||
compressed), as bench/quality/divergence.py measures them. With --lookahead N the selection also
sees the attention of the full cache's first N reply tokens (the oracle form of composite's
lookahead: the compressed cache still generates the whole reply). On a 2-core VM, 12 documents
took about 8 minutes with two variants and --lookahead 16, about 10 with all five variants.

    .venv/bin/python bench/quality/mass_merge_experiment.py --variants evict,keepkv --count 12
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import subprocess
import sys

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer, DynamicCache

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
WINDOW = 32
SINK_FRAC = 0.3
MAX_BIAS = math.log(50.0)  # an anchor the window barely saw would otherwise get a huge bias
ADAPTIVE_FLOOR = 0.2  # AdaKV's safeguard: a head keeps at least this share of an even split

# Shared with the attention function: per-layer bias [kv_head, slot] and, during a prefill, the
# observed attention it records over the first `prompt` keys.
STATE: dict = {"bias": {}, "record": None, "prompt": 0}


def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Causal attention with an optional per-(KV head, slot) logit bias (new slots: 0)."""
    layer = module.layer_idx
    heads, q_len = query.shape[1], query.shape[2]
    kv_heads, k_len = key.shape[1], key.shape[2]
    group = heads // kv_heads
    logits = query @ key.repeat_interleave(group, 1).transpose(-1, -2) * scaling
    if q_len > 1:
        causal = torch.ones(q_len, k_len, dtype=torch.bool).tril(diagonal=k_len - q_len)
        logits = logits.masked_fill(~causal, float("-inf"))
    bias = STATE["bias"].get(layer)
    if bias is not None:
        if bias.shape[1] < k_len:
            bias = torch.cat([bias, torch.zeros(kv_heads, k_len - bias.shape[1])], 1)
            STATE["bias"][layer] = bias
        logits = logits + bias.repeat_interleave(group, 0)[None, :, None, :]
    probs = torch.softmax(logits, -1)
    if STATE["record"] is not None and q_len > 1:
        # The window's rows and, with --lookahead, the reply's first tokens after it.
        n = STATE["prompt"]
        rows = WINDOW + k_len - n
        STATE["record"][layer] = (probs[0, :, -rows:, :n].sum(1), probs[0, :, :, :n].sum(1))
    out = probs @ value.repeat_interleave(group, 1)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("winnow_bias", attention)


def scores(record, values, n):
    """[kv_head, n - WINDOW]: the hybrid scorer weighted by value norms, folded into KV heads."""
    window, every_row = record
    pre = n - WINDOW
    s = (window[:, :pre] / window[:, :pre].sum(-1, keepdim=True)
         + every_row[:, :pre] / every_row[:, :pre].sum(-1, keepdim=True))
    kv_heads = values.shape[0]
    group = s.shape[0] // kv_heads
    s = s * values[:, :pre].norm(dim=-1).repeat_interleave(group, 0)
    return s.view(kv_heads, group, pre).mean(1)


def adaptive_top(s, sinks, per_head):
    """[kv_head, m] kept slots (ascending) and a [kv_head, m] mask of the ones really kept: the
    layer's kv_heads x per_head slots shared across heads (AdaKV-style), padded to the longest
    head's count with the next best slots of the shorter heads."""
    kv_heads = s.shape[0]
    share = s / s.sum(-1, keepdim=True)
    share[:, :sinks] = float("inf")
    order = share.argsort(-1, descending=True)
    chosen = torch.zeros_like(share, dtype=torch.bool)
    floor = max(sinks, int(ADAPTIVE_FLOOR * per_head))
    chosen.scatter_(1, order[:, :floor], True)
    rest = kv_heads * per_head - int(chosen.sum())
    flat = share.masked_fill(chosen, float("-inf")).flatten()
    chosen.view(-1)[torch.topk(flat, rest).indices] = True
    m = int(chosen.sum(-1).max())
    top, real = [], []
    for h in range(kv_heads):
        ranked = order[h][:m]  # the head's best m: its chosen ones come first
        mine = chosen[h][ranked]
        idx = ranked.sort().indices
        top.append(ranked[idx])
        real.append(mine[idx])
    return torch.stack(top), torch.stack(real)


def compress(cache, records, n, budget, variant):
    keep = max(1, round(budget * n))
    sinks = int(SINK_FRAC * keep)
    candidates = keep - sinks - WINDOW
    STATE["bias"] = {}
    for layer, kv in enumerate(cache.layers):
        keys, values = kv.keys[0], kv.values[0]  # [kv_head, n, d]
        kv_heads, _, dim = keys.shape
        s = scores(records[layer], values, n)
        pre = n - WINDOW
        if variant == "adaptive":
            top, real = adaptive_top(s, sinks, sinks + candidates)
        else:
            s[:, :sinks] = float("inf")
            top = torch.topk(s, sinks + candidates, -1).indices.sort(-1).values
        kept = torch.cat([top, torch.arange(pre, n).expand(kv_heads, WINDOW)], -1)
        new_k = torch.gather(keys, 1, kept[..., None].expand(-1, -1, dim)).clone()
        new_v = torch.gather(values, 1, kept[..., None].expand(-1, -1, dim)).clone()
        bias = torch.zeros(kv_heads, kept.shape[1])
        if variant == "adaptive":
            bias[:, :top.shape[1]] = torch.where(real, 0.0, float("-inf"))
        group = records[layer][0].shape[0] // kv_heads
        w = records[layer][0].view(kv_heads, group, n).mean(1)  # the window's attention
        if variant not in ("evict", "adaptive"):
            for h in range(kv_heads):
                evicted = torch.ones(pre, dtype=torch.bool)
                evicted[top[h]] = False
                evicted = evicted.nonzero().flatten()
                anchors = top[h][sinks:]
                if variant == "position":
                    owner = (evicted[:, None] - anchors[None, :]).abs().argmin(-1)
                else:
                    owner = (F.normalize(keys[h, evicted], dim=-1)
                             @ F.normalize(keys[h, anchors], dim=-1).T).argmax(-1)
                for i, anchor in enumerate(anchors.tolist()):
                    members = evicted[owner == i]
                    if members.numel() == 0:
                        continue
                    wa = w[h, anchor].clamp_min(1e-6)
                    wm = w[h, members]
                    total = wa + wm.sum()
                    if variant in ("keepkv", "position", "bias"):
                        bias[h, sinks + i] = torch.log(total / wa).clamp(max=MAX_BIAS)
                    if variant in ("keepkv", "position", "value"):
                        new_v[h, sinks + i] = (wa * values[h, anchor]
                                               + (wm[:, None] * values[h, members]).sum(0)) / total
        kv.keys, kv.values = new_k[None].contiguous(), new_v[None].contiguous()
        if variant != "evict":
            STATE["bias"][layer] = bias


def step(model, cache, token, position):
    out = model(input_ids=torch.tensor([[token]]), past_key_values=cache,
                position_ids=torch.tensor([[position]]), cache_position=torch.tensor([position]))
    return out.logits[0, -1]


def clone(cache):
    copy = DynamicCache()
    for i, kv in enumerate(cache.layers):
        copy.update(kv.keys.clone(), kv.values.clone(), i)
    return copy


@torch.no_grad()
def run_document(model, ids, budget, gen_tokens, variants, lookahead):
    n = len(ids)
    STATE["bias"], STATE["record"], STATE["prompt"] = {}, {}, n
    out = model(input_ids=torch.tensor([ids]))
    records, STATE["record"] = STATE["record"], None
    full = out.past_key_values
    first = int(out.logits[0, -1].argmax())
    reference, ref_logp = [first], [torch.log_softmax(out.logits[0, -1], -1)]
    cache = clone(full)
    for i in range(gen_tokens - 1):
        logits = step(model, cache, reference[-1], n + i)
        ref_logp.append(torch.log_softmax(logits, -1))
        reference.append(int(logits.argmax()))
    if lookahead > 0:
        # Score with the full cache's first reply tokens too (an oracle: the compressed cache
        # still generates from the prompt's end).
        STATE["bias"], STATE["record"] = {}, {}
        model(input_ids=torch.tensor([ids + reference[:lookahead]]))
        records, STATE["record"] = STATE["record"], None
    results = {}
    for variant in variants:
        compressed = clone(full)
        compress(compressed, records, n, budget, variant)
        bias = {k: v.clone() for k, v in STATE["bias"].items()}
        forced, kl = clone(compressed), []
        for i in range(gen_tokens - 1):
            logp = torch.log_softmax(step(model, forced, reference[i], n + i), -1)
            kl.append(float((ref_logp[i + 1].exp() * (ref_logp[i + 1] - logp)).sum()))
        STATE["bias"] = bias
        generated = [first]
        for i in range(gen_tokens - 1):
            generated.append(int(step(model, compressed, generated[-1], n + i).argmax()))
        agree = 0
        while agree < gen_tokens and generated[agree] == reference[agree]:
            agree += 1
        results[variant] = (agree, sum(kl) / len(kl))
    return n, results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--variants", default="evict,keepkv,value,bias,position")
    ap.add_argument("--budget", type=float, default=0.1)
    ap.add_argument("--count", type=int, default=12)
    ap.add_argument("--gen-tokens", type=int, default=32)
    ap.add_argument("--lookahead", type=int, default=0,
                    help="also score with the full cache's first N reply tokens (an oracle)")
    args = ap.parse_args(argv)
    path = pathlib.Path(args.model)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32,
                                                 attn_implementation="winnow_bias").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    docs = subprocess.run([sys.executable, str(HERE / "documents.py"), "--length", "short",
                           "--layout", "plain", "--count", str(args.count)],
                          capture_output=True, text=True, check=True).stdout.splitlines()
    variants = args.variants.split(",")
    totals = {v: ([], []) for v in variants}
    for line in docs:
        task = json.loads(line)
        text = "".join(s["text"] for s in task["segments"])
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        n, results = run_document(model, ids, args.budget, args.gen_tokens, variants,
                                  args.lookahead)
        for v, (agree, kl) in results.items():
            totals[v][0].append(agree)
            totals[v][1].append(kl)
            print(f"{task['id']} ({n} tokens) {v}: first divergence {agree}, KL {kl:.3f}",
                  flush=True)
    print(f"\n| variant | first divergence | KL |\n|---|---:|---:|")
    for v, (agree, kl) in totals.items():
        print(f"| {v} | {sum(agree) / len(agree):.1f} | {sum(kl) / len(kl):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
