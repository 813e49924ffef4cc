#include "base/unique_fd.h"

#include <unistd.h>

namespace kvtier {

void UniqueFd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace kvtier
