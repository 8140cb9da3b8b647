// The parts of the attn._core extension, each binding one header of the library.
#pragma once
#include <nanobind/nanobind.h>

namespace attn::python {

void bind_attention(nanobind::module_& m);         // include/attn/attention.h
void bind_varlen(nanobind::module_& m);            // include/attn/varlen.h
void bind_paged(nanobind::module_& m);             // include/attn/paged.h and kv_cache.h
void bind_linear_attention(nanobind::module_& m);  // include/attn/linear_attention.h
void bind_nn(nanobind::module_& m);                // include/attn/nn.h
void bind_models(nanobind::module_& m);  // include/attn/models/{tokenizer,bert,sentence}.h
void bind_viz(nanobind::module_& m);     // include/attn/viz.h
void bind_info(nanobind::module_& m);    // include/attn/info.h and nn::gemm_kernels

}  // namespace attn::python
