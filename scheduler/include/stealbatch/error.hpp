// The typed errors the library throws; only examples/ print and exit.
#pragma once

#include <stdexcept>
#include <string>

namespace stealbatch {

// Base of every error the library throws. Catch this to catch them all.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An invalid option or argument: the message names the field, the value and the valid range.
class ConfigError : public Error {
 public:
  using Error::Error;
};

// A dataset or input file that is missing, truncated or malformed.
class DataError : public Error {
 public:
  using Error::Error;
};

// A CUDA runtime, driver or cuBLAS call failed.
class CudaError : public Error {
 public:
  using Error::Error;
};

// An NCCL call failed.
class NcclError : public Error {
 public:
  using Error::Error;
};

// A device or step made no progress within the configured timeout.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace stealbatch
