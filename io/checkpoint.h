/* SPDX-License-Identifier: MIT */
/* Checkpoints: a gzip-compressed safetensors image, so `gunzip` plus any safetensors reader opens
 * one. Saving is atomic (a crash leaves the previous checkpoint intact); opening verifies the gzip
 * CRC and length, so a damaged file is rejected rather than read as garbage. */
#ifndef CGRAD_CHECKPOINT_H
#define CGRAD_CHECKPOINT_H

#include "../graph/graph.h"
#include "safetensors.h"

CG_BEGIN_DECLS

#define CG_CHECKPOINT_FORMAT "cgrad-checkpoint" /* __metadata__ "format" of a checkpoint */
#define CG_CHECKPOINT_VERSION "1"               /* __metadata__ "version" of a checkpoint */

/* Sets w's __metadata__ "format" and "version", then writes its image gzip-compressed to path
 * atomically: a temp file "<path>.tmp.<pid>.<n>" in the same directory, fsync, rename, fsync of
 * the directory. On a failure up to the rename the old file at path is untouched and the temp file
 * removed (a failed directory fsync is reported with the new file already in place); temp files
 * of processes that died mid-save are removed by the next successful save. w stays the caller's. */
cg_status cg_checkpoint_save(cg_st_writer *w, const char *path);
/* Opens a checkpoint: gunzips (verifying CRC and length), parses the image and checks format and
 * version; NULL + cg_last_error() (naming path) otherwise. Close with cg_st_close. */
cg_st *cg_checkpoint_open(const char *path);

CG_END_DECLS
#endif
