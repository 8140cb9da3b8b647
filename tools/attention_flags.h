// The attention options' flags, one set shared by `attn sdpa` and `attn ring`: flag names and help
// from attn/options.h, defaults from AttentionOptions{}. Values are taken as strings and checked
// here, so that every bad value is a one-line attn::Error naming the command and the flag.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "attn/attention.h"

namespace attn::tools {

struct AttentionFlags {
  bool causal = false;
  std::string scale, softcap, align, window, mask_type, dropout, seed, backend, threads;
  // .npy paths; read by the command (read_option_inputs), not parsed here
  std::string mask, key_lengths, alibi;
};

// Which groups of flags a command takes.
enum AttentionFlagGroup : unsigned {
  kScoreFlags = 1u << 0,     // --scale, --softcap
  kPositionFlags = 1u << 1,  // --causal, --align, --window
  kMaskFlags = 1u << 2,      // --mask, --mask-type
  kKeyLengthFlag = 1u << 3,  // --key-lengths
  kAlibiFlag = 1u << 4,      // --alibi
  kDropoutFlags = 1u << 5,   // --dropout, --seed
  kRunFlags = 1u << 6,       // --backend, --threads
  kAllAttentionFlags = (1u << 7) - 1,
};

void add_attention_flags(CLI::App* sub, AttentionFlags& f, unsigned groups);

// The options from the flags' strings (the tensors stay unset); throws "<cmd>: <flag> ...".
AttentionOptions parse_attention_flags(const char* cmd, const AttentionFlags& f);

// Helpers for a command's own flags: "<cmd>: <flag> expects a number / an integer, got '<s>'".
double parse_double_flag(const char* cmd, const char* flag, const std::string& s);
int64_t parse_int_flag(const char* cmd, const char* flag, const std::string& s);

}  // namespace attn::tools
