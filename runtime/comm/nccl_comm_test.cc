#include "runtime/comm/nccl_comm.h"

#include <catch2/catch.hpp>
#include <cstring>
#include <vector>

#include "runtime/backend/cuda/test_util.h"
#include "runtime/comm/kv_store.h"

namespace dynapipe::runtime::comm {
namespace {

using cuda::testing::DeviceArray;

absl::Time In(double seconds) { return absl::Now() + absl::Seconds(seconds); }

std::unique_ptr<Communicator> OneRank(KeyValueStore* store, const std::string& prefix) {
  NcclOptions o;
  o.job_prefix = prefix;
  o.connect_timeout = absl::Seconds(20);
  auto comm = CreateNcclCommunicator(o, store);
  INFO(comm.status().ToString());
  REQUIRE(comm.ok());
  return std::move(*comm);
}

TEST_CASE("NCCL ids survive the hex text the stores carry") {
  std::vector<unsigned char> id(128);
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<unsigned char>(i * 37 + 11);
  const std::string hex = HexEncode(id.data(), id.size());
  CHECK(hex.size() == 256);
  std::vector<unsigned char> back(128);
  REQUIRE(HexDecode(hex, back.data(), back.size()).ok());
  CHECK(back == id);
  CHECK(absl::IsDataLoss(HexDecode(hex.substr(2), back.data(), back.size())));
  std::string bad = hex;
  bad[7] = 'g';
  CHECK(absl::IsDataLoss(HexDecode(bad, back.data(), back.size())));
}

TEST_CASE("an NCCL rank outside the world is refused before touching a device") {
  MemoryKeyValueStore store;
  NcclOptions o;
  o.rank = 2;
  o.size = 2;
  auto comm = CreateNcclCommunicator(o, &store);
  CHECK(absl::IsInvalidArgument(comm.status()));
}

TEST_CASE("one NCCL rank sends to itself inside a group and all-reduces over itself", "[gpu]") {
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-a");
  CHECK(comm->rank() == 0);
  CHECK(comm->size() == 1);

  const size_t bytes = (1 << 20) + 13;
  std::vector<uint8_t> payload(bytes);
  for (size_t i = 0; i < bytes; ++i) payload[i] = static_cast<uint8_t>((i * 131) ^ (i >> 7));
  DeviceArray<uint8_t> src(payload), dst(bytes);
  dst.Zero();
  REQUIRE(comm->GroupStart().ok());
  auto send = comm->Send(0, 7, src.get(), bytes);
  auto recv = comm->Recv(0, 7, dst.get(), bytes);
  REQUIRE(send.ok());
  REQUIRE(recv.ok());
  CHECK(absl::IsFailedPrecondition((*recv)->Wait(In(1))));  // not launched before GroupEnd
  REQUIRE(comm->GroupEnd().ok());
  REQUIRE((*send)->Wait(In(30)).ok());
  REQUIRE((*recv)->Wait(In(30)).ok());
  CHECK(dst.Download() == payload);

  const std::vector<float> f = cuda::testing::RandomNormal(1000003, 3);
  DeviceArray<float> df(f);
  const int group[] = {0};
  REQUIRE(comm->AllReduceSum(group, df.get(), f.size(), In(30)).ok());
  CHECK(df.Download() == f);  // a sum over one rank is the identity, bit for bit
  std::vector<double> d(4097);
  for (size_t i = 0; i < d.size(); ++i) d[i] = 1.0 / (i + 1);
  DeviceArray<double> dd(d);
  REQUIRE(comm->AllReduceSum(group, dd.get(), d.size(), In(30)).ok());
  CHECK(dd.Download() == d);
  const int stranger[] = {1};
  CHECK(absl::IsInvalidArgument(comm->AllReduceSum(stranger, df.get(), 1, In(1))));
}

TEST_CASE("a transfer nobody answers ends at its deadline, naming the peer, and aborts the rest", "[gpu]") {
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-b");
  DeviceArray<uint8_t> buf(4096);
  auto recv = comm->Recv(0, 1, buf.get(), 4096);  // no matching send: it can never complete
  REQUIRE(recv.ok());
  const absl::Time start = absl::Now();
  const absl::Status s = (*recv)->Wait(start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  INFO(s.ToString());
  CHECK(absl::IsDeadlineExceeded(s));
  CHECK(LostPeer(s) == std::optional<int>(0));
  CHECK(took < absl::Seconds(6));  // the deadline plus ncclCommAbort
  CHECK((*recv)->Wait(In(1)) == s);  // final
  auto send = comm->Send(0, 1, buf.get(), 4096);
  CHECK(absl::IsAborted(send.status()));
}

TEST_CASE("an NCCL world whose other rank never joins fails at the connect deadline", "[gpu]") {
  MemoryKeyValueStore store;
  NcclOptions o;
  o.rank = 0;
  o.size = 2;
  o.job_prefix = "job-c";
  o.connect_timeout = absl::Seconds(2);
  const absl::Time start = absl::Now();
  auto comm = CreateNcclCommunicator(o, &store);
  INFO(comm.status().ToString());
  CHECK(absl::IsDeadlineExceeded(comm.status()));
  CHECK(absl::Now() - start < absl::Seconds(10));
}

}  // namespace
}  // namespace dynapipe::runtime::comm
