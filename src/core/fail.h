// The one way attn rejects an input: attn::Error with the rejecting function's name first
// ("attn::attention: mask of shape ..."), as include/attn/error.h promises.
#pragma once
#include <fmt/format.h>

#include <string>

#include "attn/error.h"

namespace attn::detail {

[[noreturn]] inline void fail(const char* fn, const std::string& msg) {
  throw Error(fmt::format("{}: {}", fn, msg));
}

}  // namespace attn::detail
