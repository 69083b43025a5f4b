// The exact bytes of each event kind (the trace files are compared byte for
// byte across changes), escaping of names, and the document around them.
#include "src/common/chrome_trace.h"

#include <catch2/catch.hpp>
#include <string>

namespace dynapipe {
namespace {

TEST_CASE("ChromeTraceWriter writes each phase with ph first, one event per line", "[json]") {
  ChromeTraceWriter t("ms");
  t.ProcessName(3, "rank 3");
  t.ProcessSortIndex(3, 3);
  t.ThreadName(3, 2, "comm");
  const std::pair<std::string_view, int64_t> args[] = {{"instruction", 4}, {"micro_batch", 1}};
  t.Complete("forward mb 1", "compute", 3, 1, 1.5, 2, args);
  t.Complete("F0 c0", "", 1000, 0, 0, 8644.8041);
  t.Counter("peak memory (MB)", 3, 0, {{"measured", 100}, {"planned", 99.5}});
  t.FlowStart(1, "activation mb 0", "transfer", 0, 2, 0.25);
  t.FlowEnd(1, "activation mb 0", "transfer", 1, 2, 7.25);
  CHECK(t.events() == 8);
  CHECK(t.Finish() ==
        "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n"
        R"({"ph":"M","name":"process_name","pid":3,"args":{"name":"rank 3"}},)" "\n"
        R"({"ph":"M","name":"process_sort_index","pid":3,"args":{"sort_index":3}},)" "\n"
        R"({"ph":"M","name":"thread_name","pid":3,"tid":2,"args":{"name":"comm"}},)" "\n"
        R"({"ph":"X","name":"forward mb 1","cat":"compute","pid":3,"tid":1,"ts":1.500,"dur":2.000,)"
        R"("args":{"instruction":4,"micro_batch":1}},)" "\n"
        R"({"ph":"X","name":"F0 c0","pid":1000,"tid":0,"ts":0.000,"dur":8644.804},)" "\n"
        R"j({"ph":"C","name":"peak memory (MB)","pid":3,"ts":0.000,"args":{"measured":100.000,"planned":99.500}},)j" "\n"
        R"({"ph":"s","id":1,"name":"activation mb 0","cat":"transfer","pid":0,"tid":2,"ts":0.250},)" "\n"
        R"({"ph":"f","bp":"e","id":1,"name":"activation mb 0","cat":"transfer","pid":1,"tid":2,"ts":7.250})" "\n"
        "]}\n");
}

TEST_CASE("ChromeTraceWriter escapes names and writes an empty trace as an empty array", "[json]") {
  ChromeTraceWriter t;
  CHECK(t.Finish() == "{\"traceEvents\":[\n\n]}\n");
  t.ProcessName(0, "a \"quoted\"\tname\x01");
  t.Complete("back\\slash\nline", "", 0, 0, 1, 1);
  CHECK(t.Finish() ==
        "{\"traceEvents\":[\n"
        R"({"ph":"M","name":"process_name","pid":0,"args":{"name":"a \"quoted\"\tname\u0001"}},)" "\n"
        R"({"ph":"X","name":"back\\slash\nline","pid":0,"tid":0,"ts":1.000,"dur":1.000})" "\n"
        "]}\n");
}

}  // namespace
}  // namespace dynapipe
