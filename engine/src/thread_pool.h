// A small fixed pool for the CPU backend's data-parallel loops. The calling thread takes part, so a
// pool of N threads has N-1 workers.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace a2d {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(i) for every i in [0, n) across the pool and returns when all calls have returned. Not
  // reentrant: fn must not call parallel_for. An exception in fn is rethrown here.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  void work_loop();
  // Claims and runs tasks of `generation` until none is left.
  void run_tasks(uint32_t generation);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable done_;
  bool stopping_ = false;
  const std::function<void(int64_t)>* fn_ = nullptr;
  std::atomic<int64_t> n_{0};
  // High 32 bits: the generation (one per parallel_for); low 32 bits: the next task index. A worker
  // that wakes late can only claim tasks of the generation it read, so it never runs a stale fn.
  std::atomic<uint64_t> cursor_{0};
  std::atomic<int64_t> completed_{0};
  std::exception_ptr error_;
};

}  // namespace a2d
