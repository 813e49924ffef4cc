#include "base/status.h"

#include <cerrno>
#include <cstring>

namespace kvtier {

std::string_view status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kNoSpace: return "NoSpace";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kConflict: return "Conflict";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

std::string Status::to_string() const {
  if (ok()) return "OK";
  std::string out(status_code_name(code_));
  out += ": ";
  out += message_;
  return out;
}

Status Status::with_context(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  msg += ": ";
  msg += message_;
  return Status(code_, std::move(msg));
}

Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
Status already_exists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
Status corruption(std::string m) { return {StatusCode::kCorruption, std::move(m)}; }
Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
Status no_space(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
Status resource_exhausted(std::string m) { return {StatusCode::kResourceExhausted, std::move(m)}; }
Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
Status conflict(std::string m) { return {StatusCode::kConflict, std::move(m)}; }
Status permission_denied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
Status internal_error(std::string m) { return {StatusCode::kInternal, std::move(m)}; }

Status errno_status(std::string_view what, int err) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  msg += " (errno " + std::to_string(err) + ")";
  return Status(err == ENOSPC || err == EDQUOT ? StatusCode::kNoSpace : StatusCode::kIoError,
                std::move(msg));
}

}  // namespace kvtier
