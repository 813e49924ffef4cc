#include "tiers/ssd/index/ssd_manifest.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/byte_size.h"
#include "base/unique_fd.h"

namespace kvtier {

using nlohmann::json;

namespace {
constexpr const char* kFileName = "MANIFEST.json";
constexpr const char* kFormat = "kvtier.ssd";

Status fsync_path(const std::string& path, int flags) {
  UniqueFd fd(::open(path.c_str(), flags | O_CLOEXEC));
  if (!fd.valid()) return errno_status("open " + path, errno);
  if (::fsync(fd.get()) != 0) return errno_status("fsync " + path, errno);
  return ok_status();
}
}  // namespace

SsdManifest SsdManifest::fresh(uint64_t segment_size) {
  SsdManifest m;
  m.segment_size = segment_size;
  char buf[32];
  std::time_t now = std::time(nullptr);
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  m.created = buf;
  return m;
}

Result<std::optional<SsdManifest>> SsdManifest::load(const std::string& dir) {
  const std::string path = dir + "/" + kFileName;
  if (!std::filesystem::exists(path)) return std::optional<SsdManifest>();
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, false);
  auto bad = [&](const std::string& why) { return corruption(path + ": " + why); };
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  if (!j.contains("format") || j["format"] != kFormat) return bad("not a kvtier SSD manifest");
  if (!j.contains("version") || !j["version"].is_number_integer()) return bad("missing version");
  if (!j.contains("segment_size") || !j["segment_size"].is_number_unsigned()) {
    return bad("missing segment_size");
  }
  SsdManifest m;
  m.version = j["version"].get<int>();
  m.segment_size = j["segment_size"].get<uint64_t>();
  if (j.contains("created") && j["created"].is_string()) m.created = j["created"].get<std::string>();
  if (m.version == kVersion) {
    if (j.contains("layouts")) {
      if (!j["layouts"].is_array()) return bad("layouts is not an array");
      for (const json& lj : j["layouts"]) {
        auto l = KvLayout::from_json(lj);
        if (!l.ok()) return bad("layout: " + l.status().message());
        m.layouts.push_back(*l);
      }
    }
    if (j.contains("namespaces") && j["namespaces"].is_array()) {
      for (const json& n : j["namespaces"]) {
        if (n.is_string()) m.namespaces.insert(n.get<std::string>());
      }
    }
    if (j.contains("directories") && j["directories"].is_array()) {
      for (const json& d : j["directories"]) {
        if (d.is_string()) m.directories.push_back(d.get<std::string>());
      }
    }
  }
  return std::optional<SsdManifest>(std::move(m));
}

Status SsdManifest::save(const std::string& dir) const {
  json j;
  j["format"] = kFormat;
  j["version"] = version;
  j["created"] = created;
  j["segment_size"] = segment_size;
  j["layouts"] = json::array();
  for (const KvLayout& l : layouts) j["layouts"].push_back(l.to_json());
  j["namespaces"] = namespaces;
  if (!directories.empty()) j["directories"] = directories;
  const std::string path = dir + "/" + kFileName;
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(2) << "\n";
    out.flush();
    if (!out) return io_error("write " + tmp + " failed");
  }
  KVTIER_RETURN_IF_ERROR(fsync_path(tmp, O_RDONLY));
  if (::rename(tmp.c_str(), path.c_str()) != 0) return errno_status("rename " + tmp, errno);
  return fsync_path(dir, O_RDONLY | O_DIRECTORY);
}

Status SsdManifest::check_compatible(const std::string& dir, uint64_t want_segment_size) const {
  if (version != kVersion) {
    return failed_precondition(dir + " holds an SSD cache of format version " +
                               std::to_string(version) + "; this build reads version " +
                               std::to_string(kVersion) +
                               ". Point --ssd-cache-dir elsewhere, or wipe it on purpose with "
                               "--ssd-reset.");
  }
  if (segment_size != want_segment_size) {
    return failed_precondition(dir + " was written with " + format_byte_size(segment_size) +
                               " segments, not the " + format_byte_size(want_segment_size) +
                               " asked for. Use the same segment size, or wipe it on purpose with "
                               "--ssd-reset.");
  }
  return ok_status();
}

bool SsdManifest::add_layout(const KvLayout& layout) {
  for (const KvLayout& l : layouts) {
    if (l.fingerprint() == layout.fingerprint()) return false;
  }
  layouts.push_back(layout);
  return true;
}

}  // namespace kvtier
