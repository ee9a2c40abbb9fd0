// stealbench --chunk-overhead: the runtime's cost per chunk with empty chunk functions (stealbench_overhead.cpp).
#pragma once

namespace stealbatch::perf {

// Parses its own flags from argv (--chunk-overhead, --devices SPEC, --policy, --chunks, --steps), runs, prints the
// table; returns the exit status (0: every step exact).
int run_chunk_overhead(int argc, char** argv);

}  // namespace stealbatch::perf
