// The message of what a piece of test code throws, for checks that an error says what went wrong.
#pragma once
#include <exception>
#include <functional>
#include <string>

namespace q4t::test {

// The what() of the E that f throws, or "(nothing thrown)"; an exception of another type escapes and fails the
// test.
template <class E = std::exception>
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

}  // namespace q4t::test
