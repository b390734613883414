/* What this build is: the commit (git describe at build time) and the build options. */
#include <stdio.h>

#include "cli.h"
#include "lily_version.h"

const char *lily_cli_commit(void) {
    return LILY_GIT_DESCRIBE;
}

/* The widest instruction set of this CPU that the CPU backend's kernels use. */
static const char *cpu_isa(void) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
        return __builtin_cpu_supports("avx512vnni") ? "avx512 + vnni" : "avx512";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "avx2";
#endif
    return "scalar";
}

void lily_cli_version(FILE *f) {
    fprintf(f, "lily %s\n", LILY_GIT_DESCRIBE);
#ifdef LILY_HAVE_CUDA
    fprintf(f, "  CUDA backend: on\n");
#else
    fprintf(f, "  CUDA backend: off\n");
#endif
#ifdef LILY_HAVE_SERVER
    fprintf(f, "  HTTP server (lily serve): on\n");
#else
    fprintf(f, "  HTTP server (lily serve): off\n");
#endif
#ifdef LILY_HAVE_CURL
    fprintf(f, "  pull (libcurl): on\n");
#else
    fprintf(f, "  pull (libcurl): off\n");
#endif
#ifdef LILY_HAVE_LIBEDIT
    fprintf(f, "  chat line editing (libedit): on\n");
#else
    fprintf(f, "  chat line editing (libedit): off\n");
#endif
    fprintf(f, "  CPU ISA: %s (kernels chosen at run time; the build targets baseline x86-64)\n",
            cpu_isa());
}
