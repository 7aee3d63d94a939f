#!/usr/bin/env python3
"""The PyTorch side of the GPU benchmark (issue 8): a Llama-style model from a dtrain model.toml, trained with bf16
autocast over fp32 weights, fused AdamW and PyTorch's fused attention, eager and with torch.compile, on random
token batches. Prints one line per mode: median step time, tokens/s, model TFLOP/s and MFU (dense bf16 peak given
by --peak-tflops; 989 for H100/H200 SXM).

  torch_gpu_train.py MODEL.toml [--steps 20] [--micro-batch B] [--modes eager,compile] [--device cuda]
                                [--peak-tflops 989]

Model FLOPs per step count the matmuls of the forward and backward passes (6 x parameters in matmuls x tokens) and
attention as Megatron-LM counts it (12 x layers x hidden x seq^2 x batch: the full score matrix, forward and
backward), the count dtplan uses for MFU, without recomputation. Llama-style models (arch = "llama") only. `--device cpu` with a tiny model checks the script where there
is no GPU (torch.compile needs PyTorch 2).
"""
import argparse
import gc
import math
import statistics
import time
import sys
import tomllib
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_flops import model_flops  # noqa: E402


class Layer(torch.nn.Module):
    def __init__(self, h, heads, kv, ffn):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv, h // heads
        self.attn_norm = torch.nn.Parameter(torch.ones(h))
        self.qkv = torch.nn.Linear(h, (heads + 2 * kv) * self.d, bias=False)
        self.proj = torch.nn.Linear(h, h, bias=False)
        self.mlp_norm = torch.nn.Parameter(torch.ones(h))
        self.fc1 = torch.nn.Linear(h, 2 * ffn, bias=False)
        self.fc2 = torch.nn.Linear(ffn, h, bias=False)

    @staticmethod
    def rmsnorm(x, w, eps=1e-5):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps).to(x.dtype) * w.to(x.dtype)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        q, k, v = self.qkv(self.rmsnorm(x, self.attn_norm)).split(
            [self.heads * self.d, self.kv * self.d, self.kv * self.d], dim=-1)
        q = q.view(b, s, self.heads, self.d).transpose(1, 2)
        k = k.view(b, s, self.kv, self.d).transpose(1, 2)
        v = v.view(b, s, self.kv, self.d).transpose(1, 2)
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        rep = self.heads // self.kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        if hasattr(F, "scaled_dot_product_attention"):
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # PyTorch 1.x: the score matrix, for the CPU smoke test only
            scores = (q @ k.transpose(-1, -2)) / math.sqrt(self.d)
            mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
            a = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
        gate, up = self.fc1(self.rmsnorm(x, self.mlp_norm)).chunk(2, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


def rope(x, cos, sin):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


class Llama(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        h, heads = m["hidden"], m["heads"]
        kv = m.get("kv_heads", heads)
        self.embed = torch.nn.Embedding(m["vocab"], h)
        self.layers = torch.nn.ModuleList(Layer(h, heads, kv, m["ffn_hidden"]) for _ in range(m["layers"]))
        self.norm = torch.nn.Parameter(torch.ones(h))
        self.head = torch.nn.Linear(h, m["vocab"], bias=False)
        if m.get("tied_embeddings", False):
            self.head.weight = self.embed.weight
        d = h // heads
        inv = 1.0 / (m.get("rope_theta", 10000.0) ** (torch.arange(0, d // 2).float() * 2 / d))
        angles = torch.outer(torch.arange(m["seq_len"]).float(), inv)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, ids, targets):
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin)
        logits = self.head(Layer.rmsnorm(x, self.norm))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def run(mode, cfg, args, device):
    m, t = cfg["model"], cfg["training"]
    torch.manual_seed(0)
    model = Llama(m).to(device)
    fused = {"fused": True} if device.type == "cuda" else {}
    opt = torch.optim.AdamW(model.parameters(), lr=t.get("lr", 3e-4), **fused)
    step_model = model
    if mode == "compile":
        if not hasattr(torch, "compile"):
            return f"{mode:8s} skipped: torch.compile needs PyTorch 2 (this is {torch.__version__})"
        step_model = torch.compile(model)
    batch = t["global_batch"]
    micro = args.micro_batch or batch
    autocast = torch.autocast(device_type=device.type, dtype=torch.bfloat16)
    times, losses = [], []
    for _ in range(args.steps):
        ids = torch.randint(0, m["vocab"], (batch, m["seq_len"]), device=device)
        tgt = torch.randint(0, m["vocab"], (batch, m["seq_len"]), device=device)
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i in range(0, batch, micro):
            with autocast:
                loss = step_model(ids[i:i + micro], tgt[i:i + micro]) * (min(micro, batch - i) / batch)
            loss.backward()
            total += loss.detach()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(total))
    step_s = statistics.median(times[min(3, len(times) - 1):])
    tokens = batch * m["seq_len"]
    tflops = model_flops(m, batch) / step_s / 1e12
    memory = f", peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else ""
    return (f"{mode:8s} step {step_s * 1e3:9.2f} ms  {tokens / step_s:10.0f} tokens/s  {tflops:7.1f} TFLOP/s  "
            f"MFU {100 * tflops / args.peak_tflops:5.1f}%  loss {losses[0]:.3f} -> {losses[-1]:.3f}{memory}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--micro-batch", type=int, default=0, help="sequences per forward/backward (default: all)")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    args = ap.parse_args()
    cfg = tomllib.load(open(args.model, "rb"))
    if cfg["model"].get("arch") != "llama":
        raise SystemExit(f"torch_gpu_train.py: {args.model}: arch = \"{cfg['model'].get('arch')}\"; only llama models")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_gpu_train.py: no CUDA device visible to PyTorch (use --device cpu for a smoke test)")
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU"
    print(f"PyTorch {torch.__version__} on {name}: {cfg['model']['name']}, batch {cfg['training']['global_batch']} x "
          f"{cfg['model']['seq_len']} tokens, bf16 autocast, fused AdamW")
    first_micro = args.micro_batch
    for mode in args.modes.split(","):
        # A micro-batch that does not fit the GPU's memory is halved (with as many more micro-batches per step):
        # the comparison is then at the largest micro-batch PyTorch can run, which the line says.
        args.micro_batch = first_micro
        while True:
            try:
                line = run(mode, cfg, args, device)
                break
            except torch.cuda.OutOfMemoryError:
                pass
            gc.collect()  # the exception's frames held the run's tensors until here
            torch.cuda.empty_cache()
            micro = args.micro_batch or cfg["training"]["global_batch"]
            if micro <= 1:
                line = f"{mode:8s} out of GPU memory at micro-batch 1"
                break
            print(f"{mode}: micro-batch {micro} ran out of GPU memory; trying {micro // 2}", flush=True)
            args.micro_batch = micro // 2
        if args.micro_batch != first_micro:
            line += f" (micro-batch {args.micro_batch})"
        print(line, flush=True)


if __name__ == "__main__":
    main()
