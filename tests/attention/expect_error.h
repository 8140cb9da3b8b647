// expect_error: the attention tests' check that a call is refused with a clear message.
#pragma once
#include <gtest/gtest.h>

#include <exception>
#include <functional>
#include <initializer_list>
#include <string>

#include "attn/error.h"

namespace attn::test {

// Runs fn, expects attn::Error with a message starting with `prefix: ` and containing each part.
inline void expect_error(const std::function<void()>& fn, const std::string& prefix,
                         std::initializer_list<std::string> parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(prefix + ": ", 0), 0u) << msg;
    for (const std::string& part : parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected attn::Error, got: " << e.what();
    return;
  }
  ADD_FAILURE() << "expected attn::Error containing " << *parts.begin() << ", nothing thrown";
}

}  // namespace attn::test
