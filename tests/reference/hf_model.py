#!/usr/bin/python3
"""A HuggingFace model directory's loss on one batch of a dtrain token file, computed the way HuggingFace's
transformers computes it, from HF's own names and conventions alone (written from modeling_llama, modeling_qwen2,
modeling_mixtral, modeling_qwen2_moe and modeling_gpt2; transformers itself is not installed here). Tests use it to
check `dtexec export --format hf`: the exported model's loss must be the loss dtrain reported for the same weights.

  hf_model.py HF_DIR TOKENS STEP GLOBAL_BATCH SEQ_LEN
  hf_model.py HF_DIR --sequences FILE.jsonl

Reads config.json and model.safetensors (or model.safetensors.index.json and its shards) with json, struct and numpy
(BF16 widened to float32), takes global batch STEP of the token file (sample g: tokens [g*S, g*S+S), targets shifted
by one), prints {"loss": ...} (the mean cross entropy; MoE auxiliary losses are not added, as HF adds them only with
output_router_logits). With --sequences: each line of FILE.jsonl (a JSON array of token ids; blank lines skipped) is
run alone, unpadded, and scored on its n - 1 predictions; prints one {"loss": ...} line per sequence (what `dtexec
eval --json` reports).
"""
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

DTYPES = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16, "F64": np.float64}


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        b, e = t["data_offsets"]
        raw = np.frombuffer(data[8 + n + b:8 + n + e], dtype=DTYPES[t["dtype"]])
        if t["dtype"] == "BF16":
            raw = (raw.astype(np.uint32) << 16).view(np.float32)
        out[name] = torch.tensor(raw.astype(np.float32).reshape(t["shape"]))
    return out


def read_model(directory):
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.exists(index):
        files = sorted(set(json.load(open(index))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    w = {}
    for f in files:
        w.update(read_safetensors(os.path.join(directory, f)))
    return json.load(open(os.path.join(directory, "config.json"))), w


def read_tokens(path):
    data = open(path, "rb").read()
    assert data[:8] == b"DTRAINTK"
    _, width, _, _, _ = struct.unpack("<IIIIQ", data[8:32])
    return np.frombuffer(data[32:], dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)


def rms_norm(x, w, eps):  # LlamaRMSNorm
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def attention(q, k, v):  # [b, heads, s, d], causal, keys and values repeated per group (repeat_kv)
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    s = q.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def mlp(x, w, p, gate="gate_proj", up="up_proj", down="down_proj"):  # LlamaMLP
    return F.linear(F.silu(F.linear(x, w[f"{p}.{gate}.weight"])) * F.linear(x, w[f"{p}.{up}.weight"]),
                    w[f"{p}.{down}.weight"])


def sparse_moe(x, w, p, c, mixtral):  # MixtralSparseMoeBlock / Qwen2MoeSparseMoeBlock
    flat = x.reshape(-1, x.shape[-1])
    probs = torch.softmax(F.linear(flat, w[f"{p}.{'block_sparse_moe.gate' if mixtral else 'mlp.gate'}.weight"]), -1)
    top_w, top_e = torch.topk(probs, c["num_experts_per_tok"], dim=-1)
    if mixtral or c.get("norm_topk_prob", False):
        top_w = top_w / top_w.sum(-1, keepdim=True)
    out = torch.zeros_like(flat)
    experts = c["num_local_experts"] if mixtral else c["num_experts"]
    for e in range(experts):
        tok, j = (top_e == e).nonzero(as_tuple=True)
        if len(tok) == 0:
            continue
        if mixtral:
            y = mlp(flat[tok], w, f"{p}.block_sparse_moe.experts.{e}", "w1", "w3", "w2")
        else:
            y = mlp(flat[tok], w, f"{p}.mlp.experts.{e}")
        out = out.index_add(0, tok, y * top_w[tok, j][:, None])
    if not mixtral:
        shared = mlp(flat, w, f"{p}.mlp.shared_expert")
        out = out + torch.sigmoid(F.linear(flat, w[f"{p}.mlp.shared_expert_gate.weight"])) * shared
    return out.reshape(x.shape)


def llama_logits(c, w, ids):
    b, s = ids.shape
    h, heads = c["hidden_size"], c["num_attention_heads"]
    kv, d = c.get("num_key_value_heads", heads), c.get("head_dim", h // heads)
    eps = c["rms_norm_eps"]
    inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = c.get("rope_scaling")
    kind = scaling.get("rope_type", scaling.get("type")) if scaling is not None else None
    attention_scaling = 1.0
    if kind == "linear":  # _compute_linear_scaling_rope_parameters
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "yarn":  # _compute_yarn_parameters, with "factor" as given (see docs/formats.md)
        base, factor = c.get("rope_theta", 10000.0), scaling["factor"]
        old = scaling.get("original_max_position_embeddings") or c["max_position_embeddings"]

        def get_mscale(scale, mscale=1):
            return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

        attention_scaling = scaling.get("attention_factor")
        if attention_scaling is None:
            mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
            if mscale and mscale_all_dim:
                attention_scaling = get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            else:
                attention_scaling = get_mscale(factor)
        beta_fast, beta_slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

        def correction_dim(rotations):
            return (d * math.log(old / (rotations * 2 * math.pi))) / (2 * math.log(base))

        low, high = correction_dim(beta_fast), correction_dim(beta_slow)
        if scaling.get("truncate", True):
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, d - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
        pos_freqs = base ** (torch.arange(0, d, 2).float() / d)
        extrapolation = 1 - ramp
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    elif kind is not None:  # _compute_llama3_parameters (modeling_rope_utils)
        assert kind == "llama3", scaling
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < old / high) * ~(wavelen > old / low)
        inv_freq = torch.where(medium, smoothed, scaled)
    freqs = torch.arange(s).float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * attention_scaling, emb.sin() * attention_scaling
    mixtral = c["model_type"] == "mixtral"
    x = w["model.embed_tokens.weight"][ids]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}"
        y = rms_norm(x, w[f"{p}.input_layernorm.weight"], eps)
        proj = lambda n: F.linear(y, w[f"{p}.self_attn.{n}.weight"], w.get(f"{p}.self_attn.{n}.bias"))  # noqa: E731
        q = proj("q_proj").view(b, s, heads, d).transpose(1, 2)
        k = proj("k_proj").view(b, s, kv, d).transpose(1, 2)
        v = proj("v_proj").view(b, s, kv, d).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        o = attention(q, k, v).transpose(1, 2).reshape(b, s, heads * d)
        x = x + F.linear(o, w[f"{p}.self_attn.o_proj.weight"])
        y = rms_norm(x, w[f"{p}.post_attention_layernorm.weight"], eps)
        sparse = mixtral or (c["model_type"] == "qwen2_moe" and (i + 1) % c.get("decoder_sparse_step", 1) == 0)
        x = x + (sparse_moe(y, w, p, c, mixtral) if sparse else mlp(y, w, f"{p}.mlp"))
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = w["model.embed_tokens.weight"] if c.get("tie_word_embeddings", False) else w["lm_head.weight"]
    return F.linear(x, head)


def gpt2_logits(c, w, ids):
    b, s = ids.shape
    h, heads = c["n_embd"], c["n_head"]
    eps = c["layer_norm_epsilon"]
    conv1d = lambda x, n: torch.addmm(w[f"{n}.bias"], x.reshape(-1, x.shape[-1]), w[f"{n}.weight"]).reshape(  # noqa
        *x.shape[:-1], -1)
    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][torch.arange(s)]
    for i in range(c["n_layer"]):
        p = f"transformer.h.{i}"
        y = F.layer_norm(x, (h,), w[f"{p}.ln_1.weight"], w[f"{p}.ln_1.bias"], eps)
        q, k, v = conv1d(y, f"{p}.attn.c_attn").split(h, dim=2)
        q, k, v = (t.view(b, s, heads, h // heads).transpose(1, 2) for t in (q, k, v))
        x = x + conv1d(attention(q, k, v).transpose(1, 2).reshape(b, s, h), f"{p}.attn.c_proj")
        y = F.layer_norm(x, (h,), w[f"{p}.ln_2.weight"], w[f"{p}.ln_2.bias"], eps)
        x = x + conv1d(F.gelu(conv1d(y, f"{p}.mlp.c_fc"), approximate="tanh"), f"{p}.mlp.c_proj")
    x = F.layer_norm(x, (h,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], eps)
    return F.linear(x, w["transformer.wte.weight"])


def logits_of(c, w, ids):
    return gpt2_logits(c, w, ids) if c["model_type"] == "gpt2" else llama_logits(c, w, ids)


def sequences(directory, path):
    c, w = read_model(directory)
    for line in open(path):
        if not line.strip():
            continue
        ids = torch.tensor([json.loads(line)])
        with torch.no_grad():
            logits = logits_of(c, w, ids[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        print(json.dumps({"loss": float(loss)}))


def main():
    if len(sys.argv) == 4 and sys.argv[2] == "--sequences":
        sequences(sys.argv[1], sys.argv[3])
        return
    directory, tokens_path, step, global_batch, seq = sys.argv[1:]
    step, global_batch, seq = int(step), int(global_batch), int(seq)
    c, w = read_model(directory)
    tokens = read_tokens(tokens_path)
    g0 = step * global_batch
    ids = torch.tensor(np.array([tokens[g * seq:g * seq + seq] for g in range(g0, g0 + global_batch)]))
    tgt = torch.tensor(np.array([tokens[g * seq + 1:g * seq + seq + 1] for g in range(g0, g0 + global_batch)]))
    with torch.no_grad():
        logits = logits_of(c, w, ids)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    print(json.dumps({"loss": float(loss), "architecture": c["architectures"][0], "tensors": len(w)}))


if __name__ == "__main__":
    main()
