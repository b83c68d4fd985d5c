// cisa/core/thread_pool.h — a fixed set of worker threads for data-parallel loops.
//
// Owned by whoever runs work (an engine, a model, a benchmark); there is no global pool.
//
//   cisa::ThreadPool pool(0);                        // 0: one thread per hardware thread
//   pool.parallel_for(n_tasks, [&](int64_t task, int thread) { work(task, scratch[thread]); });
//
// parallel_for blocks until every task ran. Idle workers spin for a few tens of microseconds before
// sleeping, so the back-to-back loops of a decode step do not pay a wake-up each. Tasks are handed
// out dynamically (an atomic counter), so uneven tasks balance. The calling thread takes part as
// thread 0. Not re-entrant: a task must not call parallel_for on the same pool.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace cisa {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Runs fn(task, thread) for task in [0, n); thread is in [0, num_threads()).
  // Takes any callable by reference: no std::function, so no allocation per call.
  template <class F>
  void parallel_for(int64_t n, F&& fn) {
    using Fn = std::remove_reference_t<F>;
    run(n, const_cast<void*>(static_cast<const void*>(&fn)),
        [](void* f, int64_t task, int thread) { (*static_cast<Fn*>(f))(task, thread); });
  }

 private:
  using Thunk = void (*)(void*, int64_t, int);
  void run(int64_t n, void* fn, Thunk thunk);
  void worker_loop(int thread);
  void run_tasks(int thread);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  void* fn_ = nullptr;
  Thunk thunk_ = nullptr;
  int64_t n_ = 0;
  std::atomic<int64_t> next_{0};
  // Written under mu_, read without it while spinning.
  std::atomic<int> active_{0};
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace cisa
