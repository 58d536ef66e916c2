// The job's processes: MPI under mpirun, a world of one otherwise (world.h).
#include "gpunodes/dist/world.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#ifdef GPUNODES_HAVE_MPI
// The C API only: Open MPI's deprecated C++ bindings would need libmpi_cxx.
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif

namespace gn::dist {
namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return *end || n < 0 || n > INT_MAX ? fallback : static_cast<int>(n);
}

std::chrono::milliseconds timeout_from_env() {
  if (const char* v = std::getenv("GPUNODES_COMM_TIMEOUT"); v && *v) {
    char* end = nullptr;
    const double s = std::strtod(v, &end);
    if (!*end && s > 0 && s < 1e6) return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
  }
  return std::chrono::milliseconds(30000);
}

}  // namespace

LaunchInfo launch_info() {
  LaunchInfo l;
  const int size = env_int("OMPI_COMM_WORLD_SIZE", 0);
  if (size < 1) return l;
  l.under_mpirun = true;
  l.size = size;
  l.rank = env_int("OMPI_COMM_WORLD_RANK", 0);
  l.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  l.local_size = std::max(1, env_int("OMPI_COMM_WORLD_LOCAL_SIZE", 1));
  return l;
}

bool built_with_mpi() {
#ifdef GPUNODES_HAVE_MPI
  return true;
#else
  return false;
#endif
}

std::string select_local_gpu() {
  const LaunchInfo l = launch_info();
  if (!l.under_mpirun || l.local_size < 2 || std::getenv("CUDA_VISIBLE_DEVICES")) return {};
  const std::string gpu = std::to_string(l.local_rank);
  ::setenv("CUDA_VISIBLE_DEVICES", gpu.c_str(), 1);
  return gpu;
}

World& World::get() {
  static World world;
  return world;
}

std::string World::prefix() const {
  return size_ > 1 ? "[rank " + std::to_string(rank_) + "] " : std::string();
}

#ifdef GPUNODES_HAVE_MPI

namespace {

using Clock = std::chrono::steady_clock;

void check(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, text, &length);
  throw CommError(what + ": MPI failed: " + std::string(text, static_cast<size_t>(length)));
}

// A collective in flight owns the buffers MPI reads and writes. A wait that gives up (timeout, stop) leaves
// the request pending, and MPI may still write into them later: those buffers are kept until the process
// ends instead of being freed under MPI's feet.
struct Pending {
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<char> a, b;
  std::vector<int> counts, offsets;
};
std::mutex g_abandoned_mutex;
std::vector<std::unique_ptr<Pending>> g_abandoned;

MPI_Comm g_comms[2] = {MPI_COMM_NULL, MPI_COMM_NULL};

MPI_Comm comm(World::Channel channel) {
  return g_comms[channel == World::Channel::Host ? 0 : 1];
}

// MPI_Test in a loop with a deadline and a stop check: MPI's blocking calls would wait forever for a rank
// that never comes. It yields for the first 20 ms, calling MPI_Test as often as it can: TCP progress happens
// inside MPI calls, and sleeping there cost the MLP's 0.8 MB all-reduce half its speed (2 ranks against 1
// rank of 2 devices: 0.43 with a 1 ms spin, 0.89 with this). Then it sleeps up to 1 ms a round, so a long
// wait costs little CPU.
void wait_for(std::unique_ptr<Pending>& p, const std::string& what, std::chrono::milliseconds timeout,
              const World::StopCheck& stop, const std::string& prefix) {
  const auto start = Clock::now(), deadline = start + timeout;
  auto pause = std::chrono::microseconds(0);
  auto give_up = [&] {
    std::lock_guard lock(g_abandoned_mutex);
    g_abandoned.push_back(std::move(p));
  };
  while (true) {
    int done = 0;
    const int rc = MPI_Test(&p->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      give_up();
      check(rc, what);
    }
    if (done) return;
    if (stop && stop()) {
      give_up();
      throw Stopped();
    }
    const auto now = Clock::now();
    if (now > deadline) {
      give_up();
      throw CommError(
          prefix + what + ": the other ranks did not answer within " +
          std::to_string(timeout.count() / 1000) +
          " s: a rank was lost (killed, out of memory, failed) or the ranks run different graphs");
    }
    if (now - start < std::chrono::milliseconds(20)) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2 + std::chrono::microseconds(10), std::chrono::microseconds(1000));
  }
}

template <typename T>
void allreduce(T* data, size_t count, MPI_Datatype type, MPI_Comm c, const std::string& what,
               std::chrono::milliseconds timeout, const World::StopCheck& stop, const std::string& prefix) {
  // MPI counts are ints: a larger buffer goes in pieces.
  for (size_t done = 0; done < count;) {
    const size_t n = std::min<size_t>(count - done, INT_MAX / sizeof(T));
    auto p = std::make_unique<Pending>();
    p->a.resize(n * sizeof(T));
    std::memcpy(p->a.data(), data + done, n * sizeof(T));
    check(MPI_Iallreduce(MPI_IN_PLACE, p->a.data(), static_cast<int>(n), type, MPI_SUM, c, &p->request),
          what);
    wait_for(p, what, timeout, stop, prefix);
    std::memcpy(data + done, p->a.data(), n * sizeof(T));
    done += n;
  }
}

}  // namespace

World::World() : timeout_(timeout_from_env()) {
  const LaunchInfo l = launch_info();
  if (!l.under_mpirun) return;
  int provided = 0;
  check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "starting MPI");
  mpi_ = true;
  // Errors come back as codes (and become CommErrors) instead of ending the process inside MPI.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (provided < MPI_THREAD_MULTIPLE)
    throw CommError(
        "this MPI library cannot be called from several threads (MPI_THREAD_MULTIPLE), which the "
        "training engine needs");
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size_), "MPI_Comm_size");
  // One communicator per channel: the host thread's collectives and the engine's run concurrently, and
  // collectives on one communicator must come in the same order on every rank.
  for (MPI_Comm& c : g_comms) {
    check(MPI_Comm_dup(MPI_COMM_WORLD, &c), "MPI_Comm_dup");
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
  }
  local_rank_ = l.local_rank;
  local_size_ = l.local_size;
}

World::~World() {
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  // With a collective abandoned, MPI_Finalize could wait for it forever.
  bool abandoned = false;
  {
    std::lock_guard lock(g_abandoned_mutex);
    abandoned = !g_abandoned.empty();
  }
  if (abandoned) return;
  for (MPI_Comm& c : g_comms)
    if (c != MPI_COMM_NULL) MPI_Comm_free(&c);
  MPI_Finalize();
}

void World::barrier(const std::string& what, const StopCheck& stop) {
  if (!mpi_) return;
  auto p = std::make_unique<Pending>();
  check(MPI_Ibarrier(comm(Channel::Host), &p->request), what);
  wait_for(p, what, timeout_, stop, prefix());
}

void World::broadcast(std::vector<char>& bytes, int root, const std::string& what, const StopCheck& stop) {
  if (!mpi_) return;
  auto p = std::make_unique<Pending>();
  p->a.resize(sizeof(uint64_t));
  const uint64_t mine = bytes.size();
  std::memcpy(p->a.data(), &mine, sizeof mine);
  check(MPI_Ibcast(p->a.data(), 1, MPI_UINT64_T, root, comm(Channel::Host), &p->request), what);
  wait_for(p, what, timeout_, stop, prefix());
  uint64_t size = 0;
  std::memcpy(&size, p->a.data(), sizeof size);
  if (size > static_cast<uint64_t>(INT_MAX))
    throw CommError(what + ": " + std::to_string(size) + " bytes is too many");
  p = std::make_unique<Pending>();
  p->a = rank_ == root ? bytes : std::vector<char>(static_cast<size_t>(size));
  check(MPI_Ibcast(p->a.data(), static_cast<int>(size), MPI_CHAR, root, comm(Channel::Host), &p->request),
        what);
  wait_for(p, what, timeout_, stop, prefix());
  bytes = std::move(p->a);
}

std::vector<std::string> World::allgather(const std::string& mine, const std::string& what,
                                          const StopCheck& stop) {
  if (!mpi_) return {mine};
  if (mine.size() > static_cast<size_t>(INT_MAX / std::max(1, size_)))
    throw CommError(what + ": " + std::to_string(mine.size()) + " bytes is too many to gather");
  auto p = std::make_unique<Pending>();
  p->counts.assign(static_cast<size_t>(size_), 0);
  p->a.resize(sizeof(int));
  const int own = static_cast<int>(mine.size());
  std::memcpy(p->a.data(), &own, sizeof own);
  check(
      MPI_Iallgather(p->a.data(), 1, MPI_INT, p->counts.data(), 1, MPI_INT, comm(Channel::Host), &p->request),
      what);
  wait_for(p, what, timeout_, stop, prefix());
  std::vector<int> sizes = p->counts;
  p = std::make_unique<Pending>();
  p->counts = sizes;
  p->offsets.assign(sizes.size(), 0);
  int64_t total = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    p->offsets[r] = static_cast<int>(total);
    total += sizes[r];
    if (sizes[r] < 0 || total > INT_MAX) throw CommError(what + ": the gathered strings are too large");
  }
  p->a.assign(mine.begin(), mine.end());
  p->b.resize(static_cast<size_t>(total));
  check(MPI_Iallgatherv(p->a.data(), own, MPI_CHAR, p->b.data(), p->counts.data(), p->offsets.data(),
                        MPI_CHAR, comm(Channel::Host), &p->request),
        what);
  wait_for(p, what, timeout_, stop, prefix());
  std::vector<std::string> out;
  for (size_t r = 0; r < sizes.size(); ++r)
    out.emplace_back(p->b.data() + p->offsets[r], static_cast<size_t>(sizes[r]));
  return out;
}

void World::allreduce_sum(float* data, size_t count, const std::string& what, Channel channel,
                          const StopCheck& stop) {
  if (mpi_) allreduce(data, count, MPI_FLOAT, comm(channel), what, timeout_, stop, prefix());
}

void World::allreduce_sum(double* data, size_t count, const std::string& what, Channel channel,
                          const StopCheck& stop) {
  if (mpi_) allreduce(data, count, MPI_DOUBLE, comm(channel), what, timeout_, stop, prefix());
}

void World::abort(int code) {
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

#else  // no MPI: a world of one

World::World() : timeout_(timeout_from_env()) {
  const LaunchInfo l = launch_info();
  if (l.under_mpirun && l.size > 1)
    throw CommError(
        "this gpunodes was built without MPI (GPUNODES_MPI=OFF or no libopenmpi-dev), so it cannot "
        "join a job of " +
        std::to_string(l.size) + " ranks");
}

World::~World() = default;

void World::barrier(const std::string&, const StopCheck&) {}
void World::broadcast(std::vector<char>&, int, const std::string&, const StopCheck&) {}
std::vector<std::string> World::allgather(const std::string& mine, const std::string&, const StopCheck&) {
  return {mine};
}
void World::allreduce_sum(float*, size_t, const std::string&, Channel, const StopCheck&) {}
void World::allreduce_sum(double*, size_t, const std::string&, Channel, const StopCheck&) {}

void World::abort(int code) {
  std::exit(code);
}

#endif

}  // namespace gn::dist
