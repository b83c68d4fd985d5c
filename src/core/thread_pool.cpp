#include "cisa/core/thread_pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CISA_PAUSE() _mm_pause()
#else
#define CISA_PAUSE() std::this_thread::yield()
#endif

namespace cisa {

namespace {
// Iterations of a pause loop before blocking (~50 µs on current x86 cores).
constexpr int kSpinIterations = 2000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  if (num_threads <= 0) num_threads = 1;
  for (int t = 1; t < num_threads; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_tasks(int thread) {
  for (;;) {
    int64_t task = next_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_) break;
    thunk_(fn_, task, thread);
  }
}

void ThreadPool::worker_loop(int thread) {
  uint64_t seen = 0;
  for (;;) {
    for (int i = 0; i < kSpinIterations && generation_.load(std::memory_order_acquire) == seen &&
                    !stop_.load(std::memory_order_relaxed);
         ++i)
      CISA_PAUSE();
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      if (stop_) return;
      seen = generation_.load();
    }
    run_tasks(thread);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (active_.fetch_sub(1) == 1) done_.notify_one();
    }
  }
}

void ThreadPool::run(int64_t n, void* fn, Thunk thunk) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t t = 0; t < n; ++t) thunk(fn, t, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    fn_ = fn;
    thunk_ = thunk;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    active_.store(static_cast<int>(workers_.size()));
    generation_.fetch_add(1, std::memory_order_release);
  }
  wake_.notify_all();
  run_tasks(0);
  for (int i = 0; i < kSpinIterations && active_.load(std::memory_order_acquire) != 0; ++i)
    CISA_PAUSE();
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return active_.load() == 0; });
  fn_ = nullptr;
}

}  // namespace cisa
