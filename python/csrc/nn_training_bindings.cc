// attn._core.nn's training half (include/attn/nn/training.h) for the pure-Python attn.nn, which gives
// it PyTorch's names: ParameterList (Module.parameters()), the optimizers SGD and AdamW, gradient
// clipping, the warm-up + cosine schedule and cross-entropy. Arguments are validated in attn.nn;
// the C++ entry points check again and raise ValueError with their own names.
#include <fmt/format.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "arrays.h"
#include "attn/nn/training.h"
#include "nn_parameters.h"

namespace attn::python {

namespace {

using namespace attn::nn;

// The parameters of `params` for an optimizer or clipping: no tensor twice (it would be stepped or
// scaled twice) and, for an optimizer, no name twice (its state is keyed by name).
std::vector<NamedParameter> distinct(const ParameterList& params, const char* fn,
                                     bool unique_names) {
  std::set<const void*> seen;
  std::set<std::string> names;
  for (const NamedParameter& p : params.items) {
    if (!seen.insert(p.value.data()).second)
      throw nb::value_error(
          fmt::format("{}: params holds parameter '{}' twice", fn, p.name).c_str());
    if (unique_names && !names.insert(p.name).second)
      throw nb::value_error(fmt::format("{}: two parameters are named '{}' (from different "
                                        "modules); name them apart with "
                                        "module.parameters(prefix='...')",
                                        fn, p.name)
                                .c_str());
  }
  return params.items;
}

// The optimizer's state as name -> NumPy array, copied (a snapshot later steps leave alone).
nb::dict export_state(const Optimizer& opt) {
  nb::dict d;
  for (const auto& [name, t] : opt.state_dict()) d[name.c_str()] = export_tensor(t.clone(), false);
  return d;
}

void import_state(Optimizer& opt, nb::dict state) {
  ArrayScope scope("attn.nn.Optimizer.load_state_dict");
  TensorList list;
  for (auto [k, v] : state) {
    if (!nb::isinstance<nb::str>(k))
      throw nb::type_error("attn.nn.Optimizer.load_state_dict: state keys must be str");
    const std::string name = nb::cast<std::string>(k);
    list.emplace_back(name, scope.import(v, name.c_str()));
  }
  opt.load_state_dict(list);
}

void bind_parameter_list(nb::module_& m) {
  nb::class_<ParameterList>(m, "ParameterList",
                            "Parameters of attn.nn modules (sharing their memory); + concatenates.")
      .def("__len__", [](const ParameterList& l) { return l.items.size(); })
      .def(
          "__getitem__",
          [](const ParameterList& l, int64_t i) {
            const auto n = static_cast<int64_t>(l.items.size());
            if (i < 0) i += n;
            if (i < 0 || i >= n) throw nb::index_error("ParameterList index out of range");
            return ParameterList{{l.items[static_cast<size_t>(i)]}};
          },
          nb::arg("index"), "The one-parameter list at index (so list() and chain() work).")
      .def(
          "__add__",
          [](const ParameterList& a, const ParameterList& b) {
            ParameterList r = a;
            r.items.insert(r.items.end(), b.items.begin(), b.items.end());
            return r;
          },
          nb::arg("other"))
      .def_static(
          "concat",
          [](const std::vector<const ParameterList*>& lists) {
            ParameterList r;
            for (const ParameterList* l : lists)
              r.items.insert(r.items.end(), l->items.begin(), l->items.end());
            return r;
          },
          nb::arg("lists"))
      .def(
          "names",
          [](const ParameterList& l) {
            std::vector<std::string> names;
            for (const NamedParameter& p : l.items) names.push_back(p.name);
            return names;
          },
          "PyTorch's state-dict names, in order.")
      // The gradients, in order, as NumPy arrays sharing the parameters' memory (no docstring: the
      // stubs stay within nn.pyi's 700 lines).
      .def("grads", [](const ParameterList& l) {
        nb::list out;
        for (const NamedParameter& p : l.items) out.append(export_tensor(p.grad, false));
        return out;
      });
}

void bind_optimizers(nb::module_& m) {
  nb::class_<Optimizer>(m, "Optimizer")
      .def(
          "step",
          [](Optimizer& o) {
            nb::gil_scoped_release release;
            o.step();
          },
          "Updates the parameters in place from their gradients (the last backward's).")
      .def("zero_grad", &Optimizer::zero_grad)
      .def_prop_rw("lr", &Optimizer::lr, &Optimizer::set_lr)
      .def("state_dict", &export_state,
           "name -> array copies: '<param>.momentum_buffer' (SGD with momentum, after a step), "
           "'step' [1] int64 and '<param>.exp_avg' / '<param>.exp_avg_sq' (AdamW).")
      .def("load_state_dict", &import_state, nb::arg("state"),
           "Copies a state_dict() back; a missing name or a wrong shape raises ValueError.");

  nb::class_<SGD, Optimizer>(m, "SGD").def(
      "__init__",
      [](SGD* self, const ParameterList& params, double lr, double momentum, double dampening,
         double weight_decay, bool nesterov) {
        new (self) SGD(distinct(params, "attn.nn.SGD", true), lr, momentum, weight_decay, nesterov,
                       dampening);
      },
      nb::arg("params"), nb::arg("lr"), nb::arg("momentum") = 0.0, nb::arg("dampening") = 0.0,
      nb::arg("weight_decay") = 0.0, nb::arg("nesterov") = false);

  nb::class_<AdamW, Optimizer>(m, "AdamW")
      .def(
          "__init__",
          [](AdamW* self, const ParameterList& params, double lr, double beta1, double beta2,
             double eps, double weight_decay) {
            new (self)
                AdamW(distinct(params, "attn.nn.AdamW", true), lr, beta1, beta2, eps, weight_decay);
          },
          nb::arg("params"), nb::arg("lr") = 1e-3, nb::arg("beta1") = 0.9, nb::arg("beta2") = 0.999,
          nb::arg("eps") = 1e-8, nb::arg("weight_decay") = 1e-2)
      .def_prop_ro("steps", &AdamW::steps);
}

void bind_functions(nb::module_& m) {
  m.def(
      "clip_grad_norm",
      [](const ParameterList& params, double max_norm) {
        const auto p = distinct(params, "attn.nn.clip_grad_norm_", false);
        nb::gil_scoped_release release;
        return clip_grad_norm(p, max_norm);
      },
      nb::arg("params"), nb::arg("max_norm"),
      "Scales the gradients by max_norm / (norm + 1e-6) when their global L2 norm exceeds "
      "max_norm; returns the norm before.");
  m.def(
      "grad_norm",
      [](const ParameterList& params) {
        nb::gil_scoped_release release;
        return grad_norm(params.items);
      },
      nb::arg("params"), "The global L2 norm of the gradients.");
  m.def(
      "warmup_cosine",
      [](double base_lr, int64_t warmup_steps, int64_t total_steps, double min_lr, int64_t step) {
        return WarmupCosine{base_lr, warmup_steps, total_steps, min_lr}(step);
      },
      nb::arg("base_lr"), nb::arg("warmup_steps"), nb::arg("total_steps"), nb::arg("min_lr"),
      nb::arg("step"),
      "lr at step (from 0): linear warm-up, cosine decay to min_lr at total_steps.");
  m.def(
      "cross_entropy",
      [](nb::handle logits, nb::handle targets, int64_t ignore_index, double label_smoothing) {
        ArrayScope scope("attn.nn.cross_entropy");
        const Tensor x = scope.import(logits, "logits"), t = scope.import(targets, "targets");
        CrossEntropyResult r;
        {
          nb::gil_scoped_release release;
          r = cross_entropy(x, t, ignore_index, label_smoothing);
        }
        return nb::make_tuple(r.loss, r.count, export_tensor(std::move(r.dlogits), scope.torch()));
      },
      nb::arg("logits"), nb::arg("targets"), nb::arg("ignore_index") = -100,
      nb::arg("label_smoothing") = 0.0,
      "logits [..., C], targets int [...] -> (mean loss, rows counted, dlogits [..., C] in "
      "float32 or float64).");
}

}  // namespace

void bind_training(nb::module_& m) {
  bind_parameter_list(m);
  bind_optimizers(m);
  bind_functions(m);
}

}  // namespace attn::python
