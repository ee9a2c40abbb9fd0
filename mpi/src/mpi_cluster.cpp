// MpiCluster: MPI start-up, the window of share words, and the collectives with a watch while waiting.
#include <stealbatch/error.hpp>
#include <stealbatch/mpi/mpi_cluster.hpp>

#include "mpi_error.hpp"
#include "ring_allreduce.hpp"
#include "two_level.hpp"

#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

namespace stealbatch::mpi {

namespace {

using detail::check;
using detail::error_text;

// MPI's user operation for allreduce_sum_bf16: inout[i] = bfloat16(in[i] + inout[i]), the sum in float.
void bf16_pairs(void* in, void* inout, int* len, MPI_Datatype* /*type: MPI_UINT16_T*/) {
  add_bf16(static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout), static_cast<std::size_t>(*len));
}

// The ring's additions (ring_allreduce.hpp): inout[i] += in[i]; bfloat16's as bf16_pairs.
template <class T>
void add(const void* in, void* inout, std::size_t n) {
  const T* a = static_cast<const T*>(in);
  T* b = static_cast<T*>(inout);
  for (std::size_t i = 0; i < n; ++i) b[i] += a[i];
}
void add_bf16_pairs(const void* in, void* inout, std::size_t n) { add_bf16(static_cast<const std::uint16_t*>(in), static_cast<std::uint16_t*>(inout), n); }

// MPI started by this library, and how many clusters use it.
std::mutex g_init_lock;
int g_users = 0;
bool g_we_initialised = false;
bool g_at_exit = false;  // finalize_at_exit(): MPI ends with the process, not with its last cluster

}  // namespace

struct MpiCluster::State {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Win win = MPI_WIN_NULL;
  std::uint64_t* base = nullptr;
  int rank = 0, size = 1;
  std::vector<char> same_node;
  std::vector<std::string> node_names;
  // Every MPI call of this cluster is made under this lock: the library runs MPI_THREAD_MULTIPLE, but one-sided
  // components have had thread-safety defects, and these calls are short (a window atomic, a test of a collective).
  std::mutex lock;
  // The progress agent: where the one-sided component progresses a passive target only when the target enters MPI
  // (osc ucx, between nodes), a thread enters MPI every period (20 µs) so that a thief's atomic completes while this
  // rank's devices compute. Not needed within a node (osc sm). While this rank is inside a step's sum
  // (set_prompt_access(false)) it enters every kIdleProgress instead, and leaves the cores to the sum, whose own
  // calls progress the transport (about every 50 µs while it waits).
  // `prompt` and `stop` are written under agent_lock and read by the agent under it (or, between its calls, relaxed:
  // a stale value costs one period).
  std::thread progress;
  std::mutex agent_lock;
  std::condition_variable agent_wake;
  std::atomic<bool> stop{false}, prompt{true};
  // The one-sided access under the lock now: (target rank + 1) << 48 | its start in steady-clock milliseconds, or 0.
  // One word, so a reader on another thread sees a target with its own start. Written only under the lock; relaxed
  // on both sides: the word carries all the reader needs and publishes no other memory.
  std::atomic<std::uint64_t> in_flight{0};
  // The node's pulses (Cluster::set_node_pulse): a shared-memory window over the node's ranks, one word each, mapped
  // into every process of the node; pulse[r] is rank r's word, null for ranks of other nodes or where the window
  // could not be made (an osc selection without sm). Each word is written by its rank's sentinel only and read by
  // the others', all through std::atomic_ref, relaxed: a lock-free 64-bit atomic is address-free, so it is atomic
  // across processes that map the same page, and a reader only compares values for change (no other memory is
  // published through them).
  MPI_Comm node_comm = MPI_COMM_NULL;
  MPI_Win pulse_win = MPI_WIN_NULL;
  std::vector<std::uint64_t*> pulse;
  // Ranks that joined through a port (joined()): each is its own MPI job, so the job's abort is the cluster's
  // communicator, and one-sided components see the others as remote wherever they run.
  bool joined = false;
  // bfloat16's sum (allreduce_sum_bf16): each pair added in float and rounded back.
  MPI_Op bf16_sum = MPI_OP_NULL;
  // The sums of large buffers, from ring_from bytes on: the ring in node order (ring_allreduce.hpp), or where the
  // ranks agreed on it, in two levels (two_level.hpp: `levels`, over a duplicate of the node's communicator and one
  // of the nodes' leaders).
  detail::Ring ring;
  std::size_t ring_from = detail::kRingFrom;
  detail::TwoLevel levels;  // levels.node: MPI_COMM_NULL unless the sums go in two levels
  MPI_Comm leaders_comm = MPI_COMM_NULL;
};

namespace {

std::uint64_t steady_ms() noexcept {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

// Marks one one-sided access to `rank` as in flight for its scope (the lock held).
class InFlight {
 public:
  InFlight(std::atomic<std::uint64_t>& word, int rank) noexcept : m_word(word) {
    m_word.store((static_cast<std::uint64_t>(rank) + 1) << 48 | (steady_ms() & ((std::uint64_t{1} << 48) - 1)), std::memory_order_relaxed);
  }
  ~InFlight() { m_word.store(0, std::memory_order_relaxed); }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;

 private:
  std::atomic<std::uint64_t>& m_word;
};

// How the sums of large buffers go (STEALBATCH_MPI_RING): 0, MPI's own allreduce for every size (a comparison, or a
// fallback); 1 (unset: the default), the ring in node order; 2, two levels (within each node, across the nodes'
// leaders, within again: fewer bytes across the nodes where a node holds several ranks, measured no faster on the
// emulated cluster; docs/DESIGN.md). -1: a value that is none of these.
enum LargeSums : int { kMpiOwn = 0, kRing = 1, kTwoLevel = 2 };

int large_sums_setting() {
  const char* v = std::getenv("STEALBATCH_MPI_RING");
  if (v == nullptr) return kRing;
  for (const int k : {kMpiOwn, kRing, kTwoLevel}) {
    if (std::strcmp(v, std::to_string(k).c_str()) == 0) return k;
  }
  return -1;
}

// Every rank's setting, agreed in one collective before the first sum: ranks that took different ways to the same sum
// would wait for each other for good. Every rank throws the same ConfigError where they differ, or where one is none
// of 0, 1 and 2.
int agree_large_sums(MPI_Comm comm, int mine) {
  int low_high[2] = {mine, -mine};  // the minimum of both: the lowest setting and, negated, the highest
  check(MPI_Allreduce(MPI_IN_PLACE, low_high, 2, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  const int lo = low_high[0], hi = -low_high[1];
  if (lo < 0) throw ConfigError("STEALBATCH_MPI_RING: 0 (MPI's own allreduce), 1 (the default: the ring in node order) or 2 (two levels); a rank has another value");
  if (lo != hi) throw ConfigError("STEALBATCH_MPI_RING differs between ranks (" + std::to_string(lo) + " on some, " + std::to_string(hi) + " on others, unset counting as 1): give every rank the same");
  return mine;
}

// The agent's period while this rank is inside a step's sum.
constexpr std::chrono::microseconds kIdleProgress{1000};

// The agent's period otherwise: STEALBATCH_MPI_PROGRESS_US, else 20 µs.
std::chrono::microseconds progress_period() {
  if (const char* v = std::getenv("STEALBATCH_MPI_PROGRESS_US")) {
    const long us = std::atol(v);
    if (us >= 1 && us <= 1000000) return std::chrono::microseconds(us);
    throw ConfigError(std::string("STEALBATCH_MPI_PROGRESS_US = '") + v + "': give the progress agent's period in microseconds, 1 to 1000000");
  }
  return std::chrono::microseconds(20);
}

bool wants_progress_agent(const std::vector<char>& same_node, bool joined) {
  if (const char* v = std::getenv("STEALBATCH_MPI_PROGRESS")) return std::strcmp(v, "0") != 0;
  // Separate jobs never share a window through osc sm (Open MPI 4.1 picks ucx between them even on one node, and a
  // thief's atomic on a computing victim then waited 1.8 s for it in a test), whatever the node split says.
  if (joined) return true;
  for (char c : same_node) {
    if (c == 0) return true;  // ranks on other nodes: the window is not shared memory
  }
  return false;
}

}  // namespace

bool MpiCluster::launched_by_mpirun() noexcept {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

int MpiCluster::local_rank() noexcept {
  const char* v = std::getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  if (v == nullptr) v = std::getenv("MPI_LOCALRANKID");
  return v != nullptr ? std::atoi(v) : 0;
}

namespace {

// MPI_Init_thread once per process (MPI_THREAD_MULTIPLE), and one more user of it.
void init_mpi() {
  const std::lock_guard g(g_init_lock);
  int initialised = 0, finalised = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalised);
  if (finalised) {
    throw Error("MPI: finalised already (the last cluster of this process went); a process starts MPI once, so keep a cluster alive across "
                "the runtimes that use it");
  }
  if (!initialised) {
    // Passive-target progress: a thief's compare-and-swap must complete while the victim computes. Open MPI's shared
    // memory component gives that within a node; its default selection does not (see the design document).
    setenv("OMPI_MCA_osc", "sm,ucx", /*overwrite=*/0);
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided), "MPI_Init_thread");
    g_we_initialised = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      throw Error("MPI: the library gives thread level " + std::to_string(provided) + ", below MPI_THREAD_MULTIPLE, which the runtime needs");
    }
  }
  ++g_users;
}

}  // namespace

// The ranks' ring setting agreed (before any sum), then each rank's node name (for messages and the split below), then
// which ranks share this node: a shared-memory split, and each rank's node leader gathered.
void MpiCluster::find_nodes(State& s) {
  const int how = agree_large_sums(s.comm, large_sums_setting());
  s.ring_from = how == kMpiOwn ? std::numeric_limits<std::size_t>::max() : detail::kRingFrom;
  std::vector<char> names(static_cast<std::size_t>(s.size) * MPI_MAX_PROCESSOR_NAME, '\0');
  char mine[MPI_MAX_PROCESSOR_NAME] = {};
  int len = 0;
  check(MPI_Get_processor_name(mine, &len), "MPI_Get_processor_name");
  check(MPI_Allgather(mine, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, s.comm), "MPI_Allgather");
  for (int r = 0; r < s.size; ++r) {
    const char* n = names.data() + static_cast<std::size_t>(r) * MPI_MAX_PROCESSOR_NAME;
    s.node_names.emplace_back(n, strnlen(n, MPI_MAX_PROCESSOR_NAME));
  }
  MPI_Comm node = MPI_COMM_NULL;
  if (s.joined) {
    // Ranks of separate jobs: MPI's shared-memory split knows only its own job's processes, so the node is the
    // processor name's (the first rank of the same name is the colour).
    const auto first = std::find(s.node_names.begin(), s.node_names.end(), s.node_names[static_cast<std::size_t>(s.rank)]) - s.node_names.begin();
    check(MPI_Comm_split(s.comm, static_cast<int>(first), s.rank, &node), "MPI_Comm_split");
  } else {
    check(MPI_Comm_split_type(s.comm, MPI_COMM_TYPE_SHARED, s.rank, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  }
  int node_leader = s.rank;
  check(MPI_Bcast(&node_leader, 1, MPI_INT, 0, node), "MPI_Bcast");
  s.node_comm = node;
  MPI_Comm_set_errhandler(node, MPI_ERRORS_RETURN);
  open_pulses(s);
  std::vector<int> leaders(static_cast<std::size_t>(s.size));
  check(MPI_Allgather(&node_leader, 1, MPI_INT, leaders.data(), 1, MPI_INT, s.comm), "MPI_Allgather");
  for (int l : leaders) s.same_node.push_back(l == node_leader ? 1 : 0);
  s.ring = detail::ring_of(s.comm, s.rank, leaders);
  if (how == kTwoLevel) two_levels(s);
}

// Large sums in two levels: their communicators, the node's (a duplicate, so that no other use of it meets the sums'
// messages) and the nodes' leaders', with the leaders' ring.
void MpiCluster::two_levels(State& s) {
  check(MPI_Comm_dup(s.node_comm, &s.levels.node), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(s.levels.node, MPI_ERRORS_RETURN);
  check(MPI_Comm_rank(s.levels.node, &s.levels.node_rank), "MPI_Comm_rank");
  check(MPI_Comm_size(s.levels.node, &s.levels.node_size), "MPI_Comm_size");
  check(MPI_Comm_split(s.comm, s.levels.node_rank == 0 ? 0 : MPI_UNDEFINED, s.rank, &s.leaders_comm), "MPI_Comm_split");
  int ring[2] = {0, 1};  // the leader's place in the leaders' ring, and its size: the node's ranks learn them
  if (s.leaders_comm != MPI_COMM_NULL) {
    MPI_Comm_set_errhandler(s.leaders_comm, MPI_ERRORS_RETURN);
    check(MPI_Comm_rank(s.leaders_comm, &ring[0]), "MPI_Comm_rank");
    check(MPI_Comm_size(s.leaders_comm, &ring[1]), "MPI_Comm_size");
    std::vector<int> own(static_cast<std::size_t>(ring[1]));
    std::iota(own.begin(), own.end(), 0);  // each leader its own node
    s.levels.leaders = detail::ring_of(s.leaders_comm, ring[0], own);
  }
  check(MPI_Bcast(ring, 2, MPI_INT, 0, s.levels.node), "MPI_Bcast");
  s.levels.position = ring[0], s.levels.nodes = ring[1];
}

// The node's pulse words (see State::pulse). Where the shared window cannot be made, every rank of the node finds
// out in the same collective call, and the cluster goes on without pulses.
void MpiCluster::open_pulses(State& s) {
  static_assert(std::atomic_ref<std::uint64_t>::is_always_lock_free, "the node's pulses need address-free 64-bit atomics");
  std::uint64_t* mine = nullptr;
  if (MPI_Win_allocate_shared(sizeof(std::uint64_t), sizeof(std::uint64_t), MPI_INFO_NULL, s.node_comm, &mine, &s.pulse_win) != MPI_SUCCESS) {
    s.pulse_win = MPI_WIN_NULL;
    return;
  }
  std::atomic_ref<std::uint64_t>(*mine).store(0, std::memory_order_relaxed);
  int node_size = 0;
  check(MPI_Comm_size(s.node_comm, &node_size), "MPI_Comm_size");
  std::vector<int> world_rank(static_cast<std::size_t>(node_size));
  check(MPI_Allgather(&s.rank, 1, MPI_INT, world_rank.data(), 1, MPI_INT, s.node_comm), "MPI_Allgather");
  s.pulse.assign(static_cast<std::size_t>(s.size), nullptr);
  for (int i = 0; i < node_size; ++i) {
    MPI_Aint bytes = 0;
    int unit = 0;
    void* at = nullptr;
    check(MPI_Win_shared_query(s.pulse_win, i, &bytes, &unit, &at), "MPI_Win_shared_query");
    s.pulse[static_cast<std::size_t>(world_rank[static_cast<std::size_t>(i)])] = static_cast<std::uint64_t*>(at);
  }
  check(MPI_Barrier(s.node_comm), "MPI_Barrier");  // every word zeroed before any rank reads one
}

bool MpiCluster::has_node_pulse() const noexcept { return m->pulse_win != MPI_WIN_NULL; }

void MpiCluster::set_node_pulse(std::uint64_t value) noexcept {
  if (m->pulse_win != MPI_WIN_NULL) std::atomic_ref<std::uint64_t>(*m->pulse[static_cast<std::size_t>(m->rank)]).store(value, std::memory_order_relaxed);
}

std::uint64_t MpiCluster::node_pulse(int rank) const noexcept {
  if (m->pulse_win == MPI_WIN_NULL || rank < 0 || rank >= m->size) return 0;
  std::uint64_t* word = m->pulse[static_cast<std::size_t>(rank)];
  return word != nullptr ? std::atomic_ref<std::uint64_t>(*word).load(std::memory_order_relaxed) : 0;
}

// The window: kWords words per rank, zero (tag 0 matches no step), locked once for the cluster's life.
void MpiCluster::open_window(State& s) {
  void* mem = nullptr;
  // Every atomic on the window is one 64-bit word (MPI 4's acc_single_intrinsic): Open MPI 5's osc ucx then takes no
  // lock on the target's window around each (4.1 does, and ignores the hint; see the heartbeat's sentinel).
  MPI_Info info = MPI_INFO_NULL;
  check(MPI_Info_create(&info), "MPI_Info_create");
  check(MPI_Info_set(info, "acc_single_intrinsic", "true"), "MPI_Info_set");
  const int rc = MPI_Win_allocate(static_cast<MPI_Aint>(kWords * sizeof(std::uint64_t)), sizeof(std::uint64_t), info, s.comm, &mem, &s.win);
  MPI_Info_free(&info);
  check(rc, "MPI_Win_allocate");
  s.base = static_cast<std::uint64_t*>(mem);
  // Errors of one-sided accesses come back to the caller (the default would abort the job with MPI's own words,
  // which do not say which rank or node was lost): MpiCluster::access() names them.
  check(MPI_Win_set_errhandler(s.win, MPI_ERRORS_RETURN), "MPI_Win_set_errhandler");
  check(MPI_Win_lock_all(MPI_MODE_NOCHECK, s.win), "MPI_Win_lock_all");
  for (std::size_t w = 0; w < kWords; ++w) {
    const std::uint64_t zero = 0;
    std::uint64_t old = 0;
    check(MPI_Fetch_and_op(&zero, &old, MPI_UINT64_T, s.rank, static_cast<MPI_Aint>(w), MPI_REPLACE, s.win), "MPI_Fetch_and_op");
  }
  check(MPI_Win_flush(s.rank, s.win), "MPI_Win_flush");
}

// The cluster over `comm` (which it owns from here): ranks, nodes, the window, and the progress agent where needed.
std::shared_ptr<MpiCluster> MpiCluster::over(std::unique_ptr<State> s) {
  check(MPI_Op_create(&bf16_pairs, /*commute=*/1, &s->bf16_sum), "MPI_Op_create");
  MPI_Comm_set_errhandler(s->comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(s->comm, &s->rank);
  MPI_Comm_size(s->comm, &s->size);
  find_nodes(*s);
  open_window(*s);
  check(MPI_Barrier(s->comm), "MPI_Barrier");
  if (wants_progress_agent(s->same_node, s->joined)) {
    State* st = s.get();
    const auto period = progress_period();
    st->progress = std::thread([st, period] {
      while (!st->stop.load(std::memory_order_relaxed)) {
        {
          const std::lock_guard g(st->lock);
          int flag = 0;
          MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, st->comm, &flag, MPI_STATUS_IGNORE);  // enters the progress engine
        }
        if (st->prompt.load(std::memory_order_relaxed)) {
          std::this_thread::sleep_for(period);
        } else {
          std::unique_lock l(st->agent_lock);
          st->agent_wake.wait_for(l, kIdleProgress, [st] { return st->prompt.load(std::memory_order_relaxed) || st->stop.load(std::memory_order_relaxed); });
        }
      }
    });
  }
  return std::shared_ptr<MpiCluster>(new MpiCluster(std::move(s)));
}

std::shared_ptr<MpiCluster> MpiCluster::world() {
  init_mpi();
  auto s = std::make_unique<State>();
  check(MPI_Comm_dup(MPI_COMM_WORLD, &s->comm), "MPI_Comm_dup");
  return over(std::move(s));
}

namespace {

// The port rank 0 opened (open_port), until joined() closes it.
std::string g_port;

}  // namespace

void MpiCluster::finalize_at_exit() {
  const std::lock_guard g(g_init_lock);
  if (g_at_exit) return;
  g_at_exit = true;
  std::atexit([] {
    const std::lock_guard held(g_init_lock);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_we_initialised && g_users == 0 && !finalized) MPI_Finalize();
  });
}

std::string MpiCluster::open_port() {
  init_mpi();
  if (!g_port.empty()) MPI_Close_port(g_port.c_str());  // a port opened before and never joined through
  char name[MPI_MAX_PORT_NAME] = {};
  const int rc = MPI_Open_port(MPI_INFO_NULL, name);
  {
    const std::lock_guard g(g_init_lock);
    --g_users;  // joined() counts the use; a port never joined leaves MPI to the process's end
  }
  check(rc, "MPI_Open_port");
  g_port = name;
  return g_port;
}

// The join: the ranks that have joined so far accept the next one together (rank 0 as the root) and merge with it,
// until all `size` are in; every rank but 0 first connects alone, in rank order (its turn: Open MPI's name server
// keys a connect's exchange by the port alone, so two connects in flight at once could take each other's). A last
// split puts the ranks in the launcher's order, and a gather checks that every rank gave its own rank. The join's
// communicators return their errors (MPI_ERRORS_RETURN), so a failed connect is named here.
std::shared_ptr<MpiCluster> MpiCluster::joined(int rank, int size, const std::string& port, const Turn& wait_turn, const Turn& pass_turn) {
  if (size < 1 || rank < 0 || rank >= size) throw ConfigError("MpiCluster::joined: rank " + std::to_string(rank) + " of " + std::to_string(size) + " is no rank");
  if (port.empty() || port.size() >= MPI_MAX_PORT_NAME) throw ConfigError("MpiCluster::joined: '" + port + "' is no MPI port name");
  if (rank == 0 && port != g_port) throw ConfigError("MpiCluster::joined: rank 0 joins through the port it opened (open_port()), not '" + port + "'");
  init_mpi();
  MPI_Comm group = MPI_COMM_NULL;
  check(MPI_Comm_dup(MPI_COMM_SELF, &group), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(group, MPI_ERRORS_RETURN);  // inherited by what is made from it
  const auto merge = [&group](MPI_Comm inter, int high) {
    MPI_Comm merged = MPI_COMM_NULL;
    check(MPI_Intercomm_merge(inter, high, &merged), "MPI_Intercomm_merge");
    MPI_Comm_free(&inter);
    MPI_Comm_free(&group);
    group = merged;
  };
  if (rank != 0) {
    if (wait_turn) wait_turn();
    MPI_Comm inter = MPI_COMM_NULL;
    check(MPI_Comm_connect(port.c_str(), MPI_INFO_NULL, 0, group, &inter), "MPI_Comm_connect");
    merge(inter, 1);
  }
  if (pass_turn) pass_turn();
  int in = 0;
  check(MPI_Comm_size(group, &in), "MPI_Comm_size");
  while (in < size) {
    MPI_Comm inter = MPI_COMM_NULL;
    check(MPI_Comm_accept(port.c_str(), MPI_INFO_NULL, 0, group, &inter), "MPI_Comm_accept");
    merge(inter, 0);
    check(MPI_Comm_size(group, &in), "MPI_Comm_size");
  }
  if (rank == 0) {
    MPI_Close_port(g_port.c_str());
    g_port.clear();
  }
  auto s = std::make_unique<State>();
  s->joined = true;
  check(MPI_Comm_split(group, 0, rank, &s->comm), "MPI_Comm_split");
  MPI_Comm_free(&group);
  int mine[2] = {rank, size};
  std::vector<int> all(2 * static_cast<std::size_t>(in));
  check(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, s->comm), "MPI_Allgather");
  for (int r = 0; r < in; ++r) {
    if (all[2 * r] != r || all[2 * r + 1] != size) {
      const std::string why = "MpiCluster::joined: the ranks disagree: place " + std::to_string(r) + " of the join calls itself rank " +
                              std::to_string(all[2 * r]) + " of " + std::to_string(all[2 * r + 1]) + ", and this process rank " + std::to_string(rank) +
                              " of " + std::to_string(size) + "; every rank gives the same size and its own rank";
      MPI_Comm_free(&s->comm);
      throw ConfigError(why);
    }
  }
  return over(std::move(s));
}

MpiCluster::MpiCluster(std::unique_ptr<State> s) : m(std::move(s)) {}

MpiCluster::~MpiCluster() {
  if (m->progress.joinable()) {
    {
      const std::lock_guard g(m->agent_lock);
      m->stop.store(true, std::memory_order_relaxed);
    }
    m->agent_wake.notify_one();
    m->progress.join();
  }
  if (m->win != MPI_WIN_NULL) {
    MPI_Barrier(m->comm);  // no rank frees the window while another may still be inside a steal
    MPI_Win_unlock_all(m->win);
    MPI_Win_free(&m->win);
  }
  if (m->pulse_win != MPI_WIN_NULL) MPI_Win_free(&m->pulse_win);
  if (m->levels.node != MPI_COMM_NULL) MPI_Comm_free(&m->levels.node);
  if (m->leaders_comm != MPI_COMM_NULL) MPI_Comm_free(&m->leaders_comm);
  if (m->node_comm != MPI_COMM_NULL) MPI_Comm_free(&m->node_comm);
  if (m->comm != MPI_COMM_NULL) MPI_Comm_free(&m->comm);
  if (m->bf16_sum != MPI_OP_NULL) MPI_Op_free(&m->bf16_sum);
  const std::lock_guard g(g_init_lock);
  if (--g_users == 0 && g_we_initialised && !g_at_exit) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    g_we_initialised = false;
  }
}

int MpiCluster::rank() const noexcept { return m->rank; }
int MpiCluster::size() const noexcept { return m->size; }
bool MpiCluster::same_node(int rank) const noexcept { return rank >= 0 && rank < m->size && m->same_node[static_cast<std::size_t>(rank)] != 0; }
std::string MpiCluster::node_name(int rank) const { return rank >= 0 && rank < m->size ? m->node_names[static_cast<std::size_t>(rank)] : std::string{}; }

// A one-sided access that failed: the target's process is gone or its node unreachable (UCX reports the endpoint),
// or MPI itself failed. The job cannot go on without the rank; it ends here, naming the target and its node.
void MpiCluster::fail_access(int rc, const char* what, int rank) const noexcept {
  static_assert(MPI_SUCCESS == 0, "MpiCluster::access tests for 0");
  const auto named = [this](int r) { return "rank " + std::to_string(r) + (node_name(r).empty() ? "" : " (node " + node_name(r) + ")"); };
  std::fprintf(stderr,
               "stealbatch: %s stopped answering: a one-sided access to its window from %s failed (%s: %s; its process is gone or its "
               "node unreachable, or MPI failed): ending the job\n",
               named(rank).c_str(), named(m->rank).c_str(), what, error_text(rc).c_str());
  std::fflush(stderr);
  MPI_Abort(m->joined ? m->comm : MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

std::uint64_t MpiCluster::read(int rank, Word word) {
  const std::lock_guard g(m->lock);
  const InFlight mark(m->in_flight, rank);
  std::uint64_t out = 0, none = 0;
  access(MPI_Fetch_and_op(&none, &out, MPI_UINT64_T, rank, static_cast<MPI_Aint>(word), MPI_NO_OP, m->win), "MPI_Fetch_and_op", rank);
  access(MPI_Win_flush(rank, m->win), "MPI_Win_flush", rank);
  return out;
}

std::uint64_t MpiCluster::compare_and_swap(int rank, Word word, std::uint64_t expected, std::uint64_t desired) {
  const std::lock_guard g(m->lock);
  const InFlight mark(m->in_flight, rank);
  std::uint64_t old = 0;
  access(MPI_Compare_and_swap(&desired, &expected, &old, MPI_UINT64_T, rank, static_cast<MPI_Aint>(word), m->win), "MPI_Compare_and_swap", rank);
  access(MPI_Win_flush(rank, m->win), "MPI_Win_flush", rank);
  return old;
}

void MpiCluster::write(int rank, Word word, std::uint64_t value) {
  const std::lock_guard g(m->lock);
  const InFlight mark(m->in_flight, rank);
  std::uint64_t old = 0;
  access(MPI_Fetch_and_op(&value, &old, MPI_UINT64_T, rank, static_cast<MPI_Aint>(word), MPI_REPLACE, m->win), "MPI_Fetch_and_op", rank);
  access(MPI_Win_flush(rank, m->win), "MPI_Win_flush", rank);
}

const char* MpiCluster::large_sums() const noexcept {
  return m->levels.node != MPI_COMM_NULL ? "two levels" : m->ring_from == detail::kRingFrom ? "ring" : "MPI's allreduce";
}

void MpiCluster::set_prompt_access(bool on) noexcept {
  {
    const std::lock_guard g(m->agent_lock);
    if (m->prompt.load(std::memory_order_relaxed) == on) return;
    m->prompt.store(on, std::memory_order_relaxed);
  }
  if (on) m->agent_wake.notify_one();  // the agent's next entry now, not at the end of its idle period
}

Cluster::Access MpiCluster::access_in_flight() const noexcept {
  const std::uint64_t w = m->in_flight.load(std::memory_order_relaxed);
  if (w == 0) return {};
  const std::uint64_t start = w & ((std::uint64_t{1} << 48) - 1), now = steady_ms() & ((std::uint64_t{1} << 48) - 1);
  return {static_cast<int>(w >> 48) - 1, now >= start ? static_cast<double>(now - start) / 1e3 : 0.0};
}

// Waits for a nonblocking collective without holding the lock in between tests, so that the other threads of this
// rank (a thief's steal, the heartbeat) go on while it waits. Tests often at first (a balanced step's ranks arrive
// together), then yields the core, then sleeps between tests, so a rank that waits long leaves the cores to the
// ranks still computing; `waiting` runs every 10 ms.
void MpiCluster::wait(void* request, const std::function<void()>& waiting, Waiting* shared) {
  MPI_Request& req = *static_cast<MPI_Request*>(request);
  Waiting own{std::chrono::steady_clock::now(), std::chrono::steady_clock::now() + std::chrono::milliseconds(10)};
  Waiting& w = shared ? *shared : own;
  for (int done = 0;;) {
    {
      const std::lock_guard g(m->lock);
      check(MPI_Test(&req, &done, MPI_STATUS_IGNORE), "MPI_Test");
    }
    if (done) return;
    // w.start <= own.start: the operation's waits began no later than this one.
    const auto now = std::chrono::steady_clock::now();
    if (now - own.start > std::chrono::microseconds(200) && now - w.start > std::chrono::milliseconds(5)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else if (now - w.start > std::chrono::microseconds(200)) {
      std::this_thread::yield();
    }
    if (waiting && now >= w.next_watch) {
      waiting();
      w.next_watch = now + std::chrono::milliseconds(10);
    }
  }
}

void MpiCluster::allreduce(void* data, std::size_t count, int type, const std::function<void()>& waiting) {
  if (m->size == 1) return;  // the sum over one rank is its own (and a count past INT_MAX would not fit MPI's)
  static const MPI_Datatype kTypes[] = {MPI_FLOAT, MPI_DOUBLE, MPI_INT64_T, MPI_UINT16_T};
  static const detail::RingType kRing[] = {{sizeof(float), MPI_FLOAT, add<float>},
                                           {sizeof(double), MPI_DOUBLE, add<double>},
                                           {sizeof(std::int64_t), MPI_INT64_T, add<std::int64_t>},
                                           {sizeof(std::uint16_t), MPI_UINT16_T, add_bf16_pairs}};
  const bool huge = count > static_cast<std::size_t>(std::numeric_limits<int>::max());  // past an MPI count: the ring's segments
  if (count * kRing[type].size >= m->ring_from || huge) {
    // A large sum (a gradient): the ring, or two levels. Its segments' waits are one wait: one watch every 10 ms, and past the first
    // 5 ms of the sum a sleep between tests, so that waiting ranks leave the cores to the others and to the network.
    // A failed MPI call midway leaves the ring's messages in flight into its buffers: no rank can go on from there.
    const auto now = std::chrono::steady_clock::now();
    Waiting w{now, now + std::chrono::milliseconds(10)};
    const auto wait_one = [&](MPI_Request& r) { wait(&r, waiting, &w); };
    try {
      if (m->levels.node != MPI_COMM_NULL) {
        detail::two_level_allreduce(data, count, kRing[type], m->levels, m->lock, wait_one);
      } else {
        detail::ring_allreduce(data, count, kRing[type], m->ring, m->lock, wait_one);
      }
    } catch (const std::exception& e) {
      abort(std::string("stealbatch: the sum across ranks failed midway, with messages still in flight: ") + e.what() + "; ending the job", 1);
    }
    return;
  }
  MPI_Request req = MPI_REQUEST_NULL;
  {
    const std::lock_guard g(m->lock);
    check(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), kTypes[type], type == 3 ? m->bf16_sum : MPI_SUM, m->comm, &req), "MPI_Iallreduce");
  }
  wait(&req, waiting);
}

void MpiCluster::allreduce_sum(std::span<float> data, const std::function<void()>& waiting) { allreduce(data.data(), data.size(), 0, waiting); }
void MpiCluster::allreduce_sum(std::span<double> data, const std::function<void()>& waiting) { allreduce(data.data(), data.size(), 1, waiting); }
void MpiCluster::allreduce_sum(std::span<std::int64_t> data, const std::function<void()>& waiting) { allreduce(data.data(), data.size(), 2, waiting); }

void MpiCluster::allreduce_sum_bf16(std::span<float> data, const std::function<void()>& waiting) {
  std::vector<std::uint16_t> wire(data.size());
  to_bf16(data, wire.data());
  allreduce(wire.data(), wire.size(), 3, waiting);
  from_bf16(wire.data(), data);
}

void MpiCluster::broadcast(std::span<char> data, int root) {
  constexpr std::size_t kPiece = std::size_t{1} << 30;  // MPI counts are int: pieces of 1 GiB (one call for none)
  std::size_t at = 0;
  do {
    const std::size_t n = std::min(kPiece, data.size() - at);
    MPI_Request req = MPI_REQUEST_NULL;
    {
      const std::lock_guard g(m->lock);
      check(MPI_Ibcast(data.data() + at, static_cast<int>(n), MPI_CHAR, root, m->comm, &req), "MPI_Ibcast");
    }
    wait(&req, {});
    at += n;
  } while (at < data.size());
}

void MpiCluster::barrier() {
  MPI_Request req = MPI_REQUEST_NULL;
  {
    const std::lock_guard g(m->lock);
    check(MPI_Ibarrier(m->comm, &req), "MPI_Ibarrier");
  }
  wait(&req, {});
}

void MpiCluster::abort(const std::string& why, int exit_code) noexcept {
  std::fprintf(stderr, "%s\n", why.c_str());
  std::fflush(stderr);
  MPI_Abort(m->joined ? m->comm : MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

}  // namespace stealbatch::mpi
