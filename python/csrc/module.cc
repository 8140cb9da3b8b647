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
  attn::python::bind_linear_attention(m);
#ifdef ATTN_PY_HAVE_NN
  attn::python::bind_nn(m);
  m.attr("has_nn") = true;
#else
  m.attr("has_nn") = false;
#endif
#ifdef ATTN_PY_HAVE_MODELS
  attn::python::bind_models(m);
  m.attr("has_models") = true;
#else
  m.attr("has_models") = false;
#endif
#ifdef ATTN_PY_HAVE_VIZ
  attn::python::bind_viz(m);
  m.attr("has_viz") = true;
#else
  m.attr("has_viz") = false;
#endif
}
