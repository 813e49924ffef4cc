// Blocking socket reads and writes with deadlines, for the binary protocol's two ends. Writes
// gather from many buffers in one sendmsg (a block goes out from where the tier holds it); reads
// fill the caller's buffer directly. A peer that stops sending or reading fails the call at the
// deadline instead of holding a thread for ever.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include "base/status.h"

namespace kvtier::wire {

using Deadline = std::chrono::steady_clock::time_point;

// kUnavailable when the peer closed or reset the connection, or the deadline passed (the message
// says which); kIoError for other errors.
Status recv_exact(int fd, void* data, size_t size, Deadline deadline);
// Writes every byte of `pieces` (modified: consumed as it goes).
Status send_all(int fd, std::span<iovec> pieces, Deadline deadline);
// True for the Status recv_exact or send_all return when their deadline passed.
bool is_deadline(const Status& status);
// Waits until `fd` has something to read (or an end of stream). False after `timeout`.
bool wait_readable(int fd, std::chrono::milliseconds timeout);

// A connection to host:port with TCP_NODELAY, or kUnavailable.
Result<int> connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace kvtier::wire
