// The processes of one job: a leaf library (gn_dist, no Qt, no GPU) that the host (the CLI) and the runtime
// (the Trainer's all-reduce) both use. Launched by mpirun (Open MPI sets OMPI_COMM_WORLD_SIZE), a process is
// one rank of the world and MPI is initialised on the first call of World::get(); launched any other way it
// is a world of one and no MPI function is ever called, so gpunodes behaves exactly as without MPI.
//
// Every collective here waits in a progress loop with a deadline instead of blocking inside MPI: a rank that
// never arrives (it died, runs another graph, or its host was cut off or froze) ends the wait with a
// CommError naming what was waited for and whom, never a silent hang. Collectives must be called in the same
// order on every rank; the Trainer orders its own through one engine variable.
//
// A rank that gives up on an exchange ends its own process within a bound, whatever the launcher does: a
// wait that times out arms a watchdog that ends the process (_exit) kGiveUpGrace later, and abort() one
// that ends it kAbortGrace after MPI_Abort was called, since MPI_Abort relies on mpirun and its daemons,
// which a partition may have cut off (docs/distributed.md, "Across hosts"). And since mpirun then
// waits for the lost host's daemon (forever for a frozen host, whose kernel still answers Open MPI's
// keepalives), a rank that gave up leaves a watcher process behind it that interrupts its launcher (mpirun,
// or this host's orted) if that still runs kAbortGrace after the abort, and kills it 4 s later.
#pragma once
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace gn::dist {

// A collective failed or timed out; the job cannot go on.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A wait ended because its StopCheck said so (the caller's cancel).
class Stopped : public std::runtime_error {
 public:
  Stopped() : std::runtime_error("cancelled") {}
};

// What the launcher says, from the environment alone (no MPI call): Open MPI's OMPI_COMM_WORLD_* variables.
struct LaunchInfo {
  bool under_mpirun = false;
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
};
LaunchInfo launch_info();
// Whether this build can join an MPI job (GPUNODES_MPI).
bool built_with_mpi();
// One GPU per rank: under mpirun with several ranks on this machine and CUDA_VISIBLE_DEVICES unset, makes
// the GPU of this rank's local rank the only one the process sees (it becomes its cuda:0), as PyTorch DDP's
// launchers do. Must run before the first CUDA call; the CLI calls it first thing. Returns what it set, or
// an empty string when it left the environment alone.
std::string select_local_gpu();

class World {
 public:
  // The process's world. Under mpirun this initialises MPI (with MPI_THREAD_MULTIPLE: engine worker threads
  // call collectives) and throws Error when the build has no MPI or MPI cannot start.
  static World& get();
  ~World();
  World(const World&) = delete;
  World& operator=(const World&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  bool is_root() const { return rank_ == 0; }
  // More than one process.
  bool distributed() const { return size_ > 1; }
  // Launched by mpirun, MPI in use: also a job of one rank (mpirun -np 1), which runs the collectives with
  // nobody else, so that one process checks the whole path.
  bool mpi() const { return mpi_; }
  // Whether a graph run on this rank is one run of the whole job (`gpunodes run`: every rank runs the same
  // graph, and Train trains across the ranks), or a run of its own (`gpunodes sweep`: each rank runs other
  // points, and nothing in them exchanges with other ranks). Set once, before any run.
  void set_local_runs(bool local) { local_runs_ = local; }
  bool local_runs() const { return local_runs_; }
  // Whether runs on this rank take part in a job across the ranks: launched by mpirun and not local_runs.
  bool joint_runs() const { return mpi_ && !local_runs_; }
  // "[rank 1] " in a world of several, "" alone: the prefix of every line a rank prints.
  std::string prefix() const;

  // How long a collective may wait for the other ranks: 30 s, or GPUNODES_COMM_TIMEOUT seconds.
  std::chrono::milliseconds timeout() const { return timeout_; }
  // After a wait timed out, how long the rank has to report it and call abort() before its process is ended
  // anyway; after abort(), how long MPI_Abort has to end it.
  static constexpr std::chrono::milliseconds kGiveUpGrace{10000}, kAbortGrace{5000};
  // The host each rank runs on (MPI_Get_processor_name, gathered when the world starts), by rank; this
  // process's alone in a world of one.
  const std::vector<std::string>& hosts() const { return hosts_; }
  // "rank 1 on nodeb" with two ranks; "the other 3 ranks (on nodeb, nodec)" with more: whom a collective
  // that did not complete on this rank was waiting for.
  std::string others() const;
  // The collectives this rank has waited in for at least `at_least`, as "summing the loss over the ranks
  // (12.0 s)", joined by "; ": what did not complete when mpirun ends the job under a waiting rank. Empty
  // when it waits for nothing.
  std::string waiting(std::chrono::milliseconds at_least = std::chrono::milliseconds(1000)) const;
  // Rank 0 of a job across several hosts: a warning when Open MPI's daemons would notice a lost host later
  // than the ranks give up on it (the oob_tcp_keepalive_* MCA params mpirun passes in the environment,
  // against timeout()). A partition then ends the job only when the ranks give up, and only because the
  // ranks' watcher interrupts mpirun and the far daemon (see below). Empty otherwise.
  std::string launcher_warning() const;
  // Called while waiting: when it returns true the wait ends with Stopped.
  using StopCheck = std::function<bool()>;

  void barrier(const std::string& what, const StopCheck& stop = {});
  // `bytes` on every rank becomes root's (any size).
  void broadcast(std::vector<char>& bytes, int root, const std::string& what, const StopCheck& stop = {});
  // Every rank's string, by rank.
  std::vector<std::string> allgather(const std::string& mine, const std::string& what,
                                     const StopCheck& stop = {});
  // Which communicator a collective goes on. Collectives on one communicator must come in the same order on
  // every rank, and the host thread's (loss sums, broadcasts) run concurrently with the training engine's
  // (gradient buckets, ordered by the engine): each has its own. barrier, broadcast and allgather are Host.
  enum class Channel { Host, Engine };
  // Sums `count` values over the ranks, in place; the result is the same on every rank.
  void allreduce_sum(float* data, size_t count, const std::string& what, Channel channel = Channel::Host,
                     const StopCheck& stop = {});
  void allreduce_sum(double* data, size_t count, const std::string& what, Channel channel = Channel::Host,
                     const StopCheck& stop = {});

  // Ends every rank of the job now (MPI_Abort), with `code`: for a rank that cannot go on while the others
  // wait in a collective. If MPI_Abort has not ended the process kAbortGrace later, it ends it itself.
  // Alone, std::exit(code).
  [[noreturn]] void abort(int code);

 private:
  World();
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1;
  bool mpi_ = false, local_runs_ = false;
  std::chrono::milliseconds timeout_{30000};
  std::vector<std::string> hosts_;
};

// Ends this process with `code` at `after` from now (sooner if already asked for sooner), printing `why` on
// stderr first, unless it ends before: the bound on a rank that gave up. Async-signal-safe it is not; it
// starts one thread the first time.
void end_process_within(std::chrono::milliseconds after, int code, const std::string& why);

}  // namespace gn::dist
