// ParameterLayout: tensors added back to back, with checked names and sizes.
#include <stealbatch/error.hpp>
#include <stealbatch/runtime/parameters.hpp>

#include <limits>

namespace stealbatch {

std::size_t ParameterLayout::add(std::string name, std::size_t size) { return add(std::move(name), std::vector<std::size_t>{size}); }

std::size_t ParameterLayout::add(std::string name, std::vector<std::size_t> shape) {
  if (shape.empty()) throw ConfigError("parameters: tensor '" + name + "' needs at least one dimension");
  std::size_t size = 1;
  for (std::size_t d : shape) {
    if (d != 0 && size > std::numeric_limits<std::size_t>::max() / d) throw ConfigError("parameters: tensor '" + name + "' is too large");
    size *= d;
  }
  if (name.empty()) throw ConfigError("parameters: a tensor needs a name");
  if (size == 0) throw ConfigError("parameters: tensor '" + name + "' has size 0; need at least 1 element");
  for (const TensorView& t : m_tensors) {
    if (t.name == name) throw ConfigError("parameters: tensor '" + name + "' is added twice");
  }
  m_tensors.push_back({std::move(name), m_total, size, std::move(shape)});
  m_total += size;
  return m_tensors.size() - 1;
}

std::size_t ParameterLayout::index_of(std::string_view name) const {
  for (std::size_t i = 0; i < m_tensors.size(); ++i) {
    if (m_tensors[i].name == name) return i;
  }
  throw ConfigError("parameters: no tensor named '" + std::string(name) + "'");
}

}  // namespace stealbatch
