// attn::Error: every bad input to attn raises this. Messages start with the name of the function that
// rejected the input ("attn::attention: ...") and name the argument and the shapes involved.
#pragma once
#include <stdexcept>
#include <string>

namespace attn {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

}  // namespace attn
