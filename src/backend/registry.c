/* Backend selection: the ops table for a backend kind, as built into this binary. */
#include "backend/backend.h"
#include "base/err.h"

const lily_backend_ops *lily_backend_get(lily_backend_kind kind, lily_err *e) {
    switch (kind) {
    case LILY_BACKEND_CPU: return &lily_backend_cpu;
    case LILY_BACKEND_CUDA:
#ifdef LILY_HAVE_CUDA
        return &lily_backend_cuda;
#else
        lily_fail(e, "this lily was built without CUDA (configure with -DLILY_CUDA=ON)");
        return NULL;
#endif
    }
    lily_fail(e, "unknown backend %d", (int)kind);
    return NULL;
}
