// Benchmarks stop at their first failure, naming it: a figure measured past one would mean nothing.
#pragma once

#include <errno.h>

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "base/status.h"

namespace kvtier::bench {

[[noreturn]] inline void die(const Status& st) {
  std::fprintf(stderr, "%s: %s\n", program_invocation_short_name, st.to_string().c_str());
  std::exit(1);
}

template <typename T>
T must(Result<T> r) {
  if (!r.ok()) die(r.status());
  return std::move(r).value();
}

}  // namespace kvtier::bench
