/* reg_writes.c - the registry server's PUTs: an archive's upload streamed into the blob store,
 * a dataset's, and the small signed documents (channel records, trust versions, reproduction
 * records), each checked against the trust policy in force before it is stored. Each has a
 * start, on the request's head (what can be refused before the body), and a finish, once the
 * body is in. */
#include <inttypes.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "server_int.h"

static enum MHD_Result send_published(struct MHD_Connection *c, reg_req *r, unsigned status,
                                      const char *digest, uint64_t size) {
    return reg_send_json(c, r, status,
                         json_pack("{s:s, s:s, s:s, s:I}", "name", r->seg[0], "version", r->seg[1],
                                   "digest", digest, "size", (json_int_t)size));
}

/* What an upload of what ("archive", "dataset") must have before its body: a trust policy to
 * check it under, a Content-Length within the registry's limit (into *n). false with the
 * answer queued in *res when it has not. */
static bool upload_length(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                          const char *what, uint64_t *n, enum MHD_Result *res) {
    if (!reg_has_trust(s)) {
        *res = reg_send_error(
            c, r, 422, "this registry has no trust policy (serve --trust); it accepts no uploads");
        return false;
    }
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (!cl) {
        *res = reg_send_error(c, r, 411, "an upload needs a Content-Length");
        return false;
    }
    if (!reg_length_parse(cl, n)) {
        *res = reg_send_error(c, r, 400, "bad Content-Length '%s'", cl);
        return false;
    }
    if (*n > s->max_upload) {
        *res = reg_send_error(
            c, r, 413, "%s of %" PRIu64 " bytes is larger than this registry's limit of %" PRIu64,
            what, *n, s->max_upload);
        return false;
    }
    return true;
}

/* The upload's X-Kiln-Signature, decoded into r->sig; missing names what the header must
 * hold. false with the answer queued in *res (MHD_NO when out of memory). */
static bool upload_signature(struct MHD_Connection *c, reg_req *r, const char *missing,
                             enum MHD_Result *res) {
    const char *sig = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Kiln-Signature");
    size_t slen = sig ? strlen(sig) : 0;
    if (!slen || slen > REG_SIG_MAX * 2) {
        *res = reg_send_error(c, r, 400, "%s", missing);
        return false;
    }
    kiln_err drc = reg_sig_decode(sig, &r->sig, &r->sig_len);
    if (drc == KILN_ERR_NOMEM) {
        *res = MHD_NO;
        return false;
    }
    if (drc) {
        *res = reg_send_error(c, r, 400, "X-Kiln-Signature is not base64 of a .minisig text");
        return false;
    }
    return true;
}

/* The first call of a PUT of an archive: everything that can be refused before the body. */
enum MHD_Result reg_put_version_start(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                      sqlite3 *db) {
    enum MHD_Result res;
    uint64_t n;
    if (!upload_length(s, c, r, "archive", &n, &res)) return res;
    const char *digest = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Kiln-Digest");
    if (!digest || !reg_digest_hex(digest, r->hex))
        return reg_send_error(c, r, 400,
                              "an upload needs X-Kiln-Digest: sha256:<64 lowercase hex digits>");
    /* A withdrawn archive is refused before its bytes are read (the body must then hash to
     * this digest), also when it is stored already. */
    reg_trust_ref *tr = reg_trust_acquire(s);
    kiln_err wrc = tr ? reg_withdrawn(tr->t, digest, "the archive") : KILN_OK;
    reg_trust_release(s, tr);
    if (wrc) return reg_send_kiln_error(c, r, wrc);
    if (!upload_signature(c, r, "an upload needs X-Kiln-Signature: the archive's .minisig, base64",
                          &res))
        return res;
    r->declared = n;
    kiln_err rc;
    uint64_t stored = 0;
    char *have = reg_version_digest_size(db, r->seg[0], r->seg[1], &stored, &rc);
    if (rc) return reg_send_kiln_error(c, r, rc);
    if (have) {
        /* The stored archive's size, not the one this request declares: nothing was read, and
         * the answer says what the registry holds. */
        bool same = strcmp(have + 7, r->hex) == 0;
        enum MHD_Result ok =
            same ? send_published(c, r, 200, have, stored)
                 : reg_send_error(c, r, 409, "'%s@%s' exists already with other bytes (%s)",
                                  r->seg[0], r->seg[1], have);
        free(have);
        return ok;
    }
    if ((rc = reg_upload_begin(&r->up, s->root)) != KILN_OK) return reg_send_kiln_error(c, r, rc);
    r->body = REG_BODY_ARCHIVE;
    return MHD_YES;
}

/* The body of an upload (an archive, a dataset) once it is all in: it came in whole and
 * hashes to the declared digest and size; digest is then "sha256:<hex>" and *path where its
 * bytes can be read (the caller frees). false with the answer queued in *res when not (MHD_NO
 * when out of memory). */
static bool upload_received(struct MHD_Connection *c, reg_req *r, char digest[80], char **path,
                            enum MHD_Result *res) {
    *path = NULL;
    if (r->body_failed) {
        *res = reg_send_error(c, r, reg_status_of(r->body_rc), "%s",
                              r->body_msg ? r->body_msg : "upload failed");
        return false;
    }
    snprintf(digest, 80, "sha256:%s", r->hex);
    kiln_err rc = reg_upload_check(&r->up, r->hex, r->declared);
    if (rc) {
        *res = reg_send_kiln_error(c, r, rc);
        return false;
    }
    *path = reg_upload_path(&r->up);
    if (!*path) {
        *res = MHD_NO;
        return false;
    }
    return true;
}

enum MHD_Result reg_put_version_finish(kiln_registry_server *s, struct MHD_Connection *c,
                                       reg_req *r, sqlite3 *db) {
    char digest[80], *path;
    enum MHD_Result res;
    if (!upload_received(c, r, digest, &path, &res)) return res;
    kiln_err rc;
    char label[200];
    snprintf(label, sizeof label, "upload of %s@%s", r->seg[0], r->seg[1]);
    /* sign/ checks every signature block against this server's policy (release keys, the
     * release threshold, the unvalidated rule, comments naming the manifest); the files are
     * the client's to check on pull (this server never unpacks). */
    kiln_sign_archive_report rep;
    memset(&rep, 0, sizeof rep);
    reg_archive_meta m;
    memset(&m, 0, sizeof m);
    reg_trust_ref *tr = reg_trust_acquire(s);
    rc = tr ? kiln_sign_verify_archive_sigs(path, r->sig, r->sig_len, "X-Kiln-Signature", tr->t,
                                            &rep)
            : kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
    /* A malformed signature or comment is the signature's fault; bytes whose signatures
     * verify but that are no kiln archive are the upload's, and said so. */
    if (rc == KILN_ERR_FORMAT && rep.sigs_verified && !rep.info.model[0])
        rc = kiln_errprefix(KILN_ERR_VERIFY,
                            "not a kiln archive (its signatures verify, but it has no readable "
                            "manifest; kiln pack makes one): ");
    else if (rc == KILN_ERR_FORMAT)
        rc = kiln_errprefix(KILN_ERR_VERIFY, "archive signature: ");
    reg_trust_release(s, tr);
    if (!rc) rc = reg_archive_meta_read(path, &m);
    if (rc) rc = kiln_errprefix(rc, "%s: ", label);
    rc = reg_relabel(rc, path, "the uploaded archive");
    free(path);
    if (!rc && memcmp(m.manifest_sha256, rep.info.manifest_sha256, KILN_SHA256_BYTES) != 0)
        rc = kiln_fail(KILN_ERR_VERIFY, "%s: the manifest read is not the one the signatures name",
                       label);
    if (!rc && (strcmp(m.name, r->seg[0]) || strcmp(m.version, r->seg[1])))
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "the archive's manifest names '%s@%s', but it was uploaded as '%s@%s'",
                       m.name, m.version, r->seg[0], r->seg[1]);
    if (!rc) rc = reg_upload_commit(&r->up, r->hex);
    bool existed = false;
    if (!rc) {
        reg_version_row row = {.model = r->seg[0],
                               .version = r->seg[1],
                               .digest = digest,
                               .size = r->declared,
                               .meta = &m,
                               .sig = r->sig,
                               .sig_len = r->sig_len,
                               .publisher = r->token_name,
                               .created = kiln_unix_time()};
        rc = reg_version_insert(db, &row, r->token_name, r->audit, NULL, &existed);
    }
    reg_archive_meta_release(&m);
    if (rc) return reg_send_kiln_error(c, r, rc);
    return send_published(c, r, existed ? 200 : 201, digest, r->declared);
}

/* The first call of a PUT of a dataset: refused before the body as an archive's upload is
 * (no policy, no or a bad length, over the limit, no signature); the same name and digest
 * held already is 200 with nothing read. */
enum MHD_Result reg_put_dataset_start(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                      sqlite3 *db) {
    enum MHD_Result res;
    if (!reg_dataset_hex(c, r, &res)) return res;
    uint64_t n;
    if (!upload_length(s, c, r, "dataset", &n, &res)) return res;
    if (!upload_signature(c, r, "a dataset upload needs X-Kiln-Signature: its .minisig, base64",
                          &res))
        return res;
    r->declared = n;
    char digest[80];
    snprintf(digest, sizeof digest, "sha256:%s", r->hex);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, "SELECT size FROM datasets WHERE name = ?1 AND digest = ?2", -1, &st,
                           NULL) != SQLITE_OK)
        return reg_send_kiln_error(c, r, reg_db_fail(db, "reading a dataset"));
    sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, digest, -1, SQLITE_TRANSIENT);
    if (sqlite3_step(st) == SQLITE_ROW) {
        json_int_t size = sqlite3_column_int64(st, 0);
        sqlite3_finalize(st);
        return reg_send_json(
            c, r, 200,
            json_pack("{s:s, s:s, s:I}", "name", r->seg[0], "digest", digest, "size", size));
    }
    sqlite3_finalize(st);
    kiln_err rc;
    if ((rc = reg_upload_begin(&r->up, s->root)) != KILN_OK) return reg_send_kiln_error(c, r, rc);
    r->body = REG_BODY_DATASET;
    return MHD_YES;
}

enum MHD_Result reg_put_dataset_finish(kiln_registry_server *s, struct MHD_Connection *c,
                                       reg_req *r, sqlite3 *db) {
    char digest[80], *path;
    enum MHD_Result res;
    if (!upload_received(c, r, digest, &path, &res)) return res;
    kiln_err rc;
    char who[KILN_SIGN_NAME_MAX + 1];
    reg_trust_ref *tr = reg_trust_acquire(s);
    rc = tr ? reg_dataset_verify(tr->t, r->sig, r->sig_len, "X-Kiln-Signature", path, r->seg[0],
                                 r->hex, who, sizeof who)
            : kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
    reg_trust_release(s, tr);
    if (rc) rc = kiln_errprefix(rc, "upload of dataset '%s': ", r->seg[0]);
    rc = reg_relabel(rc, path, "the uploaded dataset");
    free(path);
    if (!rc) rc = reg_upload_commit(&r->up, r->hex);
    bool existed = false;
    if (!rc) {
        reg_dataset_row row = {.name = r->seg[0],
                               .digest = digest,
                               .size = r->declared,
                               .sig = r->sig,
                               .sig_len = r->sig_len,
                               .publisher = r->token_name ? r->token_name : "?",
                               .created = kiln_unix_time()};
        rc = reg_dataset_insert(db, &row, &existed);
    }
    if (rc) return reg_send_kiln_error(c, r, rc);
    return reg_send_json(c, r, existed ? 200 : 201,
                         json_pack("{s:s, s:s, s:I, s:s}", "name", r->seg[0], "digest", digest,
                                   "size", (json_int_t)r->declared, "signed_by", who));
}

/* The start of an upload of a small signed document (body: a channel record or a trust
 * version, one the registry checks against its trust policy): the registry has a policy, the
 * Content-Length is at most max, and a buffer holds the whole body. what names one in
 * answers ("a channel record"), them several ("channel records"). */
static enum MHD_Result signed_doc_start(kiln_registry_server *s, struct MHD_Connection *c,
                                        reg_req *r, reg_body_kind body, const char *what,
                                        const char *them, unsigned max) {
    if (!reg_has_trust(s))
        return reg_send_error(
            c, r, 422, "this registry has no trust policy (serve --trust); it accepts no %s", them);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    uint64_t n;
    if (!cl) return reg_send_error(c, r, 411, "%s needs a Content-Length", what);
    if (!reg_length_parse(cl, &n)) return reg_send_error(c, r, 400, "bad Content-Length '%s'", cl);
    if (n > max) return reg_send_error(c, r, 413, "%s is at most %u bytes", what, max);
    r->rec = kiln_malloc((size_t)n + 1);
    if (!r->rec) return MHD_NO;
    r->rec_cap = (size_t)n;
    r->body = body;
    return MHD_YES;
}

/* The body signed_doc_start took, NUL-terminated: false once an answer is queued into *ret (a
 * body that failed, bad its fallback message; or a NUL byte in it, named by what). */
static bool signed_doc_text(struct MHD_Connection *c, reg_req *r, const char *bad, const char *what,
                            enum MHD_Result *ret) {
    if (r->body_failed) {
        *ret =
            reg_send_error(c, r, reg_status_of(r->body_rc), "%s", r->body_msg ? r->body_msg : bad);
        return false;
    }
    r->rec[r->rec_len] = 0;
    if (memchr(r->rec, 0, r->rec_len)) {
        *ret = reg_send_error(c, r, 400, "%s holds a NUL byte", what);
        return false;
    }
    return true;
}

enum MHD_Result reg_put_repro_start(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                    sqlite3 *db) {
    (void)db;
    return signed_doc_start(s, c, r, REG_BODY_REPRO, "a reproduction record",
                            "reproduction records", REG_REPRO_MAX);
}

/* The body {"record": text, "signature": text}: the record verified under the server's policy
 * (a key with the reproduce role, naming this version's stored digest), then stored. */
enum MHD_Result reg_put_repro_finish(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                     sqlite3 *db) {
    enum MHD_Result ret;
    if (!signed_doc_text(c, r, "bad reproduction record", "reproduction record", &ret)) return ret;
    char label[200];
    snprintf(label, sizeof label, "reproduction record for %s@%s", r->seg[0], r->seg[1]);
    json_t *doc = NULL;
    kiln_err rc = kiln_json_parse(r->rec, r->rec_len, label, &doc);
    const char *text = json_string_value(json_object_get(doc, "record")),
               *sig = json_string_value(json_object_get(doc, "signature"));
    if (!rc && (!text || !sig))
        rc = kiln_fail(KILN_ERR_FORMAT,
                       "%s: the body must be {\"record\": TEXT, \"signature\": "
                       "TEXT}",
                       label);
    uint64_t size = 0;
    char *digest = NULL;
    if (!rc) digest = reg_version_digest_size(db, r->seg[0], r->seg[1], &size, &rc);
    if (!rc && !digest)
        rc = kiln_fail(KILN_ERR_NOTFOUND, "version '%s@%s' not found", r->seg[0], r->seg[1]);
    const kiln_sign_trust_key *k = NULL;
    bool identical = false;
    char signer[KILN_SIGN_NAME_MAX + 1] = "";
    if (!rc) {
        reg_trust_ref *tr = reg_trust_acquire(s);
        rc = tr ? reg_repro_verify(tr->t, text, sig, label, r->seg[0], r->seg[1], digest, &k,
                                   &identical)
                : kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
        if (!rc) snprintf(signer, sizeof signer, "%s", k->name);
        reg_trust_release(s, tr);
    }
    sqlite3_stmt *st = NULL;
    if (!rc && (rc = reg_db_exec(db, "BEGIN IMMEDIATE")) == KILN_OK) {
        if (sqlite3_prepare_v2(db,
                               "INSERT OR IGNORE INTO reproductions(model, version, digest, signer,"
                               " verdict, record, signature, publisher, created) VALUES(?1, ?2, "
                               "?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                               -1, &st, NULL) != SQLITE_OK)
            rc = reg_db_fail(db, "storing a reproduction record");
        if (!rc) {
            sqlite3_bind_text(st, 1, r->seg[0], -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 2, r->seg[1], -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 3, digest, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 4, signer, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 5, identical ? "identical" : "different", -1, SQLITE_STATIC);
            sqlite3_bind_text(st, 6, text, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 7, sig, -1, SQLITE_TRANSIENT);
            sqlite3_bind_text(st, 8, r->token_name ? r->token_name : "?", -1, SQLITE_TRANSIENT);
            sqlite3_bind_int64(st, 9, kiln_unix_time());
            if (sqlite3_step(st) != SQLITE_DONE)
                rc = reg_db_fail(db, "storing a reproduction record");
        }
        if (st) sqlite3_finalize(st);
        if (!rc) rc = reg_audit(db, r->token_name, "reproduce", r->seg[0], r->seg[1], NULL, digest);
        if (!rc) rc = reg_db_exec(db, "COMMIT");
        if (rc) (void)reg_db_exec(db, "ROLLBACK");
    }
    json_decref(doc);
    if (rc) {
        free(digest);
        return reg_send_kiln_error(c, r, rc);
    }
    ret = reg_send_json(c, r, 201,
                        json_pack("{s:s, s:s, s:s, s:s, s:s}", "name", r->seg[0], "version",
                                  r->seg[1], "digest", digest, "signer", signer, "verdict",
                                  identical ? "identical" : "different"));
    free(digest);
    return ret;
}

/* A channel whose policy asks for reproduction records (reproduced_by) takes a record only for
 * a version that has them, verified here under the server's policy. */
static kiln_err repro_gate(kiln_registry_server *s, sqlite3 *db, const reg_record *rec) {
    reg_trust_ref *tr = reg_trust_acquire(s);
    const char *const *keys;
    size_t nkeys;
    kiln_err rc = KILN_OK;
    if (tr && kiln_sign_trust_reproduced_by(tr->t, rec->channel, &keys, &nkeys)) {
        json_t *docs = NULL;
        rc = reg_load_repros(db, rec->model, rec->version, &docs);
        if (!rc)
            rc = reg_repro_required(tr->t, rec->channel, docs, rec->model, rec->version,
                                    rec->digest, "the channel record");
        json_decref(docs);
    }
    reg_trust_release(s, tr);
    return rc;
}

enum MHD_Result reg_put_record_start(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                     sqlite3 *db) {
    return signed_doc_start(s, c, r, REG_BODY_RECORD, "a channel record", "channel records",
                            REG_RECORD_MAX);
}

enum MHD_Result reg_put_record_finish(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                      sqlite3 *db) {
    enum MHD_Result ret;
    if (!signed_doc_text(c, r, "bad record", "channel record", &ret)) return ret;
    reg_record rec;
    char label[200];
    snprintf(label, sizeof label, "channel record for %s/%s", r->seg[0], r->seg[1]);
    reg_trust_ref *tr = reg_trust_acquire(s);
    kiln_err rc = reg_record_verify(tr ? tr->t : NULL, r->rec, r->rec_len, label, &rec);
    if (!rc) {
        char what[400];
        snprintf(what, sizeof what, "%s@%s, which the %s names,", rec.model, rec.version, label);
        rc = reg_withdrawn(tr->t, rec.digest, what);
    }
    reg_trust_release(s, tr);
    if (!rc && (strcmp(rec.model, r->seg[0]) || strcmp(rec.channel, r->seg[1])))
        rc = kiln_fail(KILN_ERR_VERIFY, "%s names %s/%s instead", label, rec.model, rec.channel);
    if (!rc && rec.expires <= kiln_unix_time())
        rc = kiln_fail(KILN_ERR_VERIFY, "%s has expired", label);
    if (!rc) rc = repro_gate(s, db, &rec);
    if (!rc)
        rc = reg_record_insert(db, &rec, r->rec, r->token_name, kiln_unix_time(), r->token_name,
                               r->audit, NULL);
    if (rc) return reg_send_kiln_error(c, r, rc);
    return reg_send_json(c, r, 201,
                         json_pack("{s:s, s:s, s:I, s:s, s:s}", "model", rec.model, "channel",
                                   rec.channel, "seq", (json_int_t)rec.seq, "version", rec.version,
                                   "digest", rec.digest));
}

enum MHD_Result reg_put_trust_start(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                    sqlite3 *db) {
    return signed_doc_start(s, c, r, REG_BODY_TRUST, "a trust version", "trust versions",
                            REG_TRUST_MAX);
}

/* PUT /v1/trust/{v}: the body must be the signed policy of version v, the successor of the
 * policy in force; it is stored (one transaction, one audit row) and then used for every
 * check. One at a time, so that two PUTs of the same version cannot both pass. */
enum MHD_Result reg_put_trust_finish(kiln_registry_server *s, struct MHD_Connection *c, reg_req *r,
                                     sqlite3 *db) {
    enum MHD_Result ret;
    if (!signed_doc_text(c, r, "bad trust version", "the trust version", &ret)) return ret;
    uint64_t v = r->trust_v; /* checked in first_call */
    char label[96];
    snprintf(label, sizeof label, "trust version %llu", (unsigned long long)v);
    kiln_sign_trust *t = NULL, *next = NULL;
    kiln_err rc = kiln_sign_trust_parse(r->rec, r->rec_len, label, &t);
    if (rc) return reg_send_error(c, r, rc == KILN_ERR_NOMEM ? 500 : 400, "%s", kiln_errmsg());
    uint64_t doc_v = kiln_sign_trust_version(t);
    bool is_signed = kiln_sign_trust_signatures(t) > 0;
    kiln_sign_trust_free(t);
    if (!is_signed)
        return reg_send_error(c, r, 400, "'%s' is a plain policy: a trust version must be signed",
                              label);
    if (doc_v != v)
        return reg_send_error(c, r, 400, "'%s' holds version %llu, not the version of its URL",
                              label, (unsigned long long)doc_v);
    unsigned status = 201;
    pthread_mutex_lock(&s->trust_put_mu);
    reg_trust_ref *cur = reg_trust_acquire(s);
    uint64_t cv = cur ? kiln_sign_trust_version(cur->t) : 0;
    if (!cur)
        rc = kiln_fail(KILN_ERR_VERIFY, "this registry has no trust policy");
    else if (v != cv + 1)
        rc = kiln_fail(KILN_ERR_CONFLICT,
                       "'%s': the registry's trust policy is at version %llu, so the next is %llu",
                       label, (unsigned long long)cv, (unsigned long long)cv + 1);
    else
        rc = kiln_sign_trust_update(cur->t, r->rec, r->rec_len, label, &next, NULL);
    reg_trust_release(s, cur);
    if (rc == KILN_ERR_FORMAT) status = 400;
    if (!rc) rc = reg_trust_store(db, v, r->rec, r->rec_len, r->token_name, r->audit, NULL);
    if (!rc) {
        rc = reg_trust_swap(s, next);
        next = NULL;
        if (!rc) kiln_info("registry: trust policy version %llu in force", (unsigned long long)v);
    }
    pthread_mutex_unlock(&s->trust_put_mu);
    kiln_sign_trust_free(next);
    if (rc) {
        if (status == 400) return reg_send_error(c, r, 400, "%s", kiln_errmsg());
        return reg_send_kiln_error(c, r, rc);
    }
    return reg_send_json(c, r, status, json_pack("{s:I}", "version", (json_int_t)v));
}
