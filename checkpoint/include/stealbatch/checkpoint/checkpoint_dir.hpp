// A folder of a run's checkpoints, one file a step ("step-000000001234.safetensors"), the newest kept.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

namespace stealbatch {

//   CheckpointDir dir("runs/a");
//   rt.save_checkpoint(dir.path_for(step), meta);
//   dir.prune(3);
//   if (auto last = dir.latest()) rt.load_checkpoint(*last);
class CheckpointDir {
 public:
  // Creates the folder when it does not exist; CheckpointError (kIo) when it cannot.
  explicit CheckpointDir(std::filesystem::path dir);
  const std::filesystem::path& path() const noexcept { return m_dir; }
  std::filesystem::path path_for(std::uint64_t step) const;
  // The complete checkpoints (a file is only ever there whole: write_file_durably renames it into place), oldest
  // first, by step.
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> list() const;
  std::optional<std::filesystem::path> latest() const;
  // Removes all but the newest `keep` (>= 1) checkpoints, and the temporary files of saves that never finished (a
  // process killed while saving). Not for a folder that another process saves into at the same time.
  void prune(std::size_t keep) const;

 private:
  std::filesystem::path m_dir;
};

}  // namespace stealbatch
