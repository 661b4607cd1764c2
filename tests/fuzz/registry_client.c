/* registry_client.c - fuzz entry point for what a client reads from a registry: the threat
 * the trust policy is for is a registry that lies, and a trading service must neither crash
 * nor install what it did not verify, whatever bytes come back.
 *
 * The input is one byte that picks a client operation, then the registry's answers, one per
 * request in the order they come, separated by SEP. An answer may begin with "NNN " (its
 * status; 200 without) and then "H:" and header lines up to an empty line (sent as they are,
 * for a 206's Content-Range); the rest is the body. A loopback HTTP server in a thread gives
 * them out, 404 once they run out, and the operation runs against it with a fresh state
 * directory, under a fixed policy whose one key (the vector key, which signed the seeds'
 * archives and records) holds every role:
 *
 *   0 pull demo@production      4 provenance demo@production
 *   1 pull demo@1.0.0           5 provenance with --download
 *   2 models (verified)         6 the verified rollback target of production
 *   3 models (as stated)        7 mirror sync into a new store
 *                               8 pull over two registries (both this server)
 *                               9 a service's watch started, stopped, started again
 *  10, 11, 12: 0, 2 and 9 against an OCI registry (oci+http://HOST/fz: the server answers as
 *              docker-registry did when the seeds were recorded)
 *
 * Checked beyond "no crash, leak or UB": a pull that succeeds installed a directory that
 * the offline check (kiln_registry_installed_verify, from the evidence the pull kept) accepts,
 * of the model asked for; a pull that fails leaves nothing where it was to install; models and
 * provenance hand back a document with every KILN_OK and with no code but KILN_OK and
 * KILN_ERR_VERIFY (registry.h); a watch that starts serves a model of the channel asked for,
 * and its metrics name it.
 *
 * Seeds (tests/fuzz/corpus/registry_client/) are recorded from a real registry by
 * tests/fuzz/registry_client_seeds.sh: with KILN_FUZZ_UPSTREAM=URL the server passes each
 * GET (or HEAD) on to that registry (its Accept header with it; the answer's Content-Range, Content-Type
 * and Docker-Content-Digest kept) and KILN_FUZZ_RECORD=FILE writes the input that replays it. With
 * KILN_FUZZ_VERBOSE set each request and the operation's result go to stderr. */
#include <curl/curl.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include "fuzz.h"
#include "registry.h"
#include "registry_int.h"

int kiln_fuzz_registry_client(const uint8_t *data, size_t size);

#define SEP "\n@@kiln@@\n"
#define NOPS 13
/* The OCI operations: the kiln operation each runs, against oci+http://HOST/fz. */
#define OCI_OP0 10
static const int oci_ops[NOPS - OCI_OP0] = {0, 2, 9};

/* The policy every operation runs under (KILN_FUZZ_PUBKEY's secret key is
 * tests/vectors/minisign/test.key). */
static const char policy[] =
    "{\"format\":\"kiln-trust/1\",\"keys\":[{\"name\":\"vector\",\"pubkey\":\"" KILN_FUZZ_PUBKEY
    "\",\"roles\":[\"root\",\"release\",\"promote\"]}],\"channels\":{\"production\":"
    "{\"threshold\":1},\"staging\":{\"threshold\":1}},\"accept_unvalidated\":true}";

typedef struct {
    const uint8_t *p;
    size_t n;
} span;

typedef struct {
    int lfd, wake[2];
    span *ans;
    size_t nans, next;
    const char *upstream; /* record mode: GETs go on to this registry */
    char *rec;            /* what was recorded, SEP-joined */
    size_t rec_len, rec_cap;
    bool verbose;
} server;

static const uint8_t *find(const uint8_t *p, size_t n, const char *s) {
    size_t k = strlen(s);
    for (size_t i = 0; n >= k && i <= n - k; i++)
        if (!memcmp(p + i, s, k)) return p + i;
    return NULL;
}

static void send_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
        if (w <= 0) return;
        c += w;
        n -= (size_t)w;
    }
}

static void rec_add(server *s, const void *p, size_t n) {
    if (s->rec_len + n > s->rec_cap) {
        size_t cap = (s->rec_len + n) * 2;
        char *r = realloc(s->rec, cap);
        if (!r) abort();
        s->rec = r;
        s->rec_cap = cap;
    }
    memcpy(s->rec + s->rec_len, p, n);
    s->rec_len += n;
}

static size_t curl_body(char *p, size_t size, size_t n, void *ctx) {
    rec_add(ctx, p, size * n);
    return size * n;
}

/* The headers a client reads beyond the body (a 206's Content-Range, an OCI manifest's type
 * and digest), kept as the answer's header block "H:Name: value\n...\n". */
static size_t curl_header(char *p, size_t size, size_t n, void *ctx) {
    static const char *const keep[] = {"Content-Range:", "Content-Type:", "Docker-Content-Digest:"};
    char **hdrs = ctx;
    size_t len = size * n;
    while (len && (p[len - 1] == '\r' || p[len - 1] == '\n'))
        len--;
    if (len >= 5 && !strncmp(p, "HTTP/", 5)) { /* a new answer (after a redirect): none yet */
        free(*hdrs);
        *hdrs = NULL;
    }
    for (size_t k = 0; k < sizeof keep / sizeof *keep; k++) {
        size_t kl = strlen(keep[k]);
        if (len <= kl || strncasecmp(p, keep[k], kl)) continue;
        char *h = kiln_asprintf("%s%.*s\n", *hdrs ? *hdrs : "H:", (int)len, p);
        if (!h) abort();
        free(*hdrs);
        *hdrs = h;
    }
    return size * n;
}

/* Send one answer: "NNN " status (200 without), "H:" header lines up to an empty line, body. */
static void send_answer(int fd, span a, int status) {
    if (a.n >= 4 && a.p[3] == ' ' && a.p[0] >= '1' && a.p[0] <= '5' && a.p[1] >= '0' &&
        a.p[1] <= '9' && a.p[2] >= '0' && a.p[2] <= '9') {
        status = (a.p[0] - '0') * 100 + (a.p[1] - '0') * 10 + (a.p[2] - '0');
        a.p += 4;
        a.n -= 4;
    }
    const uint8_t *hdr = NULL;
    size_t hlen = 0;
    if (a.n >= 2 && a.p[0] == 'H' && a.p[1] == ':') {
        const uint8_t *end = find(a.p, a.n, "\n\n");
        if (end) {
            hdr = a.p + 2;
            hlen = (size_t)(end - hdr) + 1;
            a.n -= (size_t)(end + 2 - a.p);
            a.p = end + 2;
        }
    }
    char head[160];
    int n = snprintf(head, sizeof head, "HTTP/1.1 %d X\r\nContent-Length: %zu\r\n", status, a.n);
    send_all(fd, head, (size_t)n);
    for (size_t i = 0; i < hlen; i++) { /* header lines: \n becomes \r\n, no bare CR */
        if (hdr[i] == '\n')
            send_all(fd, "\r\n", 2);
        else if (hdr[i] != '\r')
            send_all(fd, hdr + i, 1);
    }
    send_all(fd, "Connection: close\r\n\r\n", 21);
    send_all(fd, a.p, a.n);
}

/* Record mode: GET the path from the upstream registry, record the answer, send it on. */
static void proxy(server *s, int fd, bool head, const char *path, const char *range,
                  const char *accept) {
    char *url = kiln_asprintf("%s%s", s->upstream, path), *crange = NULL;
    struct curl_slist *hl = accept ? curl_slist_append(NULL, accept) : NULL;
    CURL *h = curl_easy_init();
    if (!url || !h) abort();
    if (s->nans++) rec_add(s, SEP, strlen(SEP));
    size_t at = s->rec_len;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, curl_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, curl_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &crange);
    if (range) curl_easy_setopt(h, CURLOPT_RANGE, range);
    if (hl) curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    if (head) curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    if (curl_easy_perform(h) != CURLE_OK) abort();
    long code = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
    size_t blen = s->rec_len - at;
    char *body = malloc(blen + 1), status[8];
    if (!body) abort();
    memcpy(body, s->rec + at, blen);
    s->rec_len = at;
    snprintf(status, sizeof status, "%03ld ", code % 1000);
    rec_add(s, status, 4);
    if (crange) { /* the header block ends with an empty line */
        rec_add(s, crange, strlen(crange));
        rec_add(s, "\n", 1);
    }
    rec_add(s, body, blen);
    send_answer(fd, (span){(const uint8_t *)s->rec + at, s->rec_len - at}, 200);
    free(body);
    free(crange);
    free(url);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
}

/* Answer one request with the input's next answer; 404 once they run out. */
static void reply(server *s, int fd) {
    if (s->next < s->nans)
        send_answer(fd, s->ans[s->next++], 200);
    else
        send_answer(fd, (span){(const uint8_t *)"{\"error\":\"no more answers\"}", 27}, 404);
}

static void handle(server *s, int fd) {
    struct timeval tv = {2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[16384];
    size_t got = 0;
    while (got < sizeof req - 1) {
        ssize_t r = recv(fd, req + got, sizeof req - 1 - got, 0);
        if (r <= 0) return;
        got += (size_t)r;
        req[got] = 0;
        if (strstr(req, "\r\n\r\n")) break;
    }
    char method[16] = "", path[8192] = "";
    if (sscanf(req, "%15s %8191s", method, path) != 2) return;
    if (s->verbose) fprintf(stderr, "  fuzz registry: %s %s\n", method, path);
    if (s->upstream) {
        char range[64] = "", accept[512] = "", *r = strcasestr(req, "\r\nRange: bytes="),
             *acc = strcasestr(req, "\r\nAccept: ");
        if (r) sscanf(r + 15, "%63[0-9-]", range);
        if (acc) snprintf(accept, sizeof accept, "%.*s", (int)strcspn(acc + 2, "\r\n"), acc + 2);
        const bool head = !strcmp(method, "HEAD"); /* an OCI blob's, before its download */
        if (!head && strcmp(method, "GET")) abort(); /* the seeds' operations only read */
        proxy(s, fd, head, path, *range ? range : NULL, *accept ? accept : NULL);
    } else {
        reply(s, fd);
    }
}

static void *serve(void *ctx) {
    server *s = ctx;
    for (;;) {
        struct pollfd p[2] = {{s->lfd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[1].revents) break;
        int fd = accept(s->lfd, NULL, NULL);
        if (fd < 0) continue;
        handle(s, fd);
        close(fd);
    }
    return NULL;
}

/* Split the answers; they point into data. */
static size_t split(const uint8_t *data, size_t size, span **out) {
    size_t n = 1;
    for (const uint8_t *p = data, *q; (q = find(p, size - (size_t)(p - data), SEP));
         p = q + strlen(SEP))
        n++;
    span *a = malloc(n * sizeof *a);
    if (!a) abort();
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *q = find(p, size - (size_t)(p - data), SEP);
        a[i].p = p;
        a[i].n = q ? (size_t)(q - p) : size - (size_t)(p - data);
        if (q) p = q + strlen(SEP);
    }
    *out = a;
    return n;
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

static void quiet(void *ctx, const char *line) {
    (void)ctx;
    (void)line;
}

/* The operation, against the server at url. */
static void run_op(int op, const char *url, const char *root, bool verbose) {
    char *trust = kiln_path_join(root, "trust.json"), *state = kiln_path_join(root, "state"),
         *out = kiln_path_join(root, "model"), *store = kiln_path_join(root, "mirror");
    if (!trust || !state || !out || !store ||
        kiln_write_file_atomic(trust, policy, sizeof policy - 1) != KILN_OK)
        abort();
    kiln_registry_client_opts c[2] = {
        {.url = url, .retries = 0, .backoff_ms = 1, .timeout_ms = 3000, .stall_ms = 3000},
        {.url = url, .retries = 0, .backoff_ms = 1, .timeout_ms = 3000, .stall_ms = 3000}};
    kiln_err rc = KILN_OK;
    json_t *doc = NULL;
    switch (op) {
    case 0:
    case 1:
    case 8: {
        const char *ref = op == 1 ? "demo@1.0.0" : "demo@production";
        kiln_registry_pull_opts p = {.ref = ref, .out = out, .trust = trust, .state = state};
        kiln_registry_pulled res;
        rc = op == 8 ? kiln_registry_pull_any(c, 2, &p, NULL, NULL, &res)
                     : kiln_registry_pull(c, &p, &res);
        if (rc != KILN_OK) {
            if (exists(out)) abort(); /* a failed pull installs nothing */
            break;
        }
        if (strcmp(res.model, "demo") || !exists(out)) abort();
        if (res.channel[0]) { /* what it installed passes the offline check from its evidence */
            kiln_registry_installed inst;
            kiln_err v = kiln_registry_installed_verify(trust, state, ref, out, &inst);
            if (v != KILN_OK || strcmp(inst.version, res.version) ||
                strcmp(inst.digest, res.digest)) {
                fprintf(stderr, "fuzz: pulled %s@%s but the offline check says: %s\n", res.model,
                        res.version, v ? kiln_errmsg() : "another version");
                abort();
            }
        }
        break;
    }
    case 2:
    case 3: {
        kiln_registry_models_opts o = {.trust = op == 2 ? trust : NULL,
                                       .state = op == 2 ? state : NULL};
        rc = kiln_registry_models(c, 1, &o, &doc);
        break;
    }
    case 4:
    case 5: {
        kiln_registry_provenance_opts o = {
            .ref = "demo@production", .trust = trust, .state = state, .download = op == 5};
        rc = kiln_registry_provenance(c, &o, &doc);
        break;
    }
    case 6: {
        char version[KILN_REGISTRY_NAME_MAX + 1];
        kiln_digest digest;
        rc = kiln_registry_previous_version_verified(c, "demo", "production", NULL, trust, state, version,
                                                     digest);
        if (rc == KILN_OK && (kiln_registry_check_version(version) != KILN_OK ||
                              strncmp(digest, "sha256:", 7) || strlen(digest) != 71))
            abort();
        break;
    }
    case 9: { /* as a service starts (twice: the second finds the first's model kept) */
        char *dir = kiln_path_join(root, "watch");
        if (!dir) abort();
        const char *more[] = {url}; /* two registries: each request once, no backoff */
        kiln_watch_opts w = {.pull = {.registry = url,
                                      .registries = more,
                                      .nregistries = 1,
                                      .ref = "demo@production",
                                      .trust = trust,
                                      .state = state,
                                      .out = dir,
                                      .timeout_ms = 3000,
                                      .on_registry = quiet},
                             .interval_ms = 3600 * 1000};
        for (int i = 0; i < 2; i++) {
            kiln_watch *watch = NULL;
            rc = kiln_watch_start(&w, &watch);
            if (verbose && i == 0)
                fprintf(stderr, "  fuzz op 9 first start: %s\n", rc ? kiln_errmsg() : "ok");
            if (rc) continue;
            kiln_pull_result r;
            char *m = kiln_watch_metrics(watch);
            if (kiln_watch_serving(watch, 0, &r) != KILN_OK || strcmp(r.model, "demo") ||
                strcmp(r.channel, "production") || kiln_registry_check_version(r.version) || !m ||
                !strstr(m, "kiln_watch_info{"))
                abort();
            free(m);
            kiln_watch_stop(watch);
        }
        free(dir);
        break;
    }
    case 7: {
        kiln_registry_mirror_opts o = {.root = store, .from = c, .trust = trust};
        kiln_registry_mirror_result res;
        rc = kiln_registry_mirror_sync(&o, &res);
        break;
    }
    }
    if (verbose) fprintf(stderr, "  fuzz op %d: %s\n", op, rc ? kiln_errmsg() : "ok");
    /* A document comes with KILN_OK or KILN_ERR_VERIFY (a failed check it shows), and always
     * with KILN_OK; a trust walk refused is KILN_ERR_VERIFY with none. */
    if (op >= 2 && op <= 5 && (doc ? rc != KILN_OK && rc != KILN_ERR_VERIFY : rc == KILN_OK)) {
        fprintf(stderr, "fuzz: op %d returned %d (%s) with%s a document\n", op, rc,
                rc ? kiln_errmsg() : "ok", doc ? "" : "out");
        abort();
    }
    json_decref(doc);
    kiln_errclear();
    free(trust);
    free(state);
    free(out);
    free(store);
}

int kiln_fuzz_registry_client(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    server s = {.lfd = -1,
                .wake = {-1, -1},
                .upstream = getenv("KILN_FUZZ_UPSTREAM"),
                .verbose = getenv("KILN_FUZZ_VERBOSE") != NULL};
    if (s.upstream && !*s.upstream) s.upstream = NULL;
    if (!s.upstream) s.nans = split(data + 1, size - 1, &s.ans);
    kiln_log_level was = kiln_log_get_level();
    if (!s.verbose) kiln_log_set_level(KILN_LOG_ERROR);

    const char *tmp = getenv("TMPDIR");
    char *root = kiln_asprintf("%s/kiln-fuzz-reg-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!root || !mkdtemp(root)) abort();
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t alen = sizeof a;
    s.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s.lfd < 0 || bind(s.lfd, (struct sockaddr *)&a, sizeof a) || listen(s.lfd, 16) ||
        getsockname(s.lfd, (struct sockaddr *)&a, &alen) || pipe(s.wake))
        abort();
    pthread_t th;
    if (pthread_create(&th, NULL, serve, &s)) abort();
    char url[64];
    const int op = data[0] % NOPS;
    snprintf(url, sizeof url, "%s://127.0.0.1:%u%s", op >= OCI_OP0 ? "oci+http" : "http",
             (unsigned)ntohs(a.sin_port), op >= OCI_OP0 ? "/fz" : "");

    run_op(op >= OCI_OP0 ? oci_ops[op - OCI_OP0] : op, url, root, s.verbose);

    if (write(s.wake[1], "x", 1) != 1) abort();
    pthread_join(th, NULL);
    close(s.lfd);
    close(s.wake[0]);
    close(s.wake[1]);
    const char *rec = getenv("KILN_FUZZ_RECORD");
    if (s.upstream && rec && *rec) {
        FILE *f = fopen(rec, "wb");
        if (!f || fwrite(data, 1, 1, f) != 1 || fwrite(s.rec, 1, s.rec_len, f) != s.rec_len ||
            fclose(f))
            abort();
    }
    reg_rmtree(root);
    free(root);
    free(s.ans);
    free(s.rec);
    kiln_log_set_level(was);
    return 0;
}
