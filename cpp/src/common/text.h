// Small text helpers for error messages.
#pragma once

#include <string>
#include <string_view>

namespace deepinfer {

// 's', for naming a tensor, file or key in a message. Built piecewise: "'" + std::string(...)
// trips GCC 12's -Wrestrict false positive at -O3.
inline std::string in_quotes(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

}  // namespace deepinfer
