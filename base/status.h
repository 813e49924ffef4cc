// Status and Result<T>: errors as values on every I/O, parse and device path. A Status carries a
// code a caller can branch on and a message a person can act on ("segment 7 offset 1048576:
// checksum mismatch"). Exceptions exist only at the edges (CLI, HTTP), which turn these into text.
#pragma once

#include <cassert>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kvtier {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller's input is malformed (wrong shape, dtype, size, field)
  kNotFound,           // the thing asked for is not there
  kAlreadyExists,      // a create that must not overwrite found something
  kCorruption,         // stored bytes fail a check (checksum, length, hash, tokens)
  kIoError,            // the OS refused or failed an I/O
  kNoSpace,            // ENOSPC or a capacity that cannot be met
  kResourceExhausted,  // a bounded queue or pool is full
  kFailedPrecondition, // the system is not in a state that allows this (locked dir, mismatch)
  kUnavailable,        // a device or service is missing (no Vulkan device)
  kConflict,           // the same key already holds different content (hash collision)
  kPermissionDenied,   // the caller is known but may not do this (another tenant's namespace)
  kInternal,           // a bug: an invariant broke
};

std::string_view status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "Corruption: segment 7 offset 4096: checksum mismatch"
  std::string to_string() const;

  // Prefixes the message with where it happened, keeping the code: "segment 7: " + message.
  Status with_context(std::string_view context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status ok_status() { return Status(); }
Status invalid_argument(std::string message);
Status not_found(std::string message);
Status already_exists(std::string message);
Status corruption(std::string message);
Status io_error(std::string message);
// Formats an errno: "open /x/y: No such file or directory (errno 2)"; ENOSPC maps to kNoSpace.
Status errno_status(std::string_view what, int err);
Status no_space(std::string message);
Status resource_exhausted(std::string message);
Status failed_precondition(std::string message);
Status unavailable(std::string message);
Status conflict(std::string message);
Status permission_denied(std::string message);
Status internal_error(std::string message);

// Result<T> holds either a value or a non-ok Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design, like absl::StatusOr
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an ok Status has no value");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kvtier

#define KVTIER_CONCAT_INNER(a, b) a##b
#define KVTIER_CONCAT(a, b) KVTIER_CONCAT_INNER(a, b)

#define KVTIER_RETURN_IF_ERROR(expr)           \
  do {                                         \
    ::kvtier::Status _kvtier_status = (expr);  \
    if (!_kvtier_status.ok()) return _kvtier_status; \
  } while (0)

#define KVTIER_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()

#define KVTIER_ASSIGN_OR_RETURN(lhs, expr) \
  KVTIER_ASSIGN_OR_RETURN_IMPL(KVTIER_CONCAT(_kvtier_result_, __LINE__), lhs, expr)
