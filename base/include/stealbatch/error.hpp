// The typed errors the library throws; only examples/ print and exit.
#pragma once

#include <cstddef>
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

// A checkpoint that cannot be written or loaded. The message names the file and what is wrong with it; a load that
// fails leaves the runtime's state as it was.
//   kIo: the file cannot be opened, read, written, synced or renamed (the OS's reason follows);
//   kFormat: not a well-formed safetensors file (truncated, a corrupt header, offsets that do not fit);
//   kChecksum: the data's crc32 differs from the one in the header, or there is none;
//   kLayout: its tensors differ from the runtime's parameter layout (a name, a shape, a count);
//   kOptimizer: its optimizer is of another kind, or has other settings, than the runtime's.
class CheckpointError : public Error {
 public:
  enum class Reason { kIo, kFormat, kChecksum, kLayout, kOptimizer };
  CheckpointError(Reason reason, const std::string& path, const std::string& what)
      : Error("checkpoint '" + path + "': " + what), m_reason(reason), m_path(path) {}
  Reason reason() const noexcept { return m_reason; }
  const std::string& path() const noexcept { return m_path; }

 private:
  Reason m_reason;
  std::string m_path;
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

// A chunk failed: its function threw, or its device reported an error. The message names the device, the step and
// the chunk, then the cause; the cause itself is nested (std::rethrow_if_nested(e) rethrows it). can_continue()
// says whether the runtime can run another step: true after an exception from a chunk function on a CPU or
// simulated device (nothing was applied, the next step starts clean), false after a GPU error, which leaves the
// device's context unusable.
//
//   try { rt.step(batch, fn); } catch (const ChunkError& e) { log(e.what()); if (!e.can_continue()) throw; }
class ChunkError : public Error {
 public:
  ChunkError(const std::string& device, unsigned long long step, unsigned long long chunk, const std::string& cause, bool can_continue)
      : Error("device " + device + ", step " + std::to_string(step) + ", chunk " + std::to_string(chunk) + ": " + cause +
              (can_continue ? " (the runtime can run another step)" : " (the runtime cannot run another step)")),
        m_device(device), m_step(step), m_chunk(chunk), m_can_continue(can_continue) {}
  const std::string& device() const noexcept { return m_device; }
  unsigned long long step() const noexcept { return m_step; }
  unsigned long long chunk() const noexcept { return m_chunk; }
  bool can_continue() const noexcept { return m_can_continue; }

 private:
  std::string m_device;
  unsigned long long m_step, m_chunk;
  bool m_can_continue;
};

// A device or step made no progress within the configured timeout. The message names the device, the step and
// the chunk it was stuck in, and says whether the runtime can run another step.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A device died (or was declared dead) during a step. With on_device_failure = exclude the runtime drops it and
// re-runs its chunks on the survivors instead of throwing this.
class DeviceLostError : public Error {
 public:
  DeviceLostError(const std::string& device, std::size_t index, unsigned long long step, unsigned long long chunk, const std::string& why)
      : Error("device " + device + " was lost in step " + std::to_string(step) + " at chunk " + std::to_string(chunk) + ": " + why),
        m_device(device), m_index(index) {}
  const std::string& device() const noexcept { return m_device; }
  std::size_t index() const noexcept { return m_index; }  // its position among the runtime's devices when it was lost

 private:
  std::string m_device;
  std::size_t m_index;
};

}  // namespace stealbatch
