#include "runtime/comm/nccl_comm.h"

#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "runtime/kernels/cuda/test_util.h"
#include "runtime/comm/kv_store.h"

namespace dynapipe::runtime::comm {
namespace {

using cuda::testing::DeviceArray;
using cuda::testing::Gate;

absl::Time In(double seconds) { return absl::Now() + absl::Seconds(seconds); }

std::unique_ptr<Communicator> OneRank(KeyValueStore* store, const std::string& prefix,
                                      cudaStream_t compute = nullptr) {
  NcclOptions o;
  o.job_prefix = prefix;
  o.compute_stream = compute;
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

TEST_CASE("started all-reduces run while the caller goes on and finish at their waits", "[gpu]") {
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-started");
  CHECK(comm->overlaps_collectives());
  const int group[] = {0};
  // Two buckets started back to back, then a transfer, then the waits.
  const std::vector<float> a = cuda::testing::RandomNormal(1 << 20, 5), b = cuda::testing::RandomNormal(4099, 6);
  DeviceArray<float> da(a), db(b);
  auto first = comm->StartAllReduceSum(group, da.get(), a.size(), In(30));
  auto second = comm->StartAllReduceSum(group, db.get(), b.size(), In(30));
  REQUIRE(first.ok());
  REQUIRE(second.ok());
  std::vector<uint8_t> payload(4096, 7);
  DeviceArray<uint8_t> src(payload), dst(payload.size());
  dst.Zero();
  REQUIRE(comm->GroupStart().ok());
  auto send = comm->Send(0, 1, src.get(), payload.size());
  auto recv = comm->Recv(0, 1, dst.get(), payload.size());
  REQUIRE(comm->GroupEnd().ok());
  REQUIRE(send.ok());
  REQUIRE(recv.ok());
  REQUIRE((*second)->Wait(In(30)).ok());
  REQUIRE((*first)->Wait(In(30)).ok());
  REQUIRE((*send)->Wait(In(30)).ok());
  REQUIRE((*recv)->Wait(In(30)).ok());
  CHECK(da.Download() == a);
  CHECK(db.Download() == b);
  CHECK(dst.Download() == payload);
  // Nothing to reduce: complete at once; a non-member: refused at the start.
  auto empty = comm->StartAllReduceSum(group, da.get(), 0, In(1));
  REQUIRE(empty.ok());
  CHECK((*empty)->Wait(In(1)).ok());
  const int stranger[] = {1};
  CHECK(absl::IsInvalidArgument(comm->StartAllReduceSum(stranger, da.get(), 1, In(1)).status()));
}

TEST_CASE("transfers started without a group launch together at the first wait", "[gpu]") {
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-lazy");
  const size_t bytes = 3 << 20;  // larger than NCCL's buffers: one by one this would deadlock
  std::vector<uint8_t> payload(bytes);
  for (size_t i = 0; i < bytes; ++i) payload[i] = static_cast<uint8_t>(i * 7 + 3);
  DeviceArray<uint8_t> src(payload), dst(bytes);
  auto send = comm->Send(0, 1, src.get(), bytes);
  auto recv = comm->Recv(0, 1, dst.get(), bytes);
  REQUIRE(send.ok());
  REQUIRE(recv.ok());
  REQUIRE((*recv)->Wait(In(30)).ok());  // launches the send with it
  REQUIRE((*send)->Wait(In(30)).ok());
  // Copied on a stream of its own after the waits: an early completion event
  // would show here (no device-wide synchronisation hides it).
  cuda::testing::Stream copy;
  std::vector<uint8_t> got(bytes);
  CUDA_REQUIRE(cudaMemcpyAsync(got.data(), dst.get(), bytes, cudaMemcpyDeviceToHost, copy.get()));
  copy.Sync();
  CHECK(got == payload);

  // A request dropped before launch is forgotten, not an abort.
  {
    auto dropped = comm->Send(0, 2, src.get(), 16);
    REQUIRE(dropped.ok());
  }
  auto s2 = comm->Send(0, 3, src.get(), 64);
  auto r2 = comm->Recv(0, 3, dst.get(), 64);
  REQUIRE(s2.ok());
  REQUIRE(r2.ok());
  CHECK((*r2)->Wait(In(30)).ok());
  CHECK((*s2)->Wait(In(30)).ok());
}

TEST_CASE("a transfer that cannot start ends at its deadline, naming the peer, and aborts the rest", "[gpu]") {
  cuda::testing::Stream compute;
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-b", compute.get());
  DeviceArray<uint8_t> src(4096), dst(4096);
  Gate gate;
  gate.Block(compute.get());  // the data is "never produced"
  REQUIRE(comm->GroupStart().ok());
  auto send = comm->Send(0, 1, src.get(), 4096);
  auto recv = comm->Recv(0, 1, dst.get(), 4096);
  REQUIRE(send.ok());
  REQUIRE(recv.ok());
  REQUIRE(comm->GroupEnd().ok());
  // ncclCommAbort may wait for NCCL's streams, which wait for the gate.
  std::thread opener([&gate] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    gate.Open();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = (*recv)->Wait(start + absl::Seconds(1));
  const absl::Duration took = absl::Now() - start;
  opener.join();
  INFO(s.ToString() << " after " << absl::FormatDuration(took));
  CHECK(absl::IsDeadlineExceeded(s));
  CHECK(LostPeer(s) == std::optional<int>(0));
  CHECK(took < absl::Seconds(15));  // the deadline plus ncclCommAbort
  CHECK((*recv)->Wait(In(1)) == s);  // final
  // The send half of the exchange was not seen complete before the abort:
  // ABORTED, naming the cause's peer (its own event may complete once the
  // aborted kernels exit, which says nothing about its data).
  const absl::Status sent = (*send)->Wait(In(1));
  INFO(sent.ToString());
  CHECK(absl::IsAborted(sent));
  CHECK(LostPeer(sent) == std::optional<int>(0));  // the cause's peer
  auto again = comm->Send(0, 1, src.get(), 4096);
  CHECK(absl::IsAborted(again.status()));
  compute.Sync();
}

TEST_CASE("Abort from another thread ends a wait promptly without blaming a peer", "[gpu]") {
  cuda::testing::Stream compute;
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-d", compute.get());
  DeviceArray<uint8_t> src(4096), dst(4096);
  Gate gate;
  gate.Block(compute.get());
  REQUIRE(comm->GroupStart().ok());
  auto send = comm->Send(0, 1, src.get(), 4096);
  auto recv = comm->Recv(0, 1, dst.get(), 4096);
  REQUIRE(comm->GroupEnd().ok());
  // Abort returns once NCCL no longer touches the buffers, which here means
  // once the gate opens (the blocked kernels can exit): that comes 1.5 s
  // after the abort. The wait must not wait for it.
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    comm->Abort();
  });
  std::thread opener([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1800));
    gate.Open();
  });
  const absl::Time start = absl::Now();
  const absl::Status s = (*recv)->Wait(In(30));
  const absl::Duration took = absl::Now() - start;
  stopper.join();
  opener.join();
  INFO(s.ToString() << " after " << absl::FormatDuration(took));
  CHECK(absl::IsAborted(s));
  CHECK(!LostPeer(s).has_value());
  CHECK(took < absl::Milliseconds(300) + absl::Seconds(2));  // the abort's time plus 2 s at most
  // The send, launched with it, ends ABORTED too, whatever its event does.
  const absl::Status sent = (*send)->Wait(In(1));
  INFO(sent.ToString());
  CHECK(absl::IsAborted(sent));
  compute.Sync();
}

TEST_CASE("one NCCL rank reduce-scatters and all-gathers over itself (ZeRO-1's collectives)", "[gpu]") {
  cuda::testing::Stream compute;
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-z", compute.get());
  std::vector<float> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = 0.25f * static_cast<float>(i);
  DeviceArray<float> data(host);
  const int group[] = {0};
  const size_t counts[] = {host.size()};
  auto rs = comm->StartReduceScatterSum(group, data.get(), counts, In(30));
  REQUIRE(rs.ok());
  CHECK((*rs)->Wait(In(30)).ok());
  auto ag = comm->StartAllGather(group, data.get(), counts, In(30));
  REQUIRE(ag.ok());
  CHECK((*ag)->Wait(In(30)).ok());
  CHECK(data.Download() == host);  // a sum over one rank, gathered from one rank
  const size_t wrong[] = {10, 20};
  CHECK(absl::IsInvalidArgument(comm->StartAllGather(group, data.get(), wrong, In(1)).status()));
}

TEST_CASE("groups pair up and a wait inside one is refused", "[gpu]") {
  MemoryKeyValueStore store;
  auto comm = OneRank(&store, "job-e");
  CHECK(absl::IsFailedPrecondition(comm->GroupEnd()));
  REQUIRE(comm->GroupStart().ok());
  CHECK(absl::IsFailedPrecondition(comm->GroupStart()));
  DeviceArray<uint8_t> buf(64);
  auto send = comm->Send(0, 1, buf.get(), 64);
  REQUIRE(send.ok());
  CHECK(absl::IsFailedPrecondition((*send)->Wait(In(1))));
  const int group[] = {0};
  DeviceArray<float> f(std::vector<float>{1.0f});
  CHECK(absl::IsFailedPrecondition(comm->AllReduceSum(group, f.get(), 1, In(1))));
  auto recv = comm->Recv(0, 1, buf.get(), 64);
  REQUIRE(comm->GroupEnd().ok());
  CHECK((*send)->Wait(In(30)).ok());
  CHECK((*recv)->Wait(In(30)).ok());
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
