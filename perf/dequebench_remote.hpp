// dequebench --remote: one steal across MPI ranks against one on the rank's own word (dequebench_remote.cpp).
#pragma once

#include <cstdint>

namespace stealbatch::perf {

// Times `steals` one-chunk steals on each word and prints p50 and p99 on rank 0; run under mpirun -np 2. Returns
// the exit status (2: not 2 ranks).
int run_remote_steal(std::uint32_t steals);

// The cross-rank step's unit costs on any number of ranks (mpirun -np N), every rank at once: a read and a
// compare-and-swap of the next rank's word, a read of every rank's word in turn (the last call for work), the step's
// two allreduces and a 1 ms sleep's overshoot. Prints `name value` lines on rank 0, the inputs of perf/cluster_model.py.
int run_remote_costs(std::uint32_t steals);

}  // namespace stealbatch::perf
