#include "server/http/connection_pool.h"

#include <utility>

namespace winnow::server::http {
namespace {

// `accepted` as TaskQueue::enqueue's return type: bool, or nothing where it is void.
template <typename Result>
Result Accepted(bool accepted) {
  if constexpr (std::is_void_v<Result>) {
    return;
  } else {
    return accepted;
  }
}

}  // namespace

ConnectionPool::EnqueueResult ConnectionPool::enqueue(std::function<void()> fn) {
  base::MutexLock lock(&mu_);
  // Not reached in practice: httplib stops accepting before it shuts the queue down. Where
  // enqueue returns bool, false makes httplib close the connection.
  const bool accepted = !stopping_;
  if (accepted) {
    queue_.push_back(std::move(fn));
    const size_t waiting = queue_.size() - head_;
    if (waiting > idle_ && threads_.size() < max_threads_) {
      threads_.emplace_back([this] { Work(); });
    }
  }
  return Accepted<EnqueueResult>(accepted);
}

void ConnectionPool::Work() {
  for (;;) {
    std::function<void()> fn;
    {
      base::MutexLock lock(&mu_);
      ++idle_;
      auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return stopping_ || head_ < queue_.size();
      };
      mu_.Await(ready);
      --idle_;
      if (head_ == queue_.size()) return;  // stopping, nothing left
      fn = std::move(queue_[head_++]);
      if (head_ == queue_.size()) {
        queue_.clear();
        head_ = 0;
      }
    }
    fn();
  }
}

void ConnectionPool::shutdown() {
  std::vector<std::thread> threads;
  {
    base::MutexLock lock(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

}  // namespace winnow::server::http
