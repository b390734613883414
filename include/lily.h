/* lily: the public engine API. Front ends (CLI, server, bench, tests) include only this header.
 *
 * A lily_engine is a loaded model (weights mapped or uploaded once, read-only afterwards). A
 * lily_session is one timeline over that model: it owns all mutable state (the KV cache of every
 * attention layer, the conv and fp32 recurrent state of every Gated DeltaNet layer, the logits of
 * the last position). Tokens are appended with lily_session_prefill (a batch) or
 * lily_session_decode (one token). Because the recurrent state cannot be truncated, a session
 * cannot be rewound; instead its full state can be saved in a lily_snapshot and restored later.
 *
 * Conventions: every call that can fail returns 0 on success and -1 on failure, with a message in
 * the caller's lily_err (which may be NULL). Objects are freed by the _free and _close calls, which accept
 * NULL. Nothing here allocates per decoded token. */
#ifndef LILY_H
#define LILY_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lily_err {
    char msg[512];
} lily_err;

typedef struct lily_engine lily_engine;
typedef struct lily_session lily_session;
typedef struct lily_snapshot lily_snapshot;

typedef enum lily_backend_kind {
    LILY_BACKEND_CPU = 0,
    LILY_BACKEND_CUDA = 1,
} lily_backend_kind;

/* How the backend's products are computed. */
typedef enum lily_precision {
    /* The backend's default: the CPU multiplies 4-bit weights with activations quantised to
     * 16-bit codes (int16 products on AVX-512 VNNI and AVX2, fp32 otherwise); CUDA multiplies once
     * in the prefill GEMMs (the 4-bit ones on fp16 activations with a row scale, the others on
     * bf16) and in attention (bf16), as FAST. Every default path passes the trained
     * model's quality gate (BENCHMARKS.md). */
    LILY_PRECISION_DEFAULT = 0,
    /* Reference arithmetic: the CPU keeps every product in fp32 (what the GPU parity tests
     * compare against); CUDA splits GEMM activations into fp16 hi + lo and attention operands
     * into exact parts (~1e-5 of the fp32 CPU reference). */
    LILY_PRECISION_EXACT = 1,
    /* CUDA as DEFAULT (operands multiplied once in the prefill GEMMs and attention); the
     * CPU as DEFAULT but with 8-bit activations in the decode products (BENCHMARKS.md gives the
     * quality of each). */
    LILY_PRECISION_FAST = 2,
} lily_precision;

/* The highest instruction set the CPU backend's kernels use (never more than the CPU has). */
typedef enum lily_cpu_isa {
    LILY_CPU_ISA_AUTO = 0,   /* the best the CPU has */
    LILY_CPU_ISA_AVX512 = 1, /* the AVX-512 (and VNNI) kernels where the CPU has them */
    LILY_CPU_ISA_AVX2 = 2,   /* at most AVX2 + FMA */
    LILY_CPU_ISA_SCALAR = 3, /* plain C */
} lily_cpu_isa;

/* Where lily_session_draw_enqueue and lily_session_decode_sample draw tokens. */
typedef enum lily_sample_on {
    LILY_SAMPLE_ON_AUTO = 0,    /* the backend's choice: CUDA draws itself, the CPU does not */
    LILY_SAMPLE_ON_BACKEND = 1, /* the backend draws (the CPU too: the GPU sampler's reference) */
    LILY_SAMPLE_ON_HOST = 2,    /* no backend draws: callers sample from lily_session_logits */
} lily_sample_on;

/* Zero-initialise and set what you need; zero fields take the defaults given. */
typedef struct lily_engine_opts {
    lily_backend_kind backend; /* default CPU */
    int n_threads;             /* CPU worker threads; 0 = one per online core */
    int prefill_chunk;         /* tokens per prefill step; 0 = the backend's (CPU 512, CUDA 8192) */
    int device;                /* CUDA device ordinal */
    lily_precision precision;  /* default LILY_PRECISION_DEFAULT */
    lily_cpu_isa cpu_isa;      /* CPU backend only; default LILY_CPU_ISA_AUTO */
    lily_sample_on sample_on;  /* default LILY_SAMPLE_ON_AUTO */
    /* Experimental (issue 32), CUDA only: non-zero runs each decode step as one persistent,
     * dataflow-scheduled kernel (backend/cuda/mega.h) instead of the per-op launches. This switch
     * is removed once one of the two paths wins. */
    int cuda_mega;
    /* Progress while loading (done/total bytes); may be NULL. */
    void (*progress)(void *ud, uint64_t done, uint64_t total);
    void *progress_ud;
} lily_engine_opts;

/* What a loaded model is. Strings are borrowed from the engine. */
typedef struct lily_model_info {
    const char *model_type; /* "qwen3_5_moe" or "qwen3_5" */
    const char *layout;     /* "hf" or "mlx" */
    const char *quant;      /* "bf16", "mlx-4bit", "mlx-8bit", ... */
    const char *backend;    /* "cpu" or "cuda" */
    int vocab_size;         /* logits per position */
    int hidden_size;
    int n_layers;
    int n_attn_layers;              /* full attention layers; the rest are Gated DeltaNet */
    int n_experts, n_experts_used;  /* 0 for dense models */
    int max_position;               /* max_position_embeddings */
    int eos_ids[4];                 /* end-of-sequence token ids from the config, -1 padded */
    uint64_t n_params;              /* text-model parameters */
    uint64_t weight_bytes;          /* bytes of all text-model weights as stored */
    uint64_t bytes_per_token;       /* weight bytes read per decoded token (active experts only) */
    uint64_t kv_bytes_per_token;    /* KV cache growth per token of context (bf16 K and V) */
    uint64_t flops_per_token;       /* 2 x active matrix weights per token, lm_head excluded */
    uint64_t lm_head_flops;         /* 2 x lm_head weights (one position's logits) */
    uint64_t attn_flops_per_ctx;    /* attention scores + values per token per context position */
    uint64_t recurrent_state_bytes; /* GDN conv + recurrent state, independent of context */
    uint64_t file_bytes;            /* bytes of the weight files (what loading reads) */
    int n_threads;                  /* CPU worker threads (n_threads resolved) */
    const char *device;             /* the CPU's model name, or the GPU's name on CUDA */
} lily_model_info;

/* Opens the model directory dir (config.json + *.safetensors). */
int lily_engine_open(const char *dir, const lily_engine_opts *opts, lily_engine **out,
                     lily_err *err);
void lily_engine_close(lily_engine *eng);
/* Borrowed, valid until lily_engine_close. */
const lily_model_info *lily_engine_info(const lily_engine *eng);
/* Bytes the state of a session with room for max_ctx tokens takes on the backend (KV cache of
 * the attention layers, GDN conv and recurrent states). */
size_t lily_engine_session_bytes(const lily_engine *eng, int max_ctx);
/* Bytes of the backend's device memory in use now (weights, states, scratch; the driver's
 * count, other processes' included); 0 for the CPU backend or when the driver cannot tell. */
size_t lily_engine_device_used(const lily_engine *eng);

/* A session with room for max_ctx tokens of context (0 = min(max_position, 4096)). */
int lily_session_create(lily_engine *eng, int max_ctx, lily_session **out, lily_err *err);
void lily_session_free(lily_session *s);
/* Number of tokens consumed so far. */
int lily_session_pos(const lily_session *s);
int lily_session_max_ctx(const lily_session *s);
/* Forgets everything: back to an empty context. */
void lily_session_reset(lily_session *s);

/* Called after each prefill chunk with tokens done so far; return non-zero to cancel (the
 * session then holds the tokens consumed up to that chunk, and the call returns -1 with
 * "cancelled"). */
typedef int (*lily_prefill_cb)(void *ud, int done, int total);

/* Consumes n tokens. If all_logits is non-NULL it receives [n][vocab] floats (row i = logits
 * after token i); the last row is always available from lily_session_logits afterwards. */
int lily_session_prefill(lily_session *s, const int32_t *tokens, int n, float *all_logits,
                         lily_prefill_cb cb, void *ud, lily_err *err);
/* Consumes one token (the decode path). */
int lily_session_decode(lily_session *s, int32_t token, lily_err *err);
/* One decode step over several sessions at once (continuous batching): session ss[i] consumes
 * tokens[i], 1 <= n <= LILY_MAX_ROWS, all sessions of one engine and distinct. Afterwards each
 * session's logits are on the host (lily_session_logits), exactly those lily_session_decode
 * would give that session alone (bit for bit: a row's result never depends on the other rows).
 * A backend with a batched step reads the weights once for all rows; otherwise the engine runs
 * the sessions one after another. Everything is checked before any session moves; when the
 * backend then fails, every session of the call must be reset. */
#define LILY_MAX_ROWS 8
int lily_session_decode_rows(lily_session *const *ss, const int32_t *tokens, int n, lily_err *err);
/* Greedy decoding of n steps: step i consumes token (i == 0) or out[i-1] and writes the argmax
 * of the logits after it (lowest index on ties) to out[i]; out[n-1] is not consumed. Same
 * results as n lily_session_decode calls with a host argmax; on the CUDA backend the steps run
 * back to back on the device (the graph of a step feeds its argmax into the next). */
int lily_session_decode_greedy(lily_session *s, int32_t token, int n, int32_t *out, lily_err *err);
/* Drawing a token on the backend (lily_session_decode_sample): sampler.h's chain without the
 * penalties (temperature <= 0: argmax; top_k <= 0, top_p outside (0, 1), min_p <= 0: off), ids a
 * draw must never return, and which random numbers to use. */
typedef struct lily_draw {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    int n_ids;     /* ids >= n_ids are never drawn (padding rows); <= 0: none excluded */
    int ban_id;    /* an id never drawn, or -1 */
    uint64_t seed; /* with step: the random numbers of the draw */
    uint64_t step; /* the caller counts its draws (the same seed and step draw the same token) */
    /* A grammar's mask for this step (constrained decoding), or NULL: only ids i < n_allow whose
     * bit i % 32 of allow[i / 32] is set may be drawn, as if the others' logits were -inf.
     * Borrowed for the call only (the backend copies it). A masked step cannot run ahead of the
     * token before it (its mask depends on that token): lily_session_draw_enqueue with allow
     * needs every earlier draw of the session read. */
    const uint32_t *allow;
    int n_allow; /* 1 <= n_allow <= vocab when allow is set */
} lily_draw;
/* Non-zero when the backend draws tokens itself (CUDA, or any backend opened with
 * LILY_SAMPLE_ON_BACKEND; never with LILY_SAMPLE_ON_HOST); otherwise decode and sample on the
 * host from lily_session_logits. */
int lily_session_can_decode_sample(const lily_session *s);
/* Consumes token, then draws the next token from that step's logits on the backend under d,
 * without bringing the logits to the host: lily_session_logits returns NULL until a call that
 * brings them (prefill, decode). Fails when the backend cannot draw, or nothing is drawable.
 * Drops the session's unread pipelined draws first. */
int lily_session_decode_sample(lily_session *s, int32_t token, const lily_draw *d, int32_t *next,
                               lily_err *err);
/* Pipelined draws (a streaming loop): lily_session_draw_enqueue consumes token, or when token < 0
 * the token the previous call drew (it stays on the device: it becomes the step's input there),
 * and draws the next one under d, without waiting; the position advances at once.
 * lily_session_draw_next waits for the oldest draw not yet read. So the host can enqueue the
 * step that consumes draw n before it has read draw n, and handle it (detokenize, stream) while
 * that step runs; a token it then rejects has been consumed all the same. At most
 * LILY_DRAW_AHEAD draws may be unread. token < 0 requires that the previous call on the session
 * was lily_session_draw_enqueue; any other call on the session drops the unread draws. */
#define LILY_DRAW_AHEAD 2
int lily_session_draw_enqueue(lily_session *s, int32_t token, const lily_draw *d, lily_err *err);
int lily_session_draw_next(lily_session *s, int32_t *next, lily_err *err);
/* lily_session_draw_enqueue for n sessions in one step (continuous batching; 1 <= n <=
 * LILY_MAX_ROWS, one engine, distinct): ss[i] consumes tokens[i] (< 0: its previous draw) and
 * draws under d[i], which must carry no mask. Each session's draw is the one it would get alone
 * (the same seed and step draw the same token); read them with lily_session_draw_next. A backend
 * with a batched step reads the weights once for all rows. Everything is checked before any
 * session moves; when the backend then fails, the sessions' unread draws are dropped and each
 * session of the call must be reset. */
int lily_session_draw_enqueue_rows(lily_session *const *ss, const int32_t *tokens,
                                   const lily_draw *d, int n, lily_err *err);
/* Logits after the last consumed token, [vocab] (NULL when none are on the host: an empty
 * session, or after lily_session_decode_sample). Borrowed, valid until the next call on s. */
const float *lily_session_logits(lily_session *s);

/* Snapshots hold a session's full state (KV up to pos, conv and recurrent states, logits). */
int lily_session_snapshot(lily_session *s, lily_snapshot **out, lily_err *err);
/* Restores s to the snapshot's state; s must belong to the same engine with max_ctx >= the
 * snapshot's position. */
int lily_session_restore(lily_session *s, const lily_snapshot *snap, lily_err *err);
/* Non-zero when the snapshot holds the logits after its last token (not after a device draw). */
int lily_snapshot_has_logits(const lily_snapshot *snap);
int lily_snapshot_pos(const lily_snapshot *snap);
size_t lily_snapshot_bytes(const lily_snapshot *snap);
void lily_snapshot_free(lily_snapshot *snap);

#ifdef __cplusplus
}
#endif

#endif
