// The job's processes: MPI under mpirun, a world of one otherwise (world.h).
#include "gpunodes/dist/world.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
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
  local_rank_ = l.local_rank;
  local_size_ = l.local_size;
}

World::~World() {
  if (!mpi_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

namespace {

// MPI_Test in a loop with a deadline and a cancel check: MPI's blocking calls would wait forever for a rank
// that never comes. The sleep grows to 1 ms, so a long wait costs little CPU and a short one little latency.
void wait_for(MPI_Request& request, const std::string& what, std::chrono::milliseconds timeout,
              const World::StopCheck& stop, const std::string& prefix) {
  const auto deadline = Clock::now() + timeout;
  auto pause = std::chrono::microseconds(0);
  while (true) {
    int done = 0;
    check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    if (stop && stop()) throw Stopped();
    if (Clock::now() > deadline)
      throw CommError(
          prefix + what + ": the other ranks did not answer within " +
          std::to_string(timeout.count() / 1000) +
          " s: a rank was lost (killed, out of memory, failed) or the ranks run different graphs");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2 + std::chrono::microseconds(10), std::chrono::microseconds(1000));
  }
}

template <typename T>
void allreduce(T* data, size_t count, MPI_Datatype type, const std::string& what,
               std::chrono::milliseconds timeout, const World::StopCheck& stop, const std::string& prefix) {
  // MPI counts are ints: a larger buffer goes in pieces.
  for (size_t done = 0; done < count;) {
    const int n = static_cast<int>(std::min<size_t>(count - done, INT_MAX));
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, data + done, n, type, MPI_SUM, MPI_COMM_WORLD, &request), what);
    wait_for(request, what, timeout, stop, prefix);
    done += static_cast<size_t>(n);
  }
}

}  // namespace

void World::barrier(const std::string& what, const StopCheck& stop) {
  if (!mpi_) return;
  MPI_Request request;
  check(MPI_Ibarrier(MPI_COMM_WORLD, &request), what);
  wait_for(request, what, timeout_, stop, prefix());
}

void World::broadcast(std::vector<char>& bytes, int root, const std::string& what, const StopCheck& stop) {
  if (!mpi_) return;
  uint64_t size = bytes.size();
  MPI_Request request;
  check(MPI_Ibcast(&size, 1, MPI_UINT64_T, root, MPI_COMM_WORLD, &request), what);
  wait_for(request, what, timeout_, stop, prefix());
  if (size > static_cast<uint64_t>(INT_MAX))
    throw CommError(what + ": " + std::to_string(size) + " bytes is too many");
  bytes.resize(static_cast<size_t>(size));
  check(MPI_Ibcast(bytes.data(), static_cast<int>(size), MPI_CHAR, root, MPI_COMM_WORLD, &request), what);
  wait_for(request, what, timeout_, stop, prefix());
}

std::vector<std::string> World::allgather(const std::string& mine, const std::string& what,
                                          const StopCheck& stop) {
  if (!mpi_) return {mine};
  if (mine.size() > static_cast<size_t>(INT_MAX / std::max(1, size_)))
    throw CommError(what + ": " + std::to_string(mine.size()) + " bytes is too many to gather");
  std::vector<int> sizes(static_cast<size_t>(size_));
  int own = static_cast<int>(mine.size());
  MPI_Request request;
  check(MPI_Iallgather(&own, 1, MPI_INT, sizes.data(), 1, MPI_INT, MPI_COMM_WORLD, &request), what);
  wait_for(request, what, timeout_, stop, prefix());
  std::vector<int> offsets(sizes.size());
  int64_t total = 0;
  for (size_t r = 0; r < sizes.size(); ++r) {
    offsets[r] = static_cast<int>(total);
    total += sizes[r];
    if (sizes[r] < 0 || total > INT_MAX) throw CommError(what + ": the gathered strings are too large");
  }
  std::string all(static_cast<size_t>(total), '\0');
  check(MPI_Iallgatherv(mine.data(), own, MPI_CHAR, all.data(), sizes.data(), offsets.data(), MPI_CHAR,
                        MPI_COMM_WORLD, &request),
        what);
  wait_for(request, what, timeout_, stop, prefix());
  std::vector<std::string> out;
  for (size_t r = 0; r < sizes.size(); ++r) out.push_back(all.substr(offsets[r], sizes[r]));
  return out;
}

void World::allreduce_sum(float* data, size_t count, const std::string& what, const StopCheck& stop) {
  if (mpi_) allreduce(data, count, MPI_FLOAT, what, timeout_, stop, prefix());
}

void World::allreduce_sum(double* data, size_t count, const std::string& what, const StopCheck& stop) {
  if (mpi_) allreduce(data, count, MPI_DOUBLE, what, timeout_, stop, prefix());
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
void World::allreduce_sum(float*, size_t, const std::string&, const StopCheck&) {}
void World::allreduce_sum(double*, size_t, const std::string&, const StopCheck&) {}

void World::abort(int code) {
  std::exit(code);
}

#endif

}  // namespace gn::dist
