#pragma once

// Loading and printing proto messages as text (.pbtxt) or JSON. Every error
// names the source, the line and the field, e.g.
//   configs/jobs/x.pbtxt:3:3: Message type "dynapipe.proto.JobSpec" has no field named "iters".

#include <string>
#include "absl/strings/string_view.h"

#include "absl/status/status.h"
#include "google/protobuf/message.h"

namespace dynapipe {

// Parses protobuf text format. `source` names the text in errors.
absl::Status ParseTextProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message* message);

// Parses the protobuf JSON mapping (snake_case or lowerCamel names). Unknown
// fields are errors.
absl::Status ParseJsonProto(absl::string_view text, absl::string_view source,
                            google::protobuf::Message* message);

// Reads `path` and parses it by extension: .pbtxt/.textproto/.txtpb as text,
// .json as JSON. All errors are INVALID_ARGUMENT except I/O (NOT_FOUND, ...).
absl::Status LoadProtoFile(const std::string& path, google::protobuf::Message* message);

// LoadProtoFile for files a daemon reads on a remote caller's behalf: a parse
// error names the file, the line and the expected message type, but never
// echoes the file's text (a path may name a secret the caller cannot read).
absl::Status LoadProtoFileQuietly(const std::string& path, google::protobuf::Message* message);

// One-line or indented JSON with snake_case field names.
std::string ToJson(const google::protobuf::Message& message, bool pretty = false);

}  // namespace dynapipe
