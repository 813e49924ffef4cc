// Blocking socket reads and writes with deadlines, for kvtier's network ends (the binary
// protocol's client and server, the Redis client). Writes gather from many buffers in one sendmsg
// (a block goes out from where the tier holds it); reads fill the caller's buffer directly. A peer that stops sending or reading fails the call at the
// deadline instead of holding a thread for ever.
#pragma once

#include <sys/uio.h>

#include <chrono>
#include <cstddef>
#include <span>
#include <string>

#include "base/status.h"

namespace kvtier::net {

using Deadline = std::chrono::steady_clock::time_point;

// kUnavailable when the peer closed or reset the connection, or the deadline passed (the message
// says which); kIoError for other errors.
Status recv_exact(int fd, void* data, size_t size, Deadline deadline);
// Writes every byte of `pieces` (modified: consumed as it goes).
Status send_all(int fd, std::span<iovec> pieces, Deadline deadline);
// True for the Status recv_exact or send_all return when their deadline passed.
bool is_deadline(const Status& status);
// Waits for poll() `events` on `fd` (or an error or end of stream). False when the deadline passed.
bool wait_for(int fd, short events, Deadline deadline);
// Waits until `fd` has something to read (or an end of stream). False after `timeout`.
bool wait_readable(int fd, std::chrono::milliseconds timeout);

// A lingering close, for a server that refused a request before reading all of it: a close with
// unread input sends a reset, which can destroy the refusal before the client reads it. Says it
// is done writing, then discards what still arrives (at most 64 MiB, for at most 2 s), as web
// servers do. The caller closes `fd` after.
void linger(int fd);

// A connection to host:port with TCP_NODELAY, or kUnavailable.
Result<int> connect_tcp(const std::string& host, int port, std::chrono::milliseconds timeout);

}  // namespace kvtier::net
