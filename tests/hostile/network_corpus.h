#pragma once

// Bytes for the daemons' sockets: malformed HTTP/1.1 requests for the status
// endpoint, junk and broken HTTP/2 for the gRPC port, and raw protobuf bytes
// for gRPC methods.

#include <string>
#include <vector>

namespace dynapipe::testing::hostile {

struct WireCase {
  std::string name;
  std::string bytes;
  // The client stops after `bytes` and holds the connection open: the daemon
  // must drop it by itself (HTTP) or keep serving others meanwhile (gRPC).
  bool stalls = false;
};

// Requests the status endpoint must answer with 4xx/5xx or by closing.
std::vector<WireCase> HttpCases();

// Bytes on the gRPC port that must be answered with a GOAWAY or a close.
std::vector<WireCase> GrpcWireCases();

// True when `bytes` (from a gRPC server) hold a complete HTTP/2 GOAWAY frame.
bool HasGoaway(const std::string& bytes);
// The HTTP/2 frames in `bytes`: "SETTINGS, SETTINGS(ack), GOAWAY(PROTOCOL_ERROR)".
std::string DescribeFrames(const std::string& bytes);

// Message bodies for unary gRPC methods that are not valid protobuf (or are,
// but nest 100,000 groups deep, or claim a field longer than the message).
std::vector<WireCase> ProtobufJunk(int random_cases);

}  // namespace dynapipe::testing::hostile
