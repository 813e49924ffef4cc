// TempDir: a fresh directory under $TMPDIR (or /tmp) removed with everything in it at scope exit.
#pragma once

#include <filesystem>
#include <string>

namespace kvtier::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string str() const { return path_.string(); }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace kvtier::testing
