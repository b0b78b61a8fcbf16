// A small test harness for the C++ tests (no test framework is installed): TEST(name) { ... }
// registers a test; CHECK(condition) and CHECK_EQ(got, want) fail it with where and what;
// SKIP(why) skips it. main() runs them all and prints `--- PASS: name (seconds)` (or FAIL, SKIP) for
// each and `N passed, N failed, N skipped`; it exits 1 where any failed.
#pragma once

#include <chrono>
#include <functional>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace check {

struct Failed {
  std::string why;
};
struct Skipped {
  std::string why;
};

inline std::vector<std::pair<std::string, std::function<void()>>>& tests() {
  static std::vector<std::pair<std::string, std::function<void()>>> all;
  return all;
}

struct Registered {
  Registered(const char* name, std::function<void()> body) { tests().emplace_back(name, std::move(body)); }
};

template <class T>
std::string text(const T& value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

template <class T>
std::string text(const std::vector<T>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); i++) {
    out += (i ? ", " : "") + text(static_cast<std::conditional_t<sizeof(T) == 1, int, T>>(values[i]));
  }
  return out + "]";
}

inline int run_all() {
  int passed = 0, failed = 0, skipped = 0;
  for (const auto& [name, body] : tests()) {
    auto started = std::chrono::steady_clock::now();
    try {
      body();
      std::cout << "--- PASS: " << name << " ("
                << std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count()
                << " s)" << std::endl;
      passed++;
    } catch (const Skipped& s) {
      std::cout << "--- SKIP: " << name << " (" << s.why << ")" << std::endl;
      skipped++;
    } catch (const Failed& f) {
      std::cout << "--- FAIL: " << name << ": " << f.why << std::endl;
      failed++;
    } catch (const std::exception& err) {
      std::cout << "--- FAIL: " << name << ": threw " << err.what() << std::endl;
      failed++;
    }
  }
  std::cout << passed << " passed, " << failed << " failed, " << skipped << " skipped" << std::endl;
  return failed ? 1 : 0;
}

}  // namespace check

#define TEST(name)                                                 \
  static void name();                                              \
  static check::Registered registered_##name(#name, name);         \
  static void name()

#define CHECK(condition)                                                                         \
  do {                                                                                           \
    if (!(condition)) {                                                                          \
      throw check::Failed{std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #condition}; \
    }                                                                                            \
  } while (0)

#define CHECK_EQ(got, want)                                                                      \
  do {                                                                                           \
    auto got_ = (got);                                                                           \
    auto want_ = (want);                                                                         \
    if (!(got_ == want_)) {                                                                      \
      throw check::Failed{std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #got " is " + \
                          check::text(got_) + ", not " + check::text(want_)};                    \
    }                                                                                            \
  } while (0)

// The deepx::Error that body throws (a failure where it throws none).
#define THROWN(body)                                                                             \
  [&]() -> deepx::Error {                                                                        \
    try {                                                                                        \
      body;                                                                                      \
    } catch (const deepx::Error& err) {                                                          \
      return err;                                                                                \
    }                                                                                            \
    throw check::Failed{std::string(__FILE__) + ":" + std::to_string(__LINE__) + ": " #body " threw nothing"}; \
  }()

#define SKIP(why) throw check::Skipped{why}
