// The named conformance cases of tests/cases/attention_cases.txt (its header states the format), read
// into CaseSpecs: the one list that the reference crosscheck, the cpu backend on every ISA, the ring
// under MPI and the Python tests (python/tests/conformance_cases.py reads the same file) all run.
// The file's path comes from the build: ATTN_CASES_FILE (tests/CMakeLists.txt, tests/mpi/).
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <ostream>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "attention/attention_cases.h"

#ifndef ATTN_CASES_FILE
#error "ATTN_CASES_FILE must name tests/cases/attention_cases.txt (a compile definition)"
#endif

namespace attn::test {

struct NamedCase {
  std::string name;
  CaseSpec spec;
  uint64_t seed = 0;  // FNV-1a of the name: the same values whatever the order of the lines
};

// gtest prints a parameter with this (instead of its bytes) when a test fails.
inline void PrintTo(const NamedCase& c, std::ostream* os) {
  *os << c.name;
}

// The spec every line starts from (the file's header lists these defaults).
inline CaseSpec conformance_default_spec() {
  CaseSpec s;
  s.batch = {2};
  s.Hq = 4, s.Hkv = 2, s.Lq = 13, s.Lk = 21, s.D = 16, s.Dv = 12;
  s.dtype = DType::f32;
  s.value_range = 1.0;
  return s;
}

namespace cases_detail {

[[noreturn]] inline void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

inline int64_t to_int(const std::string& where, const std::string& v) {
  size_t used = 0;
  int64_t x = 0;
  try {
    x = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) fail(where, "not an integer: '" + v + "'");
  return x;
}

inline double to_double(const std::string& where, const std::string& v) {
  size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != v.size()) fail(where, "not a number: '" + v + "'");
  return x;
}

inline std::vector<std::string> split(const std::string& v, char sep) {
  std::vector<std::string> parts;
  std::stringstream ss(v);
  for (std::string p; std::getline(ss, p, sep);) parts.push_back(p);
  return parts;
}

inline Shape to_shape(const std::string& where, const std::string& v) {
  Shape s;
  if (v == "none") return s;
  for (const std::string& p : split(v, 'x')) s.push_back(to_int(where, p));
  return s;
}

inline std::pair<int64_t, int64_t> to_pair(const std::string& where, const std::string& v) {
  const std::vector<std::string> p = split(v, ',');
  if (p.size() != 2) fail(where, "expected A,B: '" + v + "'");
  return {to_int(where, p[0]), to_int(where, p[1])};
}

inline bool to_flag(const std::string& where, const std::string& v) {
  if (v != "0" && v != "1") fail(where, "expected 0 or 1: '" + v + "'");
  return v == "1";
}

inline Layout to_layout(const std::string& where, const std::string& v) {
  for (Layout l : {Layout::contiguous, Layout::padded, Layout::transposed, Layout::strided}) {
    if (v == layout_name(l)) return l;
  }
  fail(where, "unknown layout '" + v + "'");
}

inline void set(CaseSpec& s, const std::string& where, const std::string& key,
                const std::string& v) {
  if (key == "batch") {
    s.batch = to_shape(where, v);
  } else if (key == "hq") {
    s.Hq = to_int(where, v);
  } else if (key == "hkv") {
    s.Hkv = to_int(where, v);
  } else if (key == "lq") {
    s.Lq = to_int(where, v);
  } else if (key == "lk") {
    s.Lk = to_int(where, v);
  } else if (key == "d") {
    s.D = to_int(where, v);
  } else if (key == "dv") {
    s.Dv = to_int(where, v);
  } else if (key == "dtype") {
    if (v != "f32" && v != "bf16") fail(where, "dtype must be f32 or bf16: '" + v + "'");
    s.dtype = parse_dtype(v);
  } else if (key == "layout") {
    s.layout = to_layout(where, v);
  } else if (key == "causal") {
    s.causal = to_flag(where, v);
  } else if (key == "align") {
    s.align = parse_align(v);
  } else if (key == "window") {
    const auto [l, r] = to_pair(where, v);
    s.window = {l, r};
  } else if (key == "mask") {
    s.mask = parse_mask_type(v);
  } else if (key == "mask_shape") {
    s.mask_shape = to_shape(where, v);
  } else if (key == "key_lengths") {
    s.key_lengths = to_flag(where, v);
  } else if (key == "block") {
    const auto [bq, bk] = to_pair(where, v);
    s.block_layout = true, s.block_q = bq, s.block_k = bk;
  } else if (key == "alibi") {
    s.alibi = true, s.alibi_max = to_double(where, v);
  } else if (key == "softcap") {
    s.softcap = to_double(where, v);
  } else if (key == "scale") {
    s.scale = to_double(where, v);
  } else if (key == "dropout") {
    s.dropout = to_double(where, v);
  } else {
    fail(where, "unknown key '" + key + "'");
  }
}

inline uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char ch : s) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

}  // namespace cases_detail

// Every case of the file, in its order. Throws std::runtime_error naming the file and line of the
// first malformed one (a missing file, an unknown key, a repeated name, an empty list).
inline std::vector<NamedCase> conformance_cases(const std::string& path = ATTN_CASES_FILE) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("conformance_cases: cannot open " + path);
  std::vector<NamedCase> out;
  std::set<std::string> names;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    const std::string where = path + ":" + std::to_string(n);
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    NamedCase c;
    if (!(words >> c.name)) continue;  // blank or comment
    for (char ch : c.name) {
      if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) {
        cases_detail::fail(where, "a name is [a-z0-9_]: '" + c.name + "'");
      }
    }
    if (!names.insert(c.name).second) cases_detail::fail(where, "repeated name " + c.name);
    c.spec = conformance_default_spec();
    for (std::string kv; words >> kv;) {
      const size_t eq = kv.find('=');
      if (eq == std::string::npos) cases_detail::fail(where, "expected key=value: '" + kv + "'");
      cases_detail::set(c.spec, where, kv.substr(0, eq), kv.substr(eq + 1));
    }
    c.seed = cases_detail::fnv1a(c.name) % 1000003 + 1;
    out.push_back(std::move(c));
  }
  if (out.empty()) throw std::runtime_error("conformance_cases: no case in " + path);
  return out;
}

// For INSTANTIATE_TEST_SUITE_P: the case's name is the test's name.
struct CaseName {
  std::string operator()(const ::testing::TestParamInfo<NamedCase>& info) const {
    return info.param.name;
  }
};

}  // namespace attn::test
