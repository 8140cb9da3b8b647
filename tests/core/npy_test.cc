// .npy reading and writing: round trips of every dtype and of non-contiguous views, hand-made files
// in the layouts NumPy writes (format 2.0 / 3.0, big-endian, Fortran order), and every class of
// malformed file.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
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

// A .npy file by hand: magic, version, little-endian header length, the dict padded to 64 bytes,
// payload.
std::string npy_file(const std::string& dict, const std::string& payload, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  const size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header.push_back('\n');
  std::string out = "\x93NUMPY";
  out.push_back(static_cast<char>(major));
  out.push_back('\0');
  const size_t n = header.size();
  for (size_t b = 0; b < (major == 1 ? 2u : 4u); ++b)
    out.push_back(static_cast<char>((n >> (8 * b)) & 0xff));
  return out + header + payload;
}

template <class T>
std::string raw_bytes(const std::vector<T>& v, bool big_endian = false) {
  std::string s(v.size() * sizeof(T), '\0');
  std::memcpy(s.data(), v.data(), s.size());
  if (big_endian) {
    for (size_t e = 0; e < v.size(); ++e)
      std::reverse(s.begin() + e * sizeof(T), s.begin() + (e + 1) * sizeof(T));
  }
  return s;
}

// Byte-for-byte equality of two tensors' values (NaN payloads and -0.0 included).
void expect_same_bytes(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  EXPECT_EQ(std::memcmp(ca.data(), cb.data(), static_cast<size_t>(ca.numel()) * ca.itemsize()), 0);
}

Tensor random_tensor(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 3.0);
  Tensor t = Tensor::empty(shape, dtype);
  std::vector<double> vals(static_cast<size_t>(t.numel()));
  for (auto& x : vals) {
    if (dtype == DType::boolean)
      x = rng() & 1;
    else if (dtype == DType::i32)
      x = static_cast<int32_t>(rng());
    else if (dtype == DType::i64)
      x = static_cast<double>(static_cast<int64_t>(rng()) * 1000003);
    else if (dtype == DType::i8)
      x = static_cast<int8_t>(rng());
    else
      x = normal(rng);
  }
  if (is_floating(dtype) && vals.size() >= 4) {
    vals[0] = std::numeric_limits<double>::quiet_NaN();
    vals[1] = std::numeric_limits<double>::infinity();
    vals[2] = -std::numeric_limits<double>::infinity();
    vals[3] = -0.0;
  }
  return Tensor::from_vector(shape, vals, dtype);
}

TEST(Npy, RoundTripsEveryDtypeBitExactly) {
  ScratchDir dir;
  for (DType t :
       {DType::f64, DType::f32, DType::f16, DType::boolean, DType::i32, DType::i64, DType::i8}) {
    for (const Shape& shape :
         {Shape{}, Shape{5}, Shape{2, 3, 7}, Shape{0, 4}, Shape{1, 2, 1, 2, 1, 2, 1, 2}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " " + shape_to_string(shape));
      const Tensor x = random_tensor(shape, t, 7);
      const std::string path = dir.file("x.npy");
      write_npy(path, x);
      expect_same_bytes(read_npy(path), x);
    }
  }
  EXPECT_EQ(dir.entries(), std::vector<std::string>{"x.npy"});  // no temporaries left behind
}

TEST(Npy, WritesTheHeaderNumPyWrites) {
  ScratchDir dir;
  write_npy(dir.file("a.npy"), Tensor::zeros({2, 3}, DType::f32));
  const std::string bytes = read_bytes(dir.file("a.npy"));
  const std::string dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  EXPECT_EQ(bytes, npy_file(dict, std::string(24, '\0')));
  EXPECT_EQ(bytes.size(), 128u + 24u);  // data 64-byte aligned, as np.save does

  write_npy(dir.file("b.npy"), Tensor::zeros({4}, DType::boolean));
  EXPECT_EQ(
      read_bytes(dir.file("b.npy")),
      npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", std::string(4, '\0')));
  write_npy(dir.file("c.npy"), Tensor::full({}, 1.5, DType::f64));
  EXPECT_EQ(read_bytes(dir.file("c.npy")),
            npy_file("{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
                     raw_bytes(std::vector<double>{1.5})));
}

TEST(Npy, Bf16IsWrittenAsF32) {
  ScratchDir dir;
  const Tensor x = random_tensor({3, 5}, DType::bf16, 3);
  write_npy(dir.file("x.npy"), x);
  const Tensor y = read_npy(dir.file("x.npy"));
  EXPECT_EQ(y.dtype(), DType::f32);
  expect_same_bytes(y, x.to(DType::f32));
}

TEST(Npy, NonContiguousTensorsAreWrittenInLogicalOrder) {
  ScratchDir dir;
  std::vector<double> vals(120);
  for (size_t i = 0; i < vals.size(); ++i) vals[i] = 1.25 * static_cast<double>(i) - 7;
  const Tensor base = Tensor::from_vector({4, 6, 5}, vals, DType::f64);
  const std::vector<Tensor> views = {
      base.transpose(0, 2),                    // permuted strides
      base.slice(1, 1, 6, 2).slice(2, 1, 5),   // stepped slice, offset start
      base.select(1, 3),                       // dropped dim
      base.slice(0, 0, 1).expand({3, 6, 5}),   // stride 0
      base.as_strided({3, 4}, {1, 2}, 5),      // overlapping windows
      base.permute({1, 2, 0}).slice(0, 5, 6),  // view of a view
  };
  for (size_t i = 0; i < views.size(); ++i) {
    SCOPED_TRACE(i);
    write_npy(dir.file("v.npy"), views[i]);
    const Tensor y = read_npy(dir.file("v.npy"));
    EXPECT_EQ(y.shape(), views[i].shape());
    EXPECT_TRUE(y.is_contiguous());
    EXPECT_EQ(y.to_vector(), views[i].to_vector());
  }
  const Tensor h = random_tensor({5, 4}, DType::f16, 5).transpose(0, 1);
  write_npy(dir.file("h.npy"), h);
  expect_same_bytes(read_npy(dir.file("h.npy")), h);
}

TEST(Npy, ReadsFormatVersions2And3) {
  ScratchDir dir;
  const std::vector<float> vals = {1.5f, -2.0f, 3.25f};
  for (int major : {2, 3}) {
    write_bytes(dir.file("v.npy"),
                npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }",
                         raw_bytes(vals), major));
    const Tensor t = read_npy(dir.file("v.npy"));
    EXPECT_EQ(t.dtype(), DType::f32);
    EXPECT_EQ(t.to_vector(), (std::vector<double>{1.5, -2.0, 3.25}));
  }
  // Double quotes, no trailing comma, other key order, Python 2 long dims: still a valid dict
  // literal.
  write_bytes(dir.file("q.npy"),
              npy_file("{\"shape\": (3L,), \"fortran_order\": False, \"descr\": \"<f4\"}",
                       raw_bytes(vals)));
  EXPECT_EQ(read_npy(dir.file("q.npy")).to_vector(), (std::vector<double>{1.5, -2.0, 3.25}));
}

TEST(Npy, ReadsBigEndianFilesOfEveryDtype) {
  ScratchDir dir;
  auto check = [&](const std::string& descr, const std::string& payload, DType want,
                   std::vector<double> expect) {
    SCOPED_TRACE(descr);
    write_bytes(
        dir.file("be.npy"),
        npy_file("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (3,), }", payload));
    const Tensor t = read_npy(dir.file("be.npy"));
    EXPECT_EQ(t.dtype(), want);
    EXPECT_EQ(t.to_vector(), expect);
  };
  check(">f8", raw_bytes(std::vector<double>{1.0 / 3, -2.5, 1e300}, true), DType::f64,
        {1.0 / 3, -2.5, 1e300});
  check(">f4", raw_bytes(std::vector<float>{0.1f, -7.0f, 3e38f}, true), DType::f32,
        {0.1f, -7.0f, 3e38f});
  check(">f2", raw_bytes(std::vector<uint16_t>{0x3c00, 0xc000, 0x7bff}, true), DType::f16,
        {1.0, -2.0, 65504.0});
  check(">i4", raw_bytes(std::vector<int32_t>{1, -2, 0x12345678}, true), DType::i32,
        {1, -2, 0x12345678});
  check(">i8", raw_bytes(std::vector<int64_t>{1, -2, int64_t{1} << 40}, true), DType::i64,
        {1, -2, 0x10000000000});
  check("|b1", std::string("\x01\x00\x01", 3), DType::boolean, {1, 0, 1});
  check("=f4", raw_bytes(std::vector<float>{1, 2, 3}), DType::f32, {1, 2, 3});
}

TEST(Npy, ReadsFortranOrderIntoCOrder) {
  ScratchDir dir;
  // A = [[0, 1, 2], [3, 4, 5]] stored column-major: 0 3 1 4 2 5.
  write_bytes(dir.file("f.npy"),
              npy_file("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
                       raw_bytes(std::vector<float>{0, 3, 1, 4, 2, 5})));
  Tensor t = read_npy(dir.file("f.npy"));
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.to_vector(), (std::vector<double>{0, 1, 2, 3, 4, 5}));

  // 3-D, big-endian and Fortran at once: element (i, j, k) = 100 i + 10 j + k lives at i + 2 j + 6
  // k.
  std::vector<int32_t> col(2 * 3 * 4);
  std::vector<double> expect;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) {
        col[static_cast<size_t>(i + 2 * j + 6 * k)] = 100 * i + 10 * j + k;
        expect.push_back(100 * i + 10 * j + k);
      }
  write_bytes(dir.file("f3.npy"),
              npy_file("{'descr': '>i4', 'fortran_order': True, 'shape': (2, 3, 4), }",
                       raw_bytes(col, true)));
  t = read_npy(dir.file("f3.npy"));
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.to_vector(), expect);
}

TEST(Npy, BoolBytesAreNormalised) {
  ScratchDir dir;
  write_bytes(dir.file("b.npy"),
              npy_file("{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }",
                       std::string("\x00\x07\xff", 3)));
  const Tensor t = read_npy(dir.file("b.npy"));
  EXPECT_EQ(t.data_as<uint8_t>()[1], 1);
  EXPECT_EQ(t.data_as<uint8_t>()[2], 1);
}

TEST(Npy, RefusesUnsupportedDtypesNamingFileAndDtype) {
  ScratchDir dir;
  const std::string path = dir.file("u.npy");
  for (const std::string descr :
       {"<c16", "<u2", "|u1", "<f16", "<U5", "|O", "|b2", "|f4", "<M8[ns]", "f4"}) {
    SCOPED_TRACE(descr);
    write_bytes(path,
                npy_file("{'descr': '" + descr + "', 'fortran_order': False, 'shape': (1,), }",
                         std::string(16, '\0')));
    expect_error([&] { read_npy(path); },
                 {"attn::read_npy", path, "unsupported dtype", "'" + descr + "'"});
  }
  write_bytes(
      path,
      npy_file("{'descr': [('a', '<f4'), ('b', '<i4')], 'fortran_order': False, 'shape': (1,), }",
               std::string(8, '\0')));
  expect_error([&] { read_npy(path); }, {"attn::read_npy", path, "unsupported dtype"});
}

struct BadFile {
  const char* name;
  std::string bytes;
  const char* says;  // a piece of the expected message
};

TEST(Npy, RefusesEveryClassOfMalformedFile) {
  const std::string f4x3 = raw_bytes(std::vector<float>{1, 2, 3});
  const std::string ok_dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
  const std::string good = npy_file(ok_dict, f4x3);
  auto with_dict = [&](const std::string& dict, const std::string& payload = std::string(
                                                    12, '\0')) { return npy_file(dict, payload); };
  std::string wrong_magic = good;
  wrong_magic[1] = 'M';
  std::string long_header = good;  // header length field claims 0xffff bytes
  long_header[8] = '\xff';
  long_header[9] = '\xff';
  std::string long_header_v2 = npy_file(ok_dict, f4x3, 2);
  for (int b = 8; b < 12; ++b) long_header_v2[static_cast<size_t>(b)] = '\xff';

  const std::vector<BadFile> cases = {
      {"empty file", "", "not a .npy file"},
      {"short file", "\x93NUM", "not a .npy file"},
      {"wrong magic", wrong_magic, "wrong magic"},
      {"version 4", npy_file(ok_dict, f4x3, 4), "version 4.0"},
      {"truncated header", good.substr(0, 40), "truncated"},
      {"header length past the end (1.0)", long_header, "header length"},
      {"header length past the end (2.0)", long_header_v2, "header length"},
      {"payload short by one byte", good.substr(0, good.size() - 1), "truncated"},
      {"no payload", good.substr(0, good.size() - 12), "truncated"},
      {"trailing bytes", good + "xx", "2 bytes after the data"},
      {"not a dict", with_dict("['descr', '<f4']"), "malformed header"},
      {"unclosed dict", with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), "),
       "malformed header"},
      {"missing shape", with_dict("{'descr': '<f4', 'fortran_order': False, }"), "must hold"},
      {"missing descr", with_dict("{'fortran_order': False, 'shape': (3,), }"), "must hold"},
      {"unknown key", with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}"),
       "unexpected key 'x'"},
      {"duplicate key",
       with_dict("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,)}"),
       "duplicate key"},
      {"bad bool", with_dict("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,), }"),
       "True or False"},
      {"unterminated string", with_dict("{'descr: '<f4', 'fortran_order': False, 'shape': (3,), }"),
       "malformed"},
      {"garbage after the dict", with_dict(ok_dict + " x"), "unexpected text"},
      {"shape not a tuple", with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': [3], }"),
       "expected '('"},
      {"shape with a float",
       with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,), }"), "malformed"},
      {"shape unclosed", with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (3, }"),
       "malformed"},
      {"negative dim", with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,), }"),
       "negative"},
      {"dim beyond int64",
       with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }"),
       "does not fit"},
      {"element count overflows",
       with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }"),
       "overflows"},
      {"absurd dim, small file",
       with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776,), }"),
       "truncated"},
      {"byte count overflows",
       with_dict("{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }"),
       "truncated"},
      {"nine dims",
       with_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,1,1,1,1,1,1,1,3), }"),
       "more than 8 dims"},
      {"escape in a string",
       with_dict("{'descr': '<f\\4', 'fortran_order': False, 'shape': (3,), }"), "escape"},
  };
  ScratchDir dir;
  for (const BadFile& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = dir.file("bad.npy");
    write_bytes(path, c.bytes);
    expect_error([&] { read_npy(path); }, {"attn::read_npy: '" + path + "'", c.says});
  }
  // Every prefix of a valid file is refused (never a crash or an out-of-bounds read).
  for (size_t n = 0; n < good.size(); ++n) {
    write_bytes(dir.file("prefix.npy"), good.substr(0, n));
    EXPECT_THROW(read_npy(dir.file("prefix.npy")), Error) << n;
  }
  // Every single-byte corruption of the header either reads as some array or is refused with
  // attn::Error.
  for (size_t pos = 0; pos < good.size() - 12; ++pos) {
    for (int v : {0x00, 0x27, 0x2c, 0x2d, 0x39, 0xff}) {
      std::string b = good;
      b[pos] = static_cast<char>(v);
      write_bytes(dir.file("flip.npy"), b);
      try {
        (void)read_npy(dir.file("flip.npy"));
      } catch (const Error&) {
      }
    }
  }
}

TEST(Npy, MissingFilesAndFoldersAreErrors) {
  ScratchDir dir;
  expect_error([&] { read_npy(dir.file("nope.npy")); },
               {"attn::read_npy", "nope.npy", "cannot open"});
  expect_error([&] { read_npy(dir.path().string()); }, {"attn::read_npy", "not a regular file"});
}

TEST(Npy, WritingIsAtomic) {
  ScratchDir dir;
  const std::string path = dir.file("out.npy");
  const Tensor a = random_tensor({3}, DType::f32, 1);
  write_npy(path, a);
  const std::string before = read_bytes(path);

  // A failed write leaves the old file untouched and no temporary behind.
  expect_error([&] { write_npy(path, Tensor()); }, {"attn::write_npy", "undefined"});
  EXPECT_EQ(read_bytes(path), before);
  // Rename over a folder fails after the data was written: the temporary must be removed.
  std::filesystem::create_directory(dir.file("folder.npy"));
  expect_error([&] { write_npy(dir.file("folder.npy"), a); }, {"attn::write_npy", "folder.npy"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"folder.npy", "out.npy"}));
  // A folder that does not exist.
  expect_error([&] { write_npy(dir.file("no/such/dir/x.npy"), a); },
               {"attn::write_npy", "no/such/dir"});
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"folder.npy", "out.npy"}));

  // A successful write replaces the file whole.
  const Tensor b = random_tensor({2, 2}, DType::f64, 2);
  write_npy(path, b);
  expect_same_bytes(read_npy(path), b);
  EXPECT_EQ(dir.entries(), (std::vector<std::string>{"folder.npy", "out.npy"}));
}

}  // namespace
}  // namespace attn
