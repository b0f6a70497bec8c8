#include "thread_pool.h"

#include <chrono>

namespace a2d {

namespace {

// A forward issues its parallel loops microseconds apart; waking a sleeping thread costs about as
// much, so threads poll this long before they sleep. Bounded, so an oversubscribed machine loses
// little.
constexpr std::chrono::microseconds kSpin{50};

template <typename Ready>
void spin_until(Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  while (!ready() && std::chrono::steady_clock::now() < deadline) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { work_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run_tasks(uint32_t generation) {
  for (;;) {
    uint64_t cursor = cursor_.load(std::memory_order_acquire);
    int64_t index;
    do {
      index = static_cast<int64_t>(cursor & 0xffffffffu);
      if ((cursor >> 32) != generation || index >= n_) return;
    } while (!cursor_.compare_exchange_weak(cursor, cursor + 1, std::memory_order_acq_rel));
    try {
      (*fn_)(index);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
    // The last task to finish wakes the caller; the caller re-checks under the lock.
    if (completed_.fetch_add(1, std::memory_order_acq_rel) + 1 == n_) {
      std::lock_guard<std::mutex> lock(mutex_);
      done_.notify_one();
    }
  }
}

void ThreadPool::work_loop() {
  uint32_t seen = 0;
  for (;;) {
    spin_until([&] { return (cursor_.load(std::memory_order_relaxed) >> 32) != seen; });
    uint32_t generation;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || (cursor_.load() >> 32) != seen; });
      if (stopping_) return;
      generation = static_cast<uint32_t>(cursor_.load() >> 32);
      seen = generation;
    }
    run_tasks(generation);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  uint32_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = static_cast<uint32_t>(cursor_.load() >> 32) + 1;
    // Close the previous generation before touching n_: a late worker that still holds its cursor
    // could otherwise compare an old index against the new n_ and claim a task that does not exist.
    cursor_.store((static_cast<uint64_t>(generation) << 32) | 0xffffffffu);
    fn_ = &fn;
    n_.store(n);
    error_ = nullptr;
    completed_.store(0);
    cursor_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks(generation);
  spin_until([&] { return completed_.load(std::memory_order_acquire) == n_; });
  // Wait for tasks, not for workers: a worker that has not woken yet finds nothing left and sleeps.
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return completed_.load(std::memory_order_acquire) == n_; });
  if (error_) std::rethrow_exception(error_);
}

}  // namespace a2d
