#include "src/common/json_writer.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>

namespace dynapipe {
namespace {

TEST_CASE("JsonWriter nests objects and arrays with commas only between items", "[json]") {
  JsonWriter w;
  w.BeginObject().Str("job_id", "7").Int("rank", -1).Fixed("loss", 2.5, 3).Bool("lost", false);
  w.Key("recent").BeginArray();
  w.BeginObject().Int("iteration", 1).EndObject();
  w.BeginObject().Int("iteration", 2).EndObject();
  w.EndArray();
  w.Key("empty").BeginArray().EndArray();
  w.Raw("proto", R"({"a":1})").EndObject();
  CHECK(w.str() == R"({"job_id":"7","rank":-1,"loss":2.500,"lost":false,)"
                   R"("recent":[{"iteration":1},{"iteration":2}],"empty":[],"proto":{"a":1}})");
}

TEST_CASE("JsonWriter escapes what JSON requires and writes non-finite numbers as null", "[json]") {
  CHECK(JsonString("a\"b\\c") == R"("a\"b\\c")");
  CHECK(JsonString("line\nnext\ttab\r") == R"("line\nnext\ttab\r")");
  CHECK(JsonString(std::string("\x01", 1)) == R"("\u0001")");
  CHECK(JsonString("ünï") == "\"ünï\"");  // UTF-8 passes through
  JsonWriter w;
  w.BeginArray().Fixed(std::nan(""), 3).Fixed(std::numeric_limits<double>::infinity(), 1).Fixed(0.12345, 4);
  w.EndArray();
  CHECK(w.str() == "[null,null,0.1235]");
}

}  // namespace
}  // namespace dynapipe
