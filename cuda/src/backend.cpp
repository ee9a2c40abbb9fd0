// The CUDA backend's registration with the runtime: cuda: specs get one CudaDevice per GPU and NCCL; vgpu: specs
// get one CudaDevice per green-context part of GPU 0 and the parts' reduction kernel.
#include <stealbatch/cuda/backend.hpp>
#include <stealbatch/cuda/cuda_device.hpp>
#include <stealbatch/cuda/device_info.hpp>
#include <stealbatch/cuda/green.hpp>
#include <stealbatch/cuda/nccl_communicator.hpp>
#include <stealbatch/runtime/runtime.hpp>

#include <string>

namespace stealbatch::cuda {

namespace {

class Backend final : public DeviceBackend {
 public:
  explicit Backend(bool parts) : m_parts(parts) {}

  std::size_t available() const noexcept override { return static_cast<std::size_t>(device_count()); }

  std::vector<std::unique_ptr<Device>> make_devices(const DeviceSpec& spec, const RuntimeOptions& o) override {
    const int gpus = device_count();
    if (gpus == 0) throw ConfigError("devices = '" + spec.text + "': no usable GPU (" + no_device_reason() + ")");
    const CudaDevice::Options co{o.gpu.in_flight, o.gpu.input_bytes, o.gpu.gather, o.gpu.wait, o.schedule.deterministic, o.gpu.graphs, o.gpu.resident};
    std::vector<std::unique_ptr<Device>> out;
    if (m_parts) {
      const auto parts = make_partitions(0, spec);
      for (std::size_t i = 0; i < parts.size(); ++i) out.push_back(std::make_unique<CudaDevice>(i, 0, co, parts[i]));
      return out;
    }
    std::vector<int> ids = spec.ids;
    if (spec.all_gpus) {
      for (int g = 0; g < gpus; ++g) ids.push_back(g);
    }
    for (int g : ids) {
      if (g >= gpus) {
        throw ConfigError("devices = '" + spec.text + "': GPU " + std::to_string(g) + " does not exist (this machine has " + std::to_string(gpus) +
                          ", ordinals 0.." + std::to_string(gpus - 1) + ")");
      }
      out.push_back(std::make_unique<CudaDevice>(out.size(), g, co));
    }
    return out;
  }

  std::unique_ptr<Communicator> make_communicator(std::span<Device* const> devices) override {
    std::vector<CudaDevice*> cd;
    for (Device* d : devices) cd.push_back(static_cast<CudaDevice*>(d));
    if (m_parts) return std::make_unique<PartsCommunicator>(std::move(cd));
    return std::make_unique<NcclCommunicator>(std::move(cd));
  }

  std::unique_ptr<Communicator> make_cluster_communicator(std::span<Device* const> devices, Cluster& cluster, std::size_t first,
                                                          std::size_t total) override {
    if (m_parts) throw ConfigError("cluster: the parts of one GPU (vgpu:) cannot be NCCL ranks");
    std::vector<CudaDevice*> cd;
    for (Device* d : devices) cd.push_back(static_cast<CudaDevice*>(d));
    return std::make_unique<NcclCommunicator>(std::move(cd), cluster, first, total);
  }

 private:
  bool m_parts;
};

}  // namespace

void enable() {
  register_device_backend(DeviceKind::kCuda, std::make_shared<Backend>(false));
  register_device_backend(DeviceKind::kVgpu, std::make_shared<Backend>(true));
}

}  // namespace stealbatch::cuda
