/* SPDX-License-Identifier: MIT */
/* Internal: the image models' input check. */
#ifndef CGRAD_IMAGE_INPUT_H
#define CGRAD_IMAGE_INPUT_H

#include "graph/graph.h"

/* True when pixels is a real [B, channels, size, size] input of g; else false with an error naming
 * the model (e.g. "cnn") and the shape it must have. */
bool cgi_image_input_ok(cg_graph *g, const char *model, cg_tensor *pixels, int64_t channels, int64_t size);

#endif
