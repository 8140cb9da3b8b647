// attn.nn's parameter handle and training bindings. Module.parameters() returns a ParameterList of
// the module's NamedParameters, whose tensors share storage with the module: an optimizer built on
// it updates the module in place, and the list keeps that storage alive after the module is gone.
#pragma once
#include <nanobind/nanobind.h>

#include <vector>

#include "attn/nn/module.h"

namespace attn::python {

struct ParameterList {
  std::vector<attn::nn::NamedParameter> items;
};

// _core.nn.ParameterList, SGD, AdamW, clip_grad_norm, grad_norm, warmup_cosine and cross_entropy
// (include/attn/nn/training.h), for attn.nn's optimizers, schedule and loss.
void bind_training(nanobind::module_& nn);

}  // namespace attn::python
