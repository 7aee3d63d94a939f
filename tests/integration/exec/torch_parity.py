#!/usr/bin/python3
"""PyTorch reference for dtrain's Llama-style model (RMSNorm, rotate-half RoPE, grouped-query causal attention,
SwiGLU, untied head), loaded from a dtrain checkpoint. With a [model.moe] table the MLPs of the MoE layers are a
mixture of experts written here from the format's definition (docs/formats.md): softmax router, top-k (renormalised
or not), per-sequence capacity with the earliest positions first, SwiGLU experts, shared experts (gated or not), and the
per-sequence load-balancing loss averaged over the batch and summed over the layers.

  torch_parity.py MODEL.toml TOKENS CKPT_DIR GRAD_DIR FINAL_DIR METRICS.jsonl STEP STEPS

CKPT_DIR holds dtrain's checkpoint after STEP steps (parameters and Adam moments); GRAD_DIR the gradients dtrain
computed in step STEP + 1; FINAL_DIR the checkpoint after STEP + STEPS steps; METRICS the losses. Checks, printing
one line each and exiting 1 when any fails:
  - the loss of step STEP + 1 equals dtrain's within 1e-5 relative;
  - every parameter's gradient equals dtrain's within 1e-5 relative (Frobenius norm of the difference);
  - after STEPS AdamW steps (torch.optim.AdamW, the same learning-rate schedule, moments and clipping) every weight
    equals dtrain's within 1e-4 relative.
"""
import json
import math
import struct
import sys
import tomllib

import numpy as np
import torch


def read_blocks(directory, kinds):
    meta = json.load(open(f"{directory}/metadata.json"))
    out = {}
    for shard in meta["shards"]:
        data = open(f"{directory}/{shard['file']}", "rb").read()
        assert data[:8] == b"DTRAINCK", shard
        (index_size,) = struct.unpack("<Q", data[16:24])
        index = json.loads(data[24:24 + index_size])
        floats = np.frombuffer(data[24 + index_size:], dtype=np.float32)
        for t in index:
            if t["kind"] not in kinds:
                continue
            rows, cols = t["full"]
            full = out.setdefault((t["name"], t["kind"]), np.full((rows, cols), np.nan, dtype=np.float32))
            for r0, nr, c0, nc, off in t["blocks"]:
                full[r0:r0 + nr, c0:c0 + nc] = floats[off:off + nr * nc].reshape(nr, nc)
    for key, value in out.items():
        assert not np.isnan(value).any(), f"{key} not fully covered by the checkpoint"
    return out


def read_tokens(path):
    data = open(path, "rb").read()
    assert data[:8] == b"DTRAINTK"
    version, width, vocab, _, count = struct.unpack("<IIIIQ", data[8:32])
    dtype = np.uint16 if width == 2 else np.uint32
    return np.frombuffer(data[32:], dtype=dtype).astype(np.int64)


class Model:
    def __init__(self, cfg, params):
        m = cfg["model"]
        self.h, self.heads, self.kv = m["hidden"], m["heads"], m.get("kv_heads", m["heads"])
        self.layers, self.seq, self.vocab = m["layers"], m["seq_len"], m["vocab"]
        self.ffn = m["ffn_hidden"]
        self.d = self.h // self.heads
        self.eps = m.get("norm_eps", 1e-5)
        theta = m.get("rope_theta", 10000.0)
        # Angles in float64, as dtrain's rope_table computes them, then float32.
        inv = theta ** (-2.0 * np.arange(self.d // 2, dtype=np.float64) / self.d)
        ang = np.arange(self.seq, dtype=np.float64)[:, None] * inv[None, :]
        self.cos = torch.tensor(np.cos(ang), dtype=torch.float32)
        self.sin = torch.tensor(np.sin(ang), dtype=torch.float32)
        self.p = {name: torch.tensor(value, requires_grad=True) for name, value in params.items()}
        self.moe = m.get("moe")
        self.aux = []  # the load-balancing loss of each MoE layer in the last forward

    def is_moe(self, layer):
        if self.moe is None:
            return False
        first, every = self.moe.get("first_dense", 0), self.moe.get("interval", 1)
        return layer >= first and (layer - first + 1) % every == 0

    def swiglu_mlp(self, x, pre):
        gu = x @ self.p[pre + "fc1.weight"].T
        f = gu.shape[-1] // 2
        return (torch.nn.functional.silu(gu[..., :f]) * gu[..., f:]) @ self.p[pre + "fc2.weight"].T

    def moe_mlp(self, y, pre, b, s):
        mo = self.moe
        E, K = mo["experts"], mo["top_k"]
        x = y.reshape(b * s, self.h)
        probs = torch.softmax(x @ self.p[pre + "moe.router.weight"].T, dim=-1)
        top_p, top_e = torch.topk(probs, K, dim=-1)
        gates = top_p / top_p.sum(-1, keepdim=True) if mo.get("normalize_top_k", True) else top_p
        keep = torch.ones(b * s, K, dtype=torch.bool)
        if mo.get("capacity_factor", 0) > 0:
            cap = math.ceil(mo["capacity_factor"] * s * K / E)
            for q in range(b):
                used = [0] * E
                for t in range(q * s, (q + 1) * s):
                    for j in range(K):
                        e = int(top_e[t, j])
                        keep[t, j] = used[e] < cap
                        used[e] += 1
        out = torch.zeros_like(x)
        for e in range(E):
            tok, j = ((top_e == e) & keep).nonzero(as_tuple=True)
            if len(tok) > 0:
                ye = self.swiglu_mlp(x[tok], f"{pre}moe.experts.{e}.")
                out = out.index_add(0, tok, ye * gates[tok, j][:, None])
        if mo.get("shared_ffn_hidden", 0) > 0:
            shared = self.swiglu_mlp(x, pre + "moe.shared.")
            if mo.get("shared_gate", False):  # Qwen2-MoE's shared_expert_gate
                shared = torch.sigmoid(x @ self.p[pre + "moe.shared.gate.weight"].T) * shared
            out = out + shared
        coeff = mo.get("aux_loss_coeff", 0.0)
        if coeff > 0:
            counts = torch.nn.functional.one_hot(top_e, E).sum(1).reshape(b, s, E).sum(1).to(torch.float32)
            mass = probs.reshape(b, s, E).sum(1)
            self.aux.append((coeff * E / (K * s * s) * (counts * mass).sum(-1)).mean())
        return out.reshape(b, s, self.h)

    def rms(self, x, w):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + self.eps) * w.reshape(-1)

    def rope(self, x):  # x [b, s, n, d], rotate-half pairs (i, i + d/2)
        half = self.d // 2
        c, s = self.cos[None, :, None, :], self.sin[None, :, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

    def loss(self, ids, targets):
        b, s = ids.shape
        p = self.p
        x = p["embed.tokens.weight"][ids]
        for l in range(self.layers):
            pre = f"layers.{l}."
            y = self.rms(x, p[pre + "attn.norm.weight"])
            qkv = y @ p[pre + "attn.qkv.weight"].T
            q = qkv[..., : self.heads * self.d].reshape(b, s, self.heads, self.d)
            k = qkv[..., self.heads * self.d: (self.heads + self.kv) * self.d].reshape(b, s, self.kv, self.d)
            v = qkv[..., (self.heads + self.kv) * self.d:].reshape(b, s, self.kv, self.d)
            q, k = self.rope(q), self.rope(k)
            rep = self.heads // self.kv
            k = k.repeat_interleave(rep, dim=2)
            v = v.repeat_interleave(rep, dim=2)
            scores = torch.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(self.d)
            mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(mask, float("-inf"))
            probs = torch.softmax(scores, dim=-1)
            o = torch.einsum("bhij,bjhd->bihd", probs, v).reshape(b, s, self.h)
            x = x + o @ p[pre + "attn.proj.weight"].T
            y = self.rms(x, p[pre + "mlp.norm.weight"])
            x = x + (self.moe_mlp(y, pre, b, s) if self.is_moe(l) else self.swiglu_mlp(y, pre + "mlp."))
        x = self.rms(x, p["head.norm.weight"])
        logits = x @ p["head.logits.weight"].T
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, self.vocab), targets.reshape(-1))
        for aux in self.aux:
            loss = loss + aux
        self.aux = []
        return loss


def batch(tokens, step, global_batch, seq):
    ids, tgt = [], []
    for g in range(step * global_batch, (step + 1) * global_batch):
        ids.append(tokens[g * seq: g * seq + seq])
        tgt.append(tokens[g * seq + 1: g * seq + seq + 1])
    return torch.tensor(np.array(ids)), torch.tensor(np.array(tgt))


def learning_rate(t, step):
    lr, min_lr = t["lr"], t.get("min_lr", t["lr"] / 10)
    warm, decay = t.get("warmup_steps", 10), max(t.get("decay_steps", 1000), t.get("warmup_steps", 10))
    if step < warm:
        return lr * (step + 1) / warm
    if step >= decay:
        return min_lr
    progress = (step - warm) / (decay - warm)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))


def rel(a, b):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def main():
    model_path, tokens_path, ckpt, grads_dir, final_dir, metrics_path, step, steps = sys.argv[1:]
    step, steps = int(step), int(steps)
    cfg = tomllib.load(open(model_path, "rb"))
    t = cfg["training"]
    state = read_blocks(ckpt, {"param", "exp_avg", "exp_avg_sq"})
    params = {n: v for (n, k), v in state.items() if k == "param"}
    model = Model(cfg, params)
    tokens = read_tokens(tokens_path)
    gb, seq = t["global_batch"], cfg["model"]["seq_len"]
    losses = [json.loads(line)["loss"] for line in open(metrics_path)]
    ok = True

    def check(name, value, limit):
        nonlocal ok
        good = value <= limit
        ok = ok and good
        print(f"{'ok  ' if good else 'FAIL'} {name}: relative difference {value:.3g} (limit {limit:g})")

    ids, tgt = batch(tokens, step, gb, seq)
    loss = model.loss(ids, tgt)
    loss.backward()
    check(f"loss of step {step + 1} ({loss.item():.7f} vs dtrain {losses[step]:.7f})", abs(loss.item() - losses[step]) / losses[step], 1e-5)
    grads = read_blocks(grads_dir, {"grad"})
    # An expert no token chose has no gradient in PyTorch (None) and a zero one in dtrain.
    def grad_of(n):
        g = model.p[n].grad
        return np.zeros_like(params[n]) if g is None else g.numpy()
    worst = max(rel(grad_of(n), grads[(n, "grad")]) for n in params)
    check("gradients (worst tensor)", worst, 1e-5)

    decay = [p for n, p in model.p.items() if n.endswith(".weight") and "norm" not in n]
    no_decay = [p for n, p in model.p.items() if not (n.endswith(".weight") and "norm" not in n)]
    wd = t.get("weight_decay", 0.1) if t.get("optimizer", "adam") == "adamw" else 0.0
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1.0, betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)), eps=t.get("eps", 1e-8),
                            foreach=False)
    for n, p in model.p.items():
        opt.state[p] = {"step": torch.tensor(float(step)), "exp_avg": torch.tensor(state[(n, "exp_avg")]),
                        "exp_avg_sq": torch.tensor(state[(n, "exp_avg_sq")])}
    for k in range(step, step + steps):
        if k > step:
            opt.zero_grad(set_to_none=False)
            ids, tgt = batch(tokens, k, gb, seq)
            model.loss(ids, tgt).backward()
        for p in model.p.values():  # dtrain updates an expert no token chose (zero gradient); so must AdamW here
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if t.get("grad_clip", 1.0) > 0:
            torch.nn.utils.clip_grad_norm_(list(model.p.values()), t.get("grad_clip", 1.0))
        for group in opt.param_groups:
            group["lr"] = learning_rate(t, k)
        opt.step()
    final = read_blocks(final_dir, {"param"})
    worst = max(rel(model.p[n].detach().numpy(), final[(n, "param")]) for n in params)
    check(f"weights after {steps} AdamW steps (worst tensor)", worst, 1e-4)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
