// What this process can see of CUDA and NCCL, without failing where there is no GPU or driver.
#pragma once

#include <cstddef>
#include <string>

namespace stealbatch::cuda {

// The number of usable GPUs. Any error (cudaErrorInsufficientDriver, 35, where there is no driver; or
// cudaErrorNoDevice) counts as none, and the error is cleared so later calls do not see it.
int device_count() noexcept;

// Why device_count() is 0, for skip messages: "" when there is a GPU.
std::string no_device_reason();

// The NCCL library version linked at run time, as major*10000 + minor*100 + patch (NCCL's own encoding).
int nccl_version();

// Fills n floats at `device_ptr` with `value` on `stream` (a kernel; used by the tests to prove a launch).
void fill(float* device_ptr, std::size_t n, float value, void* stream);

}  // namespace stealbatch::cuda
