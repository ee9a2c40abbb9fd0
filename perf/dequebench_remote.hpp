// dequebench --remote: one steal across MPI ranks against one on the rank's own word (dequebench_remote.cpp).
#pragma once

#include <cstdint>

namespace stealbatch::perf {

// Times `steals` one-chunk steals on each word and prints p50 and p99 on rank 0; run under mpirun -np 2. Returns
// the exit status (2: not 2 ranks).
int run_remote_steal(std::uint32_t steals);

}  // namespace stealbatch::perf
