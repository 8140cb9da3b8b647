// The keyword options of attn._core's attention entry points (attention, attention_backward,
// attention_varlen, attention_varlen_backward), read from attn/options.h's table (kOptionInfo): one
// Keyword per option after the arrays (its Python type, kind and default), the parser that turns a
// call's **kwargs into AttentionOptions, and the signature and docstring text built from the same
// list. Every entry point parses its options here, so a new row of the table reaches all of them.
#pragma once
#include <array>
#include <cstddef>
#include <initializer_list>
#include <string>
#include <vector>

#include "arrays.h"
#include "attn/attention.h"
#include "attn/options.h"

namespace attn::python {

// One keyword after the arrays: an option's row of attn/options.h, or one of the bindings' own
// (block_size, return_lse: row == nullptr).
struct Keyword {
  const char* name;
  const char* type;            // its Python type, for the signature text
  const char* kind;            // what attn.torch flattens it by: its C++ type in words
  nb::object default_;         // AttentionOptions{}'s value as Python sees it
  const OptionInfo* row;       // nullptr: the bindings' own
  const char* help = nullptr;  // the bindings' own: the docstring's text (a row's is its help)
};

// attention's keywords (direction forward) or attention_backward's (backward), in the table's order:
// the options of both directions and the direction's output request, with the bindings' own:
// block_size after block_layout, return_lse before return_weights (the forward's).
const std::vector<Keyword>& keywords(OptionUse direction);
// attention_varlen's / attention_varlen_backward's: the same list without return_lse (the varlen
// forward always returns (out, lse)); the options it refuses stay, refused by the C++ by name.
const std::vector<Keyword>& varlen_keywords(OptionUse direction);

// TypeError "<fn>: <name> must be <expected>, got <dtype> with shape <shape>".
[[noreturn]] void dtype_error(const char* fn, const char* name, const char* expected,
                              const Tensor& t);
// An array of a dtype the argument does not take is a TypeError, as the docstrings promise (the
// C++ entry points, which see only tensors, report it as a bad option: ValueError).
void require_floating(const Tensor& t, const char* fn, const char* name);

// A backward's result as Python sees it: (dq, dk, dv), then d(mask) when o.mask_grad and dsinks when
// o has sinks.
nb::tuple grads_tuple(AttentionGrads g, const AttentionOptions& o, bool torch);

// At most this many keywords per function (after the arrays): the matched values live on the stack.
constexpr size_t kMaxKeywords = 32;
using KeywordValues = std::array<nb::handle, kMaxKeywords>;

// The call's keywords: matched and their types checked when constructed (as nanobind checks typed
// arguments before the call, so before the arrays are read), then their values into the options, in
// the table's order.
class OptionParser {
 public:
  // attention's / attention_backward's keywords.
  OptionParser(ArrayScope& scope, OptionUse direction, const nb::kwargs& given)
      : OptionParser(scope, direction, keywords(direction), given) {}
  // `kws`: keywords(direction) or a list made from it (varlen_keywords).
  OptionParser(ArrayScope& scope, OptionUse direction, const std::vector<Keyword>& kws,
               const nb::kwargs& given);

  // return_lse: set when the call gave it (nullptr: the list has no return_lse).
  AttentionOptions options(bool* return_lse);

 private:
  void check_type(const Keyword& kw, nb::handle h) const;
  void read(const OptionInfo& info, nb::handle h, AttentionOptions& o);
  void set_block_size(nb::handle block_size, AttentionOptions& o) const;

  ArrayScope& scope_;
  const std::vector<Keyword>& kws_;
  const KeywordValues values_;  // kws_[i]'s value, or an invalid handle when not given
  OptionUse direction_;
};

// "def name(positional: ArrayLike..., *, keyword-only..., keyword: type = default, ...) -> returns":
// `keyword_only` are the entry point's own keyword-only parameters ahead of the options, written out
// ("dweights: ArrayLike | None = None"). A positional written with its type ("cu_seqlens_q:
// ArrayLike | None = None") stays as written; the others are ArrayLike.
std::string signature(const char* name, std::initializer_list<const char*> positional,
                      std::initializer_list<const char*> keyword_only,
                      const std::vector<Keyword>& kws, const char* returns);

// The docstring's options section: one entry per keyword of `kws`, in order, with its type, default
// and flag, and the text of its row of attn/options.h (help, scalar rule, use); the bindings' own
// keywords (return_lse, block_size) carry their text. Adding a row adds its entry.
std::string options_doc(const std::vector<Keyword>& kws);

}  // namespace attn::python
