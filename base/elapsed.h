// Elapsed time as the cost models and reports use it: seconds as a double, on the steady clock
// (wall-clock jumps must not show up as a slow restore).
#pragma once

#include <chrono>

namespace kvtier {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvtier
