/* GPU MoE block (backend/cuda/moe.h) against a CPU composition of the reference ops (RMSNorm,
 * lily_cpu_matmul, lily_cpu_topk_softmax, SwiGLU, sigmoid-gated shared expert), for the fused
 * decode path and the grouped prefill path: the routing is checked against the CPU top-k, and
 * the output against the CPU block run with the GPU's routing (so a near-tie flip cannot fail the
 * test). The prefill is also run with forced routings: every token on the same k experts (those
 * get all rows, the rest none) and a skewed random load; and a dense SwiGLU MLP (no experts).
 * Every decode case runs with the router GEMV (lily_cuda_moe_force_unfused) and with the router
 * inside the gate/up launch behind a grid barrier where the shapes allow it, and the fused path
 * also under CUDA graph replay. In prefill, Q4 experts with fewer than 64 rows take the skinny
 * 16-row tiles (gemm_skinny.h: n = 1, 24 on 64 experts, 200 on 256, ...), the others 64-row tiles
 * (n = 600 on 16 experts, top-2); test_cuda_moe_tiles covers the tilings and forced loads. */
#include <stdio.h>

#ifndef LILY_HAVE_CUDA
int main(void) {
    printf("skipped: built without CUDA\n");
    return 77;
}
#else
#include <cuda_runtime_api.h>

#include "backend/cuda/moe.h"
#include "parity_util.h"

typedef struct {
    int E, k, H, I, Is, has_sg;
    lily_mat router, *gate, *up, *down, sh_gate, sh_up, sh_down, sh_gw;
    lily_dmat d_router, d_gate, d_up, d_down, d_sg, d_su, d_sd, d_sgw;
    lily_dmat d_rgw, d_sgu, v_router, v_sgw, v_sg, v_su; /* fix_stack: stacks and their views */
    lily_cuda_moe m;
    float *norm_w;
} moe_fix;

static float sig(float x) {
    return 1.0f / (1.0f + expf(-x));
}
static float silu_h(float x) {
    return x / (1.0f + expf(-x));
}

static int fix_make(moe_fix *f, int E, int k, int H, int I, int Is, int has_sg) {
    lily_err e;
    memset(f, 0, sizeof *f);
    f->E = E, f->k = k, f->H = H, f->I = I, f->Is = Is, f->has_sg = has_sg;
    f->norm_w = malloc(H * 4);
    for (int i = 0; i < H; i++)
        f->norm_w[i] = 1 + 0.2f * pt_frand();
    f->m.E = E, f->m.k = k, f->m.norm = 1;
    if (E) {
        f->router = pt_mat(LILY_DT_Q8, E, H);
        f->gate = calloc(E, sizeof(lily_mat));
        f->up = calloc(E, sizeof(lily_mat));
        f->down = calloc(E, sizeof(lily_mat));
        for (int x = 0; x < E; x++) {
            f->gate[x] = pt_mat(LILY_DT_Q4, I, H);
            f->up[x] = pt_mat(LILY_DT_Q4, I, H);
            f->down[x] = pt_mat(LILY_DT_Q4, H, I);
        }
        if (lily_cuda_dmat_upload(&f->router, 1, &f->d_router, &e) ||
            lily_cuda_dmat_upload(f->gate, E, &f->d_gate, &e) ||
            lily_cuda_dmat_upload(f->up, E, &f->d_up, &e) ||
            lily_cuda_dmat_upload(f->down, E, &f->d_down, &e))
            return pt_ok(-1, "upload experts", &e), -1;
        f->m.router = &f->d_router, f->m.gate = &f->d_gate, f->m.up = &f->d_up;
        f->m.down = &f->d_down;
    }
    if (Is) {
        f->sh_gate = pt_mat(LILY_DT_Q4, Is, H);
        f->sh_up = pt_mat(LILY_DT_Q4, Is, H);
        f->sh_down = pt_mat(LILY_DT_Q4, H, Is);
        if (lily_cuda_dmat_upload(&f->sh_gate, 1, &f->d_sg, &e) ||
            lily_cuda_dmat_upload(&f->sh_up, 1, &f->d_su, &e) ||
            lily_cuda_dmat_upload(&f->sh_down, 1, &f->d_sd, &e))
            return pt_ok(-1, "upload shared", &e), -1;
        f->m.sh_gate = &f->d_sg, f->m.sh_up = &f->d_su, f->m.sh_down = &f->d_sd;
        if (has_sg) {
            f->sh_gw = pt_mat(LILY_DT_Q8, 1, H);
            if (lily_cuda_dmat_upload(&f->sh_gw, 1, &f->d_sgw, &e))
                return pt_ok(-1, "upload shared gate", &e), -1;
            f->m.sh_gate_w = &f->d_sgw;
        }
    }
    return 0;
}

/* The stacked form the backend uploads (lily_cuda_moe.router_gw, .sh_gu): router over the shared
 * gate row and shared gate over up, one allocation each, the matrices as views of their rows. */
static int fix_stack(moe_fix *f) {
    lily_err e;
    if (f->E && f->has_sg) {
        const lily_mat ms[2] = {f->router, f->sh_gw};
        lily_dmat v[2];
        if (!pt_ok(lily_cuda_dmat_upload_cat(ms, 2, &f->d_rgw, v, &e), "stack router/shared gate",
                   &e))
            return -1;
        f->v_router = v[0], f->v_sgw = v[1];
        f->m.router = &f->v_router, f->m.sh_gate_w = &f->v_sgw, f->m.router_gw = &f->d_rgw;
    }
    if (f->Is) {
        const lily_mat ms[2] = {f->sh_gate, f->sh_up};
        lily_dmat v[2];
        if (!pt_ok(lily_cuda_dmat_upload_cat(ms, 2, &f->d_sgu, v, &e), "stack shared gate/up", &e))
            return -1;
        f->v_sg = v[0], f->v_su = v[1];
        f->m.sh_gate = &f->v_sg, f->m.sh_up = &f->v_su, f->m.sh_gu = &f->d_sgu;
    }
    return 0;
}

static void fix_free(moe_fix *f) {
    lily_cuda_dmat_free(&f->d_rgw), lily_cuda_dmat_free(&f->d_sgu);
    for (int x = 0; x < f->E; x++) {
        pt_mat_free(&f->gate[x]), pt_mat_free(&f->up[x]), pt_mat_free(&f->down[x]);
    }
    free(f->gate), free(f->up), free(f->down), free(f->norm_w);
    pt_mat_free(&f->router), pt_mat_free(&f->sh_gate), pt_mat_free(&f->sh_up);
    pt_mat_free(&f->sh_down), pt_mat_free(&f->sh_gw);
    lily_cuda_dmat_free(&f->d_router), lily_cuda_dmat_free(&f->d_gate);
    lily_cuda_dmat_free(&f->d_up), lily_cuda_dmat_free(&f->d_down), lily_cuda_dmat_free(&f->d_sg);
    lily_cuda_dmat_free(&f->d_su), lily_cuda_dmat_free(&f->d_sd), lily_cuda_dmat_free(&f->d_sgw);
}

static void swiglu_h(const lily_mat *g, const lily_mat *u, const lily_mat *d, const float *x, int H,
                     float *out) {
    int I = g->rows;
    float *a = malloc(I * 4), *b = malloc(I * 4);
    lily_cpu_matmul(pt_cpu(), g, x, 1, H, a, I, NULL);
    lily_cpu_matmul(pt_cpu(), u, x, 1, H, b, I, NULL);
    for (int i = 0; i < I; i++)
        a[i] = silu_h(a[i]) * b[i];
    lily_cpu_matmul(pt_cpu(), d, a, 1, I, out, H, NULL);
    free(a), free(b);
}

/* CPU block output for normed rows u [n][H] with the given routing; adds into x. Also returns
 * the CPU's own top-k (cidx) when cidx != NULL. */
static void moe_ref(moe_fix *f, const float *u, int n, const int *idx, const float *wt, float *x,
                    int *cidx) {
    int H = f->H, k = f->k, E = f->E;
    float *y = malloc(H * 4), *acc = malloc(H * 4), *lg = malloc((E + 1) * 4);
    float *cw = malloc((k + 1) * 4);
    for (int t = 0; t < n; t++) {
        const float *ut = u + (size_t)t * H;
        memset(acc, 0, H * 4);
        if (f->Is) {
            swiglu_h(&f->sh_gate, &f->sh_up, &f->sh_down, ut, H, y);
            float gte = 1.0f;
            if (f->has_sg) {
                float l;
                lily_cpu_matmul(pt_cpu(), &f->sh_gw, ut, 1, H, &l, 1, NULL);
                gte = sig(l);
            }
            for (int i = 0; i < H; i++)
                acc[i] = gte * y[i];
        }
        if (cidx) {
            lily_cpu_matmul(pt_cpu(), &f->router, ut, 1, H, lg, E, NULL);
            lily_cpu_topk_softmax(lg, E, k, 1, cidx + (size_t)t * k, cw);
        }
        for (int j = 0; j < k; j++) {
            int ex = idx[(size_t)t * k + j];
            swiglu_h(&f->gate[ex], &f->up[ex], &f->down[ex], ut, H, y);
            for (int i = 0; i < H; i++)
                acc[i] += wt[(size_t)t * k + j] * y[i];
        }
        for (int i = 0; i < H; i++)
            x[(size_t)t * H + i] += acc[i];
    }
    free(y), free(acc), free(lg), free(cw);
}

/* The fused router allowed (1, the default) or not (0) for the launches that follow. */
static void set_fused(int on) {
    lily_cuda_moe_force_unfused(!on);
}

/* Whether the fixture's decode should take the fused-router path when the switch is on: the
 * fixtures have a Q8 router and Q4 experts, so it is the tensor-core gate/up kernel's shapes
 * (and every grid here is small enough to be resident). */
static int expect_fused(const moe_fix *f) {
    return f->k > 0 && f->H % 256 == 0;
}

/* One decode step of x [H] on scratch scr: the output, and the routing when k > 0. */
static int dec_run(moe_fix *f, const float *x, const float *dw, void *scr, float *got, int *gidx,
                   float *gwt) {
    lily_err e;
    float *dx = pt_dup(x, f->H);
    int rc = lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr, NULL, &e);
    if (!pt_ok(rc, "moe decode launch", &e)) return lily_cuda_free(dx), -1;
    if (f->k) {
        lily_cuda_sync(&e);
        lily_cuda_d2h(gidx, lily_cuda_moe_decode_idx(&f->m, scr), f->k * 4, &e);
        lily_cuda_d2h(gwt, lily_cuda_moe_decode_wt(&f->m, scr), f->k * 4, &e);
    }
    pt_get(got, dx, f->H);
    lily_cuda_free(dx);
    return 0;
}

/* The decode step with the router GEMV (fused 0) and with the router fused into the gate/up
 * launch (fused 1), each twice on one scratch that starts poisoned: with the switch on, the
 * first step finds no barrier tag and computes the router per block, the second goes through
 * the grid barrier (moe_router.cuh). Every step is checked against the CPU; the fused steps
 * must also route exactly as the unfused one and give the same output (the kernels are
 * designed to be bit-identical; the count of differing floats is printed). */
static void decode_case(moe_fix *f) {
    char name[200];
    int H = f->H, k = f->k;
    float *x = malloc(H * 4), *u = malloc(H * 4);
    pt_fill(x, H, 2.0f);
    lily_cpu_rmsnorm(x, f->norm_w, H, 1e-6f, u);
    float *dw = pt_dup(f->norm_w, H);
    float *got[2][2], *ref = malloc(H * 4);
    int gidx[2][2][32] = {{{0}}}, cidx[32] = {0};
    float gwt[2][2][32] = {{{0}}}, cw[32] = {0};
    if (k) {
        float *lg = malloc(f->E * 4);
        lily_cpu_matmul(pt_cpu(), &f->router, u, 1, H, lg, f->E, NULL);
        lily_cpu_topk_softmax(lg, f->E, k, 1, cidx, cw);
        free(lg);
    }
    for (int fu = 0; fu < 2; fu++) {
        set_fused(fu);
        int fuses = lily_cuda_moe_decode_fuses(&f->m);
        snprintf(name, sizeof name, "moe decode E=%d k=%d H=%d fused router %s (switch %d)", f->E,
                 k, H, fuses ? "on" : "off", fu);
        pt_check_true(name, fuses == (fu && expect_fused(f)));
        void *scr = pt_dalloc(lily_cuda_moe_decode_scratch(&f->m));
        /* a recycled allocation: a valid barrier tag over a count that is not zero */
        const uint32_t stale[2] = {37u, 0x7fa11e5du};
        lily_err ei;
        pt_ok(lily_cuda_h2d(scr, stale, sizeof stale, &ei) ||
                  lily_cuda_moe_decode_scratch_init(scr, NULL, &ei),
              "moe decode scratch init", &ei);
        for (int call = 0; call < 2; call++) {
            const char *tag = fu ? (call ? " [fused, barrier]" : " [fused, first step]")
                                 : (call ? " [unfused, again]" : " [unfused]");
            got[fu][call] = malloc(H * 4);
            if (dec_run(f, x, dw, scr, got[fu][call], gidx[fu][call], gwt[fu][call])) {
                memset(got[fu][call], 0, H * 4);
                continue;
            }
            memcpy(ref, x, H * 4);
            moe_ref(f, u, 1, gidx[fu][call], gwt[fu][call], ref, NULL);
            if (k) {
                int same = 1;
                for (int j = 0; j < k; j++)
                    same &= gidx[fu][call][j] == cidx[j];
                snprintf(name, sizeof name, "moe decode routing E=%d k=%d matches the CPU top-k%s",
                         f->E, k, tag);
                pt_check_true(name, same);
                snprintf(name, sizeof name, "moe decode routing weights E=%d k=%d%s", f->E, k, tag);
                pt_check(name, gwt[fu][call], cw, k, 1e-4);
            }
            snprintf(name, sizeof name, "moe decode out E=%d k=%d H=%d I=%d Is=%d%s%s", f->E, k, H,
                     f->I, f->Is, f->has_sg ? " gated shared" : "", tag);
            pt_check(name, got[fu][call], ref, H, 1e-4);
        }
        lily_cuda_free(scr);
    }
    for (int call = 0; call < 2; call++) {
        int same = !memcmp(gidx[0][0], gidx[1][call], sizeof gidx[0][0]) &&
                   !memcmp(gwt[0][0], gwt[1][call], sizeof gwt[0][0]);
        int diff = 0;
        for (int i = 0; i < H; i++)
            diff += memcmp(&got[0][0][i], &got[1][call][i], 4) != 0;
        snprintf(name, sizeof name,
                 "moe decode E=%d k=%d H=%d fused step %d routes as unfused "
                 "(idx, wt bitwise)",
                 f->E, k, H, call + 1);
        pt_check_true(name, same);
        snprintf(name, sizeof name,
                 "moe decode E=%d H=%d fused step %d vs unfused (%d of %d differ)", f->E, H,
                 call + 1, diff, H);
        pt_check(name, got[1][call], got[0][0], H, 1e-6);
    }
    set_fused(0);
    for (int fu = 0; fu < 2; fu++)
        free(got[fu][0]), free(got[fu][1]);
    lily_cuda_free(dw);
    free(x), free(u), free(ref);
}

/* The fused router under CUDA graph replay, as the backend runs it: two MoE "layers" on one
 * scratch captured into a graph with the switch on, replayed three times from the same input.
 * Replay 1 starts on a new scratch (poisoned, its barrier pair zeroed by
 * lily_cuda_moe_decode_scratch_init: layer 1 without the barrier tag, layer 2 with the tag
 * that layer 1's down kernel wrote); replays 2 and 3 reuse the self-resetting barrier. Each must
 * equal the same two layers run eagerly through the router GEMV. */
static void graph_case(moe_fix *f) {
    lily_err e;
    char name[200];
    int H = f->H, k = f->k;
    float *x = malloc(H * 4), *want = malloc(H * 4), *got = malloc(H * 4);
    int widx[32] = {0}, gidx[32] = {0};
    pt_fill(x, H, 2.0f);
    float *dw = pt_dup(f->norm_w, H), *dx = pt_dup(x, H);
    size_t sb = lily_cuda_moe_decode_scratch(&f->m);
    set_fused(0);
    void *scr0 = pt_dalloc(sb);
    int rc = lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr0, NULL, &e) ||
             lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr0, NULL, &e);
    if (!pt_ok(rc, "moe decode (graph reference)", &e)) return;
    pt_get(want, dx, H);
    lily_cuda_d2h(widx, lily_cuda_moe_decode_idx(&f->m, scr0), k * 4, &e);
    set_fused(1);
    void *scr = pt_dalloc(sb);
    if (lily_cuda_moe_decode_scratch_init(scr, NULL, &e) || lily_cuda_sync(&e))
        return (void)pt_ok(-1, "init, sync", &e); /* the poison and init (legacy stream) */
    cudaStream_t st = NULL;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ge = NULL;
    int ok = cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess &&
             cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed) == cudaSuccess;
    if (ok) {
        rc = lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr, st, &e) ||
             lily_cuda_moe_decode(&f->m, dx, dw, 1e-6f, scr, st, &e);
        ok = cudaStreamEndCapture(st, &g) == cudaSuccess && !rc &&
             cudaGraphInstantiate(&ge, g, 0) == cudaSuccess;
    }
    if (rc) printf("     capture: %s\n", e.msg);
    snprintf(name, sizeof name, "moe decode E=%d H=%d: two fused layers captured in a graph", f->E,
             H);
    pt_check_true(name, ok && lily_cuda_moe_decode_fuses(&f->m) == expect_fused(f));
    for (int rep = 0; ok && rep < 3; rep++) {
        ok = cudaMemcpyAsync(dx, x, H * 4, cudaMemcpyHostToDevice, st) == cudaSuccess &&
             cudaGraphLaunch(ge, st) == cudaSuccess && cudaStreamSynchronize(st) == cudaSuccess;
        if (!ok) {
            snprintf(name, sizeof name, "moe decode graph replay %d: %s", rep + 1,
                     cudaGetErrorString(cudaGetLastError()));
            pt_check_true(name, 0);
            break;
        }
        pt_get(got, dx, H);
        lily_cuda_d2h(gidx, lily_cuda_moe_decode_idx(&f->m, scr), k * 4, &e);
        snprintf(name, sizeof name, "moe decode graph replay %d routes layer 2 as unfused",
                 rep + 1);
        pt_check_true(name, !memcmp(gidx, widx, sizeof gidx));
        snprintf(name, sizeof name, "moe decode graph replay %d (fused) vs eager unfused", rep + 1);
        pt_check(name, got, want, H, 1e-6);
    }
    if (ge) cudaGraphExecDestroy(ge);
    if (g) cudaGraphDestroy(g);
    if (st) cudaStreamDestroy(st);
    set_fused(0);
    lily_cuda_free(dw), lily_cuda_free(dx), lily_cuda_free(scr0), lily_cuda_free(scr);
    free(x), free(want), free(got);
}

/* mode 0: computed routing; 1: every token on experts 0..k-1; 2: skewed random. */
static void prefill_case(moe_fix *f, int n, int mode) {
    lily_err e;
    char name[160];
    int H = f->H, k = f->k, E = f->E;
    size_t nh = (size_t)n * H;
    float *x = malloc(nh * 4), *u = malloc(nh * 4);
    pt_fill(x, nh, 1.0f);
    pt_fill(u, nh, 1.5f);
    int *idx = malloc((size_t)n * (k + 1) * 4), *cidx = malloc((size_t)n * (k + 1) * 4);
    float *wt = malloc((size_t)n * (k + 1) * 4);
    if (mode) {
        for (int t = 0; t < n; t++) {
            float s = 0;
            for (int j = 0; j < k; j++) {
                int ex;
                if (mode == 1)
                    ex = j;
                else
                    do {
                        ex = (pt_rnd() % 4 == 0) ? (int)(pt_rnd() % E) : (int)(pt_rnd() % 3);
                        for (int i = 0; i < j; i++)
                            if (idx[(size_t)t * k + i] == ex) ex = -1;
                    } while (ex < 0);
                idx[(size_t)t * k + j] = ex;
                wt[(size_t)t * k + j] = 0.1f + fabsf(pt_frand());
                s += wt[(size_t)t * k + j];
            }
            for (int j = 0; j < k; j++)
                wt[(size_t)t * k + j] /= s;
        }
    }
    float *du = pt_dup(u, nh), *dx = pt_dup(x, nh);
    void *scr = pt_dalloc(lily_cuda_moe_prefill_scratch(&f->m, n));
    int rc;
    if (mode) {
        float *didx = pt_dup((const float *)idx, (size_t)n * k), *dwt = pt_dup(wt, (size_t)n * k);
        rc = lily_cuda_moe_prefill_routed(&f->m, du, n, (const int32_t *)didx, dwt, dx, scr, NULL,
                                          &e);
        lily_cuda_sync(&e);
        lily_cuda_free(didx), lily_cuda_free(dwt);
    } else {
        rc = lily_cuda_moe_prefill(&f->m, du, n, dx, scr, NULL, &e);
        if (k) {
            lily_cuda_sync(&e);
            lily_cuda_d2h(idx, lily_cuda_moe_prefill_idx(&f->m, n, scr), (size_t)n * k * 4, &e);
            lily_cuda_d2h(wt, lily_cuda_moe_prefill_wt(&f->m, n, scr), (size_t)n * k * 4, &e);
        }
    }
    if (!pt_ok(rc, "moe prefill launch", &e)) return;
    float *ref = malloc(nh * 4), *got = malloc(nh * 4);
    memcpy(ref, x, nh * 4);
    moe_ref(f, u, n, idx, wt, ref, mode == 0 && k ? cidx : NULL);
    if (mode == 0 && k) {
        int same = 0;
        for (int i = 0; i < n * k; i++)
            same += idx[i] == cidx[i];
        snprintf(name, sizeof name, "moe prefill routing n=%d: %d of %d picks as on the CPU", n,
                 same, n * k);
        /* the router GEMM is exact to ~1e-4 (fp16 weights, split activations): a flip would take
         * a near tie */
        pt_check_true(name, same >= n * k * 99 / 100);
    }
    pt_get(got, dx, nh);
    static const char *modes[] = {"routed on GPU", "all tokens on experts 0..k-1", "skewed"};
    snprintf(name, sizeof name, "moe prefill out E=%d k=%d H=%d I=%d n=%d %s", E, k, H, f->I, n,
             k ? modes[mode] : "dense");
    pt_check(name, got, ref, nh, 2e-3);
    lily_cuda_free(du), lily_cuda_free(dx), lily_cuda_free(scr);
    free(x), free(u), free(idx), free(cidx), free(wt), free(ref), free(got);
}

int main(void) {
    pt_need_gpu();
    moe_fix f;
    if (fix_make(&f, 32, 8, 2048, 512, 512, 1)) return pt_finish();
    decode_case(&f);
    decode_case(&f);
    prefill_case(&f, 1, 0);
    prefill_case(&f, 77, 0);
    prefill_case(&f, 300, 1);
    prefill_case(&f, 129, 2);
    /* the same weights stacked as the backend uploads them: the router and the shared gate
     * logit in one GEMM, the shared gate and up in one; then the views one GEMM each */
    if (fix_stack(&f)) return pt_finish();
    decode_case(&f);
    prefill_case(&f, 77, 0);
    prefill_case(&f, 129, 2);
    fix_free(&f);
    if (fix_make(&f, 256, 8, 256, 128, 128, 1)) return pt_finish();
    decode_case(&f);
    prefill_case(&f, 200, 0);
    prefill_case(&f, 64, 1);
    prefill_case(&f, 1000, 2); /* 8000 assignments: 16 scatter chunks, skewed */
    fix_free(&f);
    if (fix_make(&f, 16, 2, 320, 192, 0, 0)) return pt_finish();
    decode_case(&f);
    prefill_case(&f, 33, 0);
    prefill_case(&f, 50, 2);
    prefill_case(&f, 600, 0); /* 1200 assignments over 16 experts: the 64-row tiles */
    prefill_case(&f, 700, 2);
    fix_free(&f);
    if (fix_make(&f, 32, 4, 256, 128, 192, 1)) return pt_finish(); /* Is != I */
    decode_case(&f);
    prefill_case(&f, 65, 0);
    if (fix_stack(&f)) return pt_finish();
    prefill_case(&f, 65, 0);
    fix_free(&f);
    if (fix_make(&f, 0, 0, 512, 0, 1344, 0)) return pt_finish();
    decode_case(&f);
    prefill_case(&f, 45, 0);
    if (fix_stack(&f)) return pt_finish(); /* a dense MLP's gate and up as one */
    decode_case(&f);
    prefill_case(&f, 45, 0);
    fix_free(&f);
    /* fused-router shapes: the 35B's grid (16 x 9 = 144 blocks, fewer router rows than blocks),
     * no shared expert, a shared expert without its gate (H = 768: 16 lanes per router row),
     * and 1024 experts + the gate row over 6 blocks (many rows per warp) */
    if (fix_make(&f, 64, 8, 2048, 512, 512, 1)) return pt_finish();
    decode_case(&f);
    graph_case(&f);
    /* the 35B's expert shapes in prefill: 24 tokens x top-8 over 64 experts (~3 rows each: the
     * skinny 16-row tiles), skewed (a few experts with several tiles), and the 32-row tiles */
    prefill_case(&f, 24, 0);
    prefill_case(&f, 24, 2);
    fix_free(&f);
    if (fix_make(&f, 64, 6, 512, 256, 0, 0)) return pt_finish();
    decode_case(&f);
    fix_free(&f);
    if (fix_make(&f, 40, 3, 768, 320, 256, 0)) return pt_finish();
    decode_case(&f);
    fix_free(&f);
    if (fix_make(&f, 1024, 2, 256, 64, 64, 1)) return pt_finish();
    decode_case(&f);
    graph_case(&f);
    fix_free(&f);
    return pt_finish();
}
#endif
