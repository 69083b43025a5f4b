// hf_logits: our CPU model against Hugging Face's files, for the round trip
// with `transformers` on a machine that has it (tests/golden/
// hf_transformers_check.py; deploy/gpu_checks.sh runs it on the lent GPU
// machine) and for hf_export_test here.
//
//   hf_logits --model DIR --expected FILE [--tolerance T]
//       loads DIR (config.json and model.safetensors, or shards: a GPT-2,
//       T5 or Llama in Hugging Face's names) into our whole CPU model, runs
//       FILE's tokens ("tokens" (rows, seq) int32, with an optional
//       "segments" (rows, seq) packing several samples into a row; T5:
//       "enc_tokens" and "dec_tokens") and prints the relative error of our
//       logits against FILE's "logits" (rows * seq, vocab); exit 1 above T
//       (default 1e-4)
//   hf_logits --export gpt2|t5|t5-v1.1|llama --out DIR
//       a small model of ours (our initialiser) in Hugging Face's format,
//       with DIR/expected.safetensors: tokens (one sample per row) and our
//       logits
#include <cmath>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/memory/buffer_pool.h"
#include "runtime/model/cpu_stage.h"
#include "runtime/model/gpt.h"
#include "runtime/model/hf_checkpoint.h"
#include "runtime/model/t5.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"
#include "src/safetensors/weight_set.h"

namespace dynapipe::runtime::model {
namespace {

constexpr int kRows = 2, kSeq = 12, kEncSeq = 15;

absl::StatusOr<std::unique_ptr<CpuStageBase>> Whole(const GptConfig& c, BufferPool* pool) {
  const StageOptions whole{0, c.TotalLayers(), true, true, 17};
  if (c.encoder_decoder) {
    ASSIGN_OR_RETURN(auto s, T5Stage::Create(c, whole, pool));
    return std::unique_ptr<CpuStageBase>(std::move(s));
  }
  ASSIGN_OR_RETURN(auto s, GptStage::Create(c, whole, pool));
  return std::unique_ptr<CpuStageBase>(std::move(s));
}

// Rows of the samples `segments` marks (empty: full rows of one sample
// each, what the Hugging Face classes compute without an attention mask),
// positions restarting at each sample's first token.
TokenBatch Batch(const GptConfig& c, std::vector<int32_t> tokens, std::vector<int32_t> segments,
                 std::vector<int32_t> enc_tokens) {
  TokenBatch b;
  b.rows = kRows;
  b.seq = static_cast<int>(tokens.size()) / kRows;
  b.tokens = std::move(tokens);
  b.segments = segments.empty() ? std::vector<int32_t>(b.tokens.size(), 0) : std::move(segments);
  b.positions.resize(b.tokens.size());
  for (size_t i = 0; i < b.tokens.size(); ++i) {
    const bool start = i % b.seq == 0 || b.segments[i] != b.segments[i - 1];
    b.positions[i] = start ? 0 : b.positions[i - 1] + 1;
  }
  b.targets.assign(b.tokens.size(), 0);
  if (c.encoder_decoder) {
    b.enc_seq = static_cast<int>(enc_tokens.size()) / kRows;
    b.enc_tokens = std::move(enc_tokens);
    b.enc_segments.assign(b.enc_tokens.size(), 0);
  }
  return b;
}

absl::StatusOr<std::vector<int32_t>> IntTensor(const std::string& file, const std::string& name) {
  ASSIGN_OR_RETURN(const safetensors::Reader r, safetensors::Reader::Open(file));
  const safetensors::TensorInfo* t = r.Find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(file, ": no tensor ", name));
  ASSIGN_OR_RETURN(const std::string bytes, r.ReadBytes(*t));
  std::vector<int32_t> out(static_cast<size_t>(t->elements()));
  if (t->dtype == safetensors::DType::kI32) {
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
  } else if (t->dtype == safetensors::DType::kI64) {
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t v;
      std::memcpy(&v, bytes.data() + 8 * i, 8);
      out[i] = static_cast<int32_t>(v);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(file, ": ", name, " is not I32 or I64"));
  }
  return out;
}

absl::Status Check(const std::string& dir, const std::string& expected, double tolerance) {
  ASSIGN_OR_RETURN(const safetensors::WeightSet w, safetensors::WeightSet::Open(dir));
  ASSIGN_OR_RETURN(const GptConfig c, ConfigFromHfJson(w.config_json()));
  BufferPool pool(CpuAllocator());
  ASSIGN_OR_RETURN(auto stage, Whole(c, &pool));
  RETURN_IF_ERROR(FromHuggingFace(stage->layout(), WeightsSource(w), stage->param_data()));
  ASSIGN_OR_RETURN(std::vector<int32_t> tokens, IntTensor(expected, c.encoder_decoder ? "dec_tokens" : "tokens"));
  std::vector<int32_t> enc;
  if (c.encoder_decoder) {
    ASSIGN_OR_RETURN(enc, IntTensor(expected, "enc_tokens"));
  }
  absl::StatusOr<std::vector<int32_t>> segments = IntTensor(expected, "segments");
  if (!segments.ok() && !absl::IsNotFound(segments.status())) return segments.status();
  if (segments.ok() && segments->size() != tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(expected, ": ", segments->size(), " segments for ", tokens.size(),
                                                   " tokens"));
  }
  const TokenBatch b =
      Batch(c, std::move(tokens), segments.ok() ? std::move(*segments) : std::vector<int32_t>(), std::move(enc));
  std::vector<float> ours(b.tokens.size() * c.vocab);
  RETURN_IF_ERROR(stage->Infer(b, nullptr, ours.data()));
  ASSIGN_OR_RETURN(const safetensors::Reader e, safetensors::Reader::Open(expected));
  ASSIGN_OR_RETURN(const std::vector<float> want, e.ReadF32("logits"));
  if (want.size() != ours.size()) {
    return absl::InvalidArgumentError(absl::StrCat(expected, ": ", want.size(), " logits, ours ", ours.size()));
  }
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (static_cast<double>(ours[i]) - want[i]) * (static_cast<double>(ours[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  const double err = std::sqrt(num / std::max(den, 1e-300));
  std::printf("%s: %s, %zu logits, relative error %.3e\n", dir.c_str(), HfArchitecture(c), want.size(), err);
  if (!(err <= tolerance)) return absl::InternalError(absl::StrCat("relative error ", err, " above ", tolerance));
  return absl::OkStatus();
}

absl::Status Export(const std::string& kind, const std::string& dir) {
  GptConfig c{.num_layers = 2, .hidden = 64, .heads = 4, .ffn = 128, .vocab = 97, .max_positions = 32};
  if (kind == "t5" || kind == "t5-v1.1") {
    c.encoder_decoder = true;
    c.decoder_layers = 2;
    c.norm = NormKind::kRms;
    c.bias = false;
    c.mlp = kind == "t5" ? MlpKind::kRelu : MlpKind::kGatedGelu;
    c.tie_embeddings = kind == "t5";
  } else if (kind == "llama") {  // grouped heads, an untied head, a rope base and eps other than the defaults
    c.UseLlamaBlock();
    c.kv_heads = 2;
    c.rope_base = 500000.0f;
    c.norm_eps = 1e-5;
    c.tie_embeddings = false;
  } else if (kind != "gpt2") {
    return absl::InvalidArgumentError(absl::StrCat("--export ", kind, ": gpt2, t5, t5-v1.1 or llama"));
  }
  BufferPool pool(CpuAllocator());
  ASSIGN_OR_RETURN(auto stage, Whole(c, &pool));
  std::mt19937 rng(5);
  auto random = [&](int n) {
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = 1 + static_cast<int32_t>(rng() % (c.vocab - 1));
    return v;
  };
  std::vector<int32_t> dec = random(kRows * kSeq), enc = random(kRows * kEncSeq);
  if (c.encoder_decoder) {
    for (int r = 0; r < kRows; ++r) dec[r * kSeq] = 0;  // decoder_start_token_id
  }
  const TokenBatch b = Batch(c, dec, {}, enc);
  std::vector<float> logits(b.tokens.size() * c.vocab);
  RETURN_IF_ERROR(stage->Infer(b, nullptr, logits.data()));
  ASSIGN_OR_RETURN(const std::vector<HfTensor> hf, ToHuggingFace(stage->layout(), stage->param_data()));
  std::filesystem::create_directories(dir);
  std::vector<safetensors::TensorOut> out;
  for (const HfTensor& t : hf) out.push_back(safetensors::F32Tensor(t.name, t.shape, t.data));
  RETURN_IF_ERROR(safetensors::Write(dir + "/model.safetensors", out, {{"format", "pt"}}));
  ASSIGN_OR_RETURN(const std::string config, HfConfigJson(c));
  RETURN_IF_ERROR(WriteFileAtomic(dir + "/config.json", config));
  auto ints = [](const std::string& name, const std::vector<int32_t>& v) {
    return safetensors::TensorOut{name, safetensors::DType::kI32, {kRows, static_cast<int64_t>(v.size()) / kRows},
                                  {reinterpret_cast<const char*>(v.data()), v.size() * 4}};
  };
  std::vector<safetensors::TensorOut> e = {
      safetensors::F32Tensor("logits", {static_cast<int64_t>(b.tokens.size()), c.vocab}, logits)};
  if (c.encoder_decoder) {
    e.push_back(ints("enc_tokens", enc));
    e.push_back(ints("dec_tokens", dec));
  } else {
    e.push_back(ints("tokens", dec));
  }
  RETURN_IF_ERROR(safetensors::Write(dir + "/expected.safetensors", e));
  std::printf("exported a %s of ours to %s\n", kind.c_str(), dir.c_str());
  return absl::OkStatus();
}

}  // namespace
}  // namespace dynapipe::runtime::model

int main(int argc, char** argv) {
  std::string model, expected, exp, out;
  double tolerance = 1e-4;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string f = argv[i], v = argv[i + 1];
    if (f == "--model") model = v;
    else if (f == "--expected") expected = v;
    else if (f == "--export") exp = v;
    else if (f == "--out") out = v;
    else if (f == "--tolerance" && absl::SimpleAtod(v, &tolerance)) continue;
    else model = expected = exp = "";  // unknown: usage below
  }
  absl::Status s = absl::InvalidArgumentError(
      "usage: hf_logits --model DIR --expected FILE [--tolerance T] | --export gpt2|t5|t5-v1.1|llama --out DIR");
  if (!model.empty() && !expected.empty()) s = dynapipe::runtime::model::Check(model, expected, tolerance);
  if (!exp.empty() && !out.empty()) s = dynapipe::runtime::model::Export(exp, out);
  if (!s.ok()) {
    std::fprintf(stderr, "hf_logits: %s\n", std::string(s.message()).c_str());
    return s.code() == absl::StatusCode::kInternal ? 1 : 2;
  }
  return 0;
}
