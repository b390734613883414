/* The request log (see reqlog.h). */
#include "server/reqlog.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "gen/sb.h"

int lily_reqlog_parse_format(const char *s, lily_log_format *out) {
    if (!strcmp(s, "text"))
        *out = LILY_LOG_TEXT;
    else if (!strcmp(s, "json"))
        *out = LILY_LOG_JSON;
    else if (!strcmp(s, "none"))
        *out = LILY_LOG_NONE;
    else
        return -1;
    return 0;
}

void lily_reqlog_client(const struct sockaddr *sa, char *out, size_t n) {
    snprintf(out, n, "-");
    if (!sa) return;
    char a[INET6_ADDRSTRLEN];
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *v4 = (const struct sockaddr_in *)(const void *)sa;
        if (inet_ntop(AF_INET, &v4->sin_addr, a, sizeof a))
            snprintf(out, n, "%s:%u", a, (unsigned)ntohs(v4->sin_port));
    } else if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *v6 = (const struct sockaddr_in6 *)(const void *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
            if (inet_ntop(AF_INET, v6->sin6_addr.s6_addr + 12, a, sizeof a))
                snprintf(out, n, "%s:%u", a, (unsigned)ntohs(v6->sin6_port));
        } else if (inet_ntop(AF_INET6, &v6->sin6_addr, a, sizeof a)) {
            snprintf(out, n, "[%s]:%u", a, (unsigned)ntohs(v6->sin6_port));
        }
    }
}

double lily_reqlog_wall(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (double)now.tv_sec + now.tv_nsec * 1e-9;
}

void lily_reqlog_write(FILE *f, lily_log_format fmt, const lily_reqlog_entry *x) {
    if (fmt == LILY_LOG_NONE) return;
    time_t sec = (time_t)x->wall;
    struct tm tm;
    gmtime_r(&sec, &tm);
    char ts[40];
    size_t n = strftime(ts, sizeof ts, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + n, sizeof ts - n, ".%03dZ", (int)((x->wall - (double)sec) * 1000) % 1000);
    const char *client = x->client ? x->client : "-";
    lily_sb b = {0};
    if (fmt == LILY_LOG_JSON) {
        lily_sb_printf(&b, "{\"time\":\"%s\",\"client\":", ts);
        lily_sb_json_str(&b, client, strlen(client));
        lily_sb_puts(&b, ",\"method\":");
        lily_sb_json_str(&b, x->method, strlen(x->method));
        lily_sb_puts(&b, ",\"path\":");
        lily_sb_json_str(&b, x->path, strlen(x->path));
        lily_sb_printf(&b, ",\"status\":%d,", x->status);
        if (x->has_tokens)
            lily_sb_printf(&b, "\"prompt_tokens\":%d,\"cached_tokens\":%d,\"generated_tokens\":%d,",
                           x->n_prompt, x->n_cached, x->n_gen);
        else
            lily_sb_puts(&b, "\"prompt_tokens\":null,\"cached_tokens\":null,"
                             "\"generated_tokens\":null,");
        if (x->queue_s >= 0)
            lily_sb_printf(&b, "\"queue_s\":%.3f,", x->queue_s);
        else
            lily_sb_puts(&b, "\"queue_s\":null,");
        if (x->ttft_s >= 0)
            lily_sb_printf(&b, "\"ttft_s\":%.3f,", x->ttft_s);
        else
            lily_sb_puts(&b, "\"ttft_s\":null,");
        lily_sb_printf(&b, "\"total_s\":%.3f}\n", x->total_s);
    } else {
        /* the path is the client's: keep the line one line */
        lily_sb_printf(&b, "%s %s %s ", ts, client, x->method);
        for (const char *p = x->path; *p; p++)
            lily_sb_putc(&b, (unsigned char)*p <= ' ' || *p == 0x7f ? '?' : *p);
        lily_sb_printf(&b, " %d", x->status);
        if (x->has_tokens)
            lily_sb_printf(&b, " prompt=%d cached=%d gen=%d", x->n_prompt, x->n_cached, x->n_gen);
        if (x->queue_s >= 0) lily_sb_printf(&b, " queue=%.3fs", x->queue_s);
        if (x->ttft_s >= 0) lily_sb_printf(&b, " ttft=%.3fs", x->ttft_s);
        lily_sb_printf(&b, " total=%.3fs\n", x->total_s);
    }
    fwrite(lily_sb_str(&b), 1, b.len, f);
    fflush(f);
    lily_sb_free(&b);
}
