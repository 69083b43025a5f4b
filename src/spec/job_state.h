#pragma once

// Job states every side agrees on: the planner's store, the client.

#include "proto/services.pb.h"

namespace dynapipe::spec {

// Succeeded, failed and cancelled jobs never change state again.
inline bool IsTerminal(proto::JobState::Value s) {
  return s == proto::JobState::succeeded || s == proto::JobState::failed || s == proto::JobState::cancelled;
}

}  // namespace dynapipe::spec
