/* http.c - the registry's HTTP API from the calling side, for a client and for a mirror
 * syncing from its primary: JSON reads, channel records, publish with retries, blob downloads
 * (transfer.c runs each transfer). An OCI registry's URL sends each call to oci_kiln.c
 * instead. The pull that uses them is the client's (client/client.c). */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export.h"
#include "http_int.h"

static char *url_for(const kiln_registry_client_opts *c, const char *path) {
    size_t n = strlen(c->url);
    while (n && c->url[n - 1] == '/')
        n--;
    return kiln_asprintf("%.*s%s", (int)n, c->url, path);
}

static kiln_err auth_header(const kiln_registry_client_opts *c, struct curl_slist **h) {
    if (!c->token) return KILN_OK;
    char *a = kiln_asprintf("Authorization: Bearer %s", c->token);
    if (!a) return KILN_ERR_NOMEM;
    struct curl_slist *n = curl_slist_append(*h, a);
    sodium_memzero(a, strlen(a));
    free(a);
    KILN_FAIL_IF(!n, KILN_ERR_NOMEM, "out of memory");
    *h = n;
    return KILN_OK;
}

/* ---- small requests ---- */

typedef struct small {
    const char *url, *method, *body;
    size_t body_len, limit;
    long timeout_ms;
    struct curl_slist *hdr;
    reg_buf *out;
} small;

static kiln_err small_setup(void *ctx, CURL *h, reg_xfer *x, long left) {
    small *q = ctx;
    free(q->out->p);
    memset(q->out, 0, sizeof *q->out);
    q->out->limit = q->limit;
    x->rate = reg_min_rate(x->c);
    if (x->stall >= (unsigned long)q->timeout_ms) x->stall = 0;
    /* The stall detection alone lets a registry that sends a byte a second hold a pull (or a
     * kiln_watch poll) for days: a small answer has a deadline, and so has the operation it
     * is part of. */
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, q->timeout_ms < left ? q->timeout_ms : left);
    curl_easy_setopt(h, CURLOPT_URL, q->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, q->hdr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reg_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, q->out);
    if (q->body) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, q->method);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, q->body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)q->body_len);
    }
    return KILN_OK;
}

static kiln_err small_check(void *ctx) {
    small *q = ctx;
    KILN_FAIL_IF(q->out->over, KILN_ERR_LIMIT, "registry '%s': answer larger than %zu bytes",
                 q->url, q->limit);
    return KILN_OK;
}

/* GET or PUT (small body) path, body into *out (limit bytes), with retries. *status set. */
static kiln_err simple_request(const kiln_registry_client_opts *c, const char *method,
                               const char *path, const char *body, size_t body_len, size_t limit,
                               reg_buf *out, long *status) {
    memset(out, 0, sizeof *out);
    *status = 0;
    KILN_TRY(reg_client_init(c));
    if (reg_oci_url(c->url)) { /* kiln's routes, answered from the OCI mapping (oci_kiln.c) */
        kiln_err rc = reg_oci_route(c, method, path, body, body_len, limit, &out->p, &out->len);
        *status = rc ? 0 : 200;
        return rc;
    }
    char *url = url_for(c, path), *what = url ? kiln_asprintf("registry '%s'", url) : NULL;
    small q = {.url = url,
               .method = method,
               .body = body,
               .body_len = body_len,
               .limit = limit,
               .timeout_ms =
                   c->timeout_ms ? (long)c->timeout_ms : (long)(60000 + (limit / 16384) * 1000),
               .out = out};
    kiln_err rc = what ? auth_header(c, &q.hdr) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc && body) {
        struct curl_slist *n = curl_slist_append(q.hdr, "Content-Type: application/json");
        if (n)
            q.hdr = n;
        else
            rc = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (!rc) {
        reg_request rq = {.c = c,
                          .url = url,
                          .what = what,
                          .setup = small_setup,
                          .check = small_check,
                          .body = out,
                          .ctx = &q};
        rc = reg_request_run(&rq, status);
    }
    if (!rc && (*status < 200 || *status >= 300)) rc = reg_http_error(c, url, *status, out);
    curl_slist_free_all(q.hdr);
    if (rc) {
        free(out->p);
        memset(out, 0, sizeof *out);
    }
    free(what);
    free(url);
    return rc;
}

kiln_err kiln_registry_get_json(const kiln_registry_client_opts *c, const char *path, json_t **j) {
    *j = NULL;
    reg_buf b;
    long status;
    KILN_TRY(simple_request(c, "GET", path, NULL, 0, REG_JSON_MAX, &b, &status));
    kiln_err rc = kiln_json_parse(b.p ? b.p : "", b.len, path, j);
    free(b.p);
    return rc;
}

kiln_err kiln_registry_get_channel(const kiln_registry_client_opts *c, const char *model,
                                   const char *channel, char **record, size_t *len) {
    *record = NULL;
    *len = 0;
    KILN_TRY(kiln_registry_check_name("model", model));
    KILN_TRY(kiln_registry_check_name("channel", channel));
    char *path = kiln_asprintf("/v1/models/%s/channels/%s", model, channel);
    if (!path) return KILN_ERR_NOMEM;
    reg_buf b;
    long status;
    kiln_err rc = simple_request(c, "GET", path, NULL, 0, REG_RECORD_MAX, &b, &status);
    free(path);
    if (rc) return rc;
    *record = b.p ? b.p : kiln_strdup("");
    *len = b.len;
    return *record ? KILN_OK : KILN_ERR_NOMEM;
}

kiln_err kiln_registry_put_channel(const kiln_registry_client_opts *c, const char *model,
                                   const char *channel, const char *record, size_t len) {
    KILN_TRY(kiln_registry_check_name("model", model));
    KILN_TRY(kiln_registry_check_name("channel", channel));
    char *path = kiln_asprintf("/v1/models/%s/channels/%s", model, channel);
    if (!path) return KILN_ERR_NOMEM;
    reg_buf b;
    long status;
    /* No retries: a record that landed before a lost answer would be refused as a replay. */
    kiln_registry_client_opts once = *c;
    once.retries = 0;
    kiln_err rc = simple_request(&once, "PUT", path, record, len, REG_JSON_MAX, &b, &status);
    free(path);
    free(b.p);
    return rc;
}

kiln_err reg_get_text(const kiln_registry_client_opts *c, const char *path, size_t limit,
                      char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    reg_buf b;
    long status;
    KILN_TRY(simple_request(c, "GET", path, NULL, 0, limit, &b, &status));
    *text = b.p ? b.p : kiln_strdup("");
    *len = b.len;
    return *text ? KILN_OK : KILN_ERR_NOMEM;
}

kiln_err reg_put_text(const kiln_registry_client_opts *c, const char *path, const char *body,
                      size_t len, json_t **answer) {
    if (answer) *answer = NULL;
    reg_buf b;
    long status;
    /* No retries: a document that landed before a lost answer would be refused as a replay. */
    kiln_registry_client_opts once = *c;
    once.retries = 0;
    KILN_TRY(simple_request(&once, "PUT", path, body, len, REG_JSON_MAX, &b, &status));
    kiln_err rc = KILN_OK;
    if (answer) rc = kiln_json_parse(b.p ? b.p : "", b.len, path, answer);
    free(b.p);
    return rc;
}

/* ---- publish ---- */

static size_t file_read(char *dst, size_t size, size_t n, void *ctx) {
    size_t r = fread(dst, 1, size * n, (FILE *)ctx);
    return r == 0 && ferror((FILE *)ctx) ? CURL_READFUNC_ABORT : r;
}

typedef struct upload {
    FILE *f;
    const char *archive, *url;
    struct curl_slist *hdr;
    curl_off_t size;
    reg_buf *body;
} upload;

/* Each attempt sends the archive from its start. */
static kiln_err upload_setup(void *ctx, CURL *h, reg_xfer *x, long left) {
    upload *u = ctx;
    (void)x;
    KILN_FAIL_IF(fseeko(u->f, 0, SEEK_SET) != 0, KILN_ERR_IO, "cannot rewind '%s'", u->archive);
    free(u->body->p);
    memset(u->body, 0, sizeof *u->body);
    u->body->limit = REG_JSON_MAX;
    curl_easy_setopt(h, CURLOPT_URL, u->url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, u->hdr);
    curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(h, CURLOPT_READFUNCTION, file_read);
    curl_easy_setopt(h, CURLOPT_READDATA, u->f);
    curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, u->size);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, reg_buf_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, u->body);
    if (left != LONG_MAX) curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left);
    return KILN_OK;
}

/* PUT file to the registry at rpath with its signature (X-Kiln-Signature: sig in base64) and,
 * where digest_header, X-Kiln-Digest: sha256:hex: an archive and a dataset go up the same way.
 * *status is the answer's (200: stored already, 201: stored; any other is an error, returned),
 * body its bytes (the caller frees body->p), *url the URL (the caller frees), *size the bytes
 * sent. what names the upload in messages ("publishing" / "publishing dataset"). */
static kiln_err put_signed(const kiln_registry_client_opts *c, const char *file,
                           const char *rpath, const char *hex, bool digest_header,
                           const char *sig, size_t sig_len, const char *what, long *status,
                           reg_buf *body, char **url_out, uint64_t *size) {
    *url_out = NULL;
    kiln_err rc = KILN_OK;
    char *b64 = NULL, *url = NULL, *hd = NULL, *hs = NULL, *label = NULL;
    FILE *f = NULL;
    struct curl_slist *hdr = NULL;
    f = fopen(file, "rb");
    KILN_CHECK_IF(rc, out, !f, KILN_ERR_IO, "cannot open '%s'", file);
    struct stat sb;
    KILN_CHECK_IF(rc, out, fstat(fileno(f), &sb) != 0, KILN_ERR_IO, "cannot stat '%s'", file);
    size_t b64_len = sodium_base64_ENCODED_LEN(sig_len, sodium_base64_VARIANT_ORIGINAL);
    b64 = kiln_malloc(b64_len);
    KILN_CHECK_IF(rc, out, !b64, KILN_ERR_NOMEM, "out of memory");
    sodium_bin2base64(b64, b64_len, (const unsigned char *)sig, sig_len,
                      sodium_base64_VARIANT_ORIGINAL);
    url = url_for(c, rpath);
    hd = digest_header ? kiln_asprintf("X-Kiln-Digest: sha256:%s", hex) : NULL;
    hs = kiln_asprintf("X-Kiln-Signature: %s", b64);
    KILN_CHECK_IF(rc, out, !url || (digest_header && !hd) || !hs, KILN_ERR_NOMEM,
                  "out of memory");
    KILN_CHECK(rc, out, auth_header(c, &hdr));
    const char *extra[] = {hs, "Content-Type: application/octet-stream", hd};
    for (size_t i = 0; i < KILN_ARRAY_LEN(extra) && extra[i]; i++) {
        struct curl_slist *n = curl_slist_append(hdr, extra[i]);
        KILN_CHECK_IF(rc, out, !n, KILN_ERR_NOMEM, "out of memory");
        hdr = n;
    }
    upload up = {.f = f,
                 .archive = file,
                 .url = url,
                 .hdr = hdr,
                 .size = (curl_off_t)sb.st_size,
                 .body = body};
    label = kiln_asprintf("%s '%s' to '%s'", what, file, url);
    KILN_CHECK_IF(rc, out, !label, KILN_ERR_NOMEM, "out of memory");
    reg_request rq = {
        .c = c, .url = url, .what = label, .setup = upload_setup, .body = body, .ctx = &up};
    KILN_CHECK(rc, out, reg_request_run(&rq, status));
    if (*status != 200 && *status != 201) {
        rc = reg_http_error(c, url, *status, body);
        goto out;
    }
    *size = (uint64_t)sb.st_size;
    *url_out = url;
    url = NULL;
out:
    curl_slist_free_all(hdr);
    if (f) fclose(f);
    free(b64);
    free(url);
    free(hd);
    free(hs);
    free(label);
    return rc;
}

kiln_err kiln_registry_publish(const kiln_registry_client_opts *c_in, const char *archive,
                               const char *sig_path, kiln_registry_published *out) {
    memset(out, 0, sizeof *out);
    KILN_TRY(reg_client_init(c_in));
    if (reg_oci_url(c_in->url)) return reg_oci_publish(c_in, archive, sig_path, out);
    /* A publish is an operation of its own: every attempt within its deadline. (No minimum
     * rate: after the last byte the answer waits on the server's checks; the stall watch
     * bounds that.) */
    kiln_registry_client_opts one = *c_in;
    if (!one.until_ns) reg_deadline_start(&one, 1);
    const kiln_registry_client_opts *c = &one;
    kiln_err rc = KILN_OK;
    char *sigp = NULL, *sig = NULL, *path = NULL, *url = NULL;
    size_t sig_len = 0;
    reg_buf body = {0};
    reg_archive_meta m;
    memset(&m, 0, sizeof m);
    uint8_t digest[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    long status = 0;
    uint64_t size = 0;

    sigp = sig_path ? kiln_strdup(sig_path) : kiln_asprintf("%s.minisig", archive);
    KILN_CHECK_IF(rc, out, !sigp, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, kiln_read_file(sigp, REG_SIG_MAX, &sig, &sig_len));
    /* The server would refuse a malformed signature file too, but only naming its header:
     * parse it here first, so that the message names the file and nothing is uploaded. */
    {
        kiln_sign_sig *sigs = NULL;
        size_t nsigs = 0;
        KILN_CHECK(rc, out, kiln_sign_archive_sigs_parse(sig, sig_len, sigp, &sigs, &nsigs));
        kiln_sign_archive_sigs_free(sigs, nsigs);
    }
    KILN_CHECK(rc, out, reg_archive_meta_read(archive, &m));
    KILN_CHECK(rc, out, kiln_sha256_file(archive, digest));
    kiln_hex(digest, sizeof digest, hex);
    path = kiln_asprintf("/v1/models/%s/versions/%s", m.name, m.version);
    KILN_CHECK_IF(rc, out, !path, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, put_signed(c, archive, path, hex, true, sig, sig_len, "publishing",
                                   &status, &body, &url, &size));
    json_t *j = json_loadb(body.p ? body.p : "", body.len, 0, NULL);
    const char *d = json_string_value(json_object_get(j, "digest"));
    char want[80];
    snprintf(want, sizeof want, "sha256:%s", hex);
    if (!d || strcmp(d, want) != 0) {
        rc = kiln_fail(KILN_ERR_VERIFY, "registry '%s' stored '%s' as %s, not %s", url, archive,
                       d ? d : "(none)", want);
        json_decref(j);
        goto out;
    }
    json_decref(j);
    snprintf(out->digest, sizeof out->digest, "sha256:%s", hex);
    out->size = size;
    out->existed = status == 200;
out:
    reg_archive_meta_release(&m);
    free(body.p);
    free(sigp);
    free(sig);
    free(path);
    free(url);
    return rc;
}

char *kiln_registry_data_comment(const char *name, const char *hex) {
    return reg_dataset_comment(name, hex);
}

kiln_err kiln_registry_data_publish(const kiln_registry_client_opts *c_in, const char *path,
                                    const char *name, const char *sig, size_t sig_len,
                                    kiln_registry_published *out) {
    memset(out, 0, sizeof *out);
    KILN_TRY(kiln_registry_check_name("dataset", name));
    KILN_TRY(reg_client_init(c_in));
    KILN_FAIL_IF(reg_oci_url(c_in->url), KILN_ERR_UNSUPPORTED,
                 "registry '%s': datasets are stored on kiln's registry server only, not yet on "
                 "an OCI registry (publish it to a kiln registry, or give kiln reproduce --data)",
                 c_in->url);
    kiln_registry_client_opts one = *c_in;
    if (!one.until_ns) reg_deadline_start(&one, 1);
    const kiln_registry_client_opts *c = &one;
    kiln_err rc = KILN_OK;
    char *upath = NULL, *url = NULL;
    reg_buf body = {0};
    uint8_t digest[KILN_SHA256_BYTES];
    char hex[KILN_SHA256_HEX];
    long status = 0;
    uint64_t size = 0;
    KILN_CHECK(rc, out, kiln_sha256_file(path, digest));
    kiln_hex(digest, sizeof digest, hex);
    upath = kiln_asprintf("/v1/datasets/%s/sha256/%s", name, hex);
    KILN_CHECK_IF(rc, out, !upath, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, put_signed(c, path, upath, hex, false, sig, sig_len,
                                   "publishing dataset", &status, &body, &url, &size));
    snprintf(out->digest, sizeof out->digest, "sha256:%s", hex);
    out->size = size;
    out->existed = status == 200;
out:
    free(body.p);
    free(upath);
    free(url);
    return rc;
}

kiln_err kiln_registry_repro_sign(const kiln_sign_seckey *sk, const char *model,
                                  const char *version, const char *digest,
                                  const char *dataset_sha256, const char *host, int64_t when,
                                  bool identical, char **text, char **sig) {
    *text = *sig = NULL;
    char t[21];
    kiln_format_time(when, t);
    const char *verdict = identical ? "identical" : "different";
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s}", "format", REG_REPRO_FORMAT,
                          "model", model, "version", version, "digest", digest, "dataset_sha256",
                          dataset_sha256, "code_version", kiln_version(), "host", host, "time", t,
                          "verdict", verdict);
    char *canon = j ? kiln_json_canonical(j) : NULL;
    json_decref(j);
    char *tc = kiln_asprintf("%s\tdigest:%s\tverdict:%s", REG_REPRO_FORMAT, digest, verdict);
    kiln_err rc = canon && tc ? kiln_sign_buffer(sk, canon, strlen(canon), tc, KILN_SIGN_PREHASHED,
                                                 sig)
                              : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(tc);
    if (rc) {
        free(canon);
        return rc;
    }
    *text = canon;
    return KILN_OK;
}

char *kiln_registry_repro_doc(const char *text, const char *sig) {
    json_t *j = json_pack("{s:s,s:s}", "record", text, "signature", sig);
    char *s = j ? json_dumps(j, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(j);
    return s;
}

kiln_err kiln_registry_repro_put(const kiln_registry_client_opts *c, const char *model,
                                 const char *version, const char *doc) {
    KILN_TRY(reg_client_init(c));
    char *path = kiln_asprintf("/v1/models/%s/versions/%s/reproductions", model, version);
    KILN_FAIL_IF(!path, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = reg_put_text(c, path, doc, strlen(doc), NULL);
    free(path);
    return rc;
}

kiln_err reg_download(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                      const char *partial) {
    return reg_download_follow(c, hex, size, partial, NULL);
}

kiln_err reg_download_follow(const kiln_registry_client_opts *c, const char *hex, uint64_t size,
                             const char *partial, reg_follow *follow) {
    KILN_TRY(reg_client_init(c));
    if (reg_oci_url(c->url)) return reg_oci_download(c, hex, size, partial, follow);
    char *path = kiln_asprintf("/v1/blobs/sha256/%s", hex), *url = path ? url_for(c, path) : NULL;
    free(path);
    if (!url) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    char *auth = c->token ? kiln_asprintf("Authorization: Bearer %s", c->token) : NULL;
    kiln_err rc = c->token && !auth ? kiln_fail(KILN_ERR_NOMEM, "out of memory")
                                    : reg_download_url(c, url, auth, hex, size, partial, follow);
    if (auth) {
        sodium_memzero(auth, strlen(auth));
        free(auth);
    }
    free(url);
    return rc;
}
