#include "src/common/proto_io.h"

#include <algorithm>
#include <cctype>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "src/common/file_util.h"
#include "src/common/status_macros.h"

namespace dynapipe {
namespace {

// The field a parser message names: `... field "x"` or `field named "x"`.
std::string NamedField(absl::string_view message) {
  const size_t at = message.rfind("field");
  if (at == absl::string_view::npos) return "";
  const size_t open = message.find('"', at);
  if (open == absl::string_view::npos) return "";
  const size_t close = message.find('"', open + 1);
  if (close == absl::string_view::npos) return "";
  return std::string(message.substr(open + 1, close - open - 1));
}

// The field a text-format line starts with ("  hidden: 3" -> "hidden").
std::string LeadingField(absl::string_view line) {
  size_t i = 0;
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  const size_t start = i;
  while (i < line.size() && (std::isalnum(static_cast<unsigned char>(line[i])) || line[i] == '_')) ++i;
  if (i == start) return "";
  const size_t name_end = i;
  while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
  if (i == line.size() || (line[i] != ':' && line[i] != '{' && line[i] != '<')) return "";
  return std::string(line.substr(start, name_end - start));
}

// Keeps the first error with its position (the parser reports 0-based lines).
class FirstErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column, const std::string& message) override {
    if (!has_error_) {
      has_error_ = true;
      line_ = line + 1;
      column_ = column + 1;
      message_ = message;
    }
  }
  void AddWarning(int, google::protobuf::io::ColumnNumber, const std::string&) override {}

  bool has_error() const { return has_error_; }

  // "source:line:col: message", with the line moved to where the named field
  // is written (the parser reports some errors one token late) and the field
  // named when the parser's message does not.
  std::string Describe(absl::string_view source, absl::string_view text) const {
    const std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
    int line = line_;
    int column = column_;
    std::string message = message_;
    const std::string named = NamedField(message_);
    if (!named.empty()) {
      for (int l = std::min<int>(line_, lines.size()); l >= 1; --l) {
        if (LeadingField(lines[l - 1]) == named) {
          column = line == l ? column : 1;
          line = l;
          break;
        }
      }
    } else if (line_ >= 1 && line_ <= static_cast<int>(lines.size())) {
      const std::string field = LeadingField(lines[line_ - 1]);
      if (!field.empty()) absl::StrAppend(&message, " (field \"", field, "\")");
    }
    return absl::StrCat(source, ":", line, ":", column, ": ", message);
  }

 private:
  bool has_error_ = false;
  int line_ = 0;
  int column_ = 0;
  std::string message_;
};

// The JSON parser reports a field path ("layers[0].kind: ...") but no
// position; find the line where the innermost named field first appears.
int LineOfJsonField(absl::string_view text, absl::string_view error) {
  const size_t colon = error.find(':');
  if (colon == absl::string_view::npos) return 0;
  absl::string_view path = error.substr(0, colon);
  if (path.find(' ') != absl::string_view::npos || path.empty()) return 0;
  const size_t dot = path.rfind('.');
  absl::string_view field = dot == absl::string_view::npos ? path : path.substr(dot + 1);
  if (const size_t bracket = field.find('['); bracket != absl::string_view::npos) field = field.substr(0, bracket);
  const size_t pos = text.find(absl::StrCat("\"", field, "\""));
  if (pos == absl::string_view::npos) return 0;
  int line = 1;
  for (size_t i = 0; i < pos; ++i) line += text[i] == '\n';
  return line;
}

}  // namespace

absl::Status ParseTextProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message* message) {
  google::protobuf::TextFormat::Parser parser;
  FirstErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), message)) {
    if (errors.has_error()) return absl::InvalidArgumentError(errors.Describe(source, text));
    return absl::InvalidArgumentError(absl::StrCat(source, ": cannot parse as ", message->GetTypeName()));
  }
  return absl::OkStatus();
}

absl::Status ParseJsonProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message* message) {
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = false;
  const auto status =
      google::protobuf::util::JsonStringToMessage(google::protobuf::StringPiece(text.data(), text.size()),
                                                  message, options);
  if (status.ok()) return absl::OkStatus();
  // The parser's message may go on with an excerpt of the input and a caret
  // line: keep the first line (an error is one line, and never echoes the file).
  std::string error(status.message());
  error = error.substr(0, error.find('\n'));
  const int line = LineOfJsonField(text, error);
  if (line > 0) return absl::InvalidArgumentError(absl::StrCat(source, ":", line, ": ", error));
  return absl::InvalidArgumentError(absl::StrCat(source, ": ", error));
}

absl::Status LoadProtoFile(const std::string& path, google::protobuf::Message* message) {
  ASSIGN_OR_RETURN(const std::string text, ReadFile(path));
  if (absl::EndsWith(path, ".json")) return ParseJsonProto(text, path, message);
  if (absl::EndsWith(path, ".pbtxt") || absl::EndsWith(path, ".textproto") || absl::EndsWith(path, ".txtpb")) {
    return ParseTextProto(text, path, message);
  }
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": unknown config extension (expected .pbtxt, .textproto, .txtpb or .json)"));
}

absl::Status LoadProtoFileQuietly(const std::string& path, google::protobuf::Message* message) {
  const absl::Status s = LoadProtoFile(path, message);
  if (s.ok() || s.code() != absl::StatusCode::kInvalidArgument) return s;
  // Parse errors read "path:line[:col]: message"; keep only the position.
  absl::string_view rest(s.message());
  int line = 0;
  if (absl::ConsumePrefix(&rest, path) && absl::ConsumePrefix(&rest, ":")) {
    while (!rest.empty() && rest[0] >= '0' && rest[0] <= '9' && line < 100000000) {
      line = line * 10 + (rest[0] - '0');
      rest.remove_prefix(1);
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(path, line > 0 ? absl::StrCat(":", line) : "", ": not a valid ",
                                                 message->GetTypeName(), " file"));
}

std::string ToJson(const google::protobuf::Message& message, bool pretty) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.add_whitespace = pretty;
  std::string out;
  // Printing a valid in-memory message cannot fail.
  const auto status = google::protobuf::util::MessageToJsonString(message, &out, options);
  DP_CHECK_MSG(status.ok(), std::string(status.message()));
  return out;
}

}  // namespace dynapipe
