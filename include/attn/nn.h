// attn::nn: Transformer modules with explicit forward/backward pairs, PyTorch-named state dicts,
// losses, optimizers. docs/nn.md lists the modules with their shapes.
#pragma once
#include "attn/nn/layers.h"
#include "attn/nn/masks.h"
#include "attn/nn/module.h"
#include "attn/nn/monitor.h"
#include "attn/nn/multihead_attention.h"
#include "attn/nn/positional.h"
#include "attn/nn/training.h"
#include "attn/nn/transformer.h"
