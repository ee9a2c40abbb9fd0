// The model's parameters as named tensors inside one flat float buffer.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace stealbatch {

// One tensor's place in the flat buffer.
struct TensorView {
  std::string name;
  std::size_t offset = 0;
  std::size_t size = 0;
  std::vector<std::size_t> shape;  // its dimensions, row-major, as a checkpoint records them: {size} unless given
};

// Named tensors laid out back to back. Every replica, gradient buffer and optimizer state uses this layout, so
// one AllReduce over the flat buffer covers every tensor.
//
//   ParameterLayout layout;
//   const auto w = layout.add("fc1.weight", {256, 784});
//   const auto b = layout.add("fc1.bias", 256);
//   std::span<float> w1 = layout.view(grad, w);   // that tensor's slice of a flat buffer
class ParameterLayout {
 public:
  // Returns the tensor's index. Throws ConfigError for an empty name, a repeated name or a size of 0.
  std::size_t add(std::string name, std::size_t size);
  // The same with its dimensions (row-major; their product is its size), e.g. {256, 784} for a torch-style
  // Linear(784, 256) weight. Throws ConfigError also for no dimensions.
  std::size_t add(std::string name, std::vector<std::size_t> shape);

  std::size_t size() const noexcept { return m_total; }  // floats in the flat buffer
  std::size_t tensor_count() const noexcept { return m_tensors.size(); }
  const TensorView& tensor(std::size_t i) const { return m_tensors.at(i); }
  const std::vector<TensorView>& tensors() const noexcept { return m_tensors; }
  // Throws ConfigError when no tensor has that name.
  std::size_t index_of(std::string_view name) const;

  template <class T>
  std::span<T> view(std::span<T> flat, std::size_t i) const {
    const TensorView& t = m_tensors.at(i);
    return flat.subspan(t.offset, t.size);
  }

 private:
  std::vector<TensorView> m_tensors;
  std::size_t m_total = 0;
};

}  // namespace stealbatch
