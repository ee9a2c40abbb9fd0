// MPI's return codes as errors, for the cluster's own MPI calls (mpi_cluster.cpp, ring_allreduce.cpp).
#pragma once

#include <stealbatch/error.hpp>

#include <mpi.h>

#include <cstddef>
#include <string>

namespace stealbatch::mpi::detail {

// MPI's words for an error code.
inline std::string error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return std::string(text, static_cast<std::size_t>(len));
}

// Throws Error naming the call and MPI's words, unless rc is MPI_SUCCESS.
inline void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  throw Error(std::string("MPI: ") + what + " failed: " + error_text(rc));
}

}  // namespace stealbatch::mpi::detail
