// Shared by the libFuzzer harnesses (tests/fuzz/fuzz_*.cc) and their replay test
// (tests/reliability/fuzz_replay_test.cc): a reader that turns fuzzer bytes into choices, and the
// exception a harness throws when an invariant breaks. Under libFuzzer an escaping Violation aborts
// the process (a crash, saved as a reproducer); under GoogleTest the replay test catches it and
// fails.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <string_view>

namespace attn::fuzz {

// An invariant of the library does not hold for this input: a bug, never a legitimate rejection.
class Violation : public std::logic_error {
 public:
  using std::logic_error::logic_error;
};

[[noreturn]] inline void violation(const std::string& what) {
  throw Violation(what);
}
inline void require(bool ok, const std::string& what) {
  if (!ok) violation(what);
}

inline bool starts_with(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// Consumes the input front to back; once it is exhausted every read returns 0 (so short inputs are
// valid, and a few bytes already pick a small problem).
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  bool flag() { return (byte() & 1) != 0; }
  // An integer in [lo, hi] (hi - lo < 256).
  int64_t range(int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(byte() % (hi - lo + 1));
  }
  uint64_t u64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v = v << 8 | byte();
    return v;
  }
  template <class T, size_t N>
  T pick(const T (&choices)[N]) {
    return choices[byte() % N];
  }
  size_t remaining() const { return pos_ < size_ ? size_ - pos_ : 0; }
  const uint8_t* rest() const { return data_ + pos_; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// A per-process scratch folder for the readers' harnesses (they take paths, not bytes):
// $ATTN_FUZZ_SCRATCH when set (a folder of its own: the replay test removes it), else
// attn_fuzz_<pid> in the temporary folder (separate for concurrent processes). scripts/fuzz.sh's
// CI mode sets a fixed one: the path reaches error messages and so the comparisons libFuzzer
// mutates towards, and a process id in it changes the inputs from run to run.
inline std::filesystem::path scratch_dir() {
  static const std::filesystem::path dir = [] {
    if (const char* fixed = std::getenv("ATTN_FUZZ_SCRATCH"); fixed != nullptr && *fixed != '\0')
      return std::filesystem::path(fixed);
    return std::filesystem::temp_directory_path() / ("attn_fuzz_" + std::to_string(::getpid()));
  }();
  std::filesystem::create_directories(dir);  // again after a caller removed it
  return dir;
}

inline std::string write_scratch_file(const char* name, const uint8_t* data, size_t size) {
  const std::string path = (scratch_dir() / name).string();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  f.close();
  if (!f) violation("fuzz harness: cannot write the scratch file " + path);
  return path;
}

}  // namespace attn::fuzz
