// The CUDA backend of the runtime: cuda:all, cuda:I,J and vgpu:SM1,SM2,... device specs.
#pragma once

namespace stealbatch::cuda {

// Registers the CUDA backend with the runtime (register_device_backend) for cuda: and vgpu: specs, so that
// Runtime({.devices = "cuda:all"}) drives GPUs and an empty device spec picks every GPU when there is one.
// Idempotent; cheap; safe where there is no GPU (a cuda: spec then fails with a ConfigError saying why).
//
//   stealbatch::cuda::enable();
//   Runtime rt({.devices = "cuda:all", .gpu = {.input_bytes = 785 * 4, .gather = gather_row}});
void enable();

}  // namespace stealbatch::cuda
