#include "tools/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace attn::tools {

std::string format_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 60) return fmt::format("{:.1f}s", s);
  const auto total = static_cast<int64_t>(s + 0.5);
  if (total < 3600) return fmt::format("{}m{:02d}s", total / 60, total % 60);
  return fmt::format("{}h{:02d}m", total / 3600, (total % 3600) / 60);
}

ProgressBar::ProgressBar(int64_t total, std::FILE* out, double every_seconds)
    : total_(std::max<int64_t>(total, 1)),
      out_(out),
      tty_(isatty(fileno(out)) != 0),
      every_(every_seconds) {
  start_ = last_ = std::chrono::steady_clock::now();
}

void ProgressBar::update(int64_t done, double tokens_per_second, const std::string& status) {
  const auto now = std::chrono::steady_clock::now();
  const double since_last = std::chrono::duration<double>(now - last_).count();
  const bool last_step = done >= total_;
  if (!tty_ && !last_step && since_last < every_ && drawn_) return;
  if (tty_ && !last_step && since_last < 0.1 && drawn_) return;
  last_ = now;
  drawn_ = true;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double frac = static_cast<double>(done) / static_cast<double>(total_);
  const double eta = done > 0 ? elapsed * (1.0 - frac) / frac : NAN;
  const std::string line =
      fmt::format("step {:>{}}/{}  {}  {:.0f} tok/s  {} left", done, std::to_string(total_).size(),
                  total_, status, tokens_per_second, format_duration(eta));
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<size_t>(filled), '#');
    bar.resize(kWidth, '.');
    fmt::print(out_, "\r[{}] {}\x1b[K", bar, line);
  } else {
    fmt::print(out_, "{}\n", line);
  }
  std::fflush(out_);
}

void ProgressBar::finish() {
  if (tty_ && drawn_) fmt::print(out_, "\n");
  std::fflush(out_);
}

}  // namespace attn::tools
