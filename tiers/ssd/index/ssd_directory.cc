#include "tiers/ssd/index/ssd_directory.h"

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>

namespace kvtier {

namespace fs = std::filesystem;

namespace {

Status make_dirs(const std::string& path) {
  std::error_code ec;
  fs::create_directories(path, ec);
  if (ec) return io_error("create directory " + path + ": " + ec.message());
  return ok_status();
}

bool has_entries(const std::string& dir) {
  std::error_code ec;
  return fs::exists(dir, ec) && !fs::is_empty(dir, ec);
}

// O_DIRECT is refused by some file systems (EINVAL); probe once rather than fail every write.
bool direct_io_works(const std::string& dir) {
  const std::string probe = dir + "/.direct-io-probe";
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  ::unlink(probe.c_str());
  return fd >= 0;
}

}  // namespace

Result<SsdDirectory> open_ssd_directory(SsdState& s) {
  const std::string& dir = s.options.dir;
  KVTIER_RETURN_IF_ERROR(make_dirs(dir));
  KVTIER_ASSIGN_OR_RETURN(DirLock lock, DirLock::acquire(dir));

  if (s.options.reset) {
    std::error_code ec;
    fs::remove(dir + "/MANIFEST.json", ec);
    fs::remove_all(s.segments_dir(), ec);
    fs::remove_all(dir + "/index", ec);
    if (ec) return io_error("ssd tier: wiping " + dir + ": " + ec.message());
    spdlog::warn("ssd tier: wiped {} (--ssd-reset)", dir);
  }
  KVTIER_ASSIGN_OR_RETURN(std::optional<SsdManifest> manifest, SsdManifest::load(dir));
  if (!manifest) {
    if (has_entries(s.segments_dir()) || has_entries(dir + "/index")) {
      return failed_precondition("ssd tier: " + dir + " holds kvtier data but no MANIFEST.json; "
                                 "refusing to guess. Wipe it on purpose with --ssd-reset.");
    }
    manifest = SsdManifest::fresh(s.options.segment_size);
    KVTIER_RETURN_IF_ERROR(manifest->save(dir));
  }
  KVTIER_RETURN_IF_ERROR(manifest->check_compatible(dir, s.options.segment_size));
  // Blocks of every layout ever written here must stay decodable, and the manifest must know
  // every layout this process may write.
  for (const KvLayout& l : manifest->layouts) KVTIER_RETURN_IF_ERROR(s.layouts->add(l).status());
  bool changed = false;
  for (const auto& l : s.layouts->all()) changed = manifest->add_layout(*l) || changed;
  if (changed) KVTIER_RETURN_IF_ERROR(manifest->save(dir));

  KVTIER_RETURN_IF_ERROR(make_dirs(s.segments_dir()));
  if (s.options.direct_io && !direct_io_works(s.segments_dir())) {
    spdlog::warn("ssd tier: {} does not support O_DIRECT; using buffered I/O with fdatasync",
                 s.segments_dir());
    s.options.direct_io = false;
  }
  return SsdDirectory{std::move(lock), std::move(*manifest)};
}

}  // namespace kvtier
