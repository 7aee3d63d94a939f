// Dropout fused with the residual add, and the plain residual add, on the GPU: dtrain/kernels/dropout.h's contract.
// The masks are the CPU backend's bit for bit (Philox4x32-10 on the global element index, computed on the device).
// x, residual, out, dout, dx bf16; the sum is computed in fp32 and rounded once.
#pragma once

#include <cstdint>

#include "dtrain/kernels/cuda/context.h"
#include "dtrain/kernels/dropout.h"

namespace dtrain::kernels::cuda {

// out = residual + dropout(x, p) (residual may be nullptr). p in [0, 1); out may alias x or residual.
void dropout_add_forward(Context& ctx, const HiddenLayout& layout, const bf16* x, const bf16* residual, float p,
                         const DropoutKey& key, bf16* out);
// dx = dout * mask / (1 - p). dx may alias dout.
void dropout_add_backward(Context& ctx, const HiddenLayout& layout, const bf16* dout, float p, const DropoutKey& key,
                          bf16* dx);

// out[i] = a[i] + b[i]; out may alias a or b.
void residual_add(Context& ctx, std::int64_t n, const bf16* a, const bf16* b, bf16* out);

}  // namespace dtrain::kernels::cuda
