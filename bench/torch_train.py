#!/usr/bin/python3
"""The same Llama-style model as dtrain's in PyTorch (eager, fp32, CPU): forward, backward and an AdamW step per
training step on random token batches. Prints the median step time.

  torch_train.py MODEL.toml THREADS STEPS
"""
import sys
import time
import tomllib

import numpy as np
import torch

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/tests/integration/exec")
from torch_parity import Model  # noqa: E402


def main():
    path, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    cfg = tomllib.load(open(path, "rb"))
    m, t = cfg["model"], cfg["training"]
    h, heads, kv, ffn, vocab, layers = m["hidden"], m["heads"], m.get("kv_heads", m["heads"]), m["ffn_hidden"], m["vocab"], m["layers"]
    d = h // heads
    rng = np.random.default_rng(0)
    p = {"embed.tokens.weight": rng.normal(0, 0.02, (vocab, h)), "head.norm.weight": np.ones((h, 1)),
         "head.logits.weight": rng.normal(0, 0.02, (vocab, h))}
    for l in range(layers):
        pre = f"layers.{l}."
        p[pre + "attn.norm.weight"] = np.ones((h, 1))
        p[pre + "attn.qkv.weight"] = rng.normal(0, 0.02, ((heads + 2 * kv) * d, h))
        p[pre + "attn.proj.weight"] = rng.normal(0, 0.02, (h, h))
        p[pre + "mlp.norm.weight"] = np.ones((h, 1))
        p[pre + "mlp.fc1.weight"] = rng.normal(0, 0.02, (2 * ffn, h))
        p[pre + "mlp.fc2.weight"] = rng.normal(0, 0.02, (h, ffn))
    model = Model(cfg, {k: v.astype(np.float32) for k, v in p.items()})
    opt = torch.optim.AdamW(list(model.p.values()), lr=t.get("lr", 1e-3), foreach=False)
    gb, seq = t["global_batch"], m["seq_len"]
    times = []
    for _ in range(steps):
        ids = torch.randint(0, vocab, (gb, seq))
        tgt = torch.randint(0, vocab, (gb, seq))
        start = time.perf_counter()
        opt.zero_grad()
        model.loss(ids, tgt).backward()
        torch.nn.utils.clip_grad_norm_(list(model.p.values()), 1.0)
        opt.step()
        times.append(time.perf_counter() - start)
    times = sorted(times[3:])
    print(f"{times[len(times) // 2]:.6f}")


if __name__ == "__main__":
    main()
