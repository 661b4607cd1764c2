/* run_summary.c - fuzz entry point for what a registry version's page draws from an uploaded
 * archive: the bytes as JSON, drawn as a run summary (web/version.c: series of steps and
 * values, events, movers, layer counts, every type checked and every count bounded) and as a
 * validation report (checks, the baseline's link).
 *
 * Checked: both render (nothing but out of memory stops them), the page holds no "<script"
 * and no "<style" (names and messages are escaped), every <svg is closed, and an input that is
 * no JSON object draws no chart. */
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "web.h"

int kiln_fuzz_run_summary(const uint8_t *data, size_t size);

static size_t count(const char *s, const char *needle) {
    size_t n = 0;
    for (const char *p = s; (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

int kiln_fuzz_run_summary(const uint8_t *data, size_t size) {
    json_t *j = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, NULL);
    kiln_web_buf b = {0};
    kiln_web_run_summary(&b, j);
    kiln_web_validation_report(&b, j);
    size_t len = 0;
    char *out = kiln_web_buf_take(&b, &len);
    if (out) {
        if (strstr(out, "<script") || strstr(out, "<style")) __builtin_trap();
        if (count(out, "<svg") != count(out, "</svg>")) __builtin_trap();
        if (!json_is_object(j) && strstr(out, "<svg")) __builtin_trap();
    }
    free(out);
    json_decref(j);
    return 0;
}
