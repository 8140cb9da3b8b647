// A one-line progress bar for long work: step, loss, accuracy, tokens/s, ETA. On a terminal it redraws
// itself in place; otherwise (logs, CI) it prints a plain line every `every_seconds`.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace attn::tools {

class ProgressBar {
 public:
  ProgressBar(int64_t total, std::FILE* out = stderr, double every_seconds = 5.0);
  // `status` follows the bar, e.g. "loss 0.123  acc 0.98".
  void update(int64_t done, double tokens_per_second, const std::string& status);
  void finish();  // ends the line (terminal mode)

 private:
  int64_t total_;
  std::FILE* out_;
  bool tty_;
  double every_;
  std::chrono::steady_clock::time_point start_, last_;
  bool drawn_ = false;
};

std::string format_duration(double seconds);  // "1m05s", "12.3s"

}  // namespace attn::tools
