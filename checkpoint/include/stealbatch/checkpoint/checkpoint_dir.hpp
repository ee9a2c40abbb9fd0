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
  // kCreate: a folder to save into, made when it does not exist; kExisting: a folder to resume from, never made.
  enum class Open { kCreate, kExisting };
  // CheckpointError (kIo) when the folder cannot be made (kCreate) or is not there (kExisting).
  explicit CheckpointDir(std::filesystem::path dir, Open open = Open::kCreate);
  const std::filesystem::path& path() const noexcept { return m_dir; }
  std::filesystem::path path_for(std::uint64_t step) const;
  // The complete checkpoints (a file is only ever there whole: write_file_durably renames it into place), oldest
  // first, each with the step it records (its optimizer's step count, read from its header; its name's step where
  // it records none): a file copied or renamed under another step's name is ordered by what it holds. Entries that
  // are not themselves regular files (links, folders) are passed over.
  std::vector<std::pair<std::uint64_t, std::filesystem::path>> list() const;
  std::optional<std::filesystem::path> latest() const;
  // Removes all but the newest `keep` (>= 1) checkpoints, and the temporary files of saves that never finished (a
  // process killed while saving). Not for a folder that another process saves into at the same time.
  void prune(std::size_t keep) const;
  // Removes every checkpoint (a run that replaces another's, asked to).
  void remove_all() const;
  // That a checkpoint can be written here now: a probe file made, written, synced and removed, so a save that cannot
  // succeed (a read-only or immutable folder, a full disk) is found before any training. CheckpointError (kIo)
  // naming the folder and the system's reason.
  void check_writable() const;

  // The folder's one writer: an exclusive lock (flock) on DIR/.lock, held while the Lock lives and released by the
  // kernel however the process ends, so a crashed writer leaves no stale lock. The lock file records the holder's
  // pid for the message another writer gets.
  class Lock {
   public:
    Lock(Lock&& other) noexcept;
    Lock& operator=(Lock&&) = delete;
    Lock(const Lock&) = delete;
    ~Lock();

   private:
    friend class CheckpointDir;
    explicit Lock(int fd) noexcept : m_fd(fd) {}
    int m_fd;
  };
  // Takes the folder's lock; CheckpointError (kIo) naming the holder when another live process has it.
  Lock lock() const;

 private:
  std::filesystem::path m_dir;
};

}  // namespace stealbatch
