#include "planner/service/plan_waiters.h"

#include <algorithm>

#include "absl/strings/str_split.h"

namespace dynapipe::planner::service {

void PlanWaiters::Add(PlanWait w) {
  auto ptr = std::make_shared<PlanWait>(std::move(w));
  {
    MutexLock lock(&mu_);
    if (!stopping_) {
      fired_.push_back(ptr->key);
      waits_.emplace(ptr->key, ptr);
      return;
    }
  }
  // Stopping: nobody would ever answer this call.
  ptr->expire(absl::UnavailableError("planner shutting down; retry"));
}

void PlanWaiters::Notify(const std::string& event) {
  MutexLock lock(&mu_);
  if (event == "reconnected") {
    wake_all_ = true;
    return;
  }
  fired_.push_back(event);
  std::vector<std::string> parts = absl::StrSplit(event, ' ');
  if (parts.size() >= 2 && parts[0] != "job") fired_.push_back("job " + parts[1]);
}

bool PlanWaiters::NextBatch(absl::Time* next_sweep, std::vector<std::shared_ptr<PlanWait>>* check) {
  MutexLock lock(&mu_);
  clock_->AwaitWithDeadline(
      &mu_, [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return !fired_.empty() || wake_all_ || stopping_; },
      *next_sweep);
  const absl::Time now = clock_->Now();
  if (wake_all_ || now >= *next_sweep) {
    *next_sweep = now + recheck_;
    wake_all_ = false;
    for (auto& [k, w] : waits_) check->push_back(w);
  } else {
    for (const std::string& e : fired_) {
      auto range = waits_.equal_range(e);
      for (auto it = range.first; it != range.second; ++it) check->push_back(it->second);
    }
  }
  fired_.clear();
  return !stopping_;
}

void PlanWaiters::Remove(const std::vector<std::shared_ptr<PlanWait>>& finished) {
  MutexLock lock(&mu_);
  for (auto& w : finished) {
    auto range = waits_.equal_range(w->key);
    for (auto it = range.first; it != range.second; ++it) {
      if (it->second == w) {
        waits_.erase(it);
        break;
      }
    }
  }
}

void PlanWaiters::Run() {
  absl::Time next_sweep = clock_->Now() + recheck_;
  while (true) {
    std::vector<std::shared_ptr<PlanWait>> check;
    if (!NextBatch(&next_sweep, &check)) break;
    std::sort(check.begin(), check.end());
    check.erase(std::unique(check.begin(), check.end()), check.end());
    std::vector<std::shared_ptr<PlanWait>> finished;
    const absl::Time now = clock_->Now();
    for (auto& w : check) {
      if (w->check()) {
        finished.push_back(w);
      } else if (now >= w->deadline) {
        w->expire(absl::DeadlineExceededError("deadline"));
        finished.push_back(w);
      }
    }
    if (!finished.empty()) Remove(finished);
  }
}

void PlanWaiters::Stop() {
  MutexLock lock(&mu_);
  stopping_ = true;
  wake_all_ = true;
}

void PlanWaiters::ExpireAll() {
  std::multimap<std::string, std::shared_ptr<PlanWait>> left;
  {
    MutexLock lock(&mu_);
    left.swap(waits_);
  }
  for (auto& [key, w] : left) w->expire(absl::UnavailableError("planner shutting down; retry"));
}

size_t PlanWaiters::size() const {
  MutexLock lock(&mu_);
  return waits_.size();
}

}  // namespace dynapipe::planner::service
