#include "server/status_codes.h"

namespace kvtier {

int http_status_for(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return 400;
    case StatusCode::kNotFound: return 404;
    case StatusCode::kConflict: return 409;
    case StatusCode::kFailedPrecondition: return 422;
    case StatusCode::kResourceExhausted: return 503;
    case StatusCode::kPermissionDenied: return 403;
    case StatusCode::kNoSpace: return 507;
    default: return 500;
  }
}

const char* error_code_for(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument: return "invalid_argument";
    case StatusCode::kNotFound: return "not_found";
    case StatusCode::kConflict: return "conflict";
    case StatusCode::kFailedPrecondition: return "failed_precondition";
    case StatusCode::kResourceExhausted: return "resource_exhausted";
    case StatusCode::kPermissionDenied: return "permission_denied";
    case StatusCode::kNoSpace: return "insufficient_storage";
    case StatusCode::kIoError: return "io_error";
    default: return "internal";
  }
}

}  // namespace kvtier
