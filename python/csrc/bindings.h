// The parts of the attn._core extension, each binding one header of the library.
#pragma once
#include <nanobind/nanobind.h>

namespace attn::python {

void bind_attention(nanobind::module_& m);         // include/attn/attention.h
void bind_linear_attention(nanobind::module_& m);  // include/attn/linear_attention.h
#ifdef ATTN_PY_HAVE_NN
void bind_nn(nanobind::module_& m);  // include/attn/nn.h
#endif
#ifdef ATTN_PY_HAVE_MODELS
void bind_models(nanobind::module_& m);  // include/attn/models/{tokenizer,bert,sentence}.h
#endif
#ifdef ATTN_PY_HAVE_VIZ
void bind_viz(nanobind::module_& m);  // include/attn/viz.h
#endif

}  // namespace attn::python
