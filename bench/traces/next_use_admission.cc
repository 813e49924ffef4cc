#include "bench/traces/next_use_admission.h"

#include <algorithm>

namespace kvtier::bench {

NextUseAdmission::NextUseAdmission(std::unordered_map<BlockHash, std::vector<uint32_t>> uses,
                                   size_t horizon, size_t min_uses)
    : uses_(std::move(uses)), horizon_(horizon), min_uses_(min_uses) {}

namespace {

Result<size_t> count(const std::string& name, const std::string& digits, bool inf_allowed) {
  if (inf_allowed && digits == "inf") return NextUseAdmission::kForever;
  if (digits.empty() || digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return invalid_argument(
        "'" + name + "': expected oracle, oracle:H or oracle:H:M (H requests or inf, M uses)");
  }
  return static_cast<size_t>(std::stoul(digits));
}

}  // namespace

Result<NextUseAdmission::Rule> NextUseAdmission::parse(const std::string& name) {
  if (name == "oracle") return Rule{};
  const std::string prefix = "oracle:";
  if (name.rfind(prefix, 0) != 0) return not_found("not an oracle rule: " + name);
  const std::string rest = name.substr(prefix.size());
  const size_t colon = rest.find(':');
  Rule rule;
  KVTIER_ASSIGN_OR_RETURN(rule.horizon, count(name, rest.substr(0, colon), /*inf_allowed=*/true));
  if (colon != std::string::npos) {
    KVTIER_ASSIGN_OR_RETURN(rule.min_uses,
                            count(name, rest.substr(colon + 1), /*inf_allowed=*/false));
  }
  return rule;
}

bool NextUseAdmission::admit(const BlockHash& hash, uint64_t) {
  const auto it = uses_.find(hash);
  if (it == uses_.end()) return false;
  const std::vector<uint32_t>& u = it->second;
  const auto next = std::upper_bound(u.begin(), u.end(), now_);
  return next != u.end() && (horizon_ == kForever || *next - now_ <= horizon_) &&
         static_cast<size_t>(u.end() - next) >= min_uses_;
}

}  // namespace kvtier::bench
