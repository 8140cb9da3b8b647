// Replays every committed fuzz input through its harness (tests/fuzz/*_harness.h) in the ordinary
// test build: the seed corpus (tests/fuzz/corpus/<harness>/) and the inputs that once broke an
// invariant (tests/fuzz/regressions/<harness>/, see the README there). libFuzzer is not needed: a
// harness is a plain function that throws attn::fuzz::Violation when an invariant fails.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/attention_harness.h"
#include "fuzz/checkpoint_harness.h"
#include "fuzz/npy_harness.h"
#include "fuzz/packed_harness.h"
#include "fuzz/safetensors_harness.h"

namespace attn {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> inputs_of(const std::string& harness) {
  std::vector<fs::path> files;
  for (const char* kind : {"corpus", "regressions"}) {
    const fs::path dir = fs::path(ATTN_SOURCE_DIR) / "tests" / "fuzz" / kind / harness;
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.is_regular_file() && e.path().filename().string().front() != '.')
        files.push_back(e.path());
    }
  }
  std::sort(files.begin(), files.end());
  return files;
}

template <class Harness>
void replay(const std::string& harness, Harness&& run) {
  const std::vector<fs::path> files = inputs_of(harness);
  ASSERT_FALSE(files.empty()) << "no committed inputs for the " << harness << " harness";
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                                     std::istreambuf_iterator<char>());
    try {
      run(bytes.data(), bytes.size());
    } catch (const std::exception& e) {
      ADD_FAILURE() << f.string() << ": " << e.what();
    }
  }
  std::error_code ignored;
  fs::remove_all(fuzz::scratch_dir(), ignored);
}

TEST(FuzzReplay, Attention) {
  replay("attention", fuzz::fuzz_attention);
}
TEST(FuzzReplay, Npy) {
  replay("npy", fuzz::fuzz_npy);
}
TEST(FuzzReplay, Safetensors) {
  replay("safetensors", fuzz::fuzz_safetensors);
}

TEST(FuzzReplay, Checkpoint) {
  replay("checkpoint", fuzz::fuzz_checkpoint);
}

TEST(FuzzReplay, Packed) {
  replay("packed", fuzz::fuzz_packed);
}

}  // namespace
}  // namespace attn
