#pragma once

// CPU kernels of the GPT model, forward and backward, on contiguous
// row-major buffers (shapes in comments, llm.c style). Templated on the
// scalar: float for training, double for the finite-difference checks; both
// run the same algorithm, the float one in SIMD lanes (vec_math.h) where it
// is elementwise or a row reduction. No -ffast-math: IEEE semantics (-inf
// masks, NaN propagation) hold. Backward functions accumulate (+=) into
// parameter and input gradients.

#include <cstdint>

namespace dynapipe::runtime::cpu {

// out = inp @ weight^T + bias   (OpenBLAS gemm)
template <typename T>
void MatmulForward(T* out,           // (N, OC)
                   const T* inp,     // (N, C)
                   const T* weight,  // (OC, C)
                   const T* bias,    // (OC) or null
                   int64_t N, int64_t C, int64_t OC);

template <typename T>
void MatmulBackward(T* dinp,          // (N, C), may be null
                    T* dweight,       // (OC, C)
                    T* dbias,         // (OC) or null
                    const T* dout,    // (N, OC)
                    const T* inp,     // (N, C)
                    const T* weight,  // (OC, C)
                    int64_t N, int64_t C, int64_t OC);

// LayerNorm: eps is added to the variance (model.block.norm_eps). `bias`
// (and `dbias`) may be null: a block without biases has no shift.
inline constexpr double kLayerNormEps = 1e-5;
template <typename T>
void LayerNormForward(T* out,         // (N, C)
                      T* mean,        // (N)
                      T* rstd,        // (N)
                      const T* inp,   // (N, C)
                      const T* weight, const T* bias,  // (C)
                      int64_t N, int64_t C, double eps = kLayerNormEps);

template <typename T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias,  // (N, C), (C), (C)
                       const T* dout, const T* inp, const T* weight, const T* mean, const T* rstd,
                       int64_t N, int64_t C);

// RMS norm (T5's and Llama's): out = inp / sqrt(mean(inp^2) + eps) *
// weight, no centring and no bias; rstd (N) is kept for backward.
inline constexpr double kRmsNormEps = 1e-6;
template <typename T>
void RmsNormForward(T* out,        // (N, C)
                    T* rstd,       // (N)
                    const T* inp,  // (N, C)
                    const T* weight, int64_t N, int64_t C, double eps = kRmsNormEps);
template <typename T>
void RmsNormBackward(T* dinp, T* dweight,  // (N, C), (C)
                     const T* dout, const T* inp, const T* weight, const T* rstd, int64_t N, int64_t C);

// ReLU (T5 v1.0's feed-forward).
template <typename T>
void ReluForward(T* out, const T* inp, int64_t n);
template <typename T>
void ReluBackward(T* dinp, const T* inp, const T* dout, int64_t n);

// Gated GELU (T5 v1.1, FLAN-T5) over rows of [gate | up]: out = GELU(gate)
// * up, with GELU as GeluForward.
template <typename T>
void GatedGeluForward(T* out,        // (N, F)
                      const T* inp,  // (N, 2F)
                      int64_t N, int64_t F);
template <typename T>
void GatedGeluBackward(T* dinp,        // (N, 2F)
                       const T* inp,   // (N, 2F)
                       const T* dout,  // (N, F)
                       int64_t N, int64_t F);

// SwiGLU (Llama) over rows of [gate | up]: out = SiLU(gate) * up, SiLU(x) =
// x / (1 + exp(-x)).
template <typename T>
void SwigluForward(T* out,        // (N, F)
                   const T* inp,  // (N, 2F)
                   int64_t N, int64_t F);
template <typename T>
void SwigluBackward(T* dinp,        // (N, 2F), accumulated (+=)
                    const T* inp,   // (N, 2F)
                    const T* dout,  // (N, F)
                    int64_t N, int64_t F);

// Rotary position embedding (RoPE) in place, as Hugging Face's Llama
// ("rotate half"): in each of `heads` heads of hs values at x + n * stride
// (queries then keys of a [q | k | v] row are adjacent), the pair (i, i +
// hs/2) of token n is rotated by angle positions[n] * base^(-2i / hs).
// `inverse` rotates by the negative angle: the backward of the forward
// rotation (the gradient of the rotated values in, of the inputs out).
template <typename T>
void RotaryApply(T* x, const int32_t* positions, int64_t N, int64_t stride, int64_t heads, int64_t hs,
                 double base, bool inverse);

// GELU, tanh approximation (as GPT-2), computed through the identity
// 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)): one exp per element.
template <typename T>
void GeluForward(T* out, const T* inp, int64_t n);
template <typename T>
void GeluBackward(T* dinp, const T* inp, const T* dout, int64_t n);

// How the attention kernels treat masked pairs. Both give the same results
// up to rounding (masked pairs get probability exactly 0); they differ in
// cost.
enum class AttentionKernel {
  // Only pairs inside one sample are computed: padding and pairs across the
  // samples of a packed row cost nothing (FlashAttention's varlen kernels).
  kVarlen,
  // Every causal pair of the row is computed, then masked (Megatron-LM's
  // materialised scores with an attention mask): a row of length T costs
  // ~T^2/2 pairs whatever it holds, padding and other samples included.
  kMaterialized,
};

// Multi-head causal self-attention over qkv = [q | k | v] per token. Token i
// of row b attends to token j iff j <= i (any j with options.causal false)
// and both belong to the same segment (seg >= 0); padding (seg < 0) produces zeros and receives no gradient. With
// one segment per row this is a padded batch; several give packed rows with
// no cross-contamination. Implemented in attention.cc on BLAS blocks.
//
// `att` keeps the softmax probabilities for backward: per span of tokens
// that attend among themselves (varlen: each sample; materialized: each
// row) and head, an L x L matrix. AttentionProbsSize gives its length in
// elements for a batch; forward and backward must get the same segments.
int64_t AttentionProbsSize(const int32_t* seg, int64_t B, int64_t Tn, int64_t NH,
                           AttentionKernel kernel = AttentionKernel::kVarlen);

// T5's relative position buckets: the bucket of a key `relative` = key
// position - query position away (within one sample). Bidirectional
// (encoder): half the buckets for keys after the query; one-way (decoder):
// keys after the query share bucket 0. Of each half, the first half are
// exact distances, the rest logarithmic up to max_distance (and the last
// bucket beyond), as T5 computes them (in float).
int RelativePositionBucket(int relative, bool bidirectional, int buckets, int max_distance);

// Variants of the self-attention below beyond GPT's (all off: GPT's).
template <typename T>
struct AttentionOptions {
  bool causal = true;      // false: every key of the sample (T5's encoder)
  bool scaled = true;      // scores times 1 / sqrt(head size); T5 does not scale
  // T5's relative position bias: the score of (query i, key j) gains
  // bias[RelativePositionBucket(j - i, !causal, buckets, max_distance) * NH
  // + head] (bias: (buckets, NH), as T5 stores it); null: none.
  const T* bias = nullptr;
  int buckets = 32;
  int max_distance = 128;
  // Grouped-query attention: qkv rows are [q (C) | k (kv_heads x hs) | v
  // (kv_heads x hs)] and query head h reads kv head h / (NH / kv_heads);
  // 0: NH (rows of 3C).
  int64_t kv_heads = 0;
};

template <typename T>
void AttentionForward(T* out,          // (B, T, C)
                      T* att,          // (AttentionProbsSize) softmax probabilities, kept for backward
                      const T* qkv,    // (B, T, 3C), or (B, T, C + 2 kv_heads hs)
                      const int32_t* seg,  // (B, T)
                      int64_t B, int64_t Tn, int64_t C, int64_t NH,
                      AttentionKernel kernel = AttentionKernel::kVarlen, const AttentionOptions<T>& options = {});

// Accumulates (+=) into dqkv, and with options.bias into dbias ((buckets, NH)).
template <typename T>
void AttentionBackward(T* dqkv,        // as qkv
                       const T* dout,  // (B, T, C)
                       const T* qkv, const T* att, const int32_t* seg, int64_t B, int64_t Tn, int64_t C,
                       int64_t NH, AttentionKernel kernel = AttentionKernel::kVarlen,
                       const AttentionOptions<T>& options = {}, T* dbias = nullptr);

// Cross-attention (T5's decoder): queries from one sequence, keys and
// values from another (the encoder's output). Query token i of row b attends
// to every key token j of row b of the same sample: seg_q[i] == seg_k[j] >=
// 0, each sample a contiguous run in both (as packed rows hold them); no
// causal mask, no bias. Queries of padding, or of a sample with no keys,
// output zeros. Implemented in cross_attention.cc.
//
// `att` keeps the probabilities per sample and head, Lq x Lk;
// CrossAttentionProbsSize gives its length for a batch.
int64_t CrossAttentionProbsSize(const int32_t* seg_q, const int32_t* seg_k, int64_t B, int64_t Tq, int64_t Tk,
                                int64_t NH);

template <typename T>
void CrossAttentionForward(T* out,           // (B, Tq, C)
                           T* att,           // (CrossAttentionProbsSize)
                           const T* q,       // (B, Tq, C)
                           const T* kv,      // (B, Tk, 2C): [k | v] per token
                           const int32_t* seg_q, const int32_t* seg_k,  // (B, Tq), (B, Tk)
                           int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH,
                           bool scaled);     // scores times 1 / sqrt(head size) (T5: false)

// Accumulates (+=) into dq and dkv.
template <typename T>
void CrossAttentionBackward(T* dq,            // (B, Tq, C)
                            T* dkv,           // (B, Tk, 2C)
                            const T* dout,    // (B, Tq, C)
                            const T* q, const T* kv, const T* att, const int32_t* seg_q, const int32_t* seg_k,
                            int64_t B, int64_t Tq, int64_t Tk, int64_t C, int64_t NH, bool scaled);

// Token + position embedding: out[b,t] = wte[tok] + wpe[pos]; wpe null:
// wte[tok] alone (rotary positions).
template <typename T>
void EmbeddingForward(T* out,           // (N, C)
                      const int32_t* tokens, const int32_t* positions,  // (N)
                      const T* wte,     // (V, C)
                      const T* wpe,     // (P, C)
                      int64_t N, int64_t C);
template <typename T>
void EmbeddingBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, const int32_t* positions,
                       int64_t N, int64_t C);

// Softmax cross-entropy on the rows whose target >= 0, each weighted by
// `scale` (1 / target tokens of the whole global batch, so gradients do not
// depend on the micro-batch split). Returns the weighted loss sum; writes the
// softmax to probs.
template <typename T>
T CrossEntropyForward(T* probs,          // (N, V)
                      const T* logits,   // (N, V)
                      const int32_t* targets,  // (N), < 0: ignored
                      T scale, int64_t N, int64_t V);
// dlogits = scale * (probs - onehot(target)) on scored rows, 0 elsewhere.
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T scale, int64_t N, int64_t V);

}  // namespace dynapipe::runtime::cpu
