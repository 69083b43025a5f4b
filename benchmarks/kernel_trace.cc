#include "benchmarks/kernel_trace.h"

#include <cupti.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"

namespace dynapipe::benchmarks {
namespace {

struct Cupti {
  CUptiResult (*RegisterCallbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc) = nullptr;
  CUptiResult (*Enable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*Disable)(CUpti_ActivityKind) = nullptr;
  CUptiResult (*FlushAll)(uint32_t) = nullptr;
  CUptiResult (*GetNextRecord)(uint8_t*, size_t, CUpti_Activity**) = nullptr;
  CUptiResult (*GetResultString)(CUptiResult, const char**) = nullptr;

  absl::Status Check(CUptiResult r, const char* what) const {
    if (r == CUPTI_SUCCESS) return absl::OkStatus();
    const char* s = "?";
    if (GetResultString != nullptr) GetResultString(r, &s);
    return absl::InternalError(absl::StrCat(what, ": ", s));
  }
};

absl::StatusOr<const Cupti*> LoadCupti() {
  static const absl::StatusOr<Cupti>* const loaded = [] {
    void* lib = nullptr;
    for (const char* name : {"libcupti.so.13", "libcupti.so"}) {
      if ((lib = dlopen(name, RTLD_NOW | RTLD_LOCAL)) != nullptr) break;
    }
    if (lib == nullptr) {
      return new absl::StatusOr<Cupti>(absl::FailedPreconditionError(
          "--kernel-trace: CUPTI (libcupti.so.13) is not loadable; bin/dynapipe-env adds the toolkit's or "
          "Python's nvidia-cuda-cupti directory"));
    }
    Cupti c;
    auto get = [lib](const char* name) { return dlsym(lib, name); };
    c.RegisterCallbacks = reinterpret_cast<decltype(c.RegisterCallbacks)>(get("cuptiActivityRegisterCallbacks"));
    c.Enable = reinterpret_cast<decltype(c.Enable)>(get("cuptiActivityEnable"));
    c.Disable = reinterpret_cast<decltype(c.Disable)>(get("cuptiActivityDisable"));
    c.FlushAll = reinterpret_cast<decltype(c.FlushAll)>(get("cuptiActivityFlushAll"));
    c.GetNextRecord = reinterpret_cast<decltype(c.GetNextRecord)>(get("cuptiActivityGetNextRecord"));
    c.GetResultString = reinterpret_cast<decltype(c.GetResultString)>(get("cuptiGetResultString"));
    if (c.RegisterCallbacks == nullptr || c.Enable == nullptr || c.Disable == nullptr || c.FlushAll == nullptr ||
        c.GetNextRecord == nullptr) {
      return new absl::StatusOr<Cupti>(absl::FailedPreconditionError("--kernel-trace: CUPTI lacks an entry point"));
    }
    return new absl::StatusOr<Cupti>(c);
  }();
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

// What the buffer callbacks collect (CUPTI calls them from its own threads).
std::mutex g_mu;
std::vector<KernelTime>* g_records = nullptr;  // guarded by g_mu; null when no trace runs
bool g_trace_running = false;                  // guarded by g_mu

constexpr size_t kBufferBytes = size_t{8} << 20;

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *size = kBufferBytes;
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  const absl::StatusOr<const Cupti*> cupti = LoadCupti();
  std::vector<KernelTime> got;
  CUpti_Activity* record = nullptr;
  while (cupti.ok() && (*cupti)->GetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        got.push_back({k->name != nullptr ? k->name : "?", static_cast<int64_t>(k->end - k->start)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        got.push_back({"[memcpy]", static_cast<int64_t>(m->end - m->start)});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        got.push_back({"[memset]", static_cast<int64_t>(m->end - m->start)});
        break;
      }
      default:
        break;
    }
  }
  std::free(buffer);
  std::lock_guard<std::mutex> l(g_mu);
  if (g_records != nullptr) g_records->insert(g_records->end(), got.begin(), got.end());
}

constexpr CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_MEMCPY,
                                         CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start() {
  const absl::StatusOr<const Cupti*> c = LoadCupti();
  if (!c.ok()) return c.status();
  {
    std::lock_guard<std::mutex> l(g_mu);
    if (g_trace_running) return absl::FailedPreconditionError("--kernel-trace: a trace is already running");
    g_trace_running = true;
    g_records = new std::vector<KernelTime>();
  }
  std::unique_ptr<KernelTrace> t(new KernelTrace());
  static std::once_flag registered;
  absl::Status reg;
  std::call_once(registered, [&] { reg = (*c)->Check((*c)->RegisterCallbacks(BufferRequested, BufferCompleted),
                                                     "cuptiActivityRegisterCallbacks"); });
  if (!reg.ok()) return reg;
  for (CUpti_ActivityKind k : kKinds) {
    if (absl::Status s = (*c)->Check((*c)->Enable(k), "cuptiActivityEnable"); !s.ok()) return s;
  }
  return t;
}

absl::StatusOr<std::vector<KernelTime>> KernelTrace::Stop() {
  const absl::StatusOr<const Cupti*> c = LoadCupti();
  if (!c.ok()) return c.status();
  if (stopped_) return absl::FailedPreconditionError("KernelTrace::Stop: stopped already");
  stopped_ = true;
  for (CUpti_ActivityKind k : kKinds) (*c)->Disable(k);
  // Forced: incomplete buffers too, so every record of the stretch arrives now.
  if (absl::Status s = (*c)->Check((*c)->FlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "cuptiActivityFlushAll");
      !s.ok()) {
    return s;
  }
  std::lock_guard<std::mutex> l(g_mu);
  std::vector<KernelTime> out = std::move(*g_records);
  delete g_records;
  g_records = nullptr;
  g_trace_running = false;
  return out;
}

KernelTrace::~KernelTrace() {
  if (!stopped_) (void)Stop();
}

}  // namespace dynapipe::benchmarks
