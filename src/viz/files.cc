// Base64 (RFC 4648, for data: URIs) and whole-or-nothing file writes. Base64 is a dozen lines, so
// it is written here rather than pulled in as a dependency (none of the libraries attn already uses
// offers it).
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "attn/error.h"
#include "attn/viz.h"

namespace attn::viz {

std::string base64_encode(const std::string& bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  auto byte = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(bytes[k])); };
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = byte(i) << 16 | byte(i + 1) << 8 | byte(i + 2);
    for (int s : {18, 12, 6, 0}) out += kAlphabet[(v >> s) & 63];
  }
  if (const size_t rest = bytes.size() - i; rest > 0) {
    const uint32_t v = byte(i) << 16 | (rest == 2 ? byte(i + 1) << 8 : 0);
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

void write_file_atomically(const std::string& path, const std::string& bytes, const char* what) {
  namespace fs = std::filesystem;
  const fs::path target(path);
  if (target.filename().empty()) throw Error(fmt::format("{}: '{}' names no file", what, path));
  const fs::path dir = target.has_parent_path() ? target.parent_path() : fs::path(".");
  // A hidden temporary next to the target, so the final rename stays on one file system.
  const std::string tmpl = (dir / fmt::format(".{}.XXXXXX", target.filename().string())).string();
  std::vector<char> name(tmpl.begin(), tmpl.end());
  name.push_back('\0');
  const int fd = mkstemp(name.data());
  if (fd < 0)
    throw Error(fmt::format("{}: cannot write '{}': {}", what, path, std::strerror(errno)));
  auto fail = [&](const char* step) {
    const std::string reason = std::strerror(errno);
    close(fd);
    std::remove(name.data());
    throw Error(fmt::format("{}: cannot write '{}' ({}): {}", what, path, step, reason));
  };
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      fail("write");
    }
    done += static_cast<size_t>(n);
  }
  if (fchmod(fd, 0644) != 0) fail("chmod");
  if (close(fd) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(name.data());
    throw Error(fmt::format("{}: cannot write '{}' (close): {}", what, path, reason));
  }
  if (std::rename(name.data(), path.c_str()) != 0) {
    const std::string reason = std::strerror(errno);
    std::remove(name.data());
    throw Error(fmt::format("{}: cannot write '{}' (rename): {}", what, path, reason));
  }
}

}  // namespace attn::viz
