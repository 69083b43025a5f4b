#pragma once

// Internal to the t5_cuda target: what CudaT5Stage keeps between a
// micro-batch's forward and backward, shared by t5_cuda.cc (inputs, the
// stage's passes, the head) and t5_cuda_layers.cc (one layer).

#include <cstdint>
#include <vector>

#include "runtime/memory/buffer_pool.h"
#include "runtime/model/t5_cuda.h"

namespace dynapipe::runtime::model {

// One stack's token grid on the device (int32 arrays inside Stash::ints).
struct CudaT5Stage::Side {
  int64_t rows = 0, seq = 0;
  const int32_t* tokens = nullptr;    // (rows * seq)
  const int32_t* segments = nullptr;  // (rows * seq)
  // Its self-attention's tables (cuda/attention_ranges.h); null where the
  // stage holds none of the stack's layers.
  const int32_t* keys = nullptr;     // (rows * seq, 2)
  const int32_t* queries = nullptr;  // (rows * seq, 2)
  const int32_t* buckets = nullptr;  // (2 seq - 1)
  int64_t n() const { return rows * seq; }
};

// What backward needs from one layer's forward (the cross-attention's part
// on decoder layers only); with Recompute::kFull only x survives forward.
struct CudaT5Stage::LayerActs {
  Buffer x;                                        // layer input (N, C) bf16
  Buffer ln1, mean1, rstd1, qkv, atty, lse, x1;    // self-attention; x1 = x + proj(atty)
  Buffer ln3, mean3, rstd3, q, kv, xy, xlse, x2;   // cross-attention; x2 = x1 + xproj(xy)
  Buffer ln2, mean2, rstd2, fc, act;               // feed-forward on x2 (decoder) or x1
  const Buffer& mlp_in() const { return x2.empty() ? x1 : x2; }
};

struct CudaT5Stage::Stash {
  Side enc, dec;
  // The cross-attention's tables (decoder stages).
  const int32_t* cross_keys = nullptr;     // (dec.n(), 2)
  const int32_t* cross_queries = nullptr;  // (enc.n(), 2)
  // Last stage: the scored target rows and their targets.
  const int32_t* scored = nullptr;  // (M)
  const int32_t* targets = nullptr;  // (M)
  int64_t scored_count = 0;
  Buffer ints;                     // the device copy of host_ints
  std::vector<int32_t> host_ints;  // kept with the stash while the upload may read it
  std::vector<LayerActs> layers;
  Buffer enc_last, enc_mean, enc_rstd, enc_out;  // the encoder's last hidden state and its final norm (N_enc, C)
  Buffer xs, lnf, lnf_mean, lnf_rstd;            // head: scored rows, their final norm (scaled if tied)
  float loss_scale = 0;
};

}  // namespace dynapipe::runtime::model
