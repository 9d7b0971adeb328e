// Errors in draftfeed.
//
// Three kinds:
//  * expected failures of I/O and parsing (a corrupt file, a missing row) travel as values in
//    `Result<T>` so a caller that drops and counts bad samples does not pay for exceptions;
//  * an error that ends the operation is thrown as one of the `Error` subclasses below (the Python
//    module maps each to a Python exception type);
//  * programmer bugs are `assert`s.
// Every message names the object (file, row, request) and, where two numbers disagree, both.
#pragma once

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

namespace draftfeed {

// What went wrong, coarse enough for a policy to act on (drop and count, retry, fail).
enum class ErrorKind {
  kInvalidArgument,  // the caller asked for something impossible (Python: ValueError)
  kNotFound,         // a file or folder that should exist does not (Python: FileNotFoundError)
  kIo,               // the OS refused a read/write/mmap (Python: OSError)
  kFormat,           // bytes that do not follow the format (Python: draftfeed.FormatError)
  kMismatch,         // a file disagrees with the dataset (token ids, length)
  kNonFinite,        // NaN or Inf in hidden states
  kTimeout,          // a lock or a request took too long (Python: TimeoutError)
  kUnsupported,  // a valid format feature draftfeed does not read (Python: draftfeed.FormatError)
  kRuntime,      // anything else that ends a run (Python: RuntimeError)
};

const char* error_kind_name(ErrorKind kind);

// The OS's text for an errno value ("No such file or directory"): strerror's text, but safe to
// call from any number of threads (strerror may share one buffer between them).
std::string os_error_text(int err);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// A value or an Error. Small on purpose: enough for "parse this or say why".
template <typename T>
class Result {
 public:
  Result(T value) : state_(std::move(value)) {}      // NOLINT(google-explicit-constructor)
  Result(Error error) : state_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return std::holds_alternative<T>(state_); }
  explicit operator bool() const { return ok(); }

  const Error& error() const { return std::get<Error>(state_); }
  T& value() & {
    throw_if_error();
    return std::get<T>(state_);
  }
  const T& value() const& {
    throw_if_error();
    return std::get<T>(state_);
  }
  T&& value() && {
    throw_if_error();
    return std::get<T>(std::move(state_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  void throw_if_error() const {
    if (!ok()) throw std::get<Error>(state_);
  }
  std::variant<T, Error> state_;
};

// Throws Error(kind, message) when `condition` is false. A function, not a macro: the message is
// built eagerly, so keep it off hot loops.
inline void require(bool condition, ErrorKind kind, const std::string& message) {
  if (!condition) throw Error(kind, message);
}

}  // namespace draftfeed
