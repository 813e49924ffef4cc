#include "server/http/access_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include <nlohmann/json.hpp>

namespace kvtier {
namespace {

std::string utc_now() {
  const auto now = std::chrono::system_clock::now();
  const std::time_t t = std::chrono::system_clock::to_time_t(now);
  const auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[80];
  std::snprintf(buf, sizeof(buf), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(ms));
  return buf;
}

}  // namespace

void AccessNote::add_block(const std::string& tier, size_t index) {
  if (!tiers.empty() && tiers.back().tier == tier &&
      tiers.back().first_block + tiers.back().blocks == index) {
    ++tiers.back().blocks;
    return;
  }
  tiers.push_back({tier, index, 1});
}

Result<std::unique_ptr<AccessLog>> AccessLog::open(const std::string& path, double sample_rate) {
  if (!(sample_rate >= 0.0 && sample_rate <= 1.0)) {
    return invalid_argument("access log: sample rate " + std::to_string(sample_rate) +
                            " is not within [0, 1]");
  }
  if (path == "-")
    return std::unique_ptr<AccessLog>(new AccessLog(stderr, false, sample_rate, path));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (fd < 0) return errno_status("access log: opening " + path, errno);
  std::FILE* f = ::fdopen(fd, "a");
  if (!f) {
    const int err = errno;
    ::close(fd);
    return errno_status("access log: opening " + path, err);
  }
  return std::unique_ptr<AccessLog>(new AccessLog(f, true, sample_rate, path));
}

AccessLog::AccessLog(std::FILE* file, bool owned, double sample_rate, std::string path)
    : file_(file), owned_(owned), sample_rate_(sample_rate), path_(std::move(path)) {
  char prefix[32];
  std::snprintf(
      prefix, sizeof(prefix), "%x-%llx-", static_cast<unsigned>(::getpid()),
      static_cast<unsigned long long>(std::chrono::system_clock::now().time_since_epoch().count()));
  id_prefix_ = prefix;
}

AccessLog::~AccessLog() {
  if (owned_) std::fclose(file_);
}

bool AccessLog::sampled() {
  if (sample_rate_ >= 1.0) return true;
  thread_local std::minstd_rand rng(std::random_device{}());
  if (std::uniform_real_distribution<double>(0.0, 1.0)(rng) < sample_rate_) return true;
  sampled_out_.inc();
  return false;
}

std::string AccessLog::next_request_id() {
  return id_prefix_ + std::to_string(next_id_.fetch_add(1) + 1);
}

void AccessLog::write(const AccessLine& l) {
  nlohmann::json j{{"ts", utc_now()},
                   {"request_id", l.request_id},
                   {"tenant", l.tenant ? nlohmann::json(*l.tenant) : nlohmann::json(nullptr)}};
  const AccessNote* n = l.note;
  j["namespace"] = n && !n->ns.empty() ? nlohmann::json(n->ns) : nlohmann::json(nullptr);
  j["method"] = l.method;
  j["route"] = l.route;
  j["status"] = l.status;
  if (n && n->tokens) {
    j["tokens"] = *n->tokens;
    j["matched_tokens"] = n->matched_tokens.value_or(0);
    nlohmann::json tiers = nlohmann::json::array();
    for (const AccessNote::TierRun& r : n->tiers) {
      tiers.push_back({{"tier", r.tier}, {"first_block", r.first_block}, {"blocks", r.blocks}});
    }
    j["tiers"] = std::move(tiers);
  }
  if (n && !n->hash.empty()) j["hash"] = n->hash;
  j["bytes_in"] = l.bytes_in;
  j["bytes_out"] = l.bytes_out;
  j["latency_ms"] = l.latency_seconds * 1e3;
  j["sample_rate"] = sample_rate_;
  // Replacement, not an exception, for bytes a client sent that are not UTF-8 (a request id).
  std::string text = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  text += '\n';
  std::lock_guard lock(mu_);
  if (std::fwrite(text.data(), 1, text.size(), file_) != text.size() || std::fflush(file_) != 0) {
    const int err = errno;
    write_failures_.inc();
    failure_log_.error("access log: writing to {}: {} (lines are being lost)", path_,
                       std::strerror(err));
    std::clearerr(file_);
    return;
  }
  lines_.inc();
}

void AccessLog::visit_metrics(MetricVisitor& v) const {
  const char* help = "Requests the access log saw, by outcome";
  v.counter("kvtier_access_log_requests_total", help, {{"outcome", "written"}}, lines_.value());
  v.counter("kvtier_access_log_requests_total", help, {{"outcome", "sampled_out"}},
            sampled_out_.value());
  v.counter("kvtier_access_log_requests_total", help, {{"outcome", "write_failed"}},
            write_failures_.value());
}

}  // namespace kvtier
