// The perf tools' command lines: every usage error exits 2, and an output path is known writable before the run.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <sys/stat.h>
#include <unistd.h>

namespace stealbatch::perf {

inline constexpr int kExitUsage = 2;  // a flag or its value is wrong; nothing ran

// Parses the command line. Returns -1 to go on, else the exit status: 0 after --help, kExitUsage after any other
// parse error (CLI11 has printed it, with its hint), whatever CLI11's own code for it (105, 107, 108, ...).
inline int parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  return -1;
}

// CLI::Range for a real number, which also refuses NaN and the infinities (CLI::Range lets NaN through: every
// comparison with it is false).
inline CLI::Validator finite_range(double lo, double hi) {
  char range[96];
  std::snprintf(range, sizeof range, "[%g, %g]", lo, hi);
  return CLI::Validator(
      [lo, hi, r = std::string(range)](std::string& in) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(in.c_str(), &end);
        if (in.empty() || *end != '\0') return "'" + in + "' is not a number; expected one in " + r;
        if (!std::isfinite(v) || v < lo || v > hi) return "value " + in + " is out of range: expected a finite number in " + r;
        return {};
      },
      "FLOAT in " + std::string(range));
}

// Prints "TOOL: MESSAGE" on stderr and returns kExitUsage.
inline int usage_error(const char* tool, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", tool, message.c_str());
  return kExitUsage;
}

// Whether the file `path` that `flag` names can be written, found before the run: it is opened for appending (so
// nothing in it is lost) and removed again if it did not exist. Otherwise prints the flag, the path and the system's
// reason, and returns false. A flag given an empty path is refused too.
inline bool check_output_file(const char* tool, const CLI::App& app, const char* flag, const std::string& path) {
  if (path.empty()) {
    if (app.count(flag) == 0) return true;
    usage_error(tool, std::string(flag) + " = '': expected a file to write");
    return false;
  }
  struct stat st{};
  const bool existed = ::stat(path.c_str(), &st) == 0;
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    usage_error(tool, std::string(flag) + " = '" + path + "': cannot open it for writing: " + std::strerror(errno));
    return false;
  }
  std::fclose(f);
  if (!existed) std::remove(path.c_str());
  return true;
}

// Whether the folder `dir` that `flag` names exists and takes new files, found before the run.
inline bool check_output_dir(const char* tool, const CLI::App& app, const char* flag, const std::string& dir) {
  if (dir.empty()) {
    if (app.count(flag) == 0) return true;
    usage_error(tool, std::string(flag) + " = '': expected a folder to write into");
    return false;
  }
  struct stat st{};
  const char* why = nullptr;
  if (::stat(dir.c_str(), &st) != 0) why = std::strerror(errno);
  else if (!S_ISDIR(st.st_mode)) why = std::strerror(ENOTDIR);
  else if (::access(dir.c_str(), W_OK | X_OK) != 0) why = std::strerror(errno);
  if (why == nullptr) return true;
  usage_error(tool, std::string(flag) + " = '" + dir + "': cannot write files into it: " + why);
  return false;
}

// Writes `text` to `path` (the file `flag` names) and checks every step of it, the close included (a full disk
// shows there). Returns false after printing the flag, the path and the system's reason.
inline bool write_output(const char* tool, const char* flag, const std::string& path, std::string_view text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "%s: %s = '%s': cannot open it for writing: %s\n", tool, flag, path.c_str(), std::strerror(errno));
    return false;
  }
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size() && std::fflush(f) == 0;
  const int write_errno = errno;
  const bool closed = std::fclose(f) == 0;
  if (wrote && closed) return true;
  std::fprintf(stderr, "%s: %s = '%s': writing it failed: %s\n", tool, flag, path.c_str(), std::strerror(wrote ? errno : write_errno));
  return false;
}

}  // namespace stealbatch::perf
