// Files written so that a crash at any moment leaves the old file or the new one, never a part of either.
#pragma once

#include <cstddef>
#include <filesystem>
#include <span>
#include <vector>

namespace stealbatch {

// Writes `pieces` back to back to a temporary file in path's folder (".NAME.tmp.PID.N"), fsyncs it, renames it over
// `path` and fsyncs the folder, so the rename itself survives a power cut. On failure the temporary file is removed
// and CheckpointError (kIo) names the path, the call and the OS's reason; `path` is untouched.
void write_file_durably(const std::filesystem::path& path, std::span<const std::span<const std::byte>> pieces);

// The whole file; CheckpointError (kIo) when it cannot be opened or read.
std::vector<std::byte> read_whole_file(const std::filesystem::path& path);

}  // namespace stealbatch
