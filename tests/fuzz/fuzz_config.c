/* libFuzzer target: arbitrary bytes as config.json, with the MLX quantization table. Anything
 * accepted must be internally consistent (the checks the loader relies on). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/err.h"
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    lily_config c;
    lily_qconfig q;
    lily_err err;
    if (lily_config_parse((const char *)data, size, "config.json", &c, &q, &err) == 0) {
        LILY_ASSERT(c.hidden > 0 && c.n_layers > 0 && c.n_layers <= LILY_MAX_LAYERS);
        LILY_ASSERT(c.n_q_heads % c.n_kv_heads == 0);
        LILY_ASSERT(c.rope_dim >= 2 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim);
        LILY_ASSERT(!c.is_moe || (c.top_k >= 1 && c.top_k <= c.n_experts));
        LILY_ASSERT(lily_config_n_attn(&c) == c.n_layers || c.lin_nv % c.lin_nk == 0);
        int bits, group;
        lily_qconfig_lookup(&q, "language_model.model.layers.0.mlp.gate", &bits, &group);
        lily_qconfig_free(&q);
    }
    return 0;
}
