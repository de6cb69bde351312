// Native parts of the trie that need C++ objects the GIL never touches.
//
// Why a C++ thread and not a Python one: a Python inserter thread takes the
// GIL to dequeue and dispatch every job, so each insert forces GIL hand-offs
// (and context switches) onto the decode thread that is drafting.  Measured
// on a warm 1M-token history, that doubled the p99 of a batch-4 decode step.
// Here the queue, the thread and the jobs' lifetimes are all native: a job
// owns a shared_ptr to the store it writes, so a store freed by Python while
// its prompt is still being indexed stays alive until the job is done.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <thread>
#include <vector>

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#ifdef __linux__
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace lookahead {

// Arrays of 2 MiB or more go on transparent huge pages where the kernel
// offers them (THP "madvise" or "always").  The shared history's stream and
// index are tens of MiB that every draft reads at random, one chain step at
// a time: with 4 KiB pages nearly each step is a TLB miss too, and in a VM
// a TLB miss walks two levels of page tables.
//
// Memory comes zeroed, and resize() without a value leaves it as it is: a
// request store's index (4.5 MB for a 32k-token prompt) is then zero pages
// that the kernel maps when the insert thread first writes them, instead of
// being cleared, page fault by page fault, on the thread that called
// put_prompt (2.7 ms there for 32k tokens).
template <class T>
struct HugePageAllocator {
  using value_type = T;
  static constexpr size_t kHuge = size_t(2) << 20;
  HugePageAllocator() noexcept = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    size_t bytes = n * sizeof(T);
    void* p = nullptr;
#ifdef MADV_HUGEPAGE
    if (bytes >= kHuge) {
      bytes = (bytes + kHuge - 1) & ~(kHuge - 1);
      if (posix_memalign(&p, kHuge, bytes) != 0) throw std::bad_alloc();
      madvise(p, bytes, MADV_HUGEPAGE);  // advice only: 4 KiB pages if refused
      std::memset(p, 0, bytes);
      return static_cast<T*>(p);
    }
#endif
    // calloc skips clearing memory fresh from the kernel (already zero).
    if (!(p = std::calloc(bytes ? bytes : 1, 1))) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  // Default-initialise (for integers: leave the zeroed memory alone); a
  // value given explicitly (resize(n, v), assign(n, v)) is still written.
  template <class U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept { return true; }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept { return false; }
};
template <class T>
using BigVector = std::vector<T, HugePageAllocator<T>>;

// One token stream and its n-gram occurrence index (see TokenStore in
// _trie.pyx, which holds one of these and implements its operations).
struct NativeStore {
  BigVector<int32_t> tok;
  std::vector<BigVector<uint32_t>> prev;  // per order: distance to previous occurrence (0: none)
  std::vector<BigVector<uint32_t>> head;  // per order: hash slot -> (position + 1) mod 2**32
  int64_t n = 0;          // tokens appended
  int64_t n_indexed = 0;  // positions linked into the chains
  int64_t run = 0;        // consecutive non-separator tokens ending at n_indexed - 1
  int64_t cap = 0;
  uint64_t mask = 0;
  int hbits = 0;
  bool ring = false;
  int norders = 0;
  int orders[8] = {0};
  // Writers lock it exclusively, one bounded chunk at a time; drafts only
  // try a shared lock and skip a store that is being written right now,
  // so no draft ever waits for an insert (whatever the thread priorities).
  std::shared_mutex mtx;
};

typedef std::shared_ptr<NativeStore> StorePtr;

// Reserve room for a request store to grow to ``cap`` tokens and 2**hbits
// hash slots per order, before anything is resized: a std::bad_alloc then
// leaves the store as it was (reserve changes nothing when it throws), and
// the resizes that follow do not allocate.  Returns false when out of memory.
inline bool reserve_store(NativeStore* s, int64_t cap, int hbits) noexcept {
  try {
    s->tok.reserve(static_cast<size_t>(cap));
    for (auto& links : s->prev) links.reserve(static_cast<size_t>(cap));
    for (auto& heads : s->head) heads.reserve(size_t(1) << hbits);
    return true;
  } catch (const std::bad_alloc&) {
    return false;
  }
}

// Size a new store's arrays from its capacity, hash bits and orders: every
// token a separator (-1, SEPARATOR in _trie.pyx), every link and chain head
// empty (0, as the allocator hands them out: not written here).  A
// std::bad_alloc reaches Python as MemoryError (declared ``except +``), so a
// memory budget the process cannot hold is an error, not an abort.
inline void allocate_store(NativeStore* s) {
  s->tok.assign(static_cast<size_t>(s->cap), -1);
  s->prev.resize(s->norders);
  s->head.resize(s->norders);
  for (int o = 0; o < s->norders; ++o) {
    s->prev[o].resize(static_cast<size_t>(s->cap));
    s->head[o].resize(size_t(1) << s->hbits);
  }
}

// Drafts take priority over indexing.  Both are memory-bound, and the cores
// a server gives its scheduler often share caches and execution units (SMT
// siblings, vCPUs of one host core): on this project's 2-vCPU machines a
// busy second vCPU makes a draft up to twice as slow.  So while a draft is
// running anywhere in the process, the insert thread waits before each chunk
// of a prompt it indexes, at most kMaxYieldUs per chunk, so that indexing
// still progresses under back-to-back drafts.  A server drafts for a small
// fraction of each step, so indexing hardly slows; shares of output into
// the history are a few chunks each and do not wait.
inline std::atomic<int>& drafts_running() {
  static std::atomic<int> count{0};
  return count;
}
inline bool& on_insert_thread() {
  thread_local bool flag = false;
  return flag;
}
inline void draft_begin() { drafts_running().fetch_add(1, std::memory_order_relaxed); }
inline void draft_end() { drafts_running().fetch_sub(1, std::memory_order_relaxed); }
inline int drafts_in_progress() { return drafts_running().load(std::memory_order_relaxed); }
inline void yield_to_drafts() {
  constexpr int kSleepUs = 10, kMaxYieldUs = 1000;
  if (!on_insert_thread()) return;  // inline inserts (background=False) are the caller's own work
  for (int waited = 0; waited < kMaxYieldUs && drafts_in_progress() > 0; waited += kSleepUs)
    std::this_thread::sleep_for(std::chrono::microseconds(kSleepUs));
}

// What a job does to its store: append ``count`` tokens and index them, or
// (``index_pending``) index what was appended earlier.  Implemented in Cython.
typedef void (*ApplyFn)(NativeStore* store, const int32_t* tokens, int64_t count, int index_pending);

// A single thread applying inserts in submission order, so that the same
// calls give the same shared history on every run and every TP rank.
class InsertThread {
 public:
  InsertThread(ApplyFn apply, size_t max_pending) : apply_(apply), max_pending_(max_pending) {}
  ~InsertThread() { close(); }
  InsertThread(const InsertThread&) = delete;
  InsertThread& operator=(const InsertThread&) = delete;

  // Queue a job (the tokens are copied).  Past ``max_pending`` queued jobs
  // the caller waits until the backlog is half gone: bounded memory.  An
  // ``urgent`` job wakes the thread at once; another (a share of output
  // into the history, which no draft waits for) is picked up at the
  // thread's next poll, within kPollMs while the cache is busy, so that a
  // decode step's flush costs no wake-up system call.
  void submit(const StorePtr& store, const int32_t* tokens, int64_t count, bool index_pending,
              bool urgent = true) {
    Job job{store, std::vector<int32_t>(tokens, tokens + (count > 0 ? count : 0)), index_pending};
    std::unique_lock<std::mutex> lock(mu_);
    if (!started_) {  // started lazily: nothing runs in a process that never inserts (or forks first)
      started_ = true;
      stopping_ = false;
      thread_ = std::thread(&InsertThread::loop, this);
    }
    if (queue_.size() >= max_pending_) {
      urgent_ = true;
      work_cv_.notify_one();
      done_cv_.wait(lock, [this] { return queue_.size() <= max_pending_ / 2; });
    }
    queue_.push_back(std::move(job));
    ++submitted_;
    bool wake = urgent || deep_sleep_;
    if (wake) urgent_ = true;
    lock.unlock();  // notify outside the lock: the woken thread does not block on it
    if (wake) work_cv_.notify_one();
  }

  // Wait until every job submitted before this call has been applied.
  void synchronize() {
    std::unique_lock<std::mutex> lock(mu_);
    uint64_t target = submitted_;
    if (completed_ < target) {
      urgent_ = true;
      work_cv_.notify_one();
    }
    done_cv_.wait(lock, [this, target] { return completed_ >= target; });
  }

  size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<size_t>(submitted_ - completed_);
  }

  uint64_t failures() {
    std::lock_guard<std::mutex> lock(mu_);
    return failures_;
  }

  // Apply what is queued, then stop the thread (a later submit restarts it).
  void close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!started_) return;
      stopping_ = true;
    }
    work_cv_.notify_one();
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    started_ = false;
  }

 private:
  struct Job {
    StorePtr store;
    std::vector<int32_t> tokens;
    bool index_pending;
  };

  void loop() {
#ifdef __linux__
    // Below the decode thread's priority: when the cores are busy, the
    // scheduler lets the decode step finish before this thread's inserts
    // (on Linux, nice applies to the calling thread alone).
    setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), kNice);
#endif
    on_insert_thread() = true;  // see yield_to_drafts
    std::unique_lock<std::mutex> lock(mu_);
    int idle_polls = 0;
    for (;;) {
      // Wait for an urgent job, or poll for others every kPollMs.
      while (queue_.empty() || (!urgent_ && !stopping_)) {
        if (queue_.empty()) {
          if (stopping_) return;  // everything is applied
          urgent_ = false;        // nothing left to hurry for
          if (idle_polls >= kIdlePolls) {
            // Idle for a while: no polling while the server has nothing to
            // do; the next submit wakes us.
            deep_sleep_ = true;
            work_cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
            deep_sleep_ = false;
            idle_polls = 0;
            urgent_ = true;
            continue;
          }
        }
        bool woken = work_cv_.wait_for(lock, std::chrono::milliseconds(kPollMs),
                                       [this] { return stopping_ || (urgent_ && !queue_.empty()); });
        if (!woken) {
          if (!queue_.empty()) break;  // a non-urgent job's turn
          ++idle_polls;
        }
      }
      idle_polls = 0;
      urgent_ = false;
      Job job = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      bool failed = false;
      try {
        apply_(job.store.get(), job.tokens.data(), static_cast<int64_t>(job.tokens.size()), job.index_pending);
      } catch (...) {  // out of memory: drop this insert, keep serving
        failed = true;
      }
      job.store.reset();  // may free the store: outside the queue's lock
      lock.lock();
      if (failed) ++failures_;
      ++completed_;
      if (!queue_.empty()) urgent_ = true;  // drain the backlog before polling again
      done_cv_.notify_all();
    }
  }

  static constexpr int kNice = 10;
  static constexpr int kPollMs = 2;       // how late a non-urgent job may start
  static constexpr int kIdlePolls = 500;  // polls without work before a deep sleep (1 s)
  ApplyFn apply_;
  size_t max_pending_;
  std::mutex mu_;
  std::condition_variable work_cv_, done_cv_;
  std::deque<Job> queue_;
  std::thread thread_;
  uint64_t submitted_ = 0, completed_ = 0, failures_ = 0;
  bool started_ = false, stopping_ = false, urgent_ = false, deep_sleep_ = false;
};

}  // namespace lookahead
