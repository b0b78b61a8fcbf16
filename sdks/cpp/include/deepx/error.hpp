// Errors of the library and of the gateway, and the "did you mean" of their messages: the
// same words as Python's (deepx_flow/errors.py), so a mistake reads alike in every language.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace deepx {

// A deepx_flow error: kind names it as Python does (GraphError, InputError, NotFound, ...),
// status is the gateway's HTTP status where it came from one (over gRPC: the HTTP status of
// the same error), node the node it is about where it is about one. what() is the message,
// after "node 'id': " where there is a node.
class Error : public std::runtime_error {
 public:
  Error(std::string kind, std::string message, int status = 0, std::string node = "");

  const std::string& kind() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  int status() const noexcept { return status_; }
  const std::string& node() const noexcept { return node_; }

 private:
  std::string kind_, message_, node_;
  int status_;
};

// A value as Python's repr shows it in messages: 'text'.
std::string shown(const std::string& text);

// The choice spelled most like word (case ignored; a difflib ratio of at least 0.6), or "":
// Python's errors.closest.
std::string closest(const std::string& word, const std::vector<std::string>& choices);

// " (did you mean 'relu'?)", or "" where no choice is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& choices);

}  // namespace deepx
