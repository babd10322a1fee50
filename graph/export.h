/* SPDX-License-Identifier: MIT */
/* cgrad export macros: which declarations the shared libraries export.
 *
 * The libraries are compiled with -fvisibility=hidden, so a function is exported only when a public
 * header declares it. Every public header wraps its declarations in CG_BEGIN_DECLS ... CG_END_DECLS,
 * which opens extern "C" for C++ and gives them default visibility; internal headers (cgi_* names)
 * do not, so libcgrad.so exports cg_* names only. CG_API exports one declaration outside such a block. */
#ifndef CGRAD_EXPORT_H
#define CGRAD_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define CG_API __attribute__((visibility("default"))) /* exports one declaration */
#define CG_VISIBILITY_PUSH _Pragma("GCC visibility push(default)") /* declarations from here on are exported */
#define CG_VISIBILITY_POP _Pragma("GCC visibility pop") /* ends CG_VISIBILITY_PUSH */
#else
#define CG_API /* exports one declaration (no-op: no visibility control on this compiler) */
#define CG_VISIBILITY_PUSH /* declarations from here on are exported (no-op here) */
#define CG_VISIBILITY_POP /* ends CG_VISIBILITY_PUSH (no-op here) */
#endif

#ifdef __cplusplus
#define CG_BEGIN_DECLS extern "C" { CG_VISIBILITY_PUSH /* opens a public header's declarations */
#define CG_END_DECLS CG_VISIBILITY_POP } /* closes them */
#else
#define CG_BEGIN_DECLS CG_VISIBILITY_PUSH /* opens a public header's declarations */
#define CG_END_DECLS CG_VISIBILITY_POP /* closes them */
#endif

#endif
