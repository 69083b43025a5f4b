#include "runtime/model/batch.h"

#include "absl/strings/str_cat.h"
#include "src/data/synth.h"

namespace dynapipe::runtime::model {

namespace {

absl::StatusOr<TokenBatch> BuildEncoderDecoderBatch(const proto::MicroBatch& mb, const data::Dataset& dataset,
                                                    int max_positions) {
  TokenBatch b;
  b.rows = mb.rows();
  b.enc_seq = mb.seq_len();
  b.seq = mb.dec_seq_len();
  if (b.rows <= 0 || b.enc_seq <= 0 || b.seq <= 0 || b.enc_seq > max_positions || b.seq > max_positions ||
      b.rows > kMaxMicroBatchTokens / (b.enc_seq + b.seq)) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch ", mb.index(), ": shape ", b.rows, "x", b.enc_seq,
                                                   " / ", b.seq, " outside the model's ", max_positions,
                                                   " positions or the ", kMaxMicroBatchTokens, "-token limit"));
  }
  const size_t ne = static_cast<size_t>(b.rows * b.enc_seq), nd = static_cast<size_t>(b.rows * b.seq);
  b.enc_tokens.assign(ne, static_cast<int32_t>(data::kPad));
  b.enc_segments.assign(ne, -1);
  b.tokens.assign(nd, static_cast<int32_t>(data::kPad));
  b.positions.assign(nd, 0);
  b.segments.assign(nd, -1);
  b.targets.assign(nd, -1);
  std::vector<int32_t> next_segment(b.rows, 0);
  std::vector<int64_t> dec_end(b.rows, 0);
  for (const proto::PlacedSample& ps : mb.samples()) {
    const std::string where = absl::StrCat("micro-batch ", mb.index(), " sample ", ps.id());
    if (ps.id() < 0 || static_cast<uint64_t>(ps.id()) >= dataset.size()) {
      return absl::OutOfRangeError(absl::StrCat(where, ": not in the dataset of ", dataset.size(), " samples"));
    }
    const int64_t L = ps.input_len(), T = ps.target_len();
    if (ps.row() < 0 || ps.row() >= b.rows || ps.offset() < 0 || L <= 0 || T <= 0 || ps.offset() + L > b.enc_seq ||
        dec_end[ps.row()] + T > b.seq) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": placement row ", ps.row(), " offset ", ps.offset(),
                                                     " lengths ", L, "/", T, " do not fit ", b.rows, "x", b.enc_seq,
                                                     " / ", b.seq));
    }
    const data::SampleView sv = dataset.sample(static_cast<uint64_t>(ps.id()));
    if (L > static_cast<int64_t>(sv.input.size()) || T > static_cast<int64_t>(sv.target.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": planned lengths ", L, "/", T, " exceed the dataset's ",
                                                     sv.input.size(), "/", sv.target.size()));
    }
    const int32_t seg = next_segment[ps.row()]++;
    const size_t e = static_cast<size_t>(ps.row() * b.enc_seq + ps.offset());
    for (int64_t p = 0; p < L; ++p) {
      if (b.enc_segments[e + p] >= 0) return absl::InvalidArgumentError(absl::StrCat(where, ": overlaps another sample"));
      b.enc_tokens[e + p] = static_cast<int32_t>(sv.input[p]);
      b.enc_segments[e + p] = seg;
    }
    const size_t d = static_cast<size_t>(ps.row() * b.seq + dec_end[ps.row()]);
    dec_end[ps.row()] += T;
    for (int64_t p = 0; p < T; ++p) {
      b.tokens[d + p] = p == 0 ? static_cast<int32_t>(data::kPad) : static_cast<int32_t>(sv.target[p - 1]);
      b.positions[d + p] = static_cast<int32_t>(p);
      b.segments[d + p] = seg;
      b.targets[d + p] = static_cast<int32_t>(sv.target[p]);
    }
    b.real_tokens += T;
    b.loss_tokens += T;
  }
  return b;
}

}  // namespace

absl::StatusOr<TokenBatch> BuildTokenBatch(const proto::MicroBatch& mb, const data::Dataset& dataset,
                                           int max_positions, bool encoder_decoder) {
  if (encoder_decoder) return BuildEncoderDecoderBatch(mb, dataset, max_positions);
  if (mb.dec_seq_len() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("micro-batch ", mb.index(), ": a decoder length for a decoder-only model"));
  }
  TokenBatch b;
  b.rows = mb.rows();
  b.seq = mb.seq_len();
  // Bounded before anything is allocated: a plan is input too.
  if (b.rows <= 0 || b.seq <= 0 || b.seq > max_positions || b.rows > kMaxMicroBatchTokens / b.seq) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batch ", mb.index(), ": shape ", b.rows, "x", b.seq,
                                                   " outside the model's ", max_positions, " positions or the ",
                                                   kMaxMicroBatchTokens, "-token limit"));
  }
  const size_t n = static_cast<size_t>(b.rows * b.seq);
  b.tokens.assign(n, static_cast<int32_t>(data::kPad));
  b.positions.assign(n, 0);
  b.segments.assign(n, -1);
  b.targets.assign(n, -1);
  std::vector<int32_t> next_segment(b.rows, 0);
  for (const proto::PlacedSample& ps : mb.samples()) {
    const std::string where = absl::StrCat("micro-batch ", mb.index(), " sample ", ps.id());
    if (ps.id() < 0 || static_cast<uint64_t>(ps.id()) >= dataset.size()) {
      return absl::OutOfRangeError(absl::StrCat(where, ": not in the dataset of ", dataset.size(), " samples"));
    }
    const int64_t L = ps.input_len(), T = ps.target_len();
    if (ps.row() < 0 || ps.row() >= b.rows || ps.offset() < 0 || ps.offset() + L > b.seq || L <= 0 || T < 0 ||
        T > L) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": placement row ", ps.row(), " offset ", ps.offset(),
                                                     " length ", L, " does not fit ", b.rows, "x", b.seq));
    }
    if (L > max_positions) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": length ", L, " exceeds the model's ", max_positions, " positions"));
    }
    const data::SampleView sv = dataset.sample(static_cast<uint64_t>(ps.id()));
    const int64_t prompt = L - T;
    if (prompt > static_cast<int64_t>(sv.input.size()) || T > static_cast<int64_t>(sv.target.size())) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": planned lengths ", L, "/", T, " exceed the dataset's ",
                                                     sv.input.size(), "+", sv.target.size()));
    }
    const int32_t seg = next_segment[ps.row()]++;
    const size_t base = static_cast<size_t>(ps.row() * b.seq + ps.offset());
    for (int64_t p = 0; p < L; ++p) {
      if (b.segments[base + p] >= 0) return absl::InvalidArgumentError(absl::StrCat(where, ": overlaps another sample"));
      b.tokens[base + p] = static_cast<int32_t>(p < prompt ? sv.input[p] : sv.target[p - prompt]);
      b.positions[base + p] = static_cast<int32_t>(p);
      b.segments[base + p] = seg;
    }
    // Position p predicts token p + 1; score those predicting target tokens.
    for (int64_t p = std::max<int64_t>(prompt - 1, 0); p + 1 < L; ++p) b.targets[base + p] = b.tokens[base + p + 1];
    b.real_tokens += L;
    b.loss_tokens += L - 1 - std::max<int64_t>(prompt - 1, 0);
  }
  return b;
}

}  // namespace dynapipe::runtime::model
