#include "runtime/kernels/cuda/attention_choice.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dynapipe::runtime::cuda {
namespace {

std::string Version(size_t v) { return absl::StrCat(v / 10000, ".", (v % 10000) / 100, ".", v % 100); }

}  // namespace

absl::StatusOr<AttentionImpl> ParseAttentionImpl(absl::string_view name) {
  if (name == "auto") return AttentionImpl::kAuto;
  if (name == "cudnn") return AttentionImpl::kCudnn;
  if (name == "tiled") return AttentionImpl::kTiled;
  return absl::InvalidArgumentError(
      absl::StrCat("--attention-kernel: '", name, "' is not one of auto, cudnn, tiled"));
}

const char* AttentionImplName(AttentionImpl impl) {
  switch (impl) {
    case AttentionImpl::kAuto:
      return "auto";
    case AttentionImpl::kCudnn:
      return "cudnn";
    case AttentionImpl::kTiled:
      return "tiled";
  }
  return "?";
}

absl::Status CudnnPrerequisites(const CudnnFacts& facts) {
  if (!facts.loaded.ok()) return absl::FailedPreconditionError(facts.loaded.message());
  if (facts.version < kCudnnMinVersion) {
    return absl::FailedPreconditionError(absl::StrCat("cuDNN ", Version(facts.version),
                                                      " is older than ", Version(kCudnnMinVersion),
                                                      " (packed attention with per-token statistics)"));
  }
  if (facts.sm < 90 && facts.version < kCudnnMinVersionBelowSm90) {
    return absl::FailedPreconditionError(absl::StrCat("cuDNN ", Version(facts.version), " runs packed attention on sm_",
                                                      facts.sm, " only from ", Version(kCudnnMinVersionBelowSm90)));
  }
  return absl::OkStatus();
}

absl::StatusOr<AttentionDecision> DecideAttention(AttentionImpl requested, const CudnnFacts& facts) {
  AttentionDecision d;
  if (requested == AttentionImpl::kTiled) {
    d.line = "tiled (--attention-kernel tiled)";
    return d;
  }
  std::string why;
  if (absl::Status pre = CudnnPrerequisites(facts); !pre.ok()) {
    why = std::string(pre.message());
  } else {
    std::vector<std::string> failed;
    for (const CudnnFacts::Probe& p : facts.probes) {
      if (p.result.ok()) {
        d.cudnn_head_dims.push_back(p.head_dim);
      } else {
        failed.push_back(absl::StrCat("head dimension ", p.head_dim, ": ", p.result.message()));
      }
    }
    if (facts.probes.empty()) why = "the start-up comparison with the tiled kernel did not run";
    if (!d.cudnn_head_dims.empty()) {
      d.line = absl::StrCat("cudnn ", Version(facts.version), " fused attention for head dimensions ",
                            absl::StrJoin(d.cudnn_head_dims, ", "), ", tiled otherwise");
      if (!failed.empty()) absl::StrAppend(&d.line, " (", absl::StrJoin(failed, "; "), ")");
      return d;
    }
    if (!failed.empty()) why = absl::StrJoin(failed, "; ");
  }
  if (requested == AttentionImpl::kCudnn) {
    return absl::FailedPreconditionError(absl::StrCat("--attention-kernel cudnn: ", why));
  }
  d.cudnn_head_dims.clear();
  d.line = absl::StrCat("tiled (cuDNN not used: ", why, ")");
  return d;
}

}  // namespace dynapipe::runtime::cuda
