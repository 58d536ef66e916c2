#include "gpunodes/engine.h"

#include <algorithm>
#include <chrono>
#include <iterator>
#include <utility>

#include "gpunodes/errors.h"
#include "gpunodes/profiler.h"

namespace gn {

struct OpNode {
  OpFn fn;
  std::vector<VarPtr> reads, writes;
  Device device;
  StreamKind stream;
  OpInfo info;
  StreamWorker* worker = nullptr;  // looked up once, at push
  // Guarded by the engine's mutex:
  int pending_deps = 0;
  bool done = false;
  std::vector<std::shared_ptr<OpNode>> dependents;
  std::exception_ptr error;
  bool error_from_input = false;  // skipped because something it reads had failed
  bool awaited = false;           // a host sleeps in wait() until this op is done: finish() wakes it
  // Set when the op becomes ready, under the engine's lock: the error stuck to what it reads, so that the
  // worker learns it without taking the lock again.
  std::exception_ptr input_error;
  // The serial of the last op pushed that depends on this one: a later op's dependencies are found once each
  // in constant time, where a search of the list so far made a writer after 20,000 readers quadratic.
  uint64_t depended_on_by = 0;
};

namespace {
std::atomic<uint64_t> next_op_serial{1};

// How long a thread that ran out of work, or waits for an op, spins before it sleeps. Ops of a few
// microseconds are common (a host loop of tiny ops, a read of one value), and putting a thread to sleep and
// waking it costs more than that; a spin this short costs little when nothing comes.
constexpr auto kSpin = std::chrono::microseconds(30);

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Spins until done() or the deadline; returns done()'s last answer. After the first microsecond or so it
// yields between looks, so that on a machine with more runnable threads than cores (OpenMP teams, other
// processes) the spin gives its core to them rather than delaying what it waits for.
template <class Done>
bool spin_until(Done done, std::chrono::steady_clock::time_point deadline) {
  for (int round = 0;; ++round) {
    for (int i = 0; i < 64; ++i) {
      if (done()) return true;
      cpu_relax();
    }
    if (std::chrono::steady_clock::now() >= deadline) return done();
    if (round >= 4) std::this_thread::yield();
  }
}
}  // namespace

void OpContext::check_cancelled() const {
  if (cancelled()) throw CancelledError();
}

namespace {
thread_local std::string current_tag;
thread_local bool on_stream_worker = false;  // this thread runs ops: its pushes must never wait for them
}  // namespace

ScopedOpTag::ScopedOpTag(std::string tag) : previous_(std::move(current_tag)) {
  current_tag = std::move(tag);
}
ScopedOpTag::~ScopedOpTag() {
  current_tag = std::move(previous_);
}
const std::string& ScopedOpTag::current() {
  return current_tag;
}

Engine::Engine(Profiler& profiler, WorkerFactory factory)
    : profiler_(profiler), factory_(std::move(factory)) {}

Engine::~Engine() {
  {
    std::unique_lock lock(mutex_);
    ++all_waiters_;
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    --all_waiters_;
  }
  for (auto& [key, worker] : workers_) worker->stop();
}

void Engine::set_schedule(Schedule s) {
  std::lock_guard lock(mutex_);
  schedule_ = s;
}

Schedule Engine::schedule() const {
  std::lock_guard lock(mutex_);
  return schedule_;
}

size_t Engine::pending() const {
  std::lock_guard lock(mutex_);
  return pending_;
}

void Engine::set_max_queued(size_t ops) {
  {
    std::lock_guard lock(mutex_);
    max_queued_ = std::max<size_t>(1, ops);
  }
  room_cv_.notify_all();
}

bool Engine::has_room_for_waiting_hosts() const {
  return hosts_waiting_ > 0 && pending_ <= max_queued_ / 2;
}

size_t Engine::max_queued() const {
  std::lock_guard lock(mutex_);
  return max_queued_;
}

void Engine::push(OpFn fn, std::vector<VarPtr> reads, std::vector<VarPtr> writes, Device device,
                  StreamKind stream, OpInfo info) {
  if (InlineOps* inline_ops = InlineOps::current()) {
    inline_ops->run(std::move(fn), device, stream, info);
    return;
  }
  auto op = std::make_shared<OpNode>();
  op->fn = std::move(fn);
  op->reads = std::move(reads);
  op->writes = std::move(writes);
  op->device = device;
  op->stream = stream;
  if (info.tag.empty()) info.tag = ScopedOpTag::current();
  op->info = std::move(info);

  bool ready;
  {
    std::unique_lock lock(mutex_);
    // Backpressure, down to half the bound: one wake-up per half a backlog, not one per finished op. A
    // cancel lets the host through at once, since every queued op is about to be dropped.
    if (!on_stream_worker && pending_ >= max_queued_ && !cancel_flag_.load()) {
      ++hosts_waiting_;
      room_cv_.wait(lock, [&] { return pending_ <= max_queued_ / 2 || cancel_flag_.load(); });
      --hosts_waiting_;
    }
    const uint64_t serial = next_op_serial.fetch_add(1, std::memory_order_relaxed);
    auto depend_on = [&](const std::shared_ptr<OpNode>& other) {
      if (!other || other->done || other == op || other->depended_on_by == serial) return;
      other->depended_on_by = serial;
      other->dependents.push_back(op);
      ++op->pending_deps;
    };
    auto is_written = [&](const VarPtr& v) {
      return std::find(op->writes.begin(), op->writes.end(), v) != op->writes.end();
    };
    // Read after write: wait for the last writer.
    for (const VarPtr& v : op->reads) depend_on(v->last_writer);
    // Write after write and write after read: wait for the last writer and every reader since.
    for (const VarPtr& v : op->writes) {
      depend_on(v->last_writer);
      for (const auto& r : v->readers_since_write) depend_on(r);
    }
    if (schedule_ == Schedule::Sequential) depend_on(last_pushed_);

    for (const VarPtr& v : op->reads) {
      if (is_written(v)) continue;
      auto& readers = v->readers_since_write;
      if (readers.size() >= v->prune_readers_at) {
        std::erase_if(readers, [](const std::shared_ptr<OpNode>& r) { return r->done; });
        v->prune_readers_at = std::max<size_t>(64, 2 * readers.size());
      }
      readers.push_back(op);
    }
    for (const VarPtr& v : op->writes) {
      v->last_writer = op;
      v->readers_since_write.clear();
    }
    last_pushed_ = op;
    ++pending_;
    if (!op->info.tag.empty()) ++tags_[op->info.tag].pending;
    op->worker = &worker_locked(device, stream);
    ready = op->pending_deps == 0;
    if (ready) op->input_error = input_error_locked(*op);
  }
  if (ready) dispatch(op);
}

void Engine::dispatch(const std::shared_ptr<OpNode>& first) {
  if (!cancel_flag_.load()) {
    first->worker->enqueue(first);
    return;
  }
  // After a cancel, ops complete here without running, and each completion readies its dependents: a work
  // list, not recursion, so that a chain of a million queued ops (MatMul repeat) cannot overflow the stack.
  std::vector<std::shared_ptr<OpNode>> work{first};
  while (!work.empty()) {
    std::shared_ptr<OpNode> op = std::move(work.back());
    work.pop_back();
    if (!cancel_flag_.load()) {
      op->worker->enqueue(op);
      continue;
    }
    op->error = std::make_exception_ptr(CancelledError());
    op->fn = nullptr;
    std::vector<std::shared_ptr<OpNode>> ready = finish(op);
    // Reversed onto the stack, so they are taken in the order they became ready.
    work.insert(work.end(), std::make_move_iterator(ready.rbegin()), std::make_move_iterator(ready.rend()));
  }
}

StreamWorker& Engine::worker_locked(Device device, StreamKind stream) {
  auto key = std::make_pair(device, static_cast<int>(stream));
  auto it = workers_.find(key);
  if (it == workers_.end()) {
    auto w = factory_(device, stream);
    w->start(this, &profiler_);
    it = workers_.emplace(key, std::move(w)).first;
  }
  return *it->second;
}

std::exception_ptr Engine::input_error_locked(const OpNode& op) {
  for (const VarPtr& v : op.reads)
    if (v->error) return v->error;
  return nullptr;
}

void Engine::complete(const std::shared_ptr<OpNode>& op) {
  for (const std::shared_ptr<OpNode>& d : finish(op)) dispatch(d);
}

std::vector<std::shared_ptr<OpNode>> Engine::finish(const std::shared_ptr<OpNode>& op) {
  std::vector<std::shared_ptr<OpNode>> ready;
  std::vector<std::function<void(const TagOutcome&)>> waiters;
  TagOutcome outcome;
  std::unique_lock lock(mutex_);
  if (auto it = tags_.find(op->info.tag); it != tags_.end()) {
    TagState& st = it->second;
    --st.pending;
    const bool better = !st.outcome.error || (st.outcome.from_input && !op->error_from_input);
    if (op->error && better) st.outcome = {op->error, op->error_from_input};
    if (st.pending == 0) {
      waiters = std::move(st.waiters);
      outcome = st.outcome;
      // A failure nobody has asked about yet is kept for the next when_done.
      if (!waiters.empty() || !st.outcome.error) tags_.erase(it);
    }
  }
  if (!waiters.empty()) {
    // The tag's waiters run before the op counts as done: whoever waits for what the op wrote (a host in
    // wait(), a dependent op) then also sees the outcome of the node the op belonged to, so a node that read
    // a failed node's output finds that node failed already. And wait_all() returning means every
    // when_done callback has been made.
    lock.unlock();
    for (auto& w : waiters) {
      try {
        w(outcome);
      } catch (...) {
      }
    }
    lock.lock();
  }
  op->done = true;
  // The outcome sticks to what the op wrote: an error poisons those variables until a later op rewrites
  // them, so that dependents skip and wait() rethrows.
  for (const VarPtr& v : op->writes) {
    v->error = op->error;
    if (v->last_writer == op) v->last_writer.reset();
  }
  if (op->error && !first_error_) first_error_ = op->error;
  for (auto& d : op->dependents)
    if (--d->pending_deps == 0) {
      d->input_error = input_error_locked(*d);
      ready.push_back(d);
    }
  op->dependents.clear();
  op->reads.clear();
  op->writes.clear();
  ++completed_;
  --pending_;
  const bool room = has_room_for_waiting_hosts();  // a host waiting in push may go on
  // Only a host asleep on this op, or on an empty engine, is woken: waking a host in wait_all() at every one
  // of thousands of tiny ops cost the worker a futex call and a context switch each time.
  const bool wake = op->awaited || (pending_ == 0 && all_waiters_ > 0);
  lock.unlock();
  if (wake) done_cv_.notify_all();
  if (room) room_cv_.notify_all();
  return ready;
}

void Engine::when_done(const std::string& tag, std::function<void(const TagOutcome&)> done) {
  TagOutcome outcome;
  {
    std::lock_guard lock(mutex_);
    auto it = tags_.find(tag);
    if (it != tags_.end() && it->second.pending > 0) {
      it->second.waiters.push_back(std::move(done));
      return;
    }
    if (it != tags_.end()) {
      outcome = it->second.outcome;
      tags_.erase(it);
    }
  }
  done(outcome);
}

template <class Pred>
void Engine::wait_until(std::unique_lock<std::mutex>& lock, Pred pred) {
  if (pred()) return;
  // Spin a moment while ops complete, taking the lock only when one has: what the host waits for is often
  // a tiny op that ends within microseconds. The spin is bounded in all, so that a host waiting for a long
  // run sleeps and leaves the cores to the workers.
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  uint64_t seen = completed_.load(std::memory_order_acquire);
  lock.unlock();
  while (std::chrono::steady_clock::now() < deadline &&
         spin_until([&] { return completed_.load(std::memory_order_acquire) != seen; }, deadline)) {
    lock.lock();
    if (pred()) return;
    seen = completed_.load(std::memory_order_acquire);
    lock.unlock();
  }
  lock.lock();
  done_cv_.wait(lock, pred);
}

void Engine::wait(const VarPtr& var) {
  std::unique_lock lock(mutex_);
  // The predicate marks the op it waits for, so that finish() wakes this host when that op is done. Should a
  // later op write var meanwhile, it depends on that one, which finishes first and wakes the host to mark it.
  wait_until(lock, [&] {
    if (!var->last_writer || var->last_writer->done) return true;
    var->last_writer->awaited = true;
    return false;
  });
  if (var->error) std::rethrow_exception(var->error);
}

void Engine::wait_all() {
  std::unique_lock lock(mutex_);
  ++all_waiters_;
  wait_until(lock, [&] { return pending_ == 0; });
  --all_waiters_;
  if (auto e = std::exchange(first_error_, nullptr)) std::rethrow_exception(e);
}

void Engine::cancel() {
  {
    std::lock_guard lock(mutex_);  // a host waiting in push must not miss the flag between check and sleep
    cancel_flag_.store(true);
  }
  room_cv_.notify_all();
}

void Engine::reset_cancel() {
  std::lock_guard lock(mutex_);
  cancel_flag_.store(false);
  first_error_ = nullptr;
}

// --- InlineOps -------------------------------------------------------------------------------------------

namespace {
thread_local InlineOps* current_inline_ops = nullptr;
}

InlineOps::InlineOps(OpContext& ctx, std::function<void(OpFn)> record)
    : ctx_(ctx), record_(std::move(record)), previous_(current_inline_ops) {
  current_inline_ops = this;
}

InlineOps::~InlineOps() {
  current_inline_ops = previous_;
}

InlineOps* InlineOps::current() {
  return current_inline_ops;
}

void InlineOps::run(OpFn fn, Device device, StreamKind stream, const OpInfo& info) {
  if (device != ctx_.device || stream != ctx_.stream)
    throw CaptureError("a captured step runs on " + ctx_.device.str() + " (" + stream_name(ctx_.stream) +
                       " stream) only, but its op '" + info.name + "' is for " + device.str() + " (" +
                       stream_name(stream) + " stream)");
  ctx_.check_cancelled();
  fn(ctx_);
  if (record_) record_(std::move(fn));
}

// --- StreamWorker ----------------------------------------------------------------------------------------

StreamWorker::StreamWorker(Device device, StreamKind stream) : device_(device), stream_(stream) {}

StreamWorker::~StreamWorker() {
  stop();
}

void StreamWorker::start(Engine* engine, Profiler* profiler) {
  engine_ = engine;
  profiler_ = profiler;
  thread_ = std::thread([this] { loop(); });
}

void StreamWorker::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamWorker::enqueue(std::shared_ptr<OpNode> op) {
  bool wake;
  {
    std::lock_guard lock(mutex_);
    queue_.push_back(std::move(op));
    queued_.fetch_add(1, std::memory_order_release);
    wake = sleeping_;
  }
  if (wake) cv_.notify_one();
}

std::pair<double, double> StreamWorker::run_timed(const OpFn& fn, OpContext& ctx) {
  double start = profiler_->now_us();
  fn(ctx);
  return {start, profiler_->now_us()};
}

void StreamWorker::loop() {
  on_stream_worker = true;
  try {
    on_thread_start();
  } catch (...) {
    init_error_ = std::current_exception();
  }
  for (;;) {
    std::shared_ptr<OpNode> op;
    spin_until([&] { return queued_.load(std::memory_order_acquire) > 0; },
               std::chrono::steady_clock::now() + kSpin);
    {
      std::unique_lock lock(mutex_);
      if (queue_.empty() && !stopping_) {
        sleeping_ = true;
        cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
        sleeping_ = false;
      }
      if (queue_.empty()) break;  // stopping and drained
      op = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
    }
    OpContext ctx{device_, stream_, native_stream(), &engine_->cancel_flag_};
    if (init_error_) {
      op->error = init_error_;
    } else if (ctx.cancelled()) {
      op->error = std::make_exception_ptr(CancelledError());
    } else if (op->input_error) {
      op->error = op->input_error;
      op->error_from_input = true;
    } else {
      try {
        auto [start, end] = run_timed(op->fn, ctx);
        profiler_->record(Span{op->info.name, op->info.tag, device_, stream_, start, end, op->info.bytes,
                               op->info.flops, op->info.host_blocking});
      } catch (...) {
        op->error = std::current_exception();
      }
    }
    op->fn = nullptr;  // releases the tensors the op held, on this thread, before dependents start
    engine_->complete(op);
  }
  try {
    on_thread_stop();
  } catch (...) {
  }
}

}  // namespace gn
