#include "server/connection_closer.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <string_view>

namespace kvtier {
namespace {

int local_port(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in&>(a).sin_port);
  if (a.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6&>(a).sin6_port);
  return -1;
}

}  // namespace

int shut_accepted_connections(int port) {
  DIR* dir = ::opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  int shut = 0;
  while (const dirent* entry = ::readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == ::dirfd(dir)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t len = sizeof(local);
    if (::getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &len) != 0) continue;
    if (local_port(local) != port) continue;
    len = sizeof(peer);  // the listener has no peer: only accepted connections do
    if (::getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &len) != 0) continue;
    if (::shutdown(static_cast<int>(fd), SHUT_RD) == 0) ++shut;
  }
  ::closedir(dir);
  return shut;
}

}  // namespace kvtier
