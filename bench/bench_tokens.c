/*
 * bench_tokens.c - what a token costs a request, and what the last-used policy saves: the
 * token lookup (registry/server/token.c) when last_used is fresh (no write: what nearly every request
 * does, the policy writing at most once a minute) against the same lookup when it writes
 * every time (the clock moved a minute between calls: what a write per request would cost;
 * WAL, synchronous=FULL, on the store's disk); then GET /v1/models served over loopback on
 * one kept-alive connection (libcurl) without and with a token. Medians of ROUNDS rounds.
 * Usage: bench_tokens DIR (the store is made there); results on stdout.
 */
#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry_int.h"

#define LOOKUPS 2000
#define REQUESTS 1000
#define ROUNDS 5

static void die(const char *what) {
    fprintf(stderr, "bench_tokens: %s: %s\n", what, kiln_errmsg());
    exit(2);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return v[n / 2];
}

static size_t sink(char *d, size_t s, size_t n, void *c) {
    (void)d, (void)c;
    return s * n;
}

/* Microseconds per lookup; now advances by step seconds every call (0: a fresh last_used). */
static double lookups(sqlite3 *db, const char *tok, int64_t *now, int64_t step) {
    uint64_t a = kiln_now_ns();
    for (int i = 0; i < LOOKUPS; i++) {
        char *name;
        unsigned scopes;
        if (reg_token_lookup(db, tok, *now, &name, &scopes, NULL)) die("lookup");
        free(name);
        *now += step;
    }
    return (double)(kiln_now_ns() - a) / 1e3 / LOOKUPS;
}

/* Microseconds per GET on one connection, with the token or without. */
static double requests(const char *url, const char *tok) {
    CURL *h = curl_easy_init();
    char auth[200];
    snprintf(auth, sizeof auth, "Authorization: Bearer %s", tok ? tok : "");
    struct curl_slist *hd = tok ? curl_slist_append(NULL, auth) : NULL;
    if (!h) die("curl");
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, sink);
    uint64_t a = kiln_now_ns();
    for (int i = 0; i < REQUESTS; i++) {
        long st = 0;
        if (curl_easy_perform(h) != CURLE_OK) die("request");
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
        if (st != 200) die("status");
    }
    double us = (double)(kiln_now_ns() - a) / 1e3 / REQUESTS;
    curl_easy_cleanup(h);
    curl_slist_free_all(hd);
    return us;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: bench_tokens DIR\n");
        return 2;
    }
    const char *root = argv[1];
    char *tok = NULL;
    if (kiln_registry_token_create(root, "ci", KILN_SCOPE_READ, &tok)) die("token");
    sqlite3 *db;
    if (reg_db_connect(root, &db)) die("database");
    double fresh[ROUNDS], writes[ROUNDS], open_[ROUNDS], with[ROUNDS];
    int64_t now = kiln_unix_time();
    for (int r = 0; r < ROUNDS; r++) {
        now += REG_LAST_USED_EVERY;
        fresh[r] = lookups(db, tok, &now, 0);
        writes[r] = lookups(db, tok, &now, REG_LAST_USED_EVERY);
    }
    reg_db_close(db);
    kiln_registry_server_opts o = {.root = root, .listen = "127.0.0.1:0", .threads = 4};
    kiln_registry_server *s;
    if (kiln_registry_server_start(&o, &s)) die("server");
    char url[128];
    snprintf(url, sizeof url, "http://127.0.0.1:%u/v1/models",
             (unsigned)kiln_registry_server_port(s));
    for (int r = 0; r < ROUNDS; r++) {
        open_[r] = requests(url, NULL);
        with[r] = requests(url, tok);
    }
    kiln_registry_server_stop(s, 1000);
    printf("token lookup, last_used fresh (no write)      %8.1f us\n", median(fresh, ROUNDS));
    printf("token lookup, last_used written every call    %8.1f us\n", median(writes, ROUNDS));
    printf("GET /v1/models, kept-alive, no token          %8.1f us\n", median(open_, ROUNDS));
    printf("GET /v1/models, kept-alive, with a token      %8.1f us\n", median(with, ROUNDS));
    printf("(%d lookups and %d requests a round, median of %d rounds)\n", LOOKUPS, REQUESTS,
           ROUNDS);
    free(tok);
    return 0;
}
