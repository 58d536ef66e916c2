// The dependency engine, after MXNet's: ops declare the variables they read and write, and run as soon as
// no earlier op conflicts with them. Ops on different devices or streams therefore overlap on their own:
// this is automatic parallelism.
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "gpunodes/device.h"

namespace gn {

class Profiler;
class StreamWorker;
struct OpNode;

// What an op's body gets: where it runs, the native stream (cudaStream_t on CUDA), and the cancel flag,
// which long ops poll between chunks of work.
struct OpContext {
  Device device;
  StreamKind stream = StreamKind::Compute;
  void* native_stream = nullptr;
  const std::atomic<bool>* cancel_flag = nullptr;
  bool cancelled() const { return cancel_flag && cancel_flag->load(std::memory_order_relaxed); }
  // Throws CancelledError when cancel was asked for.
  void check_cancelled() const;
};

// An engine variable: one per tensor storage. It remembers the last writer and the readers since, so a new
// op can wait for exactly the ops it conflicts with. An error from a failed op sticks to the variables that
// op wrote, and wait() rethrows it.
struct Var {
  std::shared_ptr<OpNode> last_writer;
  std::vector<std::shared_ptr<OpNode>> readers_since_write;
  // Finished readers are dropped from the list when it reaches this size, which then doubles past what is
  // left: 20,000 queued products of one tensor cost amortised constant time each, not a scan per push.
  size_t prune_readers_at = 64;
  std::exception_ptr error;
};
using VarPtr = std::shared_ptr<Var>;
inline VarPtr new_var() {
  return std::make_shared<Var>();
}

struct OpInfo {
  std::string name;
  std::string tag;  // defaults to the thread's current tag (see ScopedOpTag)
  int64_t bytes = 0;
  double flops = 0;
  bool host_blocking = false;  // the host waits for this op: a blocking copy or read
};

enum class Schedule { Parallel, Sequential };

// What the ops pushed under one tag came to: the first error among them, preferring one the tag's own ops
// raised over one they inherited because something they read had failed (from_input).
struct TagOutcome {
  std::exception_ptr error;
  bool from_input = false;
};

// Sets the tag that ops pushed from this thread carry into their profiler spans (the node id).
class ScopedOpTag {
 public:
  explicit ScopedOpTag(std::string tag);
  ~ScopedOpTag();
  static const std::string& current();

 private:
  std::string previous_;
};

using OpFn = std::function<void(OpContext&)>;
// Creates the worker for one (device, stream): a thread that runs ops, set up for that device.
using WorkerFactory = std::function<std::unique_ptr<StreamWorker>(Device, StreamKind)>;

class Engine {
 public:
  Engine(Profiler& profiler, WorkerFactory factory);
  ~Engine();  // waits for every op, then stops the workers
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Enqueues op and returns, at once unless max_queued() ops are already pushed and unfinished: then a
  // host thread waits for the backlog to shrink to half that, as a full CUDA launch queue makes the host
  // wait. Without the bound, a host loop of a million tiny ops (MatMul repeat) queued them all, about
  // 450 bytes each. Ops pushed from a worker thread (a tensor freed by an op, a when_done callback) never
  // wait: the backlog waits on them. With the bound, an op may wait only for ops pushed before it, not
  // for the host or a later op (a multi-device all-reduce is one op for that reason): behind a full
  // backlog, the host could not push what it waits for. reads and writes may overlap or be empty.
  void push(OpFn op, std::vector<VarPtr> reads, std::vector<VarPtr> writes, Device device, StreamKind stream,
            OpInfo info);

  // Blocks until every op that writes var so far has run; rethrows the error stuck to var.
  void wait(const VarPtr& var);
  // Blocks until every op pushed so far has run; rethrows the first error since the last wait_all.
  void wait_all();

  // Parallel: ops wait only for conflicting ops. Sequential: every op waits for the one pushed before it,
  // the seed's "waitall between" baseline.
  void set_schedule(Schedule s);
  Schedule schedule() const;

  // Ops not yet started are dropped (their outputs carry CancelledError); running ops see the flag.
  // Returns at once; wait_all() afterwards drains. reset_cancel() makes the engine usable again.
  void cancel();
  void reset_cancel();
  bool cancelled() const { return cancel_flag_.load(); }

  size_t pending() const;
  static constexpr size_t kDefaultMaxQueued = 65536;  // about 30 MB of queued ops
  void set_max_queued(size_t ops);                    // at least 1
  size_t max_queued() const;

  // Calls done once no op pushed with `tag` is pending: at once on this thread when none is, otherwise on
  // the thread that completes the last one, with no engine lock held. The outcome covers the tag's ops
  // since the previous when_done for it. The graph executor learns this way when a node's work is over.
  void when_done(const std::string& tag, std::function<void(const TagOutcome&)> done);

 private:
  friend class StreamWorker;
  void dispatch(const std::shared_ptr<OpNode>& op);  // called with deps satisfied
  void complete(const std::shared_ptr<OpNode>& op);  // called by workers after running op
  // Marks op done and returns the dependents that became ready, without dispatching them.
  std::vector<std::shared_ptr<OpNode>> finish(const std::shared_ptr<OpNode>& op);
  std::exception_ptr input_error_locked(const OpNode& op);  // an error stuck to what op reads
  StreamWorker& worker_locked(Device device, StreamKind stream);
  // done_cv_.wait(lock, pred), after a short spin.
  template <class Pred>
  void wait_until(std::unique_lock<std::mutex>& lock, Pred pred);

  Profiler& profiler_;
  WorkerFactory factory_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  std::condition_variable room_cv_;  // a host waiting in push: the backlog is down to half the bound
  size_t hosts_waiting_ = 0;
  bool has_room_for_waiting_hosts() const;  // with mutex_ held
  std::map<std::pair<Device, int>, std::unique_ptr<StreamWorker>> workers_;
  std::shared_ptr<OpNode> last_pushed_;  // sequential schedule chains every op after this one
  Schedule schedule_ = Schedule::Parallel;
  size_t pending_ = 0;
  size_t all_waiters_ = 0;  // hosts in wait_all() (or the destructor): woken when pending_ reaches 0
  std::atomic<uint64_t> completed_{0};  // ops finished so far: what a spinning waiter watches
  size_t max_queued_ = kDefaultMaxQueued;
  std::exception_ptr first_error_;
  std::atomic<bool> cancel_flag_{false};
  // Per tag: ops not yet completed, their outcome so far, and who waits for them. An entry goes away when
  // its waiters are called, or when its ops finish cleanly with nobody waiting.
  struct TagState {
    size_t pending = 0;
    TagOutcome outcome;
    std::vector<std::function<void(const TagOutcome&)>> waiters;
  };
  std::unordered_map<std::string, TagState> tags_;
};

// Inside an op body: the ops this thread pushes while the scope lives run at once, in push order, in that
// op's context instead of being queued, and each is then handed to `record` (when given). This is how a
// training step is captured for replay (backend.h's capture): one op runs the whole step's code. Ops for
// another device or stream cannot join it: push throws CaptureError. No dependency tracking is needed, as
// one thread runs them in program order, and the enclosing op declares what the whole sequence reads and
// writes. The pushed ops' variables are left as they are (no writer recorded, no error stuck to them).
class InlineOps {
 public:
  explicit InlineOps(OpContext& ctx, std::function<void(OpFn)> record = {});
  ~InlineOps();
  InlineOps(const InlineOps&) = delete;
  InlineOps& operator=(const InlineOps&) = delete;
  // The scope of this thread, or null.
  static InlineOps* current();
  void run(OpFn fn, Device device, StreamKind stream, const OpInfo& info);

 private:
  OpContext& ctx_;
  std::function<void(OpFn)> record_;
  InlineOps* previous_;
};

// One thread with a FIFO of ready ops for one (device, stream). Subclasses prepare the thread (OpenMP
// thread count, CUDA device and stream) and time ops (steady clock, or CUDA events).
class StreamWorker {
 public:
  StreamWorker(Device device, StreamKind stream);
  virtual ~StreamWorker();
  void start(Engine* engine, Profiler* profiler);
  void stop();  // joins; the queue must be empty
  void enqueue(std::shared_ptr<OpNode> op);
  Device device() const { return device_; }
  StreamKind stream() const { return stream_; }

 protected:
  virtual void on_thread_start() {}
  virtual void on_thread_stop() {}
  virtual void* native_stream() { return nullptr; }
  // Runs fn and returns its span's start and end on the profiler timeline. Default: the host's steady
  // clock, right for the CPU. CUDA waits for the stream and uses events.
  virtual std::pair<double, double> run_timed(const OpFn& fn, OpContext& ctx);
  Profiler* profiler_ = nullptr;

 private:
  void loop();
  Device device_;
  StreamKind stream_;
  Engine* engine_ = nullptr;
  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<OpNode>> queue_;
  std::atomic<size_t> queued_{0};  // queue_.size(), read without the lock by the spinning worker
  bool sleeping_ = false;          // in cv_.wait: only then does enqueue pay for a notify
  bool stopping_ = false;
  std::exception_ptr init_error_;  // on_thread_start failed: every op fails with this
  std::thread thread_;
};

}  // namespace gn
