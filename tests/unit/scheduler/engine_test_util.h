// A RequestSink that collects a request's stream for the engine tests, and waits for it with a
// timeout (a hung engine fails the test instead of hanging it).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "scheduler/request.h"

namespace winnow::testing_util {

class CollectingSink : public scheduler::RequestSink {
 public:
  void OnTokens(const scheduler::TokenEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    tokens_.insert(tokens_.end(), event.token_ids.begin(), event.token_ids.end());
    text_ += event.text;
    prompt_logprobs_.insert(prompt_logprobs_.end(), event.prompt_logprobs.begin(),
                            event.prompt_logprobs.end());
    cv_.notify_all();
  }
  void OnFinish(const scheduler::FinishEvent& event) override {
    std::lock_guard<std::mutex> lock(mu_);
    finish_ = event;
    done_ = true;
    ++finish_calls_;
    cv_.notify_all();
  }
  // Waits for OnFinish (fails the test after a generous timeout instead of hanging). Generous
  // for sanitizer builds on two busy cores: an ASan repeat-probe request once took over 120 s.
  static constexpr std::chrono::seconds kTimeout{300};
  bool WaitDone() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kTimeout, [this] { return done_; });
  }
  bool WaitTokens(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, kTimeout,
                        [&] { return done_ || tokens_.size() >= n; });
  }
  std::vector<int32_t> tokens() {
    std::lock_guard<std::mutex> lock(mu_);
    return tokens_;
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }
  std::vector<scheduler::TokenLogprob> prompt_logprobs() {
    std::lock_guard<std::mutex> lock(mu_);
    return prompt_logprobs_;
  }
  scheduler::FinishEvent finish() {
    std::lock_guard<std::mutex> lock(mu_);
    return finish_;
  }
  int finish_calls() {
    std::lock_guard<std::mutex> lock(mu_);
    return finish_calls_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int32_t> tokens_;
  std::string text_;
  std::vector<scheduler::TokenLogprob> prompt_logprobs_;
  scheduler::FinishEvent finish_;
  bool done_ = false;
  int finish_calls_ = 0;
};

}  // namespace winnow::testing_util
