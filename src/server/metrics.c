/* Prometheus text export of the server counters (see metrics.h). */
#include "server/metrics.h"

#include <string.h>

void lily_metrics_init(lily_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void lily_metrics_destroy(lily_metrics *m) {
    pthread_mutex_destroy(&m->mu);
}

static void counter(lily_sb *o, const char *name, const char *help, const char *type, double v) {
    lily_sb_printf(o, "# HELP lily_%s %s\n# TYPE lily_%s %s\nlily_%s %.17g\n", name, help, name,
                   type, name, v);
}

void lily_metrics_text(lily_metrics *m, lily_sb *out) {
    pthread_mutex_lock(&m->mu);
    lily_metrics c = *m;
    pthread_mutex_unlock(&m->mu);
    counter(out, "requests_total", "HTTP requests answered.", "counter", (double)c.requests);
    counter(out, "requests_error_total", "HTTP requests answered with an error status.", "counter",
            (double)c.requests_error);
    counter(out, "generations_total", "Completions run.", "counter", (double)c.generations);
    counter(out, "cancelled_total", "Completions cancelled by a client disconnect.", "counter",
            (double)c.cancelled);
    counter(out, "rejected_busy_total", "Requests refused because the queue was full.", "counter",
            (double)c.rejected_busy);
    counter(out, "prompt_tokens_total", "Prompt tokens of completions.", "counter",
            (double)c.prompt_tokens);
    counter(out, "prefill_tokens_total", "Prompt tokens computed (not taken from the cache).",
            "counter", (double)c.prefill_tokens);
    counter(out, "cached_tokens_total", "Prompt tokens reused from the prefix cache.", "counter",
            (double)c.cached_tokens);
    counter(out, "cache_hits_total", "Completions that reused a cached prefix.", "counter",
            (double)c.cache_hits);
    counter(out, "generated_tokens_total", "Generated tokens.", "counter",
            (double)c.generated_tokens);
    counter(out, "prefill_seconds_total", "Time spent in prefill.", "counter", c.prefill_s);
    counter(out, "decode_seconds_total", "Time spent decoding.", "counter", c.decode_s);
    counter(out, "prefill_tokens_per_second", "Average prefill throughput.", "gauge",
            c.prefill_s > 0 ? (double)c.prefill_tokens / c.prefill_s : 0);
    counter(out, "decode_tokens_per_second", "Average decode throughput of one request.", "gauge",
            c.decode_s > 0 ? (double)c.generated_tokens / c.decode_s : 0);
    counter(out, "queue_depth", "Requests waiting for a slot.", "gauge", c.queue_depth);
    counter(out, "busy", "Slots running a request.", "gauge", c.busy);
    counter(out, "slots", "Slots (requests generating at once, --parallel).", "gauge", c.n_slots);
    counter(out, "decode_steps_total", "Decode steps (a token from each decoding slot).", "counter",
            (double)c.decode_steps);
    counter(out, "decode_rows_total", "Tokens taken by the decode steps.", "counter",
            (double)c.decode_rows);
    counter(out, "step_seconds_total", "Time in the decode steps.", "counter", c.step_s);
    counter(out, "aggregate_decode_tokens_per_second",
            "Tokens per second of the decode steps, all slots together.", "gauge",
            c.step_s > 0 ? (double)c.decode_rows / c.step_s : 0);
    counter(out, "queue_waits_total", "Requests that waited for a slot.", "counter",
            (double)c.queued);
    counter(out, "queue_seconds_total", "Time requests waited for a slot.", "counter", c.queue_s);
    static const char *const slot_help[][3] = {
        {"slot_busy", "1 while the slot runs a request.", "gauge"},
        {"slot_requests_total", "Requests started on the slot.", "counter"},
        {"slot_generated_tokens_total", "Tokens generated on the slot.", "counter"},
        {"slot_busy_seconds_total", "Time the slot held a request (occupancy: its rate).",
         "counter"},
        {"slot_tokens_per_second",
         "Generated tokens per second of the slot's current (else "
         "last) request.",
         "gauge"}};
    for (int k = 0; k < 5; k++) {
        lily_sb_printf(out, "# HELP lily_%s %s\n# TYPE lily_%s %s\n", slot_help[k][0],
                       slot_help[k][1], slot_help[k][0], slot_help[k][2]);
        for (int i = 0; i < c.n_slots && i < LILY_METRICS_SLOTS; i++) {
            const struct lily_slot_metrics *x = &c.slot[i];
            const double v = k == 0   ? x->busy
                             : k == 1 ? (double)x->requests
                             : k == 2 ? (double)x->tokens
                             : k == 3 ? x->busy_s
                                      : x->tps;
            lily_sb_printf(out, "lily_%s{slot=\"%d\"} %.17g\n", slot_help[k][0], i, v);
        }
    }
    counter(out, "cache_entries", "Snapshots in the prefix cache.", "gauge", c.cache_entries);
    counter(out, "cache_bytes", "Bytes held by the prefix cache.", "gauge", (double)c.cache_bytes);
}
