#include "runtime/executor/grad_reducer.h"

#include <catch2/catch.hpp>
#include <numeric>
#include <thread>

#include "runtime/comm/gloo_comm.h"
#include "runtime/comm/kv_store.h"
#include "src/common/logging.h"

namespace dynapipe::runtime::executor {
namespace {

model::GptLayout Layout(int first_layer, int num_layers, int total_layers, bool tied) {
  model::GptConfig config;
  config.num_layers = total_layers;
  config.hidden = 16;
  config.heads = 2;
  config.ffn = 32;
  config.vocab = 24;
  config.max_positions = 40;
  config.tie_embeddings = tied;
  model::StageOptions o;
  o.first_layer = first_layer;
  o.num_layers = num_layers;
  o.first = first_layer == 0;
  o.last = first_layer + num_layers == total_layers;
  auto layout = model::GptLayout::Make(config, o);
  REQUIRE(layout.ok());
  return *layout;
}

// Every parameter in exactly one bucket.
void CheckCover(const model::GptLayout& layout, const std::vector<GradBucket>& buckets) {
  std::vector<int> seen(layout.num_params(), 0);
  for (const GradBucket& b : buckets) {
    REQUIRE(b.offset + b.size <= layout.num_params());
    for (size_t i = b.offset; i < b.offset + b.size; ++i) ++seen[i];
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
}

TEST_CASE("Buckets cover a stage once, in the order backward completes them; a tied embedding stays alone") {
  for (bool tied : {true, false}) {
    for (auto [first, count] : {std::pair{0, 4}, {0, 2}, {2, 2}, {1, 2}}) {
      INFO("layers " << first << "+" << count << " tied " << tied);
      const model::GptLayout layout = Layout(first, count, 4, tied);
      const auto fine = MakeBuckets(layout, 1);
      CheckCover(layout, fine);
      // One bucket per unit: the layers, last first.
      size_t layer_buckets = 0;
      for (const GradBucket& b : fine) {
        for (const auto& l : layout.layers()) layer_buckets += b.offset == l.ln1_w;
      }
      CHECK(layer_buckets == layout.layers().size());
      CheckCover(layout, MakeBuckets(layout, 1 << 30));
      const auto coarse = MakeBuckets(layout, 1 << 30);
      const model::ParamInfo* wte = layout.FindParam("wte");
      if (wte != nullptr) {
        // Alone, whatever the bucket size.
        CHECK(std::count_if(coarse.begin(), coarse.end(),
                            [&](const GradBucket& b) { return b.offset == wte->offset && b.size == wte->size; }) == 1);
      }
    }
  }
  // A middle stage: its layers, last layer first, then merged into one.
  const model::GptLayout mid = Layout(1, 2, 4, true);
  const auto fine = MakeBuckets(mid, 1);
  REQUIRE(fine.size() == 2);
  CHECK(fine[0].offset == mid.layers()[1].ln1_w);
  CHECK(fine[1].offset == 0);
  const auto one = MakeBuckets(mid, 1 << 30);
  REQUIRE(one.size() == 1);
  CHECK(one[0].size == mid.num_params());
}

TEST_CASE("GradReducer starts buckets as they become final, in one order, and sums like one all-reduce") {
  static const bool logging =
      InitLogging(LoggingOptions{.process_name = "grad_reducer_test", .level = "warn", .file = ""}).ok();
  REQUIRE(logging);
  comm::MemoryKeyValueStore store;
  const int n = 2;
  std::vector<std::unique_ptr<comm::Communicator>> comms(n);
  {
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        comm::GlooOptions o;
        o.rank = r;
        o.size = n;
        o.job_prefix = "reducer";
        auto c = comm::CreateGlooCommunicator(o, &store);
        if (c.ok()) comms[r] = *std::move(c);
      });
    }
    for (auto& t : threads) t.join();
  }
  REQUIRE((comms[0] != nullptr && comms[1] != nullptr));
  // One chunk of 100 values in three buckets, as backward completes them: [60, 100), [20, 60), [0, 20).
  const std::vector<std::vector<GradBucket>> buckets = {{{60, 40}, {20, 40}, {0, 20}}};
  // Member 0 owns [0, 50), member 1 [50, 100): the middle bucket is split between them.
  const std::vector<std::vector<GradBucket>> regions = {{{0, 100}}};
  for (auto mode : {GradReducer::Mode::kAllReduce, GradReducer::Mode::kReduceScatter}) {
    INFO("mode " << static_cast<int>(mode));
    std::vector<std::vector<float>> grads(n);
    std::vector<absl::Status> statuses(n);
    std::vector<std::vector<int>> started(n);  // started_early after each report
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      grads[r].resize(100);
      for (size_t i = 0; i < 100; ++i) grads[r][i] = static_cast<float>(i) * (r + 1);
      threads.emplace_back([&, r] {
        GradReducer reducer(comms[r].get(), {0, 1}, mode, {grads[r].data()}, &buckets, &regions, absl::Seconds(10));
        absl::Status s = reducer.Ready(0, 0, 20);  // out of turn: waits for the others
        started[r].push_back(reducer.started_early());
        if (s.ok()) s = reducer.Ready(0, 60, 40);
        started[r].push_back(reducer.started_early());
        if (s.ok()) s = reducer.Ready(0, 20, 40);
        started[r].push_back(reducer.started_early());
        if (s.ok()) s = reducer.Finish();
        statuses[r] = s;
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << " " << statuses[r]);
      REQUIRE(statuses[r].ok());
      CHECK(started[r] == std::vector<int>{0, 1, 3});
      // All of it, or the member's half.
      const GradBucket mine = mode == GradReducer::Mode::kAllReduce ? GradBucket{0, 100} : ShardOf(regions[0][0], n, r);
      for (size_t i = mine.offset; i < mine.offset + mine.size; ++i) {
        INFO("element " << i);
        CHECK(grads[r][i] == static_cast<float>(i) * 3);
      }
    }
  }
  // Reporting a run twice is a bug, said so.
  std::vector<float> g(100, 1.0f);
  GradReducer twice(comms[0].get(), {0}, GradReducer::Mode::kAllReduce, {g.data()}, &buckets, &regions,
                    absl::Seconds(1));
  REQUIRE(twice.Ready(0, 60, 40).ok());
  CHECK(absl::IsInternal(twice.Ready(0, 60, 40)));
}

}  // namespace
}  // namespace dynapipe::runtime::executor
