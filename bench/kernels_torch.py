#!/usr/bin/python3
"""The layer of kernels_layer_bench in PyTorch (eager, CPU, fp32), timed op by op the same way.

Each op is the idiomatic PyTorch 1.13 code for it (F.linear, F.layer_norm, RMSNorm and RoPE as Hugging Face's Llama
writes them, attention as matmul -> causal mask -> softmax -> matmul since 1.13 has no fused attention on the CPU,
F.gelu(approximate='tanh'), silu(gate) * up, F.cross_entropy, torch.optim.AdamW). Forward of an op is timed alone;
backward is torch.autograd.grad of that op's output with respect to its inputs and parameters. The layer row is one
forward through all ops and one backward through the recorded graph. Minimum over repetitions, as the C++ program.

Prints "op<TAB>forward ms<TAB>backward ms" lines. Run with /usr/bin/python3 (Debian's python3-torch).
"""
import argparse
import math
import time

import torch
import torch.nn.functional as F


# Wall time, or CPU time of the process (time.process_time: all threads), as the C++ program's --clock.
clock = time.perf_counter


def time_min_ms(reps, fn):
    fn()
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = clock()
        fn()
        best = min(best, (clock() - t0) * 1e3)
    return best


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="llama", choices=["llama", "gpt"])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--ffn", type=int, default=192)
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    a = p.parse_args()
    global clock
    clock = time.process_time if a.clock == "cpu" else time.perf_counter
    torch.set_num_threads(a.threads)
    torch.manual_seed(1234)
    llama = a.arch == "llama"
    B, S, H, NH, NKV, FF = a.batch, a.seq, a.hidden, a.heads, a.kv_heads, a.ffn
    D = H // NH
    T = B * S
    qkv_w = (NH + 2 * NKV) * D
    fc1_w = 2 * FF if llama else FF

    def param(*shape, std=0.02, fill=None):
        t = torch.full(shape, fill) if fill is not None else torch.randn(*shape) * std
        return t.requires_grad_()

    g1, b1, g2, b2 = param(H, fill=1.0), param(H, fill=0.0), param(H, fill=1.0), param(H, fill=0.0)
    wqkv, bqkv = param(qkv_w, H), param(qkv_w, fill=0.0)
    wo, bo = param(H, H), param(H, fill=0.0)
    w1, bb1 = param(fc1_w, H), param(fc1_w, fill=0.0)
    w2, bb2 = param(H, FF), param(H, fill=0.0)
    eps = 1e-5

    def norm(x, g, b):
        if llama:  # Hugging Face LlamaRMSNorm
            var = x.pow(2).mean(-1, keepdim=True)
            return x * torch.rsqrt(var + eps) * g
        return F.layer_norm(x, (H,), g, b, eps)

    def linear(x, w, b):
        return F.linear(x, w, None if llama else b)

    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    ang = torch.arange(S, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1).float()  # [S, D]
    sin = torch.cat([ang.sin(), ang.sin()], -1).float()

    def rotate_half(x):
        x1, x2 = x[..., : D // 2], x[..., D // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(qkv):  # qkv [B, S, qkv_w]; rotates the Q and K heads (Hugging Face apply_rotary_pos_emb)
        q = qkv[..., : NH * D].view(B, S, NH, D)
        k = qkv[..., NH * D:(NH + NKV) * D].view(B, S, NKV, D)
        v = qkv[..., (NH + NKV) * D:]
        c, s = cos[None, :, None, :], sin[None, :, None, :]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        return torch.cat([q.reshape(B, S, -1), k.reshape(B, S, -1), v], -1)

    mask = torch.ones(S, S, dtype=torch.bool).triu(1)

    def attention(qkv):
        q = qkv[..., : NH * D].view(B, S, NH, D).transpose(1, 2)
        k = qkv[..., NH * D:(NH + NKV) * D].view(B, S, NKV, D).transpose(1, 2)
        v = qkv[..., (NH + NKV) * D:].view(B, S, NKV, D).transpose(1, 2)
        if NKV != NH:  # Hugging Face repeat_kv
            k = k.repeat_interleave(NH // NKV, dim=1)
            v = v.repeat_interleave(NH // NKV, dim=1)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(D))
        s = s.masked_fill(mask, float("-inf"))
        pr = torch.softmax(s, dim=-1)
        return (pr @ v).transpose(1, 2).reshape(B, S, NH * D)

    def act(x):
        if llama:
            gate, up = x.chunk(2, dim=-1)
            return F.silu(gate) * up
        return F.gelu(x, approximate="tanh")

    x0 = torch.randn(B, S, H)
    ops = [
        ("attn.norm", lambda x: norm(x, g1, b1), [g1, b1], (B, S, H)),
        ("attn.qkv", lambda x: linear(x, wqkv, bqkv), [wqkv, bqkv], (B, S, H)),
    ]
    if llama:
        ops.append(("attn.rope", rope, [], (B, S, qkv_w)))
    ops += [
        ("attn.core", attention, [], (B, S, qkv_w)),
        ("attn.proj", lambda x: linear(x, wo, bo), [wo, bo], (B, S, H)),
        ("attn.residual", lambda x: x + x0, [], (B, S, H)),
        ("mlp.norm", lambda x: norm(x, g2, b2), [g2, b2], (B, S, H)),
        ("mlp.fc1", lambda x: linear(x, w1, bb1), [w1, bb1], (B, S, H)),
        ("mlp.act", act, [], (B, S, fc1_w)),
        ("mlp.fc2", lambda x: linear(x, w2, bb2), [w2, bb2], (B, S, FF)),
        ("mlp.residual", lambda x: x + x0, [], (B, S, H)),
    ]

    for name, fn, params, in_shape in ops:
        x = torch.randn(*in_shape, requires_grad=True)
        used = [p for p in params if not (llama and any(p is b for b in (b1, b2, bqkv, bo, bb1, bb2)))]
        with torch.no_grad():
            f = time_min_ms(a.reps, lambda: fn(x))
        y = fn(x)
        dy = torch.randn_like(y)
        b = time_min_ms(a.reps, lambda: torch.autograd.grad(y, [x] + used, dy, retain_graph=True))
        print(f"{name}\t{f:.4f}\t{b:.4f}")

    def layer_forward(x):
        h = norm(x, g1, b1)
        qkv = linear(h, wqkv, bqkv)
        if llama:
            qkv = rope(qkv)
        x1 = x + linear(attention(qkv), wo, bo)
        return x1 + linear(act(linear(norm(x1, g2, b2), w1, bb1)), w2, bb2)

    xl = torch.randn(B, S, H, requires_grad=True)
    dyl = torch.randn(B, S, H)
    lf = time_min_ms(a.reps, lambda: layer_forward(xl))
    best_b = float("inf")
    for _ in range(a.reps + 2):
        y = layer_forward(xl)
        t0 = clock()
        y.backward(dyl)
        best_b = min(best_b, (clock() - t0) * 1e3)
    print(f"layer\t{lf:.4f}\t{best_b:.4f}")

    # Outside the layer.
    table = param(a.vocab, H)
    ids = torch.randint(0, a.vocab, (B, S))
    with torch.no_grad():
        f = time_min_ms(a.reps, lambda: F.embedding(ids, table))
    e = F.embedding(ids, table)
    de = torch.randn_like(e)
    b = time_min_ms(a.reps, lambda: torch.autograd.grad(e, [table], de, retain_graph=True))
    print(f"embed.tokens\t{f:.4f}\t{b:.4f}")
    hn = torch.randn(B, S, H, requires_grad=True)
    with torch.no_grad():
        f = time_min_ms(a.reps, lambda: F.linear(hn, table))
    lg = F.linear(hn, table)
    dl = torch.randn_like(lg)
    b = time_min_ms(a.reps, lambda: torch.autograd.grad(lg, [hn, table], dl, retain_graph=True))
    print(f"head.logits\t{f:.4f}\t{b:.4f}")
    logits = torch.randn(T, a.vocab, requires_grad=True)
    tgt = ids.view(-1)
    with torch.no_grad():
        f = time_min_ms(a.reps, lambda: F.cross_entropy(logits, tgt))
    loss = F.cross_entropy(logits, tgt)
    b = time_min_ms(a.reps, lambda: torch.autograd.grad(loss, [logits], retain_graph=True))
    print(f"head.cross_entropy\t{f:.4f}\t{b:.4f}")
    params = [g1, b1, g2, b2, wqkv, bqkv, wo, bo, w1, bb1, w2, bb2]
    for p_ in params:
        p_.grad = torch.randn_like(p_) * 1e-3
    decay = [p_ for p_ in params if p_.dim() == 2]
    no_decay = [p_ for p_ in params if p_.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8)

    def opt_step():
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()

    print(f"optimizer.adamw\t{time_min_ms(a.reps, opt_step):.4f}\t0.0000")


if __name__ == "__main__":
    main()
