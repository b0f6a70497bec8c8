#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>

#include "thread_pool.h"

using namespace a2d;

TEST_CASE("thread pool: every task runs exactly once across many back-to-back loops") {
  // Back-to-back loops of varying size are where a late worker could claim a task of the next loop.
  ThreadPool pool(16);
  std::atomic<int64_t> sum{0};
  int64_t want = 0;
  for (int it = 0; it < 50000; ++it) {
    const int64_t n = 2 + it % 37;
    pool.parallel_for(n, [&](int64_t i) { sum += i + 1; });
    want += n * (n + 1) / 2;
  }
  CHECK(sum.load() == want);
}

TEST_CASE("thread pool: an exception in a task is rethrown to the caller, and the pool stays usable") {
  ThreadPool pool(4);
  CHECK_THROWS_WITH(pool.parallel_for(100, [](int64_t i) { if (i == 57) throw std::runtime_error("task 57 failed"); }),
                    "task 57 failed");
  std::atomic<int> count{0};
  pool.parallel_for(100, [&](int64_t) { ++count; });
  CHECK(count.load() == 100);
}
