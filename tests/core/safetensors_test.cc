// safetensors reading and writing: round trips (every dtype, metadata, order, views) and hand-made
// hostile files (lying offsets, overlaps, gaps, data past the end, absurd header lengths,
// dtype/shape/bytes disagreements, duplicate names).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "attn/io.h"
#include "attn/tensor.h"
#include "core/io_test_util.h"

namespace attn {
namespace {

using testing_io::expect_error;
using testing_io::read_bytes;
using testing_io::ScratchDir;
using testing_io::write_bytes;

std::string le64(uint64_t n) {
  std::string s(8, '\0');
  for (int b = 0; b < 8; ++b) s[static_cast<size_t>(b)] = static_cast<char>((n >> (8 * b)) & 0xff);
  return s;
}

// A safetensors file by hand: the header text as given, then `data_bytes` bytes of data.
std::string st_file(const std::string& header, size_t data_bytes) {
  return le64(header.size()) + header + std::string(data_bytes, '\x01');
}

Tensor ramp(const Shape& shape, DType dtype, double start = 0.5) {
  Tensor t = Tensor::empty(shape, dtype);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = dtype == DType::boolean ? (i % 3 == 0) : start + static_cast<double>(i);
  return Tensor::from_vector(shape, v, dtype);
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  EXPECT_EQ(std::memcmp(ca.data(), cb.data(), static_cast<size_t>(ca.numel()) * ca.itemsize()), 0);
}

TEST(Safetensors, RoundTripsEveryDtypeInOrderWithMetadata) {
  ScratchDir dir;
  const Tensor big = ramp({4, 6}, DType::f32);
  const TensorList tensors = {
      {"z.weight", ramp({2, 3}, DType::f64)},       {"a.bias", ramp({3}, DType::f32)},
      {"emb", ramp({2, 2, 2}, DType::bf16)},        {"half", ramp({5}, DType::f16)},
      {"flags", ramp({4}, DType::boolean)},         {"ids", ramp({2, 2}, DType::i32, -2)},
      {"ids64", ramp({3}, DType::i64, -1)},         {"scalar", Tensor::full({}, 2.5, DType::f32)},
      {"empty", Tensor::zeros({0, 7}, DType::f32)}, {"transposed", big.transpose(0, 1)},
      {"strided", big.slice(1, 0, 6, 4)},           {"quantized", ramp({4}, DType::i8, -2)},
  };
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "made by a test"}};
  write_safetensors(dir.file("m.safetensors"), tensors, meta);

  std::map<std::string, std::string> got_meta;
  const TensorList back = read_safetensors(dir.file("m.safetensors"), &got_meta);
  EXPECT_EQ(got_meta, meta);
  ASSERT_EQ(back.size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(tensors[i].first);
    EXPECT_EQ(back[i].first, tensors[i].first);  // the state dict's order, not alphabetical
    expect_same(back[i].second, tensors[i].second);
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"m.safetensors"});

  // The header is JSON padded with spaces to a multiple of 8; BF16 stays BF16.
  const std::string bytes = read_bytes(dir.file("m.safetensors"));
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b)
    n |= uint64_t{static_cast<uint8_t>(bytes[static_cast<size_t>(b)])} << (8 * b);
  EXPECT_EQ(n % 8, 0u);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  EXPECT_EQ(header["emb"]["dtype"], "BF16");
  EXPECT_EQ(header["a.bias"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(header["__metadata__"]["format"], "pt");
}

TEST(Safetensors, ReadsAFileWrittenByHand) {
  ScratchDir dir;
  // Two f32 tensors listed out of data order, metadata in the middle.
  const std::string header =
      R"({"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"__metadata__":{"k":"v"},)"
      R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string data(12, '\0');
  const float vals[3] = {1.0f, 2.0f, -3.0f};
  std::memcpy(data.data(), vals, 12);
  write_bytes(dir.file("h.safetensors"), le64(header.size()) + header + data);
  const TensorList t = read_safetensors(dir.file("h.safetensors"));
  ASSERT_EQ(t.size(), 2u);
  EXPECT_EQ(t[0].first, "b");
  EXPECT_EQ(t[0].second.to_vector(), std::vector<double>{-3.0});
  EXPECT_EQ(t[1].first, "a");
  EXPECT_EQ(t[1].second.to_vector(), (std::vector<double>{1.0, 2.0}));
}

TEST(Safetensors, RefusesHostileFiles) {
  struct Bad {
    const char* name;
    std::string bytes;
    const char* says;
  };
  const auto one = [](const std::string& entry, size_t data) {
    return st_file(R"({"t":)" + entry + "}", data);
  };
  const std::string valid = one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8]})", 8);
  const std::vector<Bad> cases = {
      {"empty file", "", "truncated"},
      {"header length past the end", le64(1000) + "{}", "header length 1000"},
      {"absurd header length", le64(~uint64_t{0}) + "{}", "header length"},
      {"truncated data", valid.substr(0, valid.size() - 1), "do not lie within"},
      {"trailing data", valid + "abc", "3 data bytes after the last tensor"},
      {"not JSON", st_file("{nope", 0), "malformed JSON"},
      {"not an object", st_file("[1, 2]", 0), "not a JSON object"},
      {"entry not an object", one("[1]", 0), "not an object"},
      {"missing data_offsets", one(R"({"dtype":"F32","shape":[2]})", 8), "must hold"},
      {"unexpected key", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})", 8),
       "unexpected key"},
      {"unsupported dtype", one(R"({"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]})", 2),
       "unsupported dtype 'F8_E4M3'"},
      {"dtype not a string", one(R"({"dtype":4,"shape":[2],"data_offsets":[0,8]})", 8),
       "'dtype' is not a string"},
      {"negative dim", one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})", 8),
       "non-negative"},
      {"fractional dim", one(R"({"dtype":"F32","shape":[2.5],"data_offsets":[0,8]})", 8),
       "non-negative"},
      {"shape not an array", one(R"({"dtype":"F32","shape":2,"data_offsets":[0,8]})", 8),
       "not an array"},
      {"nine dims", one(R"({"dtype":"F32","shape":[1,1,1,1,1,1,1,1,2],"data_offsets":[0,8]})", 8),
       "more than 8"},
      {"overflowing shape",
       one(R"({"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]})", 8),
       "overflows"},
      {"absurd dim",
       one(R"({"dtype":"F64","shape":[1152921504606846976],"data_offsets":[0,8]})", 8), "needs"},
      {"dim beyond uint64", one(R"({"dtype":"F32","shape":[1e30],"data_offsets":[0,8]})", 8),
       "non-negative"},
      {"bytes disagree with shape", one(R"({"dtype":"F32","shape":[3],"data_offsets":[0,8]})", 8),
       "needs"},
      {"bytes disagree with dtype", one(R"({"dtype":"F64","shape":[2],"data_offsets":[0,8]})", 8),
       "needs"},
      {"offsets reversed", one(R"({"dtype":"F32","shape":[0],"data_offsets":[8,0]})", 8),
       "do not lie within"},
      {"offsets past the end", one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,16]})", 8),
       "do not lie within"},
      {"offsets negative", one(R"({"dtype":"F32","shape":[2],"data_offsets":[-8,0]})", 8),
       "non-negative integers"},
      {"offsets not a pair", one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8,16]})", 8),
       "non-negative integers"},
      {"gap", one(R"({"dtype":"F32","shape":[2],"data_offsets":[4,12]})", 12), "a gap of 4 bytes"},
      {"overlap",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
               12),
       "overlap"},
      {"same range twice",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("b":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})",
               8),
       "overlap"},
      {"duplicate names",
       st_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
               R"("a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
               16),
       "duplicate name 'a'"},
      {"duplicate field",
       one(R"({"dtype":"F32","dtype":"F64","shape":[2],"data_offsets":[0,8]})", 8),
       "duplicate name 'dtype'"},
      {"metadata not strings", st_file(R"({"__metadata__":{"k":1}})", 0), "metadata 'k'"},
      {"metadata not an object", st_file(R"({"__metadata__":"x"})", 0), "__metadata__"},
  };
  ScratchDir dir;
  for (const Bad& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    expect_error([&] { read_safetensors(path); },
                 {"attn::read_safetensors: '" + path + "'", c.says});
  }
  // Every prefix of a valid file is refused.
  for (size_t n = 0; n < valid.size(); ++n) {
    write_bytes(dir.file("prefix.safetensors"), valid.substr(0, n));
    EXPECT_THROW(read_safetensors(dir.file("prefix.safetensors")), Error) << n;
  }
  expect_error([&] { read_safetensors(dir.file("missing.safetensors")); },
               {"cannot open", "missing.safetensors"});
}

TEST(Safetensors, WritingRefusesBadListsAndIsAtomic) {
  ScratchDir dir;
  const std::string path = dir.file("w.safetensors");
  write_safetensors(path, {{"x", ramp({2}, DType::f32)}});
  const std::string before = read_bytes(path);
  expect_error(
      [&] {
        write_safetensors(path, {{"x", ramp({2}, DType::f32)}, {"x", ramp({1}, DType::f32)}});
      },
      {"attn::write_safetensors", "duplicate tensor name 'x'"});
  expect_error(
      [&] {
        write_safetensors(path, {{"__metadata__", ramp({2}, DType::f32)}});
      },
      {"__metadata__"});
  expect_error([&] { write_safetensors(path, {{"u", Tensor()}}); }, {"tensor 'u' is undefined"});
  std::filesystem::create_directory(dir.file("folder.safetensors"));
  expect_error(
      [&] {
        write_safetensors(dir.file("folder.safetensors"), {{"x", ramp({2}, DType::f32)}});
      },
      {"attn::write_safetensors", "rename"});
  EXPECT_EQ(read_bytes(path), before);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"folder.safetensors", "w.safetensors"}));
  // An empty list is a valid file.
  write_safetensors(dir.file("e.safetensors"), {});
  EXPECT_TRUE(read_safetensors(dir.file("e.safetensors")).empty());
}

}  // namespace
}  // namespace attn
