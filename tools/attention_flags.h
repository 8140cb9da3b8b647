// The attention options' flags, one set shared by `attn sdpa` and `attn ring`: one flag per row of
// attn/options.h's kOptionInfo that has one (its name, help and rule), defaults from AttentionOptions{}.
// Values are taken as strings and checked here, so that every bad value is a one-line attn::Error
// naming the command and the flag.
#pragma once
#include <CLI/CLI.hpp>
#include <array>
#include <iterator>
#include <string>
#include <string_view>

#include "attn/attention.h"
#include "attn/options.h"

namespace attn::tools {

// The flags' values as typed, one per row of kOptionInfo ("" = not given); the tensors' values are .npy
// paths, read by the command (read_option_inputs), not parsed here.
struct AttentionFlags {
  std::array<std::string, std::size(kOptionInfo)> text;
  std::array<bool, std::size(kOptionInfo)> on{};  // the bool options' flags (--causal)

  // The value of option `name` (a field name, attn::option_info's): "" when not given.
  std::string& operator[](std::string_view name);
  const std::string& operator[](std::string_view name) const;
  bool is_on(std::string_view name) const;
};

// The flags of the rows `takes` accepts (every row with a flag by default); the output requests
// (return_weights, mask_grad) are the commands' own.
void add_attention_flags(CLI::App* sub, AttentionFlags& f,
                         bool (*takes)(const OptionInfo&) = nullptr);

// The options from the flags' strings (the tensors stay unset); throws "<cmd>: <flag> ...".
AttentionOptions parse_attention_flags(const char* cmd, const AttentionFlags& f);

// Helpers for a command's own flags: "<cmd>: <flag> expects a number / an integer, got '<s>'".
double parse_double_flag(const char* cmd, const char* flag, const std::string& s);
int64_t parse_int_flag(const char* cmd, const char* flag, const std::string& s);

}  // namespace attn::tools
