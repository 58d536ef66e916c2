// The job's processes: MPI under mpirun, a world of one otherwise (world.h).
#include "gpunodes/dist/world.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <list>
#include <mutex>
#include <set>
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

using Clock = std::chrono::steady_clock;

std::string seconds_text(std::chrono::milliseconds ms) {
  char text[32];
  if (ms.count() % 1000 == 0)
    std::snprintf(text, sizeof text, "%lld s", static_cast<long long>(ms.count() / 1000));
  else
    std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(ms.count()) / 1000.0);
  return text;
}

// The collectives being waited for now, on any thread: what mpirun interrupted when it ends the job.
struct InFlight {
  std::string what;
  Clock::time_point since;
};
std::mutex g_in_flight_mutex;
std::list<InFlight> g_in_flight;

class Waiting {
 public:
  explicit Waiting(const std::string& what) {
    std::lock_guard lock(g_in_flight_mutex);
    it_ = g_in_flight.insert(g_in_flight.end(), {what, Clock::now()});
  }
  ~Waiting() {
    std::lock_guard lock(g_in_flight_mutex);
    g_in_flight.erase(it_);
  }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

 private:
  std::list<InFlight>::iterator it_;
};

// The watchdog of end_process_within(): one thread, started on first use, that sleeps until the earliest
// deadline asked for and then ends the process. A detached thread, so that nothing waits for it at exit.
struct Watchdog {
  std::mutex mutex;
  std::condition_variable changed;
  bool started = false;
  Clock::time_point deadline = Clock::time_point::max();
  int code = 1;
  std::string why;
};
Watchdog& watchdog() {
  static Watchdog* w = new Watchdog;  // never destroyed: it may still run while statics are torn down
  return *w;
}

// Set when a wait gave up on the other ranks (a host lost, frozen or cut off): the abort that follows may not
// end the job by itself (watch_launcher()).
std::atomic<bool> g_gave_up{false};
std::atomic<bool> g_watching{false};

// This rank's launcher: its parent process when that is mpirun (on mpirun's host) or Open MPI's daemon
// (orted, on the other hosts); 0 otherwise. *name gets its name.
pid_t launcher(std::string* name) {
  const pid_t parent = ::getppid();
  char path[64];
  std::snprintf(path, sizeof path, "/proc/%d/comm", static_cast<int>(parent));
  FILE* f = std::fopen(path, "r");
  if (!f) return 0;
  char comm[64] = {};
  const bool read = std::fgets(comm, sizeof comm, f) != nullptr;
  std::fclose(f);
  if (!read) return 0;
  comm[strcspn(comm, "\n")] = 0;
  static const std::set<std::string> known{"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted"};
  if (!known.count(comm)) return 0;
  *name = comm;
  return parent;
}

void sleep_ms(int ms) {
  timespec t{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&t, &t) != 0 && errno == EINTR) {
  }
}

// Whether process `pid` runs (not our child, so polled; a zombie has ended). Async-signal-safe.
bool running(pid_t pid) {
  char path[32] = "/proc/";
  int n = 6;
  char digits[16];
  int d = 0;
  for (long v = pid; v > 0 && d < 15; v /= 10) digits[d++] = static_cast<char>('0' + v % 10);
  while (d > 0) path[n++] = digits[--d];
  for (const char c : {'/', 's', 't', 'a', 't', '\0'}) path[n++] = c;
  const int fd = ::open(path, O_RDONLY);
  if (fd < 0) return false;
  char stat[512];
  const ssize_t got = ::read(fd, stat, sizeof stat - 1);
  ::close(fd);
  if (got <= 0) return false;
  // "pid (comm) S ...": the state after the last ')'.
  ssize_t close_paren = -1;
  for (ssize_t i = 0; i < got; ++i)
    if (stat[i] == ')') close_paren = i;
  if (close_paren < 0 || close_paren + 2 >= got) return true;
  const char state = stat[close_paren + 2];
  return state != 'Z' && state != 'X';
}

// Waits up to `ms` for process `pid` to end; whether it did.
bool ended_within(pid_t pid, int ms) {
  for (int waited = 0;; waited += 100) {
    if (!running(pid)) return true;
    if (waited >= ms) return false;
    sleep_ms(100);
  }
}

// After a rank gave up on the others and asked for the job's end (MPI_Abort, or its process ended by the
// watchdog), mpirun ends every rank and then waits until each host's daemon says its ranks are gone. A host
// that is cut off Open MPI notices by itself (its oob_tcp_keepalive settings); a frozen one it never
// notices, since the frozen host's kernel still answers on its connections: mpirun would wait forever. So a
// small process forked here (in a session of its own, so that mpirun's SIGTERM and SIGKILL to the rank do
// not reach it) watches the rank's launcher, mpirun or this host's orted: if it still runs `grace` later, it
// interrupts it as a second Ctrl-C would (SIGINT twice, 2 s apart: Open MPI's forced exit), and kills it 2 s
// after that. It says so on the launcher's own stderr, since the rank's output may be gone with the rank.
// The watcher uses only async-signal-safe calls; it ends as soon as the launcher has.
void watch_launcher(const World& world, std::chrono::milliseconds grace) {
  if (g_watching.exchange(true)) return;
  std::string name;
  const pid_t pid = launcher(&name);
  if (pid <= 1) return;
  const std::string err_path = "/proc/" + std::to_string(pid) + "/fd/2";
  const std::string interrupting = world.prefix() + "gpunodes: " + name + " had not ended the job " +
                                   std::to_string(grace.count() / 1000) + " s after this rank gave up on " +
                                   world.others() +
                                   " (its host frozen or cut off, and Open MPI waits for it): interrupting " +
                                   name + " (pid " + std::to_string(pid) + ")\n";
  const std::string killing = world.prefix() + "gpunodes: " + name + " still runs 4 s after it was interrupted: " +
                              "killing it\n";
  rlimit files{};
  const int max_fd = ::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY
                         ? static_cast<int>(std::min<rlim_t>(files.rlim_cur, 1 << 20))
                         : 65536;
  const int ms = static_cast<int>(grace.count());
  const pid_t child = ::fork();
  if (child != 0) return;  // the rank (or fork failed: nothing more to do)
  // The watcher. No file of the rank's stays open: mpirun waits for the rank's output pipes to close.
  ::setsid();
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) ::sigaction(sig, &ignore, nullptr);
#ifdef SYS_close_range
  if (::syscall(SYS_close_range, 0U, ~0U, 0U) != 0)
#endif
    for (int fd = 0; fd < max_fd; ++fd) ::close(fd);
  if (ended_within(pid, ms)) ::_exit(0);
  auto say = [&](const std::string& line) {
    const int fd = ::open(err_path.c_str(), O_WRONLY | O_APPEND | O_NOCTTY);
    if (fd < 0) return;
    [[maybe_unused]] const ssize_t n = ::write(fd, line.data(), line.size());
    ::close(fd);
  };
  say(interrupting);
  ::kill(pid, SIGINT);
  if (ended_within(pid, 2000)) ::_exit(0);
  ::kill(pid, SIGINT);
  if (ended_within(pid, 2000)) ::_exit(0);
  say(killing);
  ::kill(pid, SIGKILL);
  ::_exit(0);
}

}  // namespace

void end_process_within(std::chrono::milliseconds after, int code, const std::string& why) {
  Watchdog& w = watchdog();
  std::lock_guard lock(w.mutex);
  const auto deadline = Clock::now() + after;
  if (deadline < w.deadline) {
    w.deadline = deadline;
    w.code = code;
    w.why = why;
  }
  if (!w.started) {
    w.started = true;
    std::thread([&w] {
      std::unique_lock lock(w.mutex);
      while (Clock::now() < w.deadline) w.changed.wait_until(lock, w.deadline);
      // A rank that gave up on the others: its end makes mpirun end the job, which a frozen host holds up.
      if (g_gave_up.load()) watch_launcher(World::get(), World::kAbortGrace);
      const std::string line = w.why + "\n";
      // write(2) and _exit: the process may be wedged anywhere (inside MPI, in a lock of stdio, in static
      // destructors), so nothing that could wait on another thread.
      [[maybe_unused]] const ssize_t n = ::write(STDERR_FILENO, line.data(), line.size());
      ::_exit(w.code);
    }).detach();
  } else {
    w.changed.notify_all();
  }
}

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

std::string World::others() const {
  auto host = [this](int r) {
    return static_cast<size_t>(r) < hosts_.size() && !hosts_[r].empty() ? hosts_[static_cast<size_t>(r)]
                                                                         : std::string();
  };
  if (size_ == 2) {
    const int other = 1 - rank_;
    const std::string h = host(other);
    return "rank " + std::to_string(other) + (h.empty() ? std::string() : " on " + h);
  }
  // Which of several ranks a collective misses, MPI does not say: every other rank, and their hosts.
  std::set<std::string> hosts;
  for (int r = 0; r < size_; ++r)
    if (r != rank_ && !host(r).empty()) hosts.insert(host(r));
  std::string out = "the other " + std::to_string(size_ - 1) + " ranks";
  if (!hosts.empty()) {
    std::string list;
    for (const std::string& h : hosts) list += (list.empty() ? "" : ", ") + h;
    out += " (on " + list + ")";
  }
  return out;
}

std::string World::waiting(std::chrono::milliseconds at_least) const {
  std::string out;
  const auto now = Clock::now();
  std::lock_guard lock(g_in_flight_mutex);
  for (const InFlight& f : g_in_flight) {
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - f.since);
    if (waited < at_least) continue;
    char text[32];
    std::snprintf(text, sizeof text, " (%.1f s)", static_cast<double>(waited.count()) / 1000.0);
    out += (out.empty() ? "" : "; ") + f.what + text;
  }
  return out;
}

std::string World::launcher_warning() const {
  if (!mpi_ || rank_ != 0 || size_ < 2) return {};
  std::set<std::string> distinct(hosts_.begin(), hosts_.end());
  const int nodes = std::max(static_cast<int>(distinct.size()), env_int("OMPI_MCA_orte_num_nodes", 1));
  if (nodes < 2) return {};
  // Open MPI 4.1's defaults; mpirun passes its --mca settings to the ranks as OMPI_MCA_* variables.
  const int idle = env_int("OMPI_MCA_oob_tcp_keepalive_time", 300);
  const int interval = env_int("OMPI_MCA_oob_tcp_keepalive_intvl", 20);
  const int probes = env_int("OMPI_MCA_oob_tcp_keepalive_probes", 9);
  const std::string fix =
      "add --mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 "
      "to mpirun's options (docs/distributed.md)";
  const std::string cost = ", after the ranks give up on it (" + seconds_text(timeout_) +
                           "): a host cut off would end the job only then, and only by gpunodes "
                           "interrupting mpirun and the daemons; " +
                           fix;
  if (const char* v = std::getenv("OMPI_MCA_oob_tcp_keepalive_time"); v && *v && idle == 0)
    return "this job spans " + std::to_string(nodes) +
           " hosts and Open MPI's daemons never notice a lost host (oob_tcp_keepalive_time 0)" + cost;
  const int64_t notice_ms = (int64_t{idle} + int64_t{interval} * probes) * 1000;
  if (notice_ms < timeout_.count()) return {};
  return "this job spans " + std::to_string(nodes) + " hosts and Open MPI's daemons notice a lost host " +
         std::to_string(notice_ms / 1000) + " s after its link goes quiet (oob_tcp_keepalive_time " +
         std::to_string(idle) + " + " + std::to_string(probes) + " x oob_tcp_keepalive_intvl " +
         std::to_string(interval) + ")" + cost;
}

#ifdef GPUNODES_HAVE_MPI

namespace {

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
void wait_for(std::unique_ptr<Pending>& p, const std::string& what, const World& world,
              const World::StopCheck& stop) {
  const std::chrono::milliseconds timeout = world.timeout();
  const Waiting waiting(what);
  const auto start = Clock::now(), deadline = start + timeout;
  auto pause = std::chrono::microseconds(0);
  auto give_up = [&] {
    std::lock_guard lock(g_abandoned_mutex);
    g_abandoned.push_back(std::move(p));
  };
  // Once a wait gave up on the other ranks, the job is over: a later exchange (a node that runs after the
  // failed one) would only wait out the timeout again before the process ends.
  if (g_gave_up.load()) {
    give_up();
    throw CommError(world.prefix() + what + ": not waited for: an earlier exchange already gave up on " +
                    world.others());
  }
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
      g_gave_up.store(true);
      const std::string message =
          world.prefix() + what + ": " + world.others() + " did not answer within " + seconds_text(timeout) +
          ": lost (its host down, cut off or frozen; the process killed, out of memory or failed) or "
          "running another graph";
      // The job cannot go on. The caller reports this and calls abort(); whatever holds it up on the way
      // (a wedged MPI call, an engine op that waits on the lost rank too), the process ends within the bound.
      end_process_within(World::kGiveUpGrace, 1,
                         world.prefix() + "gave up on " + what + " " + seconds_text(World::kGiveUpGrace) +
                             " ago and has not ended: ending the process");
      throw CommError(message);
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
               const World& world, const World::StopCheck& stop) {
  // MPI counts are ints: a larger buffer goes in pieces.
  for (size_t done = 0; done < count;) {
    const size_t n = std::min<size_t>(count - done, INT_MAX / sizeof(T));
    auto p = std::make_unique<Pending>();
    p->a.resize(n * sizeof(T));
    std::memcpy(p->a.data(), data + done, n * sizeof(T));
    check(MPI_Iallreduce(MPI_IN_PLACE, p->a.data(), static_cast<int>(n), type, MPI_SUM, c, &p->request),
          what);
    wait_for(p, what, world, stop);
    std::memcpy(data + done, p->a.data(), n * sizeof(T));
    done += n;
  }
}

}  // namespace

World::World() : timeout_(timeout_from_env()) {
  const LaunchInfo l = launch_info();
  if (!l.under_mpirun) {
    char name[256] = {};
    if (::gethostname(name, sizeof name - 1) == 0) hosts_.emplace_back(name);
    return;
  }
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
  // Every rank's host, so that a rank that waits in vain can say whom it waited for.
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  if (MPI_Get_processor_name(name, &length) != MPI_SUCCESS) length = 0;
  auto p = std::make_unique<Pending>();
  p->a.assign(name, name + MPI_MAX_PROCESSOR_NAME);
  p->b.resize(static_cast<size_t>(MPI_MAX_PROCESSOR_NAME) * static_cast<size_t>(size_));
  check(MPI_Iallgather(p->a.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, p->b.data(), MPI_MAX_PROCESSOR_NAME,
                       MPI_CHAR, comm(Channel::Host), &p->request),
        "gathering the ranks' host names");
  wait_for(p, "gathering the ranks' host names", *this, {});
  for (int r = 0; r < size_; ++r) {
    const char* h = p->b.data() + static_cast<size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    hosts_.emplace_back(h, strnlen(h, MPI_MAX_PROCESSOR_NAME));
  }
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
  wait_for(p, what, *this, stop);
}

void World::broadcast(std::vector<char>& bytes, int root, const std::string& what, const StopCheck& stop) {
  if (!mpi_) return;
  auto p = std::make_unique<Pending>();
  p->a.resize(sizeof(uint64_t));
  const uint64_t mine = bytes.size();
  std::memcpy(p->a.data(), &mine, sizeof mine);
  check(MPI_Ibcast(p->a.data(), 1, MPI_UINT64_T, root, comm(Channel::Host), &p->request), what);
  wait_for(p, what, *this, stop);
  uint64_t size = 0;
  std::memcpy(&size, p->a.data(), sizeof size);
  if (size > static_cast<uint64_t>(INT_MAX))
    throw CommError(what + ": " + std::to_string(size) + " bytes is too many");
  p = std::make_unique<Pending>();
  p->a = rank_ == root ? bytes : std::vector<char>(static_cast<size_t>(size));
  check(MPI_Ibcast(p->a.data(), static_cast<int>(size), MPI_CHAR, root, comm(Channel::Host), &p->request),
        what);
  wait_for(p, what, *this, stop);
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
  wait_for(p, what, *this, stop);
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
  wait_for(p, what, *this, stop);
  std::vector<std::string> out;
  for (size_t r = 0; r < sizes.size(); ++r)
    out.emplace_back(p->b.data() + p->offsets[r], static_cast<size_t>(sizes[r]));
  return out;
}

void World::allreduce_sum(float* data, size_t count, const std::string& what, Channel channel,
                          const StopCheck& stop) {
  if (mpi_) allreduce(data, count, MPI_FLOAT, comm(channel), what, *this, stop);
}

void World::allreduce_sum(double* data, size_t count, const std::string& what, Channel channel,
                          const StopCheck& stop) {
  if (mpi_) allreduce(data, count, MPI_DOUBLE, comm(channel), what, *this, stop);
}

void World::abort(int code) {
  if (mpi_) {
    // MPI_Abort asks mpirun, through this host's daemon, to end the job, and Open MPI ends this process on
    // the way; with the daemon frozen or cut off that may never come.
    end_process_within(kAbortGrace, code,
                       prefix() + "MPI_Abort did not end this process within " + seconds_text(kAbortGrace) +
                           ": ending it");
    // After a wait gave up on a host, mpirun may wait for that host forever (watch_launcher()).
    if (g_gave_up.load() && size_ > 1) watch_launcher(*this, kAbortGrace);
    MPI_Abort(MPI_COMM_WORLD, code);
  }
  std::exit(code);
}

#else  // no MPI: a world of one

World::World() : timeout_(timeout_from_env()) {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) == 0) hosts_.emplace_back(name);
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
