// The runtime's devices (device_set.hpp).
#include "devices/device_set.hpp"

#include <stealbatch/error.hpp>

#include <algorithm>
#include <utility>

namespace stealbatch {

void DeviceSet::adopt(DeviceKind k, std::shared_ptr<DeviceBackend> b, std::vector<std::unique_ptr<Device>> made) {
  kind = k;
  backend = std::move(b);
  devices = std::move(made);
  host = backend->shares_host_memory();
  times_calls = !host && std::all_of(devices.begin(), devices.end(), [](const auto& d) { return d->times_calls(); });
  leaves_cores_idle = backend->leaves_cores_idle();
  replicas.clear(), ids.clear();
  for (std::size_t i = 0; i < devices.size(); ++i) replicas.push_back(std::make_unique<Replica>()), ids.push_back(i);
}

void DeviceSet::exclude(std::size_t position) {
  const auto at = static_cast<std::ptrdiff_t>(position);
  lost.push_back(std::move(devices[position]));
  devices.erase(devices.begin() + at), replicas.erase(replicas.begin() + at), ids.erase(ids.begin() + at);
}

std::vector<Device*> DeviceSet::raw() const {
  std::vector<Device*> out;
  for (const auto& d : devices) out.push_back(d.get());
  return out;
}

}  // namespace stealbatch
