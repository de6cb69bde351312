// Native parts of the trie that need C++ objects the GIL never touches.
//
// Why a C++ thread and not a Python one: a Python inserter thread takes the
// GIL to dequeue and dispatch every job, so each insert forces GIL hand-offs
// (and context switches) onto the decode thread that is drafting, and the
// decode step waits for them.  Here the queue, the thread and the jobs' lifetimes are all native: a job
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
// request store's index (megabytes, for a long prompt) is then zero pages
// that the kernel maps when the insert thread first writes them, instead of
// being cleared, page fault by page fault, on the thread that called
// put_prompt.
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
// _store.pyx, which holds one of these and implements its operations).
struct NativeStore {
  BigVector<int32_t> tok;
  std::vector<BigVector<uint32_t>> prev;  // per order: distance to previous occurrence (0: none)
  std::vector<BigVector<uint32_t>> head;  // per order: chain key -> (position + 1) mod 2**32
  std::vector<BigVector<uint64_t>> smap;  // per order, while ``sparse``: the heads as a map (see map_find)
  int64_t n = 0;          // tokens appended
  int64_t n_indexed = 0;  // positions linked into the chains
  int64_t run = 0;        // consecutive non-separator tokens ending at n_indexed - 1
  int64_t cap = 0;
  int64_t lo = 0;         // no position below this is live (a resize dropped them; see store_base)
  uint64_t mask = 0;
  int hbits = 0;          // a chain's key: the top hbits bits of its n-gram's hash
  int mbits = 0;          // while ``sparse``: log2 of the map's buckets per order
  int64_t used[8] = {0};  // while ``sparse``: buckets in use per order (live or stale)
  bool ring = false;
  bool scoped = false;    // a scope's history: resized by resize_store, its key width fixed
  bool sparse = false;
  // A store that no longer changes (a corpus piece, once loaded): its chains
  // laid out one after another instead of linked (see _freeze_order in
  // _store.pyx), order by order.  A frozen order's head and prev are empty;
  // its chain of key k is
  // occ[o][cstart[o][k] .. cstart[o][k + 1]), newest first, the same
  // positions in the same order as the links would give, but read from
  // consecutive memory: a draft knows the next positions before it reaches
  // them and loads their tokens at once, instead of one cache miss per step.
  uint32_t frozen = 0;  // bit o: order o is laid out so
  std::vector<BigVector<uint32_t>> cstart;  // per order, while frozen: 2**hbits + 1 chain starts
  std::vector<BigVector<uint32_t>> occ;     // per order, while frozen: the chains' positions
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
// token a separator (-1, SEPARATOR in _native.pxd), every link and chain head
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

// The oldest live position: a ring holds its last ``cap`` positions, and a
// resize that shrank the store dropped those below ``lo``.
inline int64_t store_base(const NativeStore* s) noexcept {
  int64_t b = s->n - s->cap;
  return b > s->lo ? b : s->lo;
}

// The position that a chain head or link target ``e`` ((position + 1) mod
// 2**32) names, as _latest in _matching.pyx reads it.
inline int64_t head_position(const NativeStore* s, uint32_t e) noexcept {
  return s->n - 1 - static_cast<int64_t>(static_cast<uint32_t>(static_cast<uint32_t>(s->n) - e));
}

// -- A scope's history: the chains of a full-size ring at any size ------------
//
// Each scope (tenant) has its own history, which starts empty and grows as
// the scope is used (resize_store).  Its chains are keyed by the slot an
// n-gram would have in the table of the full-size ring (2**hbits slots,
// fixed), so that a history of any size holds exactly the chains, hash
// collisions included, of today's full-size ring holding the same text: a
// draft walks the same occurrences in the same order whatever the history's
// size.  (A table sized to a small history would merge other chains into
// each walk and change the drafts.)  The full table costs 2**(hbits + 2)
// bytes per order; below 1/8 of the full size a map of 2 * cap buckets per
// order costs less, so there the heads live in one (``sparse``):
// open addressing with linear probing, a bucket being (key << 32) | head and
// head 0 an empty bucket.  A bucket whose head is no longer live (evicted)
// is stale: reused by the next new key that probes past it, and purged in
// place when used buckets pass 3/4 (live keys are at most ``cap``, half of
// the buckets, so a purge always frees a quarter of them).

inline bool sparse_heads(const NativeStore* s, int64_t cap) noexcept {
  return s->scoped && cap < (int64_t(1) << s->hbits) / 4;
}

inline size_t map_home(int hbits, int mbits, uint32_t key) noexcept {
  return static_cast<size_t>(key >> (hbits - mbits));
}

// The head of ``key``'s chain (0: none).  The map always has an empty bucket.
inline uint32_t map_find(const NativeStore* s, int o, uint32_t key) noexcept {
  const BigVector<uint64_t>& m = s->smap[o];
  const size_t mask = m.size() - 1;
  for (size_t i = map_home(s->hbits, s->mbits, key);; i = (i + 1) & mask) {
    uint64_t e = m[i];
    if (static_cast<uint32_t>(e) == 0) return 0;
    if (static_cast<uint32_t>(e >> 32) == key) return static_cast<uint32_t>(e);
  }
}

// Put (key, head) in a map known not to hold key (building one).
inline void map_put_new(BigVector<uint64_t>& m, int hbits, int mbits, uint32_t key, uint32_t head) noexcept {
  const size_t mask = m.size() - 1;
  size_t i = map_home(hbits, mbits, key);
  while (static_cast<uint32_t>(m[i]) != 0) i = (i + 1) & mask;
  m[i] = (uint64_t(key) << 32) | head;
}

// Empty bucket i of a map, moving later buckets of its probe run back so
// that every key stays reachable from its home (deletion by backward shift:
// linear probing needs no tombstones).
inline void map_erase(BigVector<uint64_t>& m, int hbits, int mbits, size_t i) noexcept {
  const size_t mask = m.size() - 1;
  size_t j = i;
  for (;;) {
    j = (j + 1) & mask;
    uint64_t e = m[j];
    if (static_cast<uint32_t>(e) == 0) break;
    size_t k = map_home(hbits, mbits, static_cast<uint32_t>(e >> 32));
    // The key at j stays if its home lies cyclically in (i, j].
    bool stays = i <= j ? (i < k && k <= j) : (i < k || k <= j);
    if (stays) continue;
    m[i] = e;
    i = j;
  }
  m[i] = 0;
}

// Erase every stale bucket of order o's map, in place: this runs while
// indexing, under the store's lock, where nothing may be allocated.
inline void map_purge(NativeStore* s, int o) noexcept {
  BigVector<uint64_t>& m = s->smap[o];
  const int64_t base = store_base(s);
  for (size_t i = 0; i < m.size(); ++i) {
    // A bucket that is erased may receive a later one, stale too: look again.
    while (static_cast<uint32_t>(m[i]) != 0 && head_position(s, static_cast<uint32_t>(m[i])) < base)
      map_erase(m, s->hbits, s->mbits, i);
  }
  // Counted afterwards: an erase near the end may pull in a bucket that
  // wrapped around to the start and was already passed.
  int64_t used = 0;
  for (uint64_t e : m) used += static_cast<uint32_t>(e) != 0;
  s->used[o] = used;
}

// Make ``head`` the head of ``key``'s chain; returns the previous head (0:
// none), as reading and writing a table slot does.  Caller holds s->mtx.
inline uint32_t map_update(NativeStore* s, int o, uint32_t key, uint32_t head) noexcept {
  BigVector<uint64_t>& m = s->smap[o];
  const size_t mask = m.size() - 1;
  const int64_t base = store_base(s);
  size_t i = map_home(s->hbits, s->mbits, key), reuse = SIZE_MAX;
  for (;; i = (i + 1) & mask) {
    uint64_t e = m[i];
    uint32_t h = static_cast<uint32_t>(e);
    if (h == 0) break;
    if (static_cast<uint32_t>(e >> 32) == key) {
      m[i] = (uint64_t(key) << 32) | head;
      return h;
    }
    if (reuse == SIZE_MAX && head_position(s, h) < base) reuse = i;
  }
  if (reuse == SIZE_MAX) {
    reuse = i;
    ++s->used[o];
  }
  m[reuse] = (uint64_t(key) << 32) | head;
  if (static_cast<size_t>(s->used[o]) * 4 > m.size() * 3) map_purge(s, o);
  return 0;
}

inline size_t map_bytes(const NativeStore* s) noexcept {
  size_t bytes = 0;
  for (const auto& m : s->smap) bytes += m.size() * sizeof(uint64_t);
  return bytes;
}

// The head of ``key``'s chain in either layout (0: none), and where it lies
// (to prefetch).
inline uint32_t chain_head(const NativeStore* s, int o, uint32_t key) noexcept {
  if (s->frozen >> o & 1) {
    const uint32_t first = s->cstart[o][key];
    return first < s->cstart[o][key + 1] ? s->occ[o][first] + 1 : 0;
  }
  return s->sparse ? map_find(s, o, key) : s->head[o][key];
}
inline const void* chain_head_address(const NativeStore* s, int o, uint32_t key) noexcept {
  if (s->frozen >> o & 1) return &s->cstart[o][key];
  if (s->sparse) return &s->smap[o][map_home(s->hbits, s->mbits, key)];
  return &s->head[o][key];
}

// Give a scope's history room for ``new_cap`` tokens (a power of two),
// keeping its newest min(held, new_cap) positions where they are: positions
// are absolute, so only the arrays' layout changes, and links and heads keep
// their meaning.  The new arrays are built before the lock is taken (the
// history's only writer is the thread calling this; drafts go on reading
// the old ones), then swapped in.  Throws std::bad_alloc and leaves the
// store as it was when out of memory.
inline void resize_store(NativeStore* s, int64_t new_cap) {
  const int norders = s->norders;
  const int64_t n = s->n;
  int64_t lo = store_base(s);
  if (n - new_cap > lo) lo = n - new_cap;
  const int64_t indexed = s->n_indexed > lo ? s->n_indexed : lo;
  const uint64_t mask = static_cast<uint64_t>(new_cap) - 1;
  const bool sparse = sparse_heads(s, new_cap);
  int mbits = 0;
  while (sparse && (int64_t(1) << mbits) < 2 * new_cap) ++mbits;
  // The full table is kept as it is when both layouts use it (stale heads
  // in it are harmless: a walk stops below the base).
  const bool keep_table = !sparse && !s->sparse && !s->head.empty() &&
                          s->head[0].size() == (size_t(1) << s->hbits);
  BigVector<int32_t> tok(static_cast<size_t>(new_cap), -1);
  // One (maybe empty) array per order in each layout, as readers expect.
  std::vector<BigVector<uint32_t>> prev(norders), head(norders);
  std::vector<BigVector<uint64_t>> smap(norders);
  int64_t used[8] = {0};
  for (int64_t p = lo; p < n; ++p) tok[p & mask] = s->tok[p & s->mask];
  for (int o = 0; o < norders; ++o) {
    prev[o].resize(static_cast<size_t>(new_cap));
    for (int64_t p = lo; p < indexed && p < n; ++p) prev[o][p & mask] = s->prev[o][p & s->mask];
  }
  if (!keep_table) {
    for (int o = 0; o < norders; ++o) {
      if (sparse) smap[o].resize(size_t(2) * static_cast<size_t>(new_cap));
      else head[o].resize(size_t(1) << s->hbits);
      auto keep = [&](uint32_t key, uint32_t e) {
        if (e == 0 || head_position(s, e) < lo) return;
        if (sparse) {
          map_put_new(smap[o], s->hbits, mbits, key, e);
          ++used[o];
        } else {
          head[o][key] = e;
        }
      };
      if (s->sparse) {
        for (uint64_t e : s->smap[o]) keep(static_cast<uint32_t>(e >> 32), static_cast<uint32_t>(e));
      } else if (!s->head.empty()) {
        const BigVector<uint32_t>& old = s->head[o];
        for (size_t key = 0; key < old.size(); ++key) keep(static_cast<uint32_t>(key), old[key]);
      }
    }
  }
  {
    std::unique_lock<std::shared_mutex> lock(s->mtx);
    s->tok.swap(tok);
    s->prev.swap(prev);
    if (!keep_table) {
      s->head.swap(head);  // empty arrays while sparse
      s->smap.swap(smap);  // empty arrays when the table is used
    }
    s->cap = new_cap;
    s->mask = mask;
    s->lo = lo;
    if (s->n_indexed < lo) {
      s->n_indexed = lo;
      s->run = 0;
    }
    s->sparse = sparse;
    s->mbits = mbits;
    for (int o = 0; o < 8; ++o) s->used[o] = used[o];
  }
  // The old arrays are freed here, after the lock is released.
}

// Drafts take priority over indexing.  Both are memory-bound, and the cores
// a server gives its scheduler often share caches and execution units (SMT
// siblings, vCPUs of one host core), so a busy sibling slows a draft down
// (and the decode step waiting for it).  So while a draft is
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

// The kinds of job (see InsertThread::submit).
enum JobKind { kAppend = 0, kIndexPending = 1, kResize = 2 };

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
  // ``kind``: kAppend (append and index ``count`` tokens), kIndexPending
  // (index what the store holds unindexed) or kResize (resize_store to
  // ``count`` tokens; ``tokens`` unused).
  void submit(const StorePtr& store, const int32_t* tokens, int64_t count, int kind,
              bool urgent = true) {
    Job job{store, kind == kResize ? std::vector<int32_t>()
                                   : std::vector<int32_t>(tokens, tokens + (count > 0 ? count : 0)),
            kind, count};
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
    int kind;
    int64_t count;
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
        if (job.kind == kResize)
          resize_store(job.store.get(), job.count);
        else
          apply_(job.store.get(), job.tokens.data(), static_cast<int64_t>(job.tokens.size()),
                 job.kind == kIndexPending);
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
