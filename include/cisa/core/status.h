// cisa/core/status.h — error values used across the library.
//
// Every fallible call returns a Status (or a Result<T>) instead of throwing or aborting, so that
// bad input (a malformed model file, a wrong option, an exhausted page pool) produces a clear
// message and leaves the caller's objects usable.
//
//   cisa::Result<int> parse(std::string_view s);
//   auto r = parse("12");
//   if (!r.ok()) { std::cerr << r.status().message() << "\n"; return 1; }
//   int v = *r;
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <utility>

namespace cisa {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,    // the caller passed something malformed or inconsistent
  kOutOfRange,         // an index or size is past what exists
  kNotFound,           // unknown sequence, file, tensor, key
  kResourceExhausted,  // page pool or memory exhausted
  kDataLoss,           // corrupted or truncated file
  kUnimplemented,      // valid request this build does not support
  kFailedPrecondition,
  kInternal,
  kUnavailable,  // offline, no device
};

const char* status_code_name(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "invalid argument: budget must be >= 0 (got -3)"
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status invalid_argument(std::string m) {
  return {StatusCode::kInvalidArgument, std::move(m)};
}
inline Status out_of_range(std::string m) {
  return {StatusCode::kOutOfRange, std::move(m)};
}
inline Status not_found(std::string m) {
  return {StatusCode::kNotFound, std::move(m)};
}
inline Status resource_exhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status data_loss(std::string m) {
  return {StatusCode::kDataLoss, std::move(m)};
}
inline Status unimplemented(std::string m) {
  return {StatusCode::kUnimplemented, std::move(m)};
}
inline Status failed_precondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status internal_error(std::string m) {
  return {StatusCode::kInternal, std::move(m)};
}
inline Status unavailable(std::string m) {
  return {StatusCode::kUnavailable, std::move(m)};
}

// A value or an error. Accessing the value of an error Result is a programming bug (asserted).
template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) { assert(!status_.ok()); }  // NOLINT

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  T& value() & {
    assert(ok());
    return *value_;
  }
  const T& value() const& {
    assert(ok());
    return *value_;
  }
  T&& value() && {
    assert(ok());
    return std::move(*value_);
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::move(*this).value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace cisa

// Propagate an error Status from an expression returning Status.
#define CISA_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::cisa::Status cisa_status_ = (expr);        \
    if (!cisa_status_.ok()) return cisa_status_; \
  } while (0)

#define CISA_CONCAT_INNER_(a, b) a##b
#define CISA_CONCAT_(a, b) CISA_CONCAT_INNER_(a, b)
// CISA_ASSIGN_OR_RETURN(auto x, make_x()); — binds the value or returns the error.
#define CISA_ASSIGN_OR_RETURN(lhs, expr) \
  CISA_ASSIGN_OR_RETURN_IMPL_(CISA_CONCAT_(cisa_result_, __LINE__), lhs, expr)
#define CISA_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
