// safetensors files: | u64 LE header length N | N bytes of JSON | data |
// The JSON maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end)} (offsets
// relative to the start of the data) plus an optional "__metadata__" object of strings. The data
// must be covered exactly: the tensors' byte ranges, sorted, tile [0, data size) with no gap and no
// overlap, and each range is exactly dtype size x element count long. Nothing is allocated before
// the header has been checked against the file.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "attn/io.h"
#include "core/file_io.h"

namespace attn {

namespace {

using Json = nlohmann::ordered_json;  // keeps the header's order: the order of the returned list

constexpr const char* kRead = "attn::read_safetensors";
constexpr const char* kWrite = "attn::write_safetensors";
constexpr uint64_t kMaxHeader = uint64_t{100} << 20;  // the format's own limit: 100 MB of JSON

const char* st_dtype_name(DType t) {
  switch (t) {
    case DType::f64:
      return "F64";
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::boolean:
      return "BOOL";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::i8:
      return "I8";
  }
  return "?";
}

bool parse_st_dtype(const std::string& s, DType* out) {
  for (DType t : {DType::f64, DType::f32, DType::bf16, DType::f16, DType::boolean, DType::i32,
                  DType::i64, DType::i8}) {
    if (s == st_dtype_name(t)) {
      *out = t;
      return true;
    }
  }
  return false;
}

struct Entry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0, end = 0;
  Tensor tensor;
};

// Reads a non-negative JSON integer; nullopt-like failure through the return value.
bool json_uint(const Json& j, uint64_t* out) {
  if (j.is_number_unsigned()) {
    *out = j.get<uint64_t>();
    return true;
  }
  if (j.is_number_integer() && j.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(j.get<int64_t>());
    return true;
  }
  return false;
}

Json parse_header(const std::string& text, const io_detail::FileReader& file) {
  // Duplicate keys are refused at every level (plain JSON parsing would silently keep one of them).
  std::vector<std::set<std::string>> keys;
  std::string duplicate;
  const Json::parser_callback_t cb = [&](int /*depth*/, Json::parse_event_t event, Json& parsed) {
    if (event == Json::parse_event_t::object_start) keys.emplace_back();
    if (event == Json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == Json::parse_event_t::key && !keys.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!keys.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, cb);
  } catch (const Json::exception& e) {
    file.fail(fmt::format("malformed JSON header: {}", e.what()));
  }
  if (!duplicate.empty()) file.fail(fmt::format("duplicate name '{}' in the header", duplicate));
  if (!header.is_object()) file.fail("the header is not a JSON object");
  return header;
}

// The JSON header: its length (8 bytes LE, within the file and 100 MB), then the object itself.
Json read_header(io_detail::FileReader& file) {
  uint8_t len_bytes[8];
  file.read(len_bytes, 8, "the header length");
  uint64_t header_len = 0;
  for (int b = 0; b < 8; ++b) header_len |= uint64_t{len_bytes[b]} << (8 * b);
  if (header_len > file.remaining()) {
    file.fail(
        fmt::format("truncated: the header length {} runs past the end of the file ({} bytes left)",
                    header_len, file.remaining()));
  }
  if (header_len > kMaxHeader)
    file.fail(fmt::format("header length {} exceeds 100 MB", header_len));
  std::string text(static_cast<size_t>(header_len), '\0');
  file.read(text.data(), header_len, "the header");
  return parse_header(text, file);
}

// "__metadata__": an object of strings.
void read_metadata(const Json& info, const io_detail::FileReader& file,
                   std::map<std::string, std::string>* metadata) {
  if (!info.is_object()) file.fail("'__metadata__' must be an object of strings");
  for (const auto& [mk, mv] : info.items()) {
    if (!mv.is_string()) file.fail(fmt::format("metadata '{}' is not a string", mk));
    if (metadata) (*metadata)[mk] = mv.get<std::string>();
  }
}

// One tensor's entry: exactly dtype, shape and data_offsets; a dtype attn reads; a shape of at most
// kMaxDims non-negative int64 dims; offsets within the data, exactly dtype size x element count
// apart.
Entry parse_entry(const std::string& name, const Json& info, uint64_t data_size,
                  const io_detail::FileReader& file) {
  auto bad = [&](const std::string& msg) { file.fail(fmt::format("tensor '{}': {}", name, msg)); };
  if (!info.is_object()) bad("its entry is not an object");
  for (const auto& [k, unused] : info.items()) {
    if (k != "dtype" && k != "shape" && k != "data_offsets")
      bad(fmt::format("unexpected key '{}'", k));
  }
  if (!info.contains("dtype") || !info.contains("shape") || !info.contains("data_offsets")) {
    bad("the entry must hold 'dtype', 'shape' and 'data_offsets'");
  }
  Entry e;
  e.name = name;
  const Json& dt = info["dtype"];
  if (!dt.is_string()) bad("'dtype' is not a string");
  if (!parse_st_dtype(dt.get<std::string>(), &e.dtype)) {
    bad(fmt::format("unsupported dtype '{}' (attn reads F64, F32, BF16, F16, BOOL, I32, I64)",
                    dt.get<std::string>()));
  }
  const Json& sh = info["shape"];
  if (!sh.is_array()) bad("'shape' is not an array");
  if (sh.size() > static_cast<size_t>(kMaxDims))
    bad(fmt::format("the shape has more than {} dims", kMaxDims));
  for (const Json& d : sh) {
    uint64_t v = 0;
    if (!json_uint(d, &v) || v > static_cast<uint64_t>(INT64_MAX)) {
      bad(fmt::format("shape {} has a dimension that is not a non-negative int64", sh.dump()));
    }
    e.shape.push_back(static_cast<int64_t>(v));
  }
  const Json& off = info["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !json_uint(off[0], &e.begin) ||
      !json_uint(off[1], &e.end)) {
    bad(fmt::format("'data_offsets' {} is not a pair of non-negative integers", off.dump()));
  }
  if (e.begin > e.end || e.end > data_size) {
    bad(fmt::format("data_offsets [{}, {}] do not lie within the {} data bytes", e.begin, e.end,
                    data_size));
  }
  int64_t n = 0;
  try {
    n = checked_numel(e.shape, kRead);
  } catch (const Error&) {
    bad(fmt::format("the element count of shape {} overflows", shape_to_string(e.shape)));
  }
  const uint64_t item = dtype_size(e.dtype);
  if (static_cast<uint64_t>(n) > (e.end - e.begin) / item ||
      static_cast<uint64_t>(n) * item != e.end - e.begin) {
    bad(fmt::format("{} x {} needs {} x {} bytes but data_offsets [{}, {}] hold {}",
                    st_dtype_name(e.dtype), shape_to_string(e.shape), n, item, e.begin, e.end,
                    e.end - e.begin));
  }
  return e;
}

// The entries in file order, checked to tile the data exactly: no gap, no overlap, nothing after.
std::vector<size_t> file_order(const std::vector<Entry>& entries, uint64_t data_size,
                               const io_detail::FileReader& file) {
  std::vector<size_t> order(entries.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return entries[a].begin != entries[b].begin ? entries[a].begin < entries[b].begin
                                                : entries[a].end < entries[b].end;
  });
  uint64_t cursor = 0;
  for (size_t i : order) {
    const Entry& e = entries[i];
    if (e.begin > cursor) {
      file.fail(fmt::format("tensor '{}': a gap of {} bytes before its data_offsets [{}, {}]",
                            e.name, e.begin - cursor, e.begin, e.end));
    }
    if (e.begin < cursor) {
      file.fail(
          fmt::format("tensor '{}': data_offsets [{}, {}] overlap another tensor's (ending at {})",
                      e.name, e.begin, e.end, cursor));
    }
    cursor = e.end;
  }
  if (cursor != data_size) {
    file.fail(fmt::format("{} data bytes after the last tensor are not described by the header",
                          data_size - cursor));
  }
  return order;
}

}  // namespace

TensorList read_safetensors(const std::string& path, std::map<std::string, std::string>* metadata) {
  io_detail::FileReader file(path, kRead);
  const Json header = read_header(file);
  const uint64_t data_size = file.remaining();

  std::vector<Entry> entries;
  if (metadata) metadata->clear();
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      read_metadata(info, file, metadata);
    } else {
      entries.push_back(parse_entry(name, info, data_size, file));
    }
  }
  const std::vector<size_t> order = file_order(entries, data_size, file);
  // Every size is now bounded by the file's: allocate and read in file order.
  for (size_t i : order) {
    Entry& e = entries[i];
    e.tensor = Tensor::empty(e.shape, e.dtype);
    file.read(e.tensor.data(), e.end - e.begin, "the tensor data");
    if (e.dtype == DType::boolean) {
      auto* b = e.tensor.data_as<uint8_t>();
      for (uint64_t k = 0; k < e.end - e.begin; ++k) b[k] = b[k] != 0;
    }
  }
  TensorList out;
  out.reserve(entries.size());
  for (Entry& e : entries) out.emplace_back(std::move(e.name), std::move(e.tensor));
  return out;
}

void write_safetensors(const std::string& path, const TensorList& tensors,
                       const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string> names;
  std::vector<Tensor> data;
  data.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    if (name == "__metadata__")
      throw Error(fmt::format("{}: '{}': '__metadata__' is not a tensor name", kWrite, path));
    if (!names.insert(name).second)
      throw Error(fmt::format("{}: '{}': duplicate tensor name '{}'", kWrite, path, name));
    if (!t.defined())
      throw Error(fmt::format("{}: '{}': tensor '{}' is undefined", kWrite, path, name));
    data.push_back(t.contiguous());
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * t.itemsize();
    header[name] = {{"dtype", st_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // pad so that the data starts 8-byte aligned
  uint8_t len_bytes[8];
  for (int b = 0; b < 8; ++b)
    len_bytes[b] = static_cast<uint8_t>((uint64_t{text.size()} >> (8 * b)) & 0xff);

  io_detail::AtomicWriter out(path, kWrite);
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());
  for (const Tensor& t : data) out.write(t.data(), static_cast<uint64_t>(t.numel()) * t.itemsize());
  out.commit();
}

}  // namespace attn
