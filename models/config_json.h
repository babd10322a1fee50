/* SPDX-License-Identifier: MIT */
/* Internal: reading model configs from JSON (cJSON). Unknown fields are ignored; a missing
 * required field is an error naming the field and the config. */
#ifndef CGRAD_CONFIG_JSON_H
#define CGRAD_CONFIG_JSON_H

#include <cjson/cJSON.h>

#include "graph/graph.h"

/* Parses text as a JSON object; NULL with a message naming what (e.g. "gpt2 config"). */
cJSON *cgi_json_object(const char *text, const char *what);
/* Reads an integer field; absent or null gives dflt unless required. */
bool cgi_json_int(const cJSON *o, const char *key, bool required, int64_t dflt, int64_t *out, const char *what);
/* Reads a number field; absent or null gives dflt unless required. */
bool cgi_json_num(const cJSON *o, const char *key, bool required, double dflt, double *out, const char *what);
/* Reads a whole file into a NUL-terminated malloc'd buffer; NULL with a message naming path. */
char *cgi_read_text(const char *path, size_t *len);

#endif
