#include "backends/reference/attention_ref.h"

namespace attn::reference {
// Placeholder until the reference lands (being written now).
void forward(const contract::ForwardProblem&) { throw Error("attn::reference::forward: unavailable"); }
void backward(const contract::BackwardProblem&) { throw Error("attn::reference::backward: unavailable"); }
}  // namespace attn::reference
