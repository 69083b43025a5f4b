// The C++ GPT against PyTorch: loss, logits and every parameter gradient of a
// tiny model (GPT-2's block, and two other blocks) on one padded and packed batch, computed in float64 by
// make_golden.py, must match the CPU backend's float32 within 1e-5 relative
// (per tensor, ||ours - golden|| / ||golden||), on one stage and split over
// two stages.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "runtime/model/gpt.h"
#include "runtime/model/t5.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe::runtime::model {
namespace {

constexpr double kTolerance = 1e-5;

struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> f32;    // dtype f32
  std::vector<int32_t> i32;  // dtype i32
};

// One golden file pair: the model config, the batch, and the tensors by name
// ("loss", "logits", "param/<name>", "grad/<name>").
struct Golden {
  GptConfig config;
  TokenBatch batch;
  std::map<std::string, Tensor> tensors;
  std::vector<std::string> params;  // parameter names, in file order

  const std::vector<float>& F(const std::string& name) const { return tensors.at(name).f32; }
};

// Values of `# <tag> key=value ...` header lines.
std::map<std::string, double> HeaderValues(const std::string& manifest, const std::string& tag) {
  std::map<std::string, double> values;
  std::istringstream lines(manifest);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string hash, word;
    if (!(words >> hash >> word) || hash != "#" || word != tag) continue;
    while (words >> word) {
      const size_t eq = word.find('=');
      double v = 0;
      if (eq != std::string::npos && absl::SimpleAtod(word.substr(eq + 1), &v)) values[word.substr(0, eq)] = v;
    }
  }
  return values;
}

// Runfiles: Bazel runs tests in the main workspace's runfiles root.
absl::StatusOr<Golden> LoadGolden(const std::string& stem) {
  const std::string base = "tests/golden/" + stem;
  ASSIGN_OR_RETURN(const std::string manifest, ReadFile(base + ".txt"));
  ASSIGN_OR_RETURN(const std::string bin, ReadFile(base + ".bin"));
  Golden g;
  auto config = HeaderValues(manifest, "config");
  for (const char* key : {"layers", "hidden", "heads", "ffn", "vocab", "max_positions", "tie_embeddings"}) {
    if (!config.contains(key)) return absl::DataLossError(absl::StrCat(base, ".txt: config lacks ", key));
  }
  g.config.num_layers = static_cast<int>(config["layers"]);
  g.config.hidden = static_cast<int>(config["hidden"]);
  g.config.heads = static_cast<int>(config["heads"]);
  g.config.ffn = static_cast<int>(config["ffn"]);
  g.config.vocab = static_cast<int>(config["vocab"]);
  g.config.max_positions = static_cast<int>(config["max_positions"]);
  g.config.tie_embeddings = config["tie_embeddings"] != 0;
  // The block (absent: GPT-2's), in the executor's enum order.
  g.config.norm = config.contains("norm") && config["norm"] == 1 ? NormKind::kRms : NormKind::kLayerNorm;
  const int64_t mlp = config.contains("mlp") ? static_cast<int64_t>(config["mlp"]) : 0;
  g.config.mlp = mlp == 3   ? MlpKind::kSwiglu
                 : mlp == 2 ? MlpKind::kGatedGelu
                 : mlp == 1 ? MlpKind::kRelu
                            : MlpKind::kGelu;
  g.config.bias = !config.contains("bias") || config["bias"] != 0;
  if (config.contains("rotary") && config["rotary"] != 0) {  // Llama's block
    g.config.rotary = true;
    g.config.kv_heads = static_cast<int>(config["kv_heads"]);
    g.config.norm_eps = config["norm_eps"];
    g.config.rope_base = static_cast<float>(config["rope_base"]);
  }
  // An encoder-decoder (T5): `layers` encoder layers, then these.
  if (config.contains("decoder_layers")) {
    g.config.encoder_decoder = true;
    g.config.decoder_layers = static_cast<int>(config["decoder_layers"]);
    g.config.relative_buckets = static_cast<int>(config["buckets"]);
    g.config.relative_max_distance = static_cast<int>(config["max_distance"]);
  }

  size_t offset = 0;
  std::istringstream lines(manifest);
  for (std::string line; std::getline(lines, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string name, dtype;
    if (!(words >> name >> dtype)) return absl::DataLossError(absl::StrCat(base, ".txt: ", line));
    Tensor t;
    size_t n = 1;
    for (int64_t d; words >> d;) {
      t.shape.push_back(d);
      n *= static_cast<size_t>(d);
    }
    if (dtype != "f32" && dtype != "i32") return absl::DataLossError(absl::StrCat(base, ".txt: ", line));
    if (offset + 4 * n > bin.size()) return absl::DataLossError(absl::StrCat(base, ".bin: ends inside ", name));
    // Little-endian on disk, as on every machine we build for.
    if (dtype == "f32") {
      t.f32.resize(n);
      std::memcpy(t.f32.data(), bin.data() + offset, 4 * n);
    } else {
      t.i32.resize(n);
      std::memcpy(t.i32.data(), bin.data() + offset, 4 * n);
    }
    offset += 4 * n;
    if (name.starts_with("param/")) g.params.push_back(name.substr(6));
    g.tensors[name] = std::move(t);
  }
  if (offset != bin.size()) {
    return absl::DataLossError(absl::StrCat(base, ".bin: ", bin.size() - offset, " bytes left"));
  }
  for (const char* name : {"tokens", "positions", "segments", "targets", "loss", "logits"}) {
    if (!g.tensors.contains(name)) return absl::DataLossError(absl::StrCat(base, ".txt: no tensor ", name));
  }
  for (const char* name : {"tokens", "positions", "segments", "targets"}) {
    if (g.tensors[name].shape.size() != 2 || g.tensors[name].shape != g.tensors["tokens"].shape) {
      return absl::DataLossError(absl::StrCat(base, ".txt: ", name, " is not (rows, seq) like tokens"));
    }
  }
  TokenBatch& b = g.batch;
  b.rows = g.tensors["tokens"].shape.at(0);
  b.seq = g.tensors["tokens"].shape.at(1);
  b.tokens = g.tensors["tokens"].i32;
  b.positions = g.tensors["positions"].i32;
  b.segments = g.tensors["segments"].i32;
  b.targets = g.tensors["targets"].i32;
  for (int64_t k = 0; k < b.rows * b.seq; ++k) {
    b.real_tokens += b.segments[k] >= 0;
    b.loss_tokens += b.targets[k] >= 0;
  }
  if (g.config.encoder_decoder) {
    for (const char* name : {"enc_tokens", "enc_segments"}) {
      if (!g.tensors.contains(name) || g.tensors[name].shape.size() != 2 ||
          g.tensors[name].shape.at(0) != b.rows) {
        return absl::DataLossError(absl::StrCat(base, ".txt: no (rows, enc_seq) tensor ", name));
      }
    }
    b.enc_seq = g.tensors["enc_tokens"].shape.at(1);
    b.enc_tokens = g.tensors["enc_tokens"].i32;
    b.enc_segments = g.tensors["enc_segments"].i32;
  }
  return g;
}

Golden Load(const std::string& stem) {
  absl::StatusOr<Golden> g = LoadGolden(stem);
  INFO(g.status().ToString());
  REQUIRE(g.ok());
  return std::move(*g);
}

// ||a - b|| / ||b|| (||a - b|| where b is zero).
double RelError(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// The largest per-tensor error of a group of comparisons and whose it was.
struct Worst {
  std::string name;
  double error = -1;
  void Add(const std::string& tensor, double e) {
    if (e > error || std::isnan(e)) {
      name = tensor;
      error = e;
    }
  }
};

// Stage `Kind` (GptStage, T5Stage) for layers [first_layer, +num_layers)
// with the golden weights in place of its own initialisation.
template <typename Kind>
std::unique_ptr<Kind> MakeGoldenStage(const Golden& g, int first_layer, int num_layers, BufferPool* pool) {
  StageOptions o;
  o.first_layer = first_layer;
  o.num_layers = num_layers;
  o.first = first_layer == 0;
  o.last = first_layer + num_layers == g.config.TotalLayers();
  o.seed = 1;
  auto stage = Kind::Create(g.config, o, pool);
  INFO(stage.status().ToString());
  REQUIRE(stage.ok());
  for (const ParamInfo& p : (*stage)->layout().params()) {
    INFO("stage parameter " << p.name);
    REQUIRE(g.tensors.contains("param/" + p.name));
    const Tensor& t = g.tensors.at("param/" + p.name);
    REQUIRE(t.shape == p.shape);
    std::copy(t.f32.begin(), t.f32.end(), (*stage)->param_data().begin() + p.offset);
  }
  REQUIRE((*stage)->ZeroGrads().ok());
  return std::move(*stage);
}

std::unique_ptr<GptStage> MakeStage(const Golden& g, int first_layer, int num_layers, BufferPool* pool) {
  return MakeGoldenStage<GptStage>(g, first_layer, num_layers, pool);
}

std::vector<float> Grad(const CpuStageBase& stage, const std::string& name) {
  const ParamInfo* p = stage.FindParam(name);
  REQUIRE(p != nullptr);
  const auto g = stage.grad_data().subspan(p->offset, p->size);
  return {g.begin(), g.end()};
}

float LossScale(const TokenBatch& b) { return 1.0f / static_cast<float>(b.loss_tokens); }

struct Run {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;  // summed over the stages holding the parameter
};

// Forward and backward of the golden batch over stages of `split` layers each.
Run ForwardBackward(const Golden& g, const TokenBatch& batch, const std::vector<int>& split) {
  BufferPool pool(CpuAllocator());
  std::vector<std::unique_ptr<GptStage>> stages;
  int first = 0;
  for (int n : split) {
    stages.push_back(MakeStage(g, first, n, &pool));
    first += n;
  }
  const size_t S = stages.size();
  std::vector<std::vector<float>> hidden(S);  // hidden[s]: input of stage s
  for (size_t s = 1; s < S; ++s) hidden[s].resize(stages[s]->HiddenElements(batch));
  Run run;
  for (size_t s = 0; s < S; ++s) {
    auto loss = stages[s]->ForwardLoss(0, batch, s > 0 ? hidden[s].data() : nullptr,
                                   s + 1 < S ? hidden[s + 1].data() : nullptr, LossScale(batch));
    INFO(loss.status().ToString());
    REQUIRE(loss.ok());
    if (s + 1 < S) CHECK(*loss == 0);
    run.loss = *loss;
  }
  std::vector<std::vector<float>> dhidden(S);  // dhidden[s]: gradient of stage s's input
  for (size_t s = 1; s < S; ++s) dhidden[s].resize(stages[s]->HiddenElements(batch));
  for (size_t s = S; s-- > 0;) {
    const absl::Status st =
        stages[s]->Backward(0, s + 1 < S ? dhidden[s + 1].data() : nullptr, s > 0 ? dhidden[s].data() : nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
    CHECK(stages[s]->in_flight() == 0);
  }
  for (const auto& stage : stages) {
    for (const ParamInfo& p : stage->layout().params()) {
      std::vector<float> grad = Grad(*stage, p.name);
      auto [it, inserted] = run.grads.emplace(p.name, grad);
      if (!inserted) {
        // Only the tied embedding may sit on two stages.
        CHECK(p.name == "wte");
        CHECK(stage->HasSharedEmbedding());
        for (size_t i = 0; i < grad.size(); ++i) it->second[i] += grad[i];
      }
    }
  }
  return run;
}

// Logits of every position through stages of `split` layers each.
std::vector<float> Logits(const Golden& g, const std::vector<int>& split) {
  BufferPool pool(CpuAllocator());
  std::vector<float> in, out;
  int first = 0;
  for (int n : split) {
    std::unique_ptr<GptStage> stage = MakeStage(g, first, n, &pool);
    first += n;
    const bool last = first == g.config.num_layers;
    out.assign(last ? g.batch.rows * g.batch.seq * g.config.vocab : stage->HiddenElements(g.batch), 0.0f);
    const absl::Status st = stage->Infer(g.batch, in.empty() ? nullptr : in.data(), out.data());
    INFO(st.ToString());
    REQUIRE(st.ok());
    in.swap(out);
  }
  return in;
}

// The run's loss and every gradient against the golden's, and the stages
// holding exactly the golden's parameters.
void CheckRun(const Golden& g, const Run& run) {
  const double golden_loss = g.F("loss")[0];
  const double loss_error = std::abs(run.loss - golden_loss) / std::abs(golden_loss);
  INFO("loss " << run.loss << " vs " << golden_loss << ": relative error " << loss_error);
  CHECK(loss_error <= kTolerance);
  std::set<std::string> ours, theirs(g.params.begin(), g.params.end());
  for (const auto& [name, grad] : run.grads) ours.insert(name);
  CHECK(ours == theirs);
  Worst worst;
  std::vector<std::string> failing;
  for (const std::string& name : g.params) {
    if (!run.grads.contains(name)) continue;
    const double e = RelError(run.grads.at(name), g.F("grad/" + name));
    worst.Add("grad/" + name, e);
    if (!(e <= kTolerance)) failing.push_back(absl::StrCat(name, " ", e));
  }
  INFO("worst gradient: " << worst.name << " relative error " << worst.error);
  INFO("failing: " << Catch::Detail::stringify(failing));
  CHECK(worst.error >= 0);
  CHECK(worst.error <= kTolerance);
}

void CheckAgainstGolden(const std::string& stem, const std::vector<int>& split) {
  const Golden g = Load(stem);
  INFO(stem << ", stages of " << Catch::Detail::stringify(split) << " layers");

  const std::vector<float> logits = Logits(g, split);
  const double logits_error = RelError(logits, g.F("logits"));
  INFO("logits: relative error " << logits_error);
  CHECK(logits_error <= kTolerance);

  const Run run = ForwardBackward(g, g.batch, split);
  CheckRun(g, run);
}

TEST_CASE("Tied GPT on one stage matches PyTorch: loss, logits, every gradient") {
  CheckAgainstGolden("gpt_golden", {4});
}

TEST_CASE("Tied GPT split over two stages matches PyTorch; wte gradients summed across the copies") {
  CheckAgainstGolden("gpt_golden", {2, 2});
}

TEST_CASE("Untied GPT (lm_head.w) on one stage matches PyTorch") { CheckAgainstGolden("gpt_golden_untied", {2}); }

TEST_CASE("Untied GPT split over two stages matches PyTorch") { CheckAgainstGolden("gpt_golden_untied", {1, 1}); }

TEST_CASE("T5 v1.1's block (RMS norm, gated GELU, no biases) matches PyTorch on one stage and split over two") {
  CheckAgainstGolden("gpt_golden_t5_block", {2});
  CheckAgainstGolden("gpt_golden_t5_block", {1, 1});
}

TEST_CASE("A block with ReLU and LayerNorm without biases matches PyTorch on one stage and split over two") {
  CheckAgainstGolden("gpt_golden_relu", {2});
  CheckAgainstGolden("gpt_golden_relu", {1, 1});
}

TEST_CASE("Llama's block (RMS eps 1e-5, SwiGLU, rotary positions, 2 kv heads for 4) matches PyTorch") {
  CheckAgainstGolden("gpt_golden_llama", {2});
  CheckAgainstGolden("gpt_golden_llama", {1, 1});
}

// ---- T5 -----------------------------------------------------------------

std::unique_ptr<T5Stage> MakeT5(const Golden& g, int first_layer, int num_layers, BufferPool* pool) {
  return MakeGoldenStage<T5Stage>(g, first_layer, num_layers, pool);
}

std::vector<std::unique_ptr<T5Stage>> MakeT5Stages(const Golden& g, const std::vector<int>& split, BufferPool* pool) {
  std::vector<std::unique_ptr<T5Stage>> stages;
  int first = 0;
  for (int n : split) {
    stages.push_back(MakeT5(g, first, n, pool));
    first += n;
  }
  REQUIRE(first == g.config.TotalLayers());
  return stages;
}

// Forward and backward of the golden batch through stages of `split`
// layers; gradients of a tensor several stages hold are summed, as the
// worker sums them.
Run T5ForwardBackward(const Golden& g, const std::vector<int>& split) {
  BufferPool pool(CpuAllocator());
  std::vector<std::unique_ptr<T5Stage>> stages = MakeT5Stages(g, split, &pool);
  const size_t S = stages.size();
  std::vector<std::vector<float>> hidden(S + 1), dhidden(S + 1);  // [s]: input of stage s
  for (size_t s = 1; s < S; ++s) {
    hidden[s].resize(stages[s]->InputBytes(g.batch) / sizeof(float));
    dhidden[s].resize(hidden[s].size());
    CHECK(stages[s - 1]->OutputBytes(g.batch) == stages[s]->InputBytes(g.batch));
  }
  Run run;
  for (size_t s = 0; s < S; ++s) {
    auto loss = stages[s]->ForwardLoss(0, g.batch, s > 0 ? hidden[s].data() : nullptr,
                                       s + 1 < S ? hidden[s + 1].data() : nullptr, LossScale(g.batch));
    INFO(loss.status().ToString());
    REQUIRE(loss.ok());
    run.loss = *loss;
  }
  for (size_t s = S; s-- > 0;) {
    const absl::Status st =
        stages[s]->Backward(0, s + 1 < S ? dhidden[s + 1].data() : nullptr, s > 0 ? dhidden[s].data() : nullptr);
    INFO(st.ToString());
    REQUIRE(st.ok());
  }
  for (const auto& stage : stages) {
    for (const ParamInfo& p : stage->layout().params()) {
      std::vector<float> grad = Grad(*stage, p.name);
      auto [it, inserted] = run.grads.emplace(p.name, grad);
      if (!inserted) {
        CHECK(IsEncoderDecoderShared(p.name));
        for (size_t i = 0; i < grad.size(); ++i) it->second[i] += grad[i];
      }
    }
  }
  return run;
}

std::vector<float> T5Logits(const Golden& g, const std::vector<int>& split) {
  BufferPool pool(CpuAllocator());
  std::vector<std::unique_ptr<T5Stage>> stages = MakeT5Stages(g, split, &pool);
  std::vector<float> in, out;
  for (const auto& stage : stages) {
    out.assign(stage->options().last ? g.batch.rows * g.batch.seq * g.config.vocab
                                     : stage->OutputBytes(g.batch) / sizeof(float),
               0.0f);
    const absl::Status st = stage->Infer(g.batch, in.empty() ? nullptr : in.data(), out.data());
    INFO(st.ToString());
    REQUIRE(st.ok());
    in.swap(out);
  }
  return in;
}

void CheckT5AgainstGolden(const std::string& stem, const std::vector<int>& split) {
  const Golden g = Load(stem);
  INFO(stem << ", stages of " << Catch::Detail::stringify(split) << " layers");
  const std::vector<float> logits = T5Logits(g, split);
  INFO("logits: relative error " << RelError(logits, g.F("logits")));
  CHECK(RelError(logits, g.F("logits")) <= kTolerance);

  CheckRun(g, T5ForwardBackward(g, split));
}

TEST_CASE("T5 v1.0 (RMS norm, ReLU, tied head) matches PyTorch: loss, logits, every gradient, packed and padded") {
  CheckT5AgainstGolden("t5_golden", {4});
}

TEST_CASE("T5 v1.1 (gated GELU, lm_head.w, 3 decoder layers) matches PyTorch: loss, logits, every gradient") {
  CheckT5AgainstGolden("t5_golden_v11", {5});
}

TEST_CASE("T5 split over 2 and 3 stages matches PyTorch, the encoder's end inside a stage and between stages") {
  // t5_golden: 2 encoder + 2 decoder layers; t5_golden_v11: 2 + 3.
  for (const std::vector<int>& split : {std::vector<int>{2, 2}, {1, 3}, {3, 1}, {1, 1, 2}, {1, 2, 1}}) {
    CheckT5AgainstGolden("t5_golden", split);
  }
  for (const std::vector<int>& split : {std::vector<int>{2, 3}, {3, 2}, {1, 2, 2}, {2, 1, 2}, {1, 1, 1, 1, 1}}) {
    CheckT5AgainstGolden("t5_golden_v11", split);
  }
}

TEST_CASE("Token ids and positions in padding cells change neither loss nor gradients") {
  const Golden g = Load("gpt_golden");
  TokenBatch garbage = g.batch;
  int padding = 0;
  for (int64_t k = 0; k < garbage.rows * garbage.seq; ++k) {
    if (garbage.segments[k] >= 0) continue;
    garbage.tokens[k] = static_cast<int32_t>((7 + 13 * k) % g.config.vocab);
    garbage.positions[k] = static_cast<int32_t>((3 + 5 * k) % g.config.max_positions);
    ++padding;
  }
  REQUIRE(padding == 10);  // the golden batch's padding cells
  for (const std::vector<int>& split : {std::vector<int>{4}, std::vector<int>{2, 2}}) {
    INFO("stages of " << Catch::Detail::stringify(split) << " layers");
    const Run clean = ForwardBackward(g, g.batch, split);
    const Run dirty = ForwardBackward(g, garbage, split);
    CHECK(std::abs(dirty.loss - clean.loss) <= 1e-6 * std::abs(clean.loss));
    Worst worst;
    for (const auto& [name, grad] : clean.grads) worst.Add(name, RelError(dirty.grads.at(name), grad));
    INFO("worst gradient: " << worst.name << " relative change " << worst.error);
    CHECK(worst.error >= 0);
    CHECK(worst.error <= 1e-6);
  }
}

}  // namespace
}  // namespace dynapipe::runtime::model
