/* registry_fx.c - the fixtures the registry's C tests share (registry_fx.h). */
#include <arpa/inet.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "export.h"
#include "registry_fx.h"
#include "registry_int.h"
#include "test.h"
#include "testutil.h"

/* ---- a registry on loopback ---- */

uint16_t rfx_serve(const char *root, const char *trust, bool read_required, int threads,
                   kiln_registry_server **srv, char url[64]) {
    kiln_registry_server_stop(*srv, 1000);
    *srv = NULL;
    kiln_registry_server_opts o = {.root = root,
                                   .listen = "127.0.0.1:0",
                                   .trust = trust,
                                   .read_token_required = read_required,
                                   .threads = threads};
    if (kiln_registry_server_start(&o, srv) != KILN_OK) return 0;
    uint16_t port = kiln_registry_server_port(*srv);
    snprintf(url, 64, "http://127.0.0.1:%u", (unsigned)port);
    return port;
}

bool rfx_start(rfx *r, const char *trust) {
    r->port = rfx_serve(r->root, trust, r->read_required, r->threads, &r->srv, r->url);
    return r->port != 0;
}

bool rfx_init(rfx *r, const char *store, const char *policy, unsigned tokens, int threads,
              bool read_required) {
    memset(r, 0, sizeof *r);
    r->threads = threads;
    r->read_required = read_required;
    snprintf(r->root, sizeof r->root, "%s/%s", kiln_test_dir(), store);
    snprintf(r->trust, sizeof r->trust, "%s/trust.json", kiln_test_dir());
    snprintf(r->state, sizeof r->state, "%s/state", kiln_test_dir());
    const struct {
        unsigned scope;
        const char *name;
        char **tok;
    } made[] = {{KILN_SCOPE_ADMIN, "ops", &r->admin},
                {KILN_SCOPE_PUBLISH, "ci", &r->pub},
                {KILN_SCOPE_PROMOTE, "rm", &r->prom},
                {KILN_SCOPE_READ, "viewer", &r->rd}};
    if (!policy || kiln_write_file_atomic(r->trust, policy, strlen(policy)) != KILN_OK)
        return false;
    for (size_t i = 0; i < KILN_ARRAY_LEN(made); i++)
        if ((tokens & made[i].scope) &&
            kiln_registry_token_create(r->root, made[i].name, made[i].scope, made[i].tok) !=
                KILN_OK)
            return false;
    return rfx_start(r, r->trust);
}

void rfx_free(rfx *r) {
    kiln_registry_server_stop(r->srv, 1000);
    r->srv = NULL;
    free(r->admin), free(r->pub), free(r->prom), free(r->rd);
    r->admin = r->pub = r->prom = r->rd = NULL;
}

kiln_watch_opts rfx_watch_opts(const rfx *r, const char *trust, const char *dir,
                               void (*on_update)(void *ctx, kiln_err rc, const char *message,
                                                 const kiln_pull_result *res),
                               void *ctx) {
    kiln_watch_opts o = {.pull = {.registry = r->url,
                                  .ref = "demo@staging",
                                  .trust = trust,
                                  .out = dir,
                                  .state = r->state},
                         .interval_ms = 20,
                         .on_update = on_update,
                         .ctx = ctx};
    return o;
}

/* ---- HTTP ---- */

static size_t body_cb(char *d, size_t s, size_t n, void *ctx) {
    rfx_resp *r = ctx;
    size_t k = s * n;
    char *nb = realloc(r->body, r->len + k + 1);
    if (!nb) return 0;
    memcpy(nb + r->len, d, k);
    r->body = nb;
    r->len += k;
    r->body[r->len] = 0;
    return k;
}

static size_t hdr_cb(char *d, size_t s, size_t n, void *ctx) {
    rfx_resp *r = ctx;
    size_t k = s * n, room = sizeof r->hdr - 1 - r->hlen;
    memcpy(r->hdr + r->hlen, d, k < room ? k : room);
    r->hlen += k < room ? k : room;
    r->hdr[r->hlen] = 0;
    return k;
}

void rfx_resp_free(rfx_resp *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

long rfx_http(const char *base, const char *method, const char *path, const char *token,
              const char *body, const char *const *headers, rfx_resp *out) {
    rfx_resp local = {0};
    if (!out) out = &local;
    rfx_resp_free(out);
    out->body = calloc(1, 1);
    char *url = kiln_asprintf("%s%s", base, path);
    CURL *h = out->body && url ? curl_easy_init() : NULL;
    struct curl_slist *hdr = NULL;
    if (h) {
        char auth[256];
        if (token) {
            snprintf(auth, sizeof auth, "Authorization: Bearer %s", token);
            hdr = curl_slist_append(hdr, auth);
        }
        for (int i = 0; headers && headers[i]; i++)
            hdr = curl_slist_append(hdr, headers[i]);
        curl_easy_setopt(h, CURLOPT_URL, url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        if (!strcmp(method, "HEAD"))
            curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        else
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
        if (body) {
            curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
            curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
        }
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_cb);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
        curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, hdr_cb);
        curl_easy_setopt(h, CURLOPT_HEADERDATA, out);
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        if (curl_easy_perform(h) == CURLE_OK)
            curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
        curl_easy_cleanup(h);
        curl_slist_free_all(hdr);
    }
    free(url);
    long status = out->status;
    rfx_resp_free(&local);
    return status;
}

bool rfx_metrics_have(const char *base, const char *token, const char *const *want, rfx_resp *out) {
    const char *missing = NULL;
    for (int i = 0; i < 100; i++) {
        if (i) nanosleep(&(struct timespec){0, 10 * 1000 * 1000}, NULL);
        missing = rfx_http(base, "GET", "/metrics", token, NULL, NULL, out) == 200 ? NULL : "200";
        for (size_t k = 0; !missing && want[k]; k++)
            if (!strstr(out->body, want[k])) missing = want[k];
        if (!missing) return true;
    }
    fprintf(stderr, "    /metrics lacks '%s'\n", missing);
    return false;
}

/* ---- the store's SQLite ---- */

static sqlite3 *db_of(const char *root, rfx_db how) {
    sqlite3 *db = NULL;
    kiln_err rc = how == RFX_OPEN ? reg_db_open(root, &db) : reg_db_connect(root, &db);
    return rc == KILN_OK ? db : NULL;
}

int64_t rfx_int(const char *root, rfx_db how, const char *sql) {
    sqlite3 *db = db_of(root, how);
    sqlite3_stmt *st = NULL;
    int64_t v = -1;
    if (db && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW)
        v = sqlite3_column_int64(st, 0);
    sqlite3_finalize(st);
    reg_db_close(db);
    return v;
}

char *rfx_text(const char *root, rfx_db how, const char *sql) {
    sqlite3 *db = db_of(root, how);
    sqlite3_stmt *st = NULL;
    char *v = NULL;
    if (db && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK &&
        sqlite3_step(st) == SQLITE_ROW && sqlite3_column_text(st, 0))
        v = kiln_strdup((const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
    reg_db_close(db);
    return v;
}

bool rfx_sql(const char *root, rfx_db how, const char *sql, const char *text) {
    sqlite3 *db = db_of(root, how);
    sqlite3_stmt *st = NULL;
    bool ok = db && sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK;
    if (ok && text) sqlite3_bind_text(st, 1, text, -1, SQLITE_TRANSIENT);
    if (ok && sqlite3_bind_parameter_count(st) >= 2) sqlite3_bind_int64(st, 2, kiln_unix_time());
    ok = ok && sqlite3_step(st) == SQLITE_DONE;
    sqlite3_finalize(st);
    reg_db_close(db);
    return ok;
}

/* ---- what a registry holds ---- */

bool rfx_keys(kiln_sign_seckey **sk, char (*b64)[KILN_SIGN_PUBKEY_B64], int n) {
    for (int i = 0; i < n; i++)
        sk[i] = NULL;
    for (int i = 0; i < n; i++)
        if (!kiln_test_keypair(&sk[i], b64[i])) return false;
    return true;
}

void rfx_keys_free(kiln_sign_seckey **sk, int n) {
    for (int i = 0; i < n; i++) {
        kiln_sign_seckey_free(sk[i]);
        sk[i] = NULL;
    }
}

bool rfx_sign(kiln_sign_seckey *sk, const char *archive, bool allow_unvalidated) {
    char *sig = NULL, *sigp = kiln_asprintf("%s.minisig", archive), *have = NULL, *all = NULL;
    size_t have_len = 0;
    bool ok = sigp && kiln_sign_archive(sk, archive, allow_unvalidated, &sig, NULL) == KILN_OK;
    if (ok && kiln_path_exists(sigp))
        ok = kiln_read_file(sigp, 1 << 20, &have, &have_len) == KILN_OK;
    ok = ok && kiln_sign_archive_sigs_add(have, have_len, sigp, sig, &all) == KILN_OK &&
         kiln_write_file_atomic(sigp, all, strlen(all)) == KILN_OK;
    free(sig), free(sigp), free(have), free(all);
    return ok;
}

char *rfx_archive(const char *name, const void *weights, size_t len, const char *card,
                  const char *version, kiln_sign_seckey *sk, char hex[KILN_SHA256_HEX]) {
    char *dir = kiln_test_path(name), *path = kiln_asprintf("%s.kiln", dir ? dir : ""),
         *sigp = kiln_asprintf("%s.kiln.minisig", dir ? dir : ""),
         *w = kiln_path_join(dir ? dir : "", "model.safetensors"),
         *c = kiln_path_join(dir ? dir : "", "card.json");
    uint8_t digest[KILN_SHA256_BYTES];
    kiln_manifest *m = NULL;
    bool ok = dir && path && sigp && w && c && kiln_mkdir_p(dir) == KILN_OK &&
              kiln_write_file_atomic(w, weights, len) == KILN_OK &&
              kiln_write_file_atomic(c, card, strlen(card)) == KILN_OK &&
              kiln_archive_pack(dir, "demo", version, path, digest, &m) == KILN_OK;
    if (ok) {
        unlink(sigp);
        ok = rfx_sign(sk, path, true);
        kiln_hex(digest, sizeof digest, hex);
    }
    kiln_manifest_free(m);
    free(dir), free(sigp), free(w), free(c);
    if (!ok) {
        free(path);
        return NULL;
    }
    return path;
}

char *rfx_vector_archive(const char *name, const char *vector, const char *version,
                         kiln_sign_seckey *sk, char hex[KILN_SHA256_HEX]) {
    char *src = kiln_test_vector(vector), *data = NULL, *a = NULL;
    size_t len = 0;
    if (src && kiln_read_file(src, 1 << 26, &data, &len) == KILN_OK)
        a = rfx_archive(name, data, len, RFX_CARD, version, sk, hex);
    free(src);
    free(data);
    return a;
}

char *rfx_record(const char *channel, const char *version, const char *hex, uint64_t seq,
                 int64_t expires, const char *reason, kiln_sign_seckey *const *keys) {
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    uint8_t d[32];
    char *text = NULL;
    size_t len;
    bool ok = kiln_unhex(hex, d, 32) && kiln_sign_record_set(&r, "demo", channel, version, d, seq,
                                                             expires, reason) == KILN_OK;
    for (int i = 0; ok && keys[i]; i++)
        ok = kiln_sign_record_add_signature(&r, keys[i]) == KILN_OK;
    if (ok && kiln_sign_record_text(&r, &text, &len) != KILN_OK) text = NULL;
    kiln_sign_record_release(&r);
    return text;
}

char *rfx_trust_sign(const char *text, const char *label, kiln_sign_seckey *const *sk,
                     const int *signers) {
    char *doc = NULL;
    size_t len = 0;
    for (int i = 0; text && signers[i] >= 0; i++) {
        char *next = NULL;
        kiln_err rc =
            i ? kiln_sign_trust_add_signature(doc, len, label, sk[signers[i]], &next, &len)
              : kiln_sign_trust_sign(text, strlen(text), label, sk[signers[i]], &next, &len);
        free(doc);
        doc = rc ? NULL : next;
    }
    return doc;
}

/* ---- stub servers ---- */

bool rfx_listen(int *fd, char url[64]) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    *fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (*fd < 0 || bind(*fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(*fd, 8) != 0 ||
        getsockname(*fd, (struct sockaddr *)&a, &al) != 0) {
        if (*fd >= 0) close(*fd);
        *fd = -1;
        return false;
    }
    snprintf(url, 64, "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return true;
}

/* A non-blocking connect to the listener fd: the socket, or -1. */
static int connect_nb(int fd) {
    struct sockaddr_in a;
    socklen_t al = sizeof a;
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c < 0) return -1;
    if (getsockname(fd, (struct sockaddr *)&a, &al) != 0 ||
        (connect(c, (struct sockaddr *)&a, al) != 0 && errno != EINPROGRESS)) {
        close(c);
        return -1;
    }
    return c;
}

void rfx_blackhole_close(int fds[3]) {
    for (int i = 0; i < 3; i++) {
        if (fds[i] >= 0) close(fds[i]);
        fds[i] = -1;
    }
}

bool rfx_blackhole(int fds[3], char url[64]) {
    fds[0] = fds[1] = fds[2] = -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    /* Backlog 0: the queue is full once one connection waits in it. */
    bool ok = fds[0] >= 0 && bind(fds[0], (struct sockaddr *)&a, sizeof a) == 0 &&
              listen(fds[0], 0) == 0 && getsockname(fds[0], (struct sockaddr *)&a, &al) == 0;
    for (int i = 1; ok && i < 3; i++) {
        fds[i] = connect_nb(fds[0]);
        struct pollfd p = {.fd = fds[i], .events = POLLOUT};
        ok = fds[i] >= 0 && (i > 1 || poll(&p, 1, 1000) == 1);
    }
    /* The probe: its connect must hang. */
    int probe = ok ? connect_nb(fds[0]) : -1;
    struct pollfd p = {.fd = probe, .events = POLLOUT};
    ok = probe >= 0 && poll(&p, 1, 200) == 0;
    if (probe >= 0) close(probe);
    if (!ok) {
        rfx_blackhole_close(fds);
        return false;
    }
    snprintf(url, 64, "http://127.0.0.1:%u", (unsigned)ntohs(a.sin_port));
    return true;
}

static void *stub_main(void *arg) {
    rfx_stub *s = arg;
    for (;;) {
        char req[4096];
        int c = rfx_accept(s->fd, req, sizeof req);
        if (c < 0) return NULL;
        if (s->answer(s->ctx, c, req)) close(c);
    }
}

bool rfx_stub_start(rfx_stub *s, bool (*answer)(void *ctx, int c, const char *req), void *ctx) {
    memset(s, 0, sizeof *s);
    s->answer = answer;
    s->ctx = ctx;
    if (!rfx_listen(&s->fd, s->url)) return false;
    s->started = pthread_create(&s->thread, NULL, stub_main, s) == 0;
    if (!s->started) {
        close(s->fd);
        s->fd = -1;
    }
    return s->started;
}

void rfx_stub_stop(rfx_stub *s) {
    if (!s->started) return;
    shutdown(s->fd, SHUT_RDWR);
    close(s->fd);
    pthread_join(s->thread, NULL);
    s->started = false;
}

void rfx_stub_answer(int c, int status, const char *body) {
    char head[256];
    size_t n = body ? strlen(body) : 0;
    snprintf(head, sizeof head,
             "HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
             "Connection: close\r\n\r\n",
             status, n);
    if (send(c, head, strlen(head), MSG_NOSIGNAL) < 0 || (n && send(c, body, n, MSG_NOSIGNAL) < 0)) {
    }
}

bool rfx_tls_files(char ca[1024], char cert[1024], char key[1024]) {
    const char *d = kiln_test_dir();
    snprintf(ca, 1024, "%s/tls-ca.pem", d);
    snprintf(cert, 1024, "%s/tls-srv.pem", d);
    snprintf(key, 1024, "%s/tls-srv.key", d);
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && printf 'subjectAltName=IP:127.0.0.1\\n' >tls.ext && "
             "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes "
             "-keyout tls-ca.key -out tls-ca.pem -days 3650 -subj '/CN=kiln test CA' && "
             "openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout tls-srv.key "
             "-out tls-srv.csr -subj '/CN=kiln test server' && "
             "openssl x509 -req -in tls-srv.csr -CA tls-ca.pem -CAkey tls-ca.key -CAcreateserial "
             "-out tls-srv.pem -days 3650 -extfile tls.ext",
             d);
    char full[8300];
    snprintf(full, sizeof full, "(%s) >'%s/tls.log' 2>&1", cmd, d);
    int rc = system(full);
    if (rc != 0) fprintf(stderr, "    openssl failed (exit %d); see %s/tls.log\n", rc, d);
    return rc == 0;
}

int rfx_accept(int fd, char *req, size_t size) {
    int c = accept(fd, NULL, NULL);
    if (c < 0) return -1;
    size_t n = 0;
    ssize_t r;
    req[0] = 0;
    while (n < size - 1 && (r = read(c, req + n, size - 1 - n)) > 0) {
        n += (size_t)r;
        req[n] = 0;
        if (strstr(req, "\r\n\r\n")) break;
    }
    return c;
}

char *rfx_policy(const char *rel, const char *p1, const char *p2) {
    return kiln_asprintf(
        "{\"format\":\"kiln-trust/1\",\"keys\":["
        "{\"name\":\"rel\",\"pubkey\":\"%s\",\"roles\":[\"release\"]},"
        "{\"name\":\"p1\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]},"
        "{\"name\":\"p2\",\"pubkey\":\"%s\",\"roles\":[\"promote\"]}],"
        "\"channels\":{\"staging\":{\"threshold\":1},\"production\":{\"threshold\":2}},"
        "\"accept_unvalidated\":true}",
        rel, p1, p2);
}
