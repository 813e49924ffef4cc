// How a Status reaches a client of kvtierd: the HTTP status number and the JSON error code the
// HTTP API answers with. The binary protocol carries the same numbers, so both doors report an
// error alike and one client-side mapping (status_from_http) reads both.
#pragma once

#include "base/status.h"

namespace kvtier {

int http_status_for(StatusCode code);
const char* error_code_for(StatusCode code);

}  // namespace kvtier
