// The reductions across GPU devices: NCCL across physical GPUs, a device kernel across the parts of one GPU.
#pragma once

#include <stealbatch/cuda/cuda_device.hpp>
#include <stealbatch/runtime/cluster.hpp>
#include <stealbatch/runtime/communicator.hpp>

#include <nccl.h>

#include <atomic>
#include <vector>

namespace stealbatch::cuda {

// One ncclAllReduce (sum, fp32) per step over each GPU's flat gradient buffer, issued for all local GPUs inside one
// ncclGroupStart/End from the runtime's thread (communicators from ncclCommInitAll), on each device's compute stream:
// ordered after its chunks, and before its update. With one GPU there is nothing to reduce.
class NcclCommunicator final : public Communicator {
 public:
  explicit NcclCommunicator(std::vector<CudaDevice*> devices);
  // Across ranks: one NCCL communicator over the job's `total` GPUs, this rank's being ranks [first, first + n) of
  // it, from ncclCommInitRank with the unique id that rank 0 of the cluster makes and broadcasts (as nccl-tests
  // does). allreduce_all() then sums over every GPU of the job. Every rank must make it, in the same order.
  NcclCommunicator(std::vector<CudaDevice*> devices, Cluster& cluster, std::size_t first, std::size_t total);
  ~NcclCommunicator() override;
  void allreduce_sum(std::size_t, std::span<float* const>, std::size_t) override {}
  void allreduce_all(std::span<float* const> buffers, std::size_t count) override;
  // ncclCommAbort on every communicator: a collective stuck on a dead or stalled peer returns. The communicators
  // are gone afterwards, so the runtime cannot reduce again.
  bool abort() noexcept override;
  bool survives_abort() const noexcept override { return m_comms.empty(); }

 private:
  std::vector<CudaDevice*> m_devices;
  std::vector<ncclComm_t> m_comms;
  std::atomic<bool> m_aborted{false};
};

// The parts of one GPU (vgpu:): NCCL cannot put two ranks on one GPU, so one kernel sums every part's buffer in part
// order and writes the sum back into each. It runs on a stream of the GPU's primary context, owned by the
// communicator, from the runtime's thread: a part's green context stays current to its worker alone. Nothing here
// waits on the host: events order the sum after every part's chunks and each part's next work after the sum.
class PartsCommunicator final : public Communicator {
 public:
  // On the runtime's thread, with GPU devices[0]->gpu()'s primary context current there (cudaSetDevice).
  explicit PartsCommunicator(std::vector<CudaDevice*> devices);
  // On part d's worker, after its chunks were drained: records its ready event, which the sum waits for (with one
  // part there is no sum, and nothing to record).
  void allreduce_sum(std::size_t device, std::span<float* const>, std::size_t) override;
  void allreduce_all(std::span<float* const> buffers, std::size_t count) override;

 private:
  std::vector<CudaDevice*> m_devices;
  Stream m_stream;                    // the primary context's: the sum may use every SM
  Event m_summed;                     // recorded on m_stream behind the sum
  DeviceBuffer<float*> m_table;       // the parts' buffer addresses, on the device
  std::vector<float*> m_addresses;    // ... and on the host, the copy's source
};

}  // namespace stealbatch::cuda
