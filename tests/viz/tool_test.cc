// `attn viz` end to end: .npy in, PNG/SVG out; bad input gives one line on stderr, a non-zero exit
// and no file.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "attn/io.h"
#include "attn/viz.h"
#include "viz/viz_test_util.h"

namespace attn::viz {
namespace {

namespace fs = std::filesystem;
using testing::DecodedPng;

struct ToolRun {
  int status = -1;
  std::string err;
};

class VizTool : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("attn_viz_tool_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  ToolRun viz(const std::string& args) const {
    const std::string err = path("stderr.txt");
    const std::string cmd =
        std::string(ATTN_BINARY_DIR) + "/attn viz " + args + " > /dev/null 2> " + err;
    ToolRun r;
    const int raw = std::system(cmd.c_str());
    r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    std::ifstream in(err);
    r.err.assign(std::istreambuf_iterator<char>(in), {});
    return r;
  }

  static std::string read(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  // Files other than the inputs and stderr.txt: what a failed run must not leave behind.
  int outputs() const {
    int n = 0;
    for (const auto& e : fs::directory_iterator(dir_))
      n += e.path().extension() != ".npy" && e.path().extension() != ".txt";
    return n;
  }

  void expect_refused(const std::string& args, const std::string& mentions) const {
    const ToolRun r = viz(args);
    EXPECT_NE(r.status, 0) << args;
    EXPECT_EQ(r.err.rfind("attn: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(mentions), std::string::npos) << r.err;
    EXPECT_EQ(outputs(), 0) << args;
  }

  fs::path dir_;
};

TEST_F(VizTool, DrawsOneMapAGridOrOneHead) {
  Tensor w = Tensor::zeros({2, 3, 4, 4}, DType::f32);  // [B, H, Lq, Lk]
  for (int64_t h = 0; h < 3; ++h)
    for (int64_t i = 0; i < 4; ++i) w.set({1, h, i, 3 - i}, 1.0);
  write_npy(path("w4.npy"), w);
  write_npy(path("w2.npy"), w.select(0, 1).select(0, 0));
  std::ofstream(path("keys.txt")) << "a b\nc\nd\ne\n";

  ToolRun r = viz("--weights " + path("w2.npy") +
                  " --x-labels p,q,r,s --y-labels s,r,q,p --title T --out " + path("one.png"));
  ASSERT_EQ(r.status, 0) << r.err;
  DecodedPng one(read(path("one.png")));
  ASSERT_TRUE(one.ok());
  EXPECT_GT(one.count(colormap(1)), 4 * 100);

  r = viz("--weights " + path("w4.npy") + " --batch 1 --x-labels-file " + path("keys.txt") +
          " --out " + path("grid.svg"));
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string svg = read(path("grid.svg"));
  for (const char* s : {"head 0", "head 1", "head 2", ">a b<", ">e<"})
    EXPECT_NE(svg.find(s), std::string::npos) << s;

  r = viz("--weights " + path("w4.npy") + " --batch 1 --head 2 --out " + path("head.png"));
  ASSERT_EQ(r.status, 0) << r.err;
  DecodedPng head(read(path("head.png")));
  ASSERT_TRUE(head.ok());
  // One panel is narrower than the three-panel grid drawn the same way.
  r = viz("--weights " + path("w4.npy") + " --batch 1 --out " + path("grid.png"));
  ASSERT_EQ(r.status, 0) << r.err;
  DecodedPng grid(read(path("grid.png")));
  ASSERT_TRUE(grid.ok());
  EXPECT_LT(head.width(), grid.width());
  EXPECT_GT(grid.count(colormap(1)),
            3 * 4 * 100);  // batch 1: four hot cells in each of three heads
  // More batch dims ([2, 1, 3, 4, 4], as attn sdpa writes them) flatten into one batch index.
  write_npy(path("w5.npy"), w.unsqueeze(1));
  r = viz("--weights " + path("w5.npy") + " --batch 1 --out " + path("grid5.png"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(read(path("grid5.png")), read(path("grid.png")));
  // Batch 0 is all zeros: no hot cell anywhere but the colour bar.
  r = viz("--weights " + path("w4.npy") + " --head 0 --out " + path("zero.png"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_LT(DecodedPng(read(path("zero.png"))).count(colormap(1)), 100);
}

TEST_F(VizTool, BadInputIsOneLineAndNoFile) {
  write_npy(path("w1.npy"), Tensor::zeros({5}, DType::f32));
  write_npy(path("w3.npy"), Tensor::zeros({2, 3, 4}, DType::f32));
  write_npy(path("w2.npy"), Tensor::zeros({3, 4}, DType::f32));
  std::ofstream(path("bad.npy")) << "not a numpy file";
  expect_refused("--weights " + path("w1.npy") + " --out " + path("o.png"), "[5]");
  expect_refused("--weights " + path("w3.npy") + " --out " + path("o.jpg"), ".png or .svg");
  expect_refused("--weights " + path("w3.npy") + " --head 2 --out " + path("o.png"), "--head 2");
  expect_refused("--weights " + path("w2.npy") + " --head 0 --out " + path("o.png"), "--head");
  expect_refused("--weights " + path("w3.npy") + " --x-labels a,b --out " + path("o.png"),
                 "x_labels has 2");
  expect_refused("--weights " + path("w2.npy") + " --vmin 1 --vmax 0 --out " + path("o.svg"),
                 "vmin");
  expect_refused("--weights " + path("bad.npy") + " --out " + path("o.png"), "bad.npy");
  expect_refused("--weights " + path("missing.npy") + " --out " + path("o.png"), "missing.npy");
  expect_refused("--weights " + path("w2.npy") + " --y-labels-file " + path("nope.txt") +
                     " --out " + path("o.png"),
                 "nope.txt");
}

}  // namespace
}  // namespace attn::viz
