/* SPDX-License-Identifier: MIT */
/* cgrad umbrella header: includes the module headers, nothing else. */
#ifndef CGRAD_H
#define CGRAD_H
#include "graph/graph.h"
#include "graph/gradcheck.h"
#include "ops/ops.h"
#include "ops/custom.h"
#include "models/layers.h"
#include "models/zoo.h"
#include "io/safetensors.h"
#include "io/checkpoint.h"
#include "io/tokenizer.h"
#include "io/data.h"
#include "io/idx.h"
#include "optim/optim.h"
#include "optim/lora.h"
#include "dist/dist.h"
#endif
