/* reg_reads.c - the registry server's answers that read the store: /healthz, models,
 * versions, channels and their history, blobs (file-backed, with Range), the audit log,
 * tokens, datasets, reproduction records, trust versions, and the web UI's pages. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <microhttpd.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server_int.h"

/* GET /healthz: "ok"; on a mirror, then what it mirrors and how fresh it is. Without a token
 * or the store's connection (db is NULL): a primary's answer touches nothing. */
enum MHD_Result reg_do_health(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                              sqlite3 *db) {
    if (!s->mirror_of) return reg_send_buf(c, r, 200, kiln_strdup("ok\n"), 3, "text/plain");
    sqlite3 *mdb = NULL;
    reg_mirror_status ms = {0};
    kiln_err rc = reg_db_connect(s->root, &mdb);
    if (!rc) rc = reg_mirror_status_read(mdb, &ms);
    reg_db_close(mdb);
    if (rc) return reg_send_kiln_error(c, r, rc);
    char when[21];
    kiln_format_time(ms.last_sync, when);
    char *text = ms.last_sync ? kiln_asprintf("ok\nmirror of %s, last synced %s (%lld s ago)\n",
                                              s->mirror_of, when,
                                              (long long)(kiln_unix_time() - ms.last_sync))
                              : kiln_asprintf("ok\nmirror of %s, never synced\n", s->mirror_of);
    reg_mirror_status_release(&ms);
    if (!text) return MHD_NO;
    return reg_send_buf(c, r, 200, text, strlen(text), "text/plain");
}

static json_t *col_json(sqlite3_stmt *st, int i) {
    const char *t = reg_col(st, i);
    if (!t) return json_null();
    json_t *j = json_loads(t, JSON_REJECT_DUPLICATES, NULL);
    return j ? j : json_null();
}

/* A column's exact bytes as a JSON string; null when NULL or not UTF-8 text. */
static json_t *col_string(sqlite3_stmt *st, int i) {
    const char *t = reg_col(st, i);
    json_t *j = t ? json_stringn(t, (size_t)sqlite3_column_bytes(st, i)) : NULL;
    return j ? j : json_null();
}

/* The verdict of a version's validation summary column ({"passed": bool, "sha256"}):
 * "passed", "failed", or "none" when the archive has no report. */
static const char *validation_verdict(sqlite3_stmt *st, int i) {
    const char *t = reg_col(st, i);
    json_t *v = t ? json_loads(t, JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *p = json_object_get(v, "passed");
    const char *verdict = json_is_boolean(p) ? (json_is_true(p) ? "passed" : "failed") : "none";
    json_decref(v);
    return verdict;
}

enum MHD_Result reg_do_models(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                              sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db, "SELECT model, count(*), max(created) FROM versions GROUP BY model ORDER BY model",
            -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "listing models"));
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr, json_pack("{s:s, s:I, s:o}", "name", reg_col(st, 0), "versions",
                                             (json_int_t)sqlite3_column_int64(st, 1), "updated",
                                             kiln_time_json(sqlite3_column_int64(st, 2))));
    sqlite3_finalize(st);
    return reg_send_json(c, r, 200, json_pack("{s:o}", "models", arr));
}

enum MHD_Result reg_do_model(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                             sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT version, digest, size, publisher, created, validation, (SELECT count(*) FROM"
            " reproductions p WHERE p.model = v.model AND p.version = v.version) FROM versions v"
            " WHERE model = ?1 ORDER BY created, version",
            -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading a model"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    json_t *versions = json_array(), *channels = json_object();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(
            versions,
            json_pack("{s:s, s:s, s:I, s:s, s:o, s:s, s:I}", "version", reg_col(st, 0), "digest",
                      reg_col(st, 1), "size", (json_int_t)sqlite3_column_int64(st, 2), "publisher",
                      reg_col(st, 3), "created", kiln_time_json(sqlite3_column_int64(st, 4)),
                      "validation", validation_verdict(st, 5), "reproductions",
                      (json_int_t)sqlite3_column_int64(st, 6)));
    sqlite3_finalize(st);
    st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT channel, seq, version, digest, expires, reason, publisher, created"
            " FROM channel_records c WHERE model = ?1"
            " AND seq = (SELECT max(seq) FROM channel_records d"
            "            WHERE d.model = c.model AND d.channel = c.channel) ORDER BY channel",
            -1, &st, NULL) == SQLITE_OK) {
        sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
        while (sqlite3_step(st) == SQLITE_ROW)
            json_object_set_new(channels, reg_col(st, 0),
                                json_pack("{s:I, s:s, s:s, s:o, s:o, s:s, s:o}", "seq",
                                          (json_int_t)sqlite3_column_int64(st, 1), "version",
                                          reg_col(st, 2), "digest", reg_col(st, 3), "expires",
                                          kiln_time_json(sqlite3_column_int64(st, 4)), "reason",
                                          col_string(st, 5), "put_by", reg_col(st, 6), "put_at",
                                          kiln_time_json(sqlite3_column_int64(st, 7))));
    }
    sqlite3_finalize(st);
    if (!json_array_size(versions) && !json_object_size(channels)) {
        json_decref(versions);
        json_decref(channels);
        return reg_send_error(c, r, 404, "model '%s' not found", r->seg[0]);
    }
    return reg_send_json(c, r, 200,
                         json_pack("{s:s, s:o, s:o}", "name", r->seg[0], "versions", versions,
                                   "channels", channels));
}

enum MHD_Result reg_do_version(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                               sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(
            db,
            "SELECT digest, size, manifest, signature, card, validation, publisher, created,"
            " validation_text FROM versions WHERE model = ?1 AND version = ?2",
            -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading a version"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return reg_send_error(c, r, 404, "version '%s@%s' not found", r->seg[0], r->seg[1]);
    }
    json_t *j = json_pack("{s:s, s:s, s:s, s:I, s:o, s:s, s:o, s:o, s:o, s:s, s:o}", "name",
                          r->seg[0], "version", r->seg[1], "digest", reg_col(st, 0), "size",
                          (json_int_t)sqlite3_column_int64(st, 1), "manifest", col_json(st, 2),
                          "signature", reg_col(st, 3), "card", col_json(st, 4), "validation",
                          col_json(st, 5), "validation_text", col_string(st, 8), "publisher",
                          reg_col(st, 6), "created", kiln_time_json(sqlite3_column_int64(st, 7)));
    sqlite3_finalize(st);
    return reg_send_json(c, r, 200, j);
}

enum MHD_Result reg_do_channel(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                               sqlite3 *db) {
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT record FROM channel_records WHERE model = ?1 AND channel = ?2 "
                           "ORDER BY seq DESC LIMIT 1",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading a channel"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return reg_send_error(c, r, 404, "channel '%s' of model '%s' not found", r->seg[1],
                              r->seg[0]);
    }
    /* The record goes out byte for byte as it was signed and stored. */
    char *text = kiln_strdup(reg_col(st, 0));
    sqlite3_finalize(st);
    if (!text) return MHD_NO;
    return reg_send_buf(c, r, 200, text, strlen(text), "application/json");
}

/* ?after=SEQ: only the records after it (a mirror's sync asks for what it lacks). Each
 * record's stored bytes go out as "text" beside the parsed "record", so that a copy of them
 * is byte for byte what was signed and stored. */
enum MHD_Result reg_do_history(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                               sqlite3 *db) {
    const char *after_arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "after");
    int64_t after = 0;
    /* Digits that fit, as /v1/audit's numbers (no sign, space or exponent): 400 otherwise. */
    if (after_arg && !reg_audit_number(after_arg, INT64_MAX, &after))
        return reg_send_error(c, r, 400, "after must be a record's seq (digits)");
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT record, publisher, created FROM channel_records WHERE model = "
                           "?1 AND channel = ?2 AND seq > ?3"
                           " ORDER BY seq",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading a channel"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, after);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr,
                              json_pack("{s:o, s:s, s:s, s:o}", "record", col_json(st, 0), "text",
                                        reg_col(st, 0), "publisher", reg_col(st, 1), "created",
                                        kiln_time_json(sqlite3_column_int64(st, 2))));
    sqlite3_finalize(st);
    if (!json_array_size(arr) && after == 0) {
        json_decref(arr);
        return reg_send_error(c, r, 404, "channel '%s' of model '%s' not found", r->seg[1],
                              r->seg[0]);
    }
    return reg_send_json(
        c, r, 200,
        json_pack("{s:s, s:s, s:o}", "model", r->seg[0], "channel", r->seg[1], "records", arr));
}

static const char *query_arg(struct MHD_Connection *c, const char *name) {
    return MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
}

enum MHD_Result reg_do_audit(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                             sqlite3 *db) {
    reg_audit_query q;
    char why[200];
    if (!reg_audit_parse(query_arg(c, "after"), query_arg(c, "limit"), query_arg(c, "since"),
                         query_arg(c, "model"), query_arg(c, "action"), &q, why))
        return reg_send_error(c, r, 400, "%s", why);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT id, time, token, action, model, version, channel, digest, "
                           "reason FROM audit WHERE id > ?1 AND time >= ?3"
                           " AND (?4 IS NULL OR model = ?4)"
                           " AND (?5 IS NULL OR action IN (SELECT value FROM json_each(?5)))"
                           " ORDER BY id LIMIT ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading the audit log"));
    sqlite3_bind_int64(st, 1, q.after);
    sqlite3_bind_int64(st, 2, q.limit);
    sqlite3_bind_int64(st, 3, q.since);
    if (q.model[0]) sqlite3_bind_text(st, 4, q.model, -1, SQLITE_TRANSIENT);
    if (q.actions[0]) sqlite3_bind_text(st, 5, q.actions, -1, SQLITE_TRANSIENT);
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *e =
            json_pack("{s:I, s:o, s:s}", "id", (json_int_t)sqlite3_column_int64(st, 0), "time",
                      kiln_time_json(sqlite3_column_int64(st, 1)), "action", reg_col(st, 3));
        /* By column: id, time and action are set above. */
        static const char *const keys[] = {NULL,      NULL,      "token",  NULL,    "model",
                                           "version", "channel", "digest", "reason"};
        for (int k = 0; k < (int)KILN_ARRAY_LEN(keys); k++)
            if (keys[k])
                json_object_set_new(e, keys[k],
                                    reg_col(st, k) ? json_string(reg_col(st, k)) : json_null());
        json_array_append_new(arr, e);
    }
    sqlite3_finalize(st);
    return reg_send_json(c, r, 200, json_pack("{s:o}", "entries", arr));
}

/* The tokens as `kiln registry token list --json` shows them: never a secret or a hash. */
enum MHD_Result reg_do_tokens(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                              sqlite3 *db) {
    kiln_registry_token_info *t;
    size_t n;
    kiln_err rc = reg_token_list_db(db, &t, &n);
    if (rc) return reg_send_kiln_error(c, r, rc);
    json_t *j = kiln_registry_token_json(t, n, kiln_unix_time());
    free(t);
    return j ? reg_send_json(c, r, 200, j) : MHD_NO;
}

/* ---- the pages of the web UI (ui.c reads the store, web/ writes the HTML): each renders
 * into b under t, the policy in force (NULL: none) ---- */

kiln_err reg_page_home(REG_PAGE_ARGS) {
    return reg_ui_home(db, t, now, b);
}

kiln_err reg_page_model(REG_PAGE_ARGS) {
    return reg_ui_model(db, t, r->seg[0], now, b);
}

kiln_err reg_page_version(REG_PAGE_ARGS) {
    return reg_ui_version(db, t, s->root, r->seg[0], r->seg[1], now, b);
}

/* ?before=SEQ: the records before it (a bad one shows the newest, as a link would). */
kiln_err reg_page_channel(REG_PAGE_ARGS) {
    const char *before = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
    return reg_ui_channel(db, t, r->seg[0], r->seg[1], before ? strtoll(before, NULL, 10) : 0, now,
                          b);
}

kiln_err reg_page_trust(REG_PAGE_ARGS) {
    const char *before = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
    return reg_ui_trust(db, t, s->trust_start, before ? strtoull(before, NULL, 10) : 0, now, b);
}

kiln_err reg_page_audit(REG_PAGE_ARGS) {
    reg_audit_query q;
    char why[200];
    if (!reg_audit_parse(query_arg(c, "after"), NULL, NULL, NULL, NULL, &q, why))
        q.after = 0; /* a page (as before= of the others): a bad link shows the start */
    return reg_ui_audit(db, q.after, now, b);
}

/* A page row's answer: its page under the policy in force. */
enum MHD_Result reg_do_page(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                            sqlite3 *db, reg_page_fn page) {
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    reg_trust_ref *tr = reg_trust_acquire(s);
    kiln_err rc = page(s, c, r, db, tr ? tr->t : NULL, kiln_unix_time(), &b);
    reg_trust_release(s, tr);
    if (rc) {
        kiln_web_buf_release(&b);
        return reg_send_kiln_error(c, r, rc);
    }
    return reg_send_page(c, r, 200, &b);
}

/* A blob served over TLS: read from its file in blocks of REG_TLS_BLOCK. */
#define REG_TLS_BLOCK (256 * 1024)
typedef struct blob_reader {
    int fd;
    uint64_t start;
} blob_reader;

static ssize_t blob_read(void *cls, uint64_t pos, char *buf, size_t max) {
    blob_reader *br = cls;
    ssize_t n;
    do
        n = pread(br->fd, buf, max, (off_t)(br->start + pos));
    while (n < 0 && errno == EINTR);
    if (n <= 0)
        return MHD_CONTENT_READER_END_WITH_ERROR; /* the size was declared: short is an error */
    return n;
}

static void blob_done(void *cls) {
    blob_reader *br = cls;
    close(br->fd);
    free(br);
}

enum MHD_Result reg_do_blob(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                            sqlite3 *db) {
    char digest[80], hex[KILN_SHA256_HEX];
    snprintf(digest, sizeof digest, "sha256:%s", r->seg[2]);
    if (!reg_digest_hex(digest, hex))
        return reg_send_error(c, r, 400, "'%s' is not a sha256 digest", r->seg[2]);
    char *path = reg_blob_path(s->root, hex);
    if (!path) return MHD_NO;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    free(path);
    if (fd < 0) return reg_send_error(c, r, 404, "blob sha256:%s not found", hex);
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return reg_send_error(c, r, 500, "cannot stat blob sha256:%s", hex);
    }
    uint64_t size = (uint64_t)sb.st_size, start = 0, end = size ? size - 1 : 0;
    unsigned status = 200;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Range");
    if (range) {
        if (!reg_range_parse(range, size, &start, &end)) {
            close(fd);
            char *b =
                kiln_asprintf("{\"error\":\"range not satisfiable for %" PRIu64 " bytes\"}", size);
            if (!b) return MHD_NO;
            struct MHD_Response *resp =
                MHD_create_response_from_buffer(strlen(b), b, MHD_RESPMEM_MUST_FREE);
            if (!resp) {
                free(b);
                return MHD_NO;
            }
            char cr[64];
            snprintf(cr, sizeof cr, "bytes */%" PRIu64, size);
            MHD_add_response_header(resp, "Content-Range", cr);
            MHD_add_response_header(resp, "Content-Type", "application/json");
            r->status = 416;
            enum MHD_Result ok = MHD_queue_response(c, 416, resp);
            MHD_destroy_response(resp);
            return ok;
        }
        status = 206;
    }
    uint64_t len = size ? end - start + 1 : 0;
    struct MHD_Response *resp = NULL;
    blob_reader *br = NULL;
    if (s->tls_cert && (br = kiln_malloc(sizeof *br))) {
        /* Over TLS there is no sendfile; libmicrohttpd's file response then reads 4 KiB at a
         * time and sends each as its own TLS record. 256 KiB blocks, sent as full records. */
        br->fd = fd;
        br->start = start;
        resp = MHD_create_response_from_callback(len, REG_TLS_BLOCK, blob_read, br, blob_done);
        if (!resp) free(br);
    } else {
        resp = MHD_create_response_from_fd_at_offset64(len, fd, start);
    }
    if (!resp) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(resp, "Content-Type", "application/octet-stream");
    MHD_add_response_header(resp, "Accept-Ranges", "bytes");
    char etag[80];
    snprintf(etag, sizeof etag, "\"sha256:%s\"", hex);
    MHD_add_response_header(resp, "ETag", etag);
    if (status == 206) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %" PRIu64 "-%" PRIu64 "/%" PRIu64, start, end, size);
        MHD_add_response_header(resp, "Content-Range", cr);
    }
    r->status = status;
    r->body_bytes = len;
    enum MHD_Result ok = MHD_queue_response(c, status, resp);
    MHD_destroy_response(resp);
    return ok;
}

/* ---- datasets (docs/registry.md, "Datasets") ---- */

enum MHD_Result reg_do_datasets(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                sqlite3 *db) {
    (void)s;
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT name, digest, size, publisher, created FROM datasets ORDER BY "
                           "name, created, digest",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "listing datasets"));
    /* The versions trained on each: their cards' lineage.dataset_sha256 (the stored card is the
     * archive's, whose digest the release keys signed through the manifest). */
    sqlite3_stmt *tr = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT model || '@' || version FROM versions WHERE "
                           "json_valid(card) AND 'sha256:' || json_extract(card, "
                           "'$.lineage.dataset_sha256') = ?1 ORDER BY model, created, version",
                           -1, &tr, NULL) != SQLITE_OK) {
        sqlite3_finalize(st);
        return reg_send_kiln_error(c, r, reg_db_fail(db, "listing datasets"));
    }
    json_t *arr = json_array();
    while (sqlite3_step(st) == SQLITE_ROW) {
        json_t *trained = json_array();
        sqlite3_reset(tr);
        sqlite3_bind_text(tr, 1, reg_col(st, 1), -1, SQLITE_TRANSIENT);
        while (sqlite3_step(tr) == SQLITE_ROW)
            json_array_append_new(trained, json_string(reg_col(tr, 0)));
        json_array_append_new(
            arr, json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "name", reg_col(st, 0), "digest",
                           reg_col(st, 1), "size", (json_int_t)sqlite3_column_int64(st, 2),
                           "publisher", reg_col(st, 3), "created",
                           kiln_time_json(sqlite3_column_int64(st, 4)), "trained", trained));
    }
    sqlite3_finalize(tr);
    sqlite3_finalize(st);
    return reg_send_json(c, r, 200, json_pack("{s:o}", "datasets", arr));
}

/* {digest} of a dataset's route: 64 lowercase hex digits. */
bool reg_dataset_hex(struct MHD_Connection *c, reg_req *r, enum MHD_Result *res) {
    size_t n = strlen(r->seg[2]);
    bool ok = n == 64;
    for (size_t i = 0; ok && i < n; i++)
        ok = (r->seg[2][i] >= '0' && r->seg[2][i] <= '9') ||
             (r->seg[2][i] >= 'a' && r->seg[2][i] <= 'f');
    if (!ok)
        *res = reg_send_error(c, r, 400, "a dataset's digest is 64 lowercase hex digits, not '%s'",
                              r->seg[2]);
    else
        memcpy(r->hex, r->seg[2], 65);
    return ok;
}

enum MHD_Result reg_do_dataset(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                               sqlite3 *db) {
    (void)s;
    enum MHD_Result res;
    if (!reg_dataset_hex(c, r, &res)) return res;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", r->hex);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT size, signature, publisher, created FROM datasets WHERE name = "
                           "?1 AND digest = ?2",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading a dataset"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, digest, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) != SQLITE_ROW) {
        sqlite3_finalize(st);
        return reg_send_error(c, r, 404, "dataset '%s@%s' not found", r->seg[0], digest);
    }
    json_t *j =
        json_pack("{s:s, s:s, s:I, s:s, s:s, s:o}", "name", r->seg[0], "digest", digest, "size",
                  (json_int_t)sqlite3_column_int64(st, 0), "signature", reg_col(st, 1), "publisher",
                  reg_col(st, 2), "created", kiln_time_json(sqlite3_column_int64(st, 3)));
    sqlite3_finalize(st);
    return reg_send_json(c, r, 200, j);
}

/* ---- reproduction records (docs/reproduce.md) ---- */

/* model@version's records as [{"record", "signature", "signer", "verdict", "publisher",
 * "created"}], oldest first, into *out (new). */
kiln_err reg_load_repros(sqlite3 *db, const char *model, const char *version, json_t **out) {
    sqlite3_stmt *st = NULL;
    *out = NULL;
    if (sqlite3_prepare_v2(db,
                           "SELECT record, signature, signer, verdict, publisher, created FROM "
                           "reproductions WHERE model = ?1 AND version = ?2 ORDER BY created, "
                           "rowid",
                           -1, &st, NULL) != SQLITE_OK)
        return reg_db_fail(db, "reading reproduction records");
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
    json_t *arr = json_array();
    while (arr && sqlite3_step(st) == SQLITE_ROW)
        json_array_append_new(arr,
                              json_pack("{s:s, s:s, s:s, s:s, s:s, s:o}", "record", reg_col(st, 0),
                                        "signature", reg_col(st, 1), "signer", reg_col(st, 2),
                                        "verdict", reg_col(st, 3), "publisher", reg_col(st, 4),
                                        "created", kiln_time_json(sqlite3_column_int64(st, 5))));
    sqlite3_finalize(st);
    if (!arr) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    *out = arr;
    return KILN_OK;
}

enum MHD_Result reg_do_repros(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                              sqlite3 *db) {
    (void)s;
    json_t *arr;
    kiln_err rc = reg_load_repros(db, r->seg[0], r->seg[1], &arr);
    if (rc) return reg_send_kiln_error(c, r, rc);
    return reg_send_json(c, r, 200,
                         json_pack("{s:s, s:s, s:o}", "name", r->seg[0], "version", r->seg[1],
                                   "reproductions", arr));
}

/* ---- trust versions ---- */

/* GET /v1/trust (trust_v 0: the newest) and /v1/trust/{version}: the signed document as
 * stored. */
enum MHD_Result reg_do_trust(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                             sqlite3 *db) {
    char *doc;
    size_t len;
    kiln_err rc = reg_trust_get(db, r->trust_v, &doc, &len);
    if (rc) return reg_send_kiln_error(c, r, rc);
    return reg_send_buf(c, r, 200, doc, len, "application/json");
}
