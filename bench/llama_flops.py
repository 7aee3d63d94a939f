"""Model FLOPs of a training step of a Llama-style dtrain model.toml, the count dtplan uses for MFU: the matmuls of the
forward and backward passes (6 x parameters in matmuls x tokens) and attention as Megatron-LM counts it
(12 x layers x hidden x seq^2 x batch: the full score matrix, forward and backward), without recomputation.
Shared by torch_gpu_train.py and dtrain_step_report.py so that both sides of the comparison count alike."""


def model_flops(m, batch):
    h, s, layers, vocab = m["hidden"], m["seq_len"], m["layers"], m["vocab"]
    heads = m["heads"]
    kv = m.get("kv_heads", heads)
    d = h // heads
    per_layer = h * (heads + 2 * kv) * d + h * h + h * 2 * m["ffn_hidden"] + m["ffn_hidden"] * h
    matmul_params = layers * per_layer + vocab * h
    return 6 * matmul_params * batch * s + 12 * layers * h * s * s * batch
