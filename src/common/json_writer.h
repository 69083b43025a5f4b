#pragma once

// One way to write JSON: compact (no spaces), keys in the order written,
// strings escaped per RFC 8259, numbers as the caller formats them (fixed
// decimals or integers), non-finite numbers as null. Used by every status
// endpoint, `dynapipe plan --json` and the Chrome traces; protobuf messages
// go through ToJson (proto_io.h) instead.
//
//   JsonWriter w;
//   w.BeginObject().Str("job_id", id).Int("rank", 3).Fixed("loss", 2.5, 3);
//   w.Key("recent").BeginArray().Int(1).Int(2).EndArray().EndObject();
//   w.str()  // {"job_id":"j","rank":3,"loss":2.500,"recent":[1,2]}

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dynapipe {

// `v` as a JSON string literal, quotes included.
std::string JsonString(std::string_view v);

class JsonWriter {
 public:
  JsonWriter& BeginObject() { return Open('{'); }
  JsonWriter& EndObject() { return Close('}'); }
  JsonWriter& BeginArray() { return Open('['); }
  JsonWriter& EndArray() { return Close(']'); }
  // The key of the next value (inside an object).
  JsonWriter& Key(std::string_view key);

  JsonWriter& String(std::string_view v);
  JsonWriter& Int(int64_t v);
  // printf's "%.<decimals>f"; null when not finite.
  JsonWriter& Fixed(double v, int decimals);
  JsonWriter& Bool(bool v);
  JsonWriter& Null();
  // A value already written as JSON (e.g. by ToJson or another writer).
  JsonWriter& Raw(std::string_view json);

  // A key and its value.
  JsonWriter& Str(std::string_view key, std::string_view v) { return Key(key).String(v); }
  JsonWriter& Int(std::string_view key, int64_t v) { return Key(key).Int(v); }
  JsonWriter& Fixed(std::string_view key, double v, int decimals) { return Key(key).Fixed(v, decimals); }
  JsonWriter& Bool(std::string_view key, bool v) { return Key(key).Bool(v); }
  JsonWriter& Raw(std::string_view key, std::string_view json) { return Key(key).Raw(json); }

  const std::string& str() const { return out_; }
  std::string Take() { return std::move(out_); }

 private:
  // Writes the separator a new value or key needs in the current container.
  void Separate();
  JsonWriter& Open(char bracket);
  JsonWriter& Close(char bracket);

  std::string out_;
  std::vector<bool> has_items_;  // per open container: something written already
  bool after_key_ = false;
};

}  // namespace dynapipe
