// NumPy .npy files (format versions 1.0, 2.0, 3.0):
//   "\x93NUMPY" major minor | header length (u16 LE for 1.x, u32 LE for 2.x / 3.x) | header | raw
//   data
// The header is a Python dict literal {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// padded with spaces and a newline. Every number in a file is checked before it is trusted: the
// header must fit in the file, the shape's element count must not overflow, and the data must be
// exactly as long as the shape says, so that a hostile file costs at most its own size in memory.
#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "attn/io.h"
#include "core/file_io.h"

namespace attn {

namespace {

static_assert(std::endian::native == std::endian::little, "attn assumes a little-endian host");

constexpr const char* kRead = "attn::read_npy";
constexpr const char* kWrite = "attn::write_npy";
constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};

// A recursive-descent parser for the one dict literal a .npy header holds. Throws std::string on
// failure (the caller adds the file name).
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view text) : s_(text) {}

  NpyHeader parse() {
    NpyHeader h;
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    expect('{');
    while (true) {
      skip_ws();
      if (eat('}')) break;
      const std::string key = parse_string("a key");
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (have_descr) throw std::string("duplicate key 'descr'");
        if (peek() != '\'' && peek() != '"') {
          throw std::string(
              "unsupported dtype: structured or non-string 'descr' values are not supported");
        }
        h.descr = parse_string("the 'descr' value");
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_order) throw std::string("duplicate key 'fortran_order'");
        h.fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        if (have_shape) throw std::string("duplicate key 'shape'");
        h.shape = parse_shape();
        have_shape = true;
      } else {
        throw fmt::format("unexpected key '{}' in the header", key);
      }
      skip_ws();
      if (eat(',')) continue;
      expect('}');
      break;
    }
    skip_ws();
    if (i_ != s_.size()) throw fmt::format("unexpected text after the header dict at byte {}", i_);
    if (!have_descr || !have_order || !have_shape) {
      throw std::string("the header dict must hold 'descr', 'fortran_order' and 'shape'");
    }
    return h;
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool eat(char c) {
    if (i_ >= s_.size() || s_[i_] != c) return false;
    ++i_;
    return true;
  }
  void expect(char c) {
    if (!eat(c)) {
      throw i_ < s_.size()
          ? fmt::format("malformed header: expected '{}' at byte {}, found '{}'", c, i_, s_[i_])
          : fmt::format("malformed header: expected '{}' at byte {}, found the end", c, i_);
    }
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  std::string parse_string(const char* what) {
    const char q = peek();
    if (q != '\'' && q != '"')
      throw fmt::format("malformed header: expected {} (a string) at byte {}", what, i_);
    ++i_;
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\') throw fmt::format("malformed header: escape sequence in {}", what);
      ++i_;
    }
    if (i_ >= s_.size()) throw fmt::format("malformed header: unterminated string in {}", what);
    std::string out(s_.substr(start, i_ - start));
    ++i_;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    throw fmt::format("malformed header: 'fortran_order' must be True or False (byte {})", i_);
  }
  int64_t parse_dim() {
    if (peek() == '-') throw std::string("the shape has a negative dimension");
    if (peek() < '0' || peek() > '9')
      throw fmt::format("malformed header: expected a dimension at byte {}", i_);
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = peek() - '0';
      if (v > (std::numeric_limits<int64_t>::max() - digit) / 10) {
        throw std::string("a dimension of the shape does not fit in int64");
      }
      v = v * 10 + digit;
      ++i_;
    }
    eat('L');  // Python 2 long literals in old files
    return v;
  }
  Shape parse_shape() {
    expect('(');
    Shape shape;
    skip_ws();
    while (!eat(')')) {
      const int64_t dim = parse_dim();
      if (shape.size() == shape.capacity()) {
        throw fmt::format("the shape has more than {} dims", kMaxDims);
      }
      shape.push_back(dim);
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      expect(')');
      break;
    }
    return shape;
  }

  std::string_view s_;
  size_t i_ = 0;
};

struct DiskType {
  DType dtype;
  bool big_endian;
};

// '<f8' and friends; '|' (not applicable) only for one-byte types, '=' is native (little) endian.
std::optional<DiskType> parse_descr(const std::string& d) {
  if (d.size() != 3) return std::nullopt;
  const char order = d[0];
  const std::string kind = d.substr(1);
  std::optional<DType> t;
  if (kind == "f8") t = DType::f64;
  if (kind == "f4") t = DType::f32;
  if (kind == "f2") t = DType::f16;
  if (kind == "b1") t = DType::boolean;
  if (kind == "i4") t = DType::i32;
  if (kind == "i8") t = DType::i64;
  if (kind == "i1") t = DType::i8;
  if (!t) return std::nullopt;
  if (*t == DType::boolean || *t == DType::i8) {  // one byte: no order
    if (order != '|' && order != '<' && order != '>' && order != '=') return std::nullopt;
    return DiskType{*t, false};
  }
  if (order == '<' || order == '=') return DiskType{*t, false};
  if (order == '>') return DiskType{*t, true};
  return std::nullopt;
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::f64:
      return "<f8";
    case DType::f32:
      return "<f4";
    case DType::bf16:
      return "<f4";  // NumPy has no bf16: bf16 travels as f32
    case DType::f16:
      return "<f2";
    case DType::boolean:
      return "|b1";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    case DType::i8:
      return "|i1";
  }
  return "?";
}

void byte_swap(char* p, int64_t n, size_t item) {
  for (int64_t e = 0; e < n; ++e, p += item) {
    for (size_t a = 0, b = item - 1; a < b; ++a, --b) std::swap(p[a], p[b]);
  }
}

}  // namespace

Tensor read_npy(const std::string& path) {
  io_detail::FileReader file(path, kRead);
  char magic[6];
  if (file.size() < 10) file.fail(fmt::format("not a .npy file: only {} bytes", file.size()));
  file.read(magic, 6, "the magic string");
  if (std::memcmp(magic, kMagic, 6) != 0) file.fail("not a .npy file: wrong magic string");
  uint8_t version[2];
  file.read(version, 2, "the format version");
  uint64_t header_len = 0;
  if (version[0] == 1) {
    uint8_t b[2];
    file.read(b, 2, "the header length");
    header_len = b[0] | (uint64_t{b[1]} << 8);
  } else if (version[0] == 2 || version[0] == 3) {
    uint8_t b[4];
    file.read(b, 4, "the header length");
    header_len = b[0] | (uint64_t{b[1]} << 8) | (uint64_t{b[2]} << 16) | (uint64_t{b[3]} << 24);
  } else {
    file.fail(fmt::format("unsupported .npy format version {}.{} (attn reads 1.0, 2.0 and 3.0)",
                          version[0], version[1]));
  }
  if (header_len > file.remaining()) {
    file.fail(
        fmt::format("truncated: the header length {} runs past the end of the file ({} bytes left)",
                    header_len, file.remaining()));
  }
  std::string text(static_cast<size_t>(header_len), '\0');
  file.read(text.data(), header_len, "the header");

  NpyHeader h;
  try {
    h = HeaderParser(text).parse();
  } catch (const std::string& msg) {
    file.fail(msg);
  }
  const std::optional<DiskType> disk = parse_descr(h.descr);
  if (!disk) {
    file.fail(fmt::format(
        "unsupported dtype '{}' (attn reads f64 '<f8', f32 '<f4', f16 '<f2', bool '|b1', "
        "i32 '<i4', i64 '<i8', little- or big-endian)",
        h.descr));
  }
  const size_t item = dtype_size(disk->dtype);
  int64_t n = 0;
  try {
    n = checked_numel(h.shape, kRead);
  } catch (const Error&) {
    file.fail(fmt::format("the element count of shape {} overflows", shape_to_string(h.shape)));
  }
  if (static_cast<uint64_t>(n) > file.remaining() / item) {
    file.fail(fmt::format("truncated: shape {} of {} needs {} x {} data bytes, the file has {}",
                          shape_to_string(h.shape), dtype_name(disk->dtype), n, item,
                          file.remaining()));
  }
  const uint64_t bytes = static_cast<uint64_t>(n) * item;
  if (file.remaining() != bytes) {
    file.fail(fmt::format("{} bytes after the data of shape {} ({} bytes): not a single array",
                          file.remaining() - bytes, shape_to_string(h.shape), bytes));
  }

  // Fortran order stores the reversed-shape array in C order; read it so, then transpose into C
  // order.
  Shape disk_shape = h.shape;
  if (h.fortran_order) disk_shape.assign(h.shape.rbegin(), h.shape.rend());
  Tensor t = Tensor::empty(disk_shape, disk->dtype);
  file.read(t.data(), bytes, "the data");
  if (disk->big_endian && item > 1) byte_swap(static_cast<char*>(t.data()), n, item);
  if (disk->dtype == DType::boolean) {
    auto* b = t.data_as<uint8_t>();
    for (int64_t e = 0; e < n; ++e) b[e] = b[e] != 0;
  }
  if (h.fortran_order && t.dim() > 1) {
    std::vector<int> order(static_cast<size_t>(t.dim()));
    for (int d = 0; d < t.dim(); ++d) order[static_cast<size_t>(d)] = t.dim() - 1 - d;
    t = t.permute(order).contiguous();
  }
  return t;
}

void write_npy(const std::string& path, const Tensor& tensor) {
  if (!tensor.defined())
    throw Error(fmt::format("{}: '{}': the tensor is undefined", kWrite, path));
  // bf16 goes to disk as f32; everything else as itself, in C order.
  const Tensor data = tensor.dtype() == DType::bf16 ? tensor.to(DType::f32) : tensor.contiguous();
  std::string shape;
  for (int64_t s : data.shape()) shape += fmt::format("{}, ", s);
  if (data.dim() > 1) shape.resize(shape.size() - 2);   // (2, 3) but (3,) and ()
  if (data.dim() == 1) shape.resize(shape.size() - 1);  // "3," without the space
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}",
                                   descr_of(data.dtype()), shape);
  // Pad with spaces and end with '\n' so that the data starts 64-byte aligned, as NumPy does. With
  // at most kMaxDims dims the header is a few hundred bytes: format 1.0 (u16 length) always
  // suffices.
  constexpr size_t kPrefix = 10;
  const size_t total = (kPrefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - kPrefix - header.size() - 1, ' ');
  header.push_back('\n');

  std::string pre(kMagic, 6);
  pre.push_back('\x01');
  pre.push_back('\0');
  pre.push_back(static_cast<char>(header.size() & 0xff));
  pre.push_back(static_cast<char>(header.size() >> 8));

  io_detail::AtomicWriter out(path, kWrite);
  out.write(pre.data(), pre.size());
  out.write(header.data(), header.size());
  out.write(data.data(), static_cast<uint64_t>(data.numel()) * data.itemsize());
  out.commit();
}

}  // namespace attn
