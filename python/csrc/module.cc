// attn._core: the compiled half of the attn Python package (the pure-Python half is
// python/src/attn).
#include <nanobind/nanobind.h>

#include "bindings.h"

NB_MODULE(_core, m) {
  m.doc() =
      "The compiled half of attn: its C++ library bound with nanobind; use it through the attn "
      "package (attn.nn, attn.models and attn.viz wrap the submodules _core.nn, _core.models and "
      "_core.viz).";
  attn::python::bind_attention(m);
  attn::python::bind_varlen(m);
  attn::python::bind_paged(m);
  attn::python::bind_linear_attention(m);
  attn::python::bind_nn(m);
  attn::python::bind_models(m);
  attn::python::bind_viz(m);
  attn::python::bind_info(m);
}
