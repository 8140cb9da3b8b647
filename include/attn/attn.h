// The umbrella header of attn.
#pragma once
#include "attn/attention.h"
#include "attn/dtype.h"
#include "attn/error.h"
#include "attn/io.h"
#include "attn/kv_cache.h"
#include "attn/linear_attention.h"
#include "attn/memory.h"
#include "attn/paged.h"
#include "attn/tensor.h"
#include "attn/threads.h"
#include "attn/varlen.h"
