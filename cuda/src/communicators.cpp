// NcclCommunicator and PartsCommunicator.
#include "kernels.hpp"

#include <stealbatch/cuda/green.hpp>
#include <stealbatch/cuda/nccl_communicator.hpp>

#include <algorithm>
#include <cstdio>
#include <string>

namespace stealbatch::cuda {

NcclCommunicator::NcclCommunicator(std::vector<CudaDevice*> devices) : m_devices(std::move(devices)) {
  if (m_devices.size() <= 1) return;
  std::vector<int> gpus;
  for (const CudaDevice* d : m_devices) gpus.push_back(d->gpu());
  m_comms.resize(gpus.size());
  SB_NCCL_CHECK(ncclCommInitAll(m_comms.data(), static_cast<int>(gpus.size()), gpus.data()));
}

NcclCommunicator::NcclCommunicator(std::vector<CudaDevice*> devices, Cluster& cluster, std::size_t first, std::size_t total)
    : m_devices(std::move(devices)) {
  if (total <= 1) return;  // one GPU in the whole job: nothing to reduce
  ncclUniqueId id{};
  if (cluster.rank() == 0) SB_NCCL_CHECK(ncclGetUniqueId(&id));
  const std::span<char> bytes(reinterpret_cast<char*>(&id), sizeof id);  // the id is opaque bytes
  cluster.broadcast(bytes, 0);
  m_comms.resize(m_devices.size());
  // Several GPUs of this rank join inside one group, so none waits for the others' init.
  SB_NCCL_CHECK(ncclGroupStart());
  for (std::size_t d = 0; d < m_devices.size(); ++d) {
    const DeviceScope on(m_devices[d]->gpu());
    const ncclResult_t r = ncclCommInitRank(&m_comms[d], static_cast<int>(total), id, static_cast<int>(first + d));
    if (r != ncclSuccess) {
      (void)ncclGroupEnd();
      throw NcclError(m_devices[d]->name() + ": ncclCommInitRank failed: " + ncclGetErrorString(r));
    }
  }
  SB_NCCL_CHECK(ncclGroupEnd());
}

bool NcclCommunicator::abort() noexcept {
  if (m_comms.empty()) return true;
  if (m_aborted.exchange(true)) return false;
  for (ncclComm_t c : m_comms) {
    const ncclResult_t r = ncclCommAbort(c);
    if (r != ncclSuccess) std::fprintf(stderr, "stealbatch: ncclCommAbort failed: %s\n", ncclGetErrorString(r));
  }
  return false;
}

NcclCommunicator::~NcclCommunicator() {
  if (m_aborted.load()) return;  // ncclCommAbort freed them
  for (ncclComm_t c : m_comms) {
    const ncclResult_t r = ncclCommDestroy(c);
    if (r != ncclSuccess) std::fprintf(stderr, "stealbatch: ncclCommDestroy failed: %s\n", ncclGetErrorString(r));
  }
}

void NcclCommunicator::allreduce_all(std::span<float* const> buffers, std::size_t count) {
  if (m_comms.empty()) return;  // one GPU: its buffer is already the sum
  if (m_aborted.load()) throw NcclError("the NCCL communicators were aborted by the stall watchdog; create a new runtime");
  SB_NCCL_CHECK(ncclGroupStart());
  for (std::size_t d = 0; d < m_devices.size(); ++d) {
    const ncclResult_t r = ncclAllReduce(buffers[d], buffers[d], count, ncclFloat, ncclSum, m_comms[d], m_devices[d]->compute_stream());
    if (r != ncclSuccess) {
      (void)ncclGroupEnd();
      throw NcclError(m_devices[d]->name() + ": ncclAllReduce failed: " + ncclGetErrorString(r));
    }
  }
  SB_NCCL_CHECK(ncclGroupEnd());
}

PartsCommunicator::PartsCommunicator(std::vector<CudaDevice*> devices) : m_devices(std::move(devices)) {
  if (m_devices.size() <= 1) return;
  const DeviceScope on(m_devices[0]->gpu());  // the stream belongs to that GPU's primary context; the caller's device comes back after
  m_stream = make_stream();
  m_summed = make_event();
}

void PartsCommunicator::allreduce_sum(std::size_t device, std::span<float* const>, std::size_t) {
  if (m_devices.size() <= 1) return;  // one part: nothing to reduce, and its update follows on its own stream
  m_devices[device]->record_ready();
}

// Ordered on the device, the host waiting for none of it: the sum waits for every part's ready event (its chunks),
// and every part's stream waits for the sum before anything queued next (its update and zeroing, or the copy that
// hands the gradient over). An event is recorded only on a stream of its own context, but a stream may wait
// for an event of any context (cuStreamWaitEvent), so the parts' events are theirs and the sum's is this stream's.
void PartsCommunicator::allreduce_all(std::span<float* const> buffers, std::size_t count) {
  if (m_devices.size() <= 1) return;
  const DeviceScope on(m_devices[0]->gpu());  // the stream's and the table's device, whatever the caller has current
  cudaStream_t s = m_stream.get();
  for (CudaDevice* d : m_devices) SB_CUDA_CHECK(cudaStreamWaitEvent(s, d->ready_event(), 0));
  // The buffers' addresses change only with the replicas: copied (from memory that outlives the copy) when they do.
  if (!std::equal(buffers.begin(), buffers.end(), m_addresses.begin(), m_addresses.end())) {
    m_addresses.assign(buffers.begin(), buffers.end());
    if (m_table.size() != buffers.size()) m_table = DeviceBuffer<float*>(buffers.size());
    SB_CUDA_CHECK(cudaMemcpyAsync(m_table.data(), m_addresses.data(), m_addresses.size() * sizeof(float*), cudaMemcpyHostToDevice, s));
  }
  detail::sum_into_all(m_table.data(), buffers.size(), count, s);
  SB_CUDA_CHECK(cudaEventRecord(m_summed.get(), s));
  for (CudaDevice* d : m_devices) SB_CUDA_CHECK(cudaStreamWaitEvent(d->compute_stream(), m_summed.get(), 0));
}

}  // namespace stealbatch::cuda
