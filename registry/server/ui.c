/* ui.c - what the registry's web page shows: each page's rows read from the store and
 * handed to web/ one at a time, with the signers of archives and channel records read
 * from their stored signatures (key ids, named by the server's trust policy) and the
 * history's rollbacks worked out from the order versions were published in.
 *
 * Display only, as `kiln channel history` is: nothing here verifies a signature (the server
 * did on upload, and kiln pull does again); it reads what they say. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "server_int.h"
#include "web.h"

#define UI_AUDIT_PAGE 100
#define UI_HISTORY_PAGE 200
#define UI_TRUST_PAGE 50

static kiln_err prepare(sqlite3 *db, const char *sql, sqlite3_stmt **st, const char *what) {
    *st = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK) return reg_db_fail(db, what);
    return KILN_OK;
}

static kiln_err step_done(sqlite3 *db, int r, const char *what) {
    return r == SQLITE_DONE ? KILN_OK : reg_db_fail(db, what);
}

static void signer_of(const kiln_sign_trust *t, const uint8_t keyid[KILN_SIGN_KEYID_BYTES],
                      kiln_web_signer *out) {
    const kiln_sign_trust_key *k = t ? kiln_sign_trust_find(t, keyid) : NULL;
    out->name = k ? k->name : NULL;
    kiln_sign_keyid_hex(keyid, out->keyid);
    out->note = NULL;
}

/* The blocks of an archive's signature file: *sigs (kiln_sign_archive_sigs_free) holds what
 * out[] points into; a block whose trusted comment carries allow-unvalidated says so. */
static size_t archive_signers(const kiln_sign_trust *t, const char *text, kiln_sign_sig **sigs,
                              size_t *nsigs, kiln_web_signer out[KILN_SIGN_ARCHIVE_MAX_SIGS]) {
    *sigs = NULL;
    *nsigs = 0;
    if (!text || kiln_sign_archive_sigs_parse(text, strlen(text), "signature", sigs, nsigs))
        return 0;
    size_t n = *nsigs < KILN_SIGN_ARCHIVE_MAX_SIGS ? *nsigs : KILN_SIGN_ARCHIVE_MAX_SIGS;
    for (size_t i = 0; i < n; i++) {
        signer_of(t, (*sigs)[i].keyid, &out[i]);
        kiln_sign_archive_info info;
        if (kiln_sign_archive_comment_parse((*sigs)[i].trusted_comment, "comment", &info))
            out[i].note = "comment unreadable";
        else if (info.allow_unvalidated)
            out[i].note = "allow-unvalidated";
    }
    return n;
}

/* The keys that signed a stored channel record. */
static size_t record_signers(const kiln_sign_trust *t, const char *text,
                             kiln_web_signer out[KILN_SIGN_RECORD_MAX_SIGS]) {
    kiln_sign_record rec;
    kiln_sign_record_init(&rec);
    size_t n = 0;
    if (text && kiln_sign_record_parse(text, strlen(text), "record", &rec) == KILN_OK) {
        for (size_t i = 0; i < rec.nsigs && n < KILN_SIGN_RECORD_MAX_SIGS; i++) {
            kiln_sign_sig sig;
            kiln_sign_sig_init(&sig);
            if (kiln_sign_sig_parse(rec.sigs[i], strlen(rec.sigs[i]), "record signature", &sig) ==
                KILN_OK)
                signer_of(t, sig.keyid, &out[n++]);
            kiln_sign_sig_release(&sig);
        }
    }
    kiln_sign_record_release(&rec);
    return n;
}

/* A record's expiry at now by sign/'s rule, as the page flags it. */
static kiln_web_expiry web_expiry(int64_t expires, int64_t now) {
    const kiln_record_expiry e = kiln_record_expiry_at(expires, now);
    return e == KILN_RECORD_EXPIRY_EXPIRED ? KILN_WEB_EXPIRY_EXPIRED
           : e == KILN_RECORD_EXPIRY_SOON  ? KILN_WEB_EXPIRY_SOON
                                           : KILN_WEB_EXPIRY_OK;
}

/* A stored channel record as the page shows it, from the row's columns at + 0 .. at + 7:
 * seq, version, digest, expires, reason, record (the signed JSON, whose signers go into
 * signers[]), publisher, created. The rest of *rec is zero for the caller to fill. */
static void record_row(const kiln_sign_trust *t, sqlite3_stmt *st, int at, int64_t now,
                       kiln_web_signer signers[KILN_SIGN_RECORD_MAX_SIGS], kiln_web_record *rec) {
    *rec = (kiln_web_record){.seq = sqlite3_column_int64(st, at),
                             .version = reg_col(st, at + 1),
                             .digest = reg_col(st, at + 2),
                             .expires = sqlite3_column_int64(st, at + 3),
                             .reason = reg_col(st, at + 4),
                             .publisher = reg_col(st, at + 6),
                             .created = sqlite3_column_int64(st, at + 7),
                             .expiry = web_expiry(sqlite3_column_int64(st, at + 3), now),
                             .signers = signers};
    rec->nsigners = record_signers(t, reg_col(st, at + 5), signers);
}

/* The current record of each of a model's channels: ?1 is the model. */
#define CURRENT_RECORDS                                                                            \
    " FROM (SELECT channel, max(seq) AS seq, count(*) AS n FROM channel_records"                   \
    "       WHERE model = ?1 GROUP BY channel) m"                                                  \
    " JOIN channel_records c ON c.model = ?1 AND c.channel = m.channel AND c.seq = m.seq"          \
    " ORDER BY c.channel"

/* ---- "/" ---- */

/* ---- a policy as the page shows it ---- */

typedef struct ui_policy {
    kiln_web_trust_policy p;
    kiln_web_trust_key *keys;
    kiln_web_trust_channel *chans;
} ui_policy;

static void ui_policy_release(ui_policy *u) {
    free(u->keys);
    free(u->chans);
    memset(u, 0, sizeof *u);
}

/* u points into t, which must outlive it. */
static kiln_err ui_policy_of(const kiln_sign_trust *t, ui_policy *u) {
    memset(u, 0, sizeof *u);
    size_t nk = kiln_sign_trust_key_count(t), nc = kiln_sign_trust_channel_count(t);
    u->keys = kiln_calloc(nk ? nk : 1, sizeof *u->keys);
    u->chans = kiln_calloc(nc ? nc : 1, sizeof *u->chans);
    if (!u->keys || !u->chans) {
        ui_policy_release(u);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < nk; i++) {
        const kiln_sign_trust_key *k = kiln_sign_trust_key_at(t, i);
        u->keys[i] = (kiln_web_trust_key){.name = k->name,
                                          .root = k->roles & KILN_SIGN_ROLE_ROOT,
                                          .release = k->roles & KILN_SIGN_ROLE_RELEASE,
                                          .promote = k->roles & KILN_SIGN_ROLE_PROMOTE};
        kiln_sign_keyid_hex(k->pub.keyid, u->keys[i].keyid);
    }
    for (size_t i = 0; i < nc; i++)
        u->chans[i].name = kiln_sign_trust_channel_at(t, i, &u->chans[i].threshold);
    u->p = (kiln_web_trust_policy){.version = kiln_sign_trust_version(t),
                                   .keys = u->keys,
                                   .nkeys = nk,
                                   .root_threshold = kiln_sign_trust_root_threshold(t),
                                   .release_threshold = kiln_sign_trust_release_threshold(t),
                                   .accept_unvalidated = kiln_sign_trust_accepts_unvalidated(t),
                                   .channels = u->chans,
                                   .nchannels = nc};
    return KILN_OK;
}

/* The datasets (kiln data publish), each with the versions whose card names its digest; no
 * section when there are none. */
static kiln_err datasets(sqlite3 *db, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL, *tr = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT name, digest, size, publisher, created FROM datasets ORDER BY "
                       "name, created, digest",
                       &st, "listing datasets"));
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT model || '@' || version FROM versions WHERE json_valid(card) AND "
                       "'sha256:' || json_extract(card, '$.lineage.dataset_sha256') = ?1 ORDER "
                       "BY model, created, version",
                       &tr, "listing datasets"));
    int r, n = 0;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        if (!n++) kiln_web_printf(b, "<h2>Datasets</h2>\n");
        char line[2048], when[21];
        kiln_format_time(sqlite3_column_int64(st, 4), when);
        size_t len = (size_t)snprintf(line, sizeof line, "%s %s, %lld bytes, published by %s at %s",
                                      reg_col(st, 0), reg_col(st, 1),
                                      (long long)sqlite3_column_int64(st, 2), reg_col(st, 3), when);
        sqlite3_reset(tr);
        sqlite3_bind_text(tr, 1, reg_col(st, 1), -1, SQLITE_TRANSIENT);
        for (int k = 0; sqlite3_step(tr) == SQLITE_ROW && len < sizeof line; k++)
            len += (size_t)snprintf(line + len, sizeof line - len, "%s%s",
                                    k ? ", " : "; trained on it: ", reg_col(tr, 0));
        kiln_web_para(b, line);
    }
    KILN_CHECK(rc, out, step_done(db, r, "listing datasets"));
out:
    sqlite3_finalize(st);
    sqlite3_finalize(tr);
    return rc;
}

kiln_err reg_ui_home(sqlite3 *db, const kiln_sign_trust *t, int64_t now, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL, *ch = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT model, count(*), max(created),"
                       " (SELECT version FROM versions w WHERE w.model = v.model"
                       "  ORDER BY created DESC, rowid DESC LIMIT 1),"
                       " (SELECT max(created) FROM channel_records c WHERE c.model = v.model)"
                       " FROM versions v GROUP BY model ORDER BY model",
                       &st, "listing models"));
    KILN_CHECK(rc, out,
               prepare(db, "SELECT c.channel, c.seq, c.version, c.expires" CURRENT_RECORDS, &ch,
                       "listing channels"));
    kiln_web_begin(b, KILN_WEB_HOME, NULL, NULL, NULL);
    reg_ui_mirror_line(db, now, b); /* mirror.c: a mirror says of what, and how fresh */
    if (t) {
        ui_policy u;
        KILN_CHECK(rc, out, ui_policy_of(t, &u));
        kiln_web_trust_summary(b, &u.p);
        ui_policy_release(&u);
    } else {
        kiln_web_trust_summary(b, NULL);
    }
    kiln_web_models_begin(b);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t updated = sqlite3_column_int64(st, 2);
        if (sqlite3_column_type(st, 4) != SQLITE_NULL && sqlite3_column_int64(st, 4) > updated)
            updated = sqlite3_column_int64(st, 4);
        kiln_web_model m = {.name = reg_col(st, 0),
                            .versions = sqlite3_column_int64(st, 1),
                            .latest = reg_col(st, 3),
                            .updated = updated};
        kiln_web_models_row(b, &m);
        sqlite3_reset(ch);
        sqlite3_bind_text(ch, 1, m.name, -1, SQLITE_TRANSIENT);
        int q;
        while ((q = sqlite3_step(ch)) == SQLITE_ROW) {
            kiln_web_record rec = {.channel = reg_col(ch, 0),
                                   .seq = sqlite3_column_int64(ch, 1),
                                   .version = reg_col(ch, 2),
                                   .expires = sqlite3_column_int64(ch, 3),
                                   .expiry = web_expiry(sqlite3_column_int64(ch, 3), now)};
            kiln_web_models_channel(b, m.name, &rec, now);
        }
        KILN_CHECK(rc, out, step_done(db, q, "listing channels"));
        kiln_web_models_row_end(b);
    }
    KILN_CHECK(rc, out, step_done(db, r, "listing models"));
    kiln_web_table_end(b, "Nothing has been published yet.");
    KILN_CHECK(rc, out, datasets(db, b));
    kiln_web_end(b, KILN_WEB_HOME, NULL, NULL, now);
out:
    sqlite3_finalize(st);
    sqlite3_finalize(ch);
    return rc;
}

/* ---- "/ui/models/{model}" ---- */

typedef struct current {
    char channel[KILN_REGISTRY_NAME_MAX + 1], version[KILN_REGISTRY_NAME_MAX + 1];
} current;

static kiln_err model_channels(sqlite3 *db, const kiln_sign_trust *t, const char *model,
                               int64_t now, kiln_web_buf *b, current **cur, size_t *ncur) {
    sqlite3_stmt *st = NULL;
    KILN_TRY(prepare(db,
                     "SELECT c.channel, c.seq, c.version, c.digest, c.expires, c.reason, c.record,"
                     " c.publisher, c.created, m.n" CURRENT_RECORDS,
                     &st, "reading channels"));
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    kiln_err rc = KILN_OK;
    kiln_web_channels_begin(b);
    int r;
    size_t cap = 0;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        kiln_web_signer signers[KILN_SIGN_RECORD_MAX_SIGS];
        kiln_web_record rec;
        record_row(t, st, 1, now, signers, &rec);
        rec.channel = reg_col(st, 0);
        rec.records = (size_t)sqlite3_column_int64(st, 9);
        kiln_web_channels_row(b, model, &rec, now);
        /* Remembered to tag the versions the channels point at. */
        if (*ncur == cap) {
            cap = cap ? 2 * cap : 8;
            current *nc = realloc(*cur, cap * sizeof *nc);
            KILN_CHECK_IF(rc, out, !nc, KILN_ERR_NOMEM, "out of memory");
            *cur = nc;
        }
        snprintf((*cur)[*ncur].channel, sizeof(*cur)->channel, "%s",
                 rec.channel ? rec.channel : "");
        snprintf((*cur)[*ncur].version, sizeof(*cur)->version, "%s",
                 rec.version ? rec.version : "");
        (*ncur)++;
    }
    KILN_CHECK(rc, out, step_done(db, r, "reading channels"));
    kiln_web_table_end(b, "No channel points at any version of this model yet.");
out:
    sqlite3_finalize(st);
    return rc;
}

static kiln_err model_versions(sqlite3 *db, const kiln_sign_trust *t, const char *model,
                               kiln_web_buf *b, const current *cur, size_t ncur) {
    sqlite3_stmt *st = NULL;
    KILN_TRY(prepare(db,
                     "SELECT version, digest, size, signature, card, validation, publisher, created"
                     " FROM versions WHERE model = ?1 ORDER BY created DESC, rowid DESC",
                     &st, "reading versions"));
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    kiln_err rc = KILN_OK;
    const char **chans = ncur ? malloc(ncur * sizeof *chans) : NULL;
    KILN_CHECK_IF(rc, out, ncur && !chans, KILN_ERR_NOMEM, "out of memory");
    kiln_web_versions_begin(b);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        kiln_web_signer signers[KILN_SIGN_ARCHIVE_MAX_SIGS];
        kiln_sign_sig *sigs;
        size_t nsigs;
        kiln_web_version v = {.version = reg_col(st, 0),
                              .digest = reg_col(st, 1),
                              .size = (uint64_t)sqlite3_column_int64(st, 2),
                              .publisher = reg_col(st, 6),
                              .created = sqlite3_column_int64(st, 7),
                              .signers = signers,
                              .channels = chans};
        v.nsigners = archive_signers(t, reg_col(st, 3), &sigs, &nsigs, signers);
        /* Stored canonical by the server; whatever does not parse is shown as no lineage. */
        json_t *card = reg_col(st, 4) ? json_loads(reg_col(st, 4), JSON_REJECT_DUPLICATES, NULL) : NULL;
        json_t *val = reg_col(st, 5) ? json_loads(reg_col(st, 5), JSON_REJECT_DUPLICATES, NULL) : NULL;
        json_t *passed = json_object_get(val, "passed");
        v.validation =
            json_is_boolean(passed) ? (json_is_true(passed) ? "passed" : "failed") : "absent";
        v.card = card;
        for (size_t i = 0; i < ncur; i++)
            if (v.version && !strcmp(cur[i].version, v.version))
                chans[v.nchannels++] = cur[i].channel;
        kiln_web_versions_row(b, model, &v);
        json_decref(card);
        json_decref(val);
        kiln_sign_archive_sigs_free(sigs, nsigs);
    }
    KILN_CHECK(rc, out, step_done(db, r, "reading versions"));
    kiln_web_table_end(b, "No versions.");
out:
    free(chans);
    sqlite3_finalize(st);
    return rc;
}

kiln_err reg_ui_model(sqlite3 *db, const kiln_sign_trust *t, const char *model, int64_t now,
                      kiln_web_buf *b) {
    sqlite3_stmt *st = NULL;
    KILN_TRY(prepare(db,
                     "SELECT EXISTS(SELECT 1 FROM versions WHERE model = ?1)"
                     " OR EXISTS(SELECT 1 FROM channel_records WHERE model = ?1)",
                     &st, "reading a model"));
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    int r = sqlite3_step(st);
    bool found = r == SQLITE_ROW && sqlite3_column_int(st, 0);
    sqlite3_finalize(st);
    if (r != SQLITE_ROW) return reg_db_fail(db, "reading a model");
    KILN_FAIL_IF(!found, KILN_ERR_NOTFOUND, "model '%s' not found", model);
    current *cur = NULL;
    size_t ncur = 0;
    kiln_web_begin(b, KILN_WEB_MODEL, model, NULL, NULL);
    kiln_err rc = model_channels(db, t, model, now, b, &cur, &ncur);
    if (!rc) rc = model_versions(db, t, model, b, cur, ncur);
    if (!rc) kiln_web_end(b, KILN_WEB_MODEL, model, NULL, now);
    free(cur);
    return rc;
}

/* ---- "/ui/models/{model}/channels/{channel}?before=SEQ" ---- */

kiln_err reg_ui_channel(sqlite3 *db, const kiln_sign_trust *t, const char *model,
                        const char *channel, int64_t before, int64_t now, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT count(*), max(seq) FROM channel_records"
                       " WHERE model = ?1 AND channel = ?2",
                       &st, "reading a channel"));
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, channel, -1, SQLITE_TRANSIENT);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_ROW, KILN_ERR_IO,
                  "registry database: %s while reading a channel", sqlite3_errmsg(db));
    int64_t total = sqlite3_column_int64(st, 0), current = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    st = NULL;
    KILN_CHECK_IF(rc, out, total == 0, KILN_ERR_NOTFOUND, "channel '%s' of model '%s' not found",
                  channel, model);
    /* Window functions run before ORDER BY and LIMIT, so the oldest record on a page still
     * knows the one before it. The versions' rowids are the order they were published in: a
     * record whose version came before the previous record's is a rollback. */
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT c.seq, c.version, c.digest, c.expires, c.reason, c.record,"
                       " c.publisher, c.created, lag(c.version) OVER w,"
                       " v.rowid < lag(v.rowid) OVER w"
                       " FROM channel_records c"
                       " LEFT JOIN versions v ON v.model = c.model AND v.version = c.version"
                       " WHERE c.model = ?1 AND c.channel = ?2 AND c.seq < ?3"
                       " WINDOW w AS (ORDER BY c.seq) ORDER BY c.seq DESC LIMIT ?4",
                       &st, "reading a channel"));
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, channel, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int64(st, 3, before > 0 ? before : INT64_MAX);
    sqlite3_bind_int(st, 4, UI_HISTORY_PAGE + 1);
    kiln_web_begin(b, KILN_WEB_CHANNEL, model, channel, NULL);
    kiln_web_history_begin(b, total, before);
    int r, n = 0;
    int64_t last = 0;
    while ((r = sqlite3_step(st)) == SQLITE_ROW && n < UI_HISTORY_PAGE) {
        kiln_web_signer signers[KILN_SIGN_RECORD_MAX_SIGS];
        kiln_web_record rec;
        record_row(t, st, 0, now, signers, &rec);
        rec.channel = channel;
        rec.previous = reg_col(st, 8);
        rec.older = sqlite3_column_int(st, 9) != 0;
        rec.current = rec.seq == current;
        kiln_web_history_row(b, model, &rec, now);
        last = rec.seq;
        n++;
    }
    bool more = r == SQLITE_ROW;
    KILN_CHECK(rc, out, more ? KILN_OK : step_done(db, r, "reading a channel"));
    kiln_web_history_end(b, model, channel, last, more);
    kiln_web_end(b, KILN_WEB_CHANNEL, model, channel, now);
out:
    sqlite3_finalize(st);
    return rc;
}

/* ---- "/ui/audit?after=ID" ---- */

kiln_err reg_ui_audit(sqlite3 *db, int64_t after, int64_t now, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    int64_t total = 0, newest = 0;
    if (after < 0) after = 0;
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT count(*), coalesce((SELECT id FROM audit ORDER BY id DESC"
                       " LIMIT 1 OFFSET ?1), 0) FROM audit",
                       &st, "reading the audit log"));
    sqlite3_bind_int(st, 1, UI_AUDIT_PAGE);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_ROW, KILN_ERR_IO,
                  "registry database: %s while reading the audit log", sqlite3_errmsg(db));
    total = sqlite3_column_int64(st, 0);
    newest = sqlite3_column_int64(st, 1);
    sqlite3_finalize(st);
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT id, time, token, action, model, version, channel, digest, reason"
                       " FROM audit WHERE id > ?1 ORDER BY id LIMIT ?2",
                       &st, "reading the audit log"));
    sqlite3_bind_int64(st, 1, after);
    sqlite3_bind_int(st, 2, UI_AUDIT_PAGE + 1);
    kiln_web_begin(b, KILN_WEB_AUDIT, NULL, NULL, NULL);
    kiln_web_audit_begin(b, after, total);
    int r, n = 0;
    int64_t last = after;
    while ((r = sqlite3_step(st)) == SQLITE_ROW && n < UI_AUDIT_PAGE) {
        kiln_web_audit e = {.id = sqlite3_column_int64(st, 0),
                            .time = sqlite3_column_int64(st, 1),
                            .token = reg_col(st, 2),
                            .action = reg_col(st, 3),
                            .model = reg_col(st, 4),
                            .version = reg_col(st, 5),
                            .channel = reg_col(st, 6),
                            .digest = reg_col(st, 7),
                            .reason = reg_col(st, 8)};
        kiln_web_audit_row(b, &e);
        last = e.id;
        n++;
    }
    bool more = r == SQLITE_ROW;
    KILN_CHECK(rc, out, more ? KILN_OK : step_done(db, r, "reading the audit log"));
    kiln_web_audit_end(b, last, more, newest);
    kiln_web_end(b, KILN_WEB_AUDIT, NULL, NULL, now);
out:
    sqlite3_finalize(st);
    return rc;
}

/* ---- "/ui/trust?before=N" ---- */

/* A stored version on the page, worked out on the walk up from the server's --trust. */
typedef struct trust_row {
    uint64_t version;
    int64_t created;
    char *publisher, *changes, *problem, *note;
    bool checked, in_force;
    kiln_sign_trust_update_result res;
} trust_row;

static void trust_row_release(trust_row *r) {
    free(r->publisher);
    free(r->changes);
    free(r->problem);
    free(r->note);
}

/* The walk: each stored version checked as the successor of the one below it, as a client
 * walks them; the first above the server's --trust against that policy. */
typedef struct trust_walk {
    const kiln_sign_trust *start; /* NULL: the server has no policy */
    uint64_t sv;                  /* start's version */
    uint64_t in_force;            /* the version the server uses */
    kiln_sign_trust *prev;        /* the row below's policy (verified or only parsed) */
    uint64_t prev_v;              /* its version; 0: none yet */
    bool prev_ok;                 /* it verified, and so did every version down to start */
} trust_walk;

static char *dup_or_null(const char *s) {
    return s && s[0] ? kiln_strdup(s) : NULL;
}

/* One stored version: checked against the version below it where there is one (start, or
 * the row below), else only parsed. out (NULL for a row below the page) gets what the page
 * shows. Only running out of memory fails: whatever is wrong with the row is its problem. */
static kiln_err walk_row(trust_walk *w, uint64_t v, const char *doc, size_t len, trust_row *out) {
    char label[64], problem[1536] = "", note[256] = "";
    snprintf(label, sizeof label, "trust version %llu", (unsigned long long)v);
    const kiln_sign_trust *base = NULL;
    bool base_ok = false, below = w->start && v <= w->sv;
    if (w->start && v == w->sv + 1) {
        base = w->start;
        base_ok = true;
    } else if (w->prev && w->prev_v + 1 == v) {
        base = w->prev;
        base_ok = w->prev_ok;
    }
    kiln_sign_trust_update_result local, *res = out ? &out->res : &local;
    memset(res, 0, sizeof *res);
    kiln_sign_trust *next = NULL;
    kiln_err rc;
    if (base) {
        rc = kiln_sign_trust_update(base, doc, len, label, &next, res);
        if (rc == KILN_ERR_NOMEM) return rc;
        if (rc) {
            snprintf(problem, sizeof problem, "%s", kiln_errmsg());
            /* Read anyway, so that what it would change is still shown. */
            if (kiln_sign_trust_parse(doc, len, label, &next) == KILN_ERR_NOMEM)
                return KILN_ERR_NOMEM;
        } else if (!base_ok && !below) {
            snprintf(problem, sizeof problem,
                     "it follows version %llu, but version %llu does not verify: no client "
                     "walks past it",
                     (unsigned long long)(v - 1), (unsigned long long)(v - 1));
        }
    } else {
        rc = kiln_sign_trust_parse(doc, len, label, &next);
        if (rc == KILN_ERR_NOMEM) return rc;
        if (rc)
            snprintf(problem, sizeof problem, "%s", kiln_errmsg());
        else if (kiln_sign_trust_version(next) != v)
            snprintf(problem, sizeof problem, "'%s' holds version %llu", label,
                     (unsigned long long)kiln_sign_trust_version(next));
        else if (!w->start)
            snprintf(problem, sizeof problem,
                     "this registry has no trust policy (serve --trust) to check it against");
        else if (!below && w->prev_v + 1 == v)
            snprintf(problem, sizeof problem,
                     "version %llu below it does not parse, so no client can walk to this one",
                     (unsigned long long)(v - 1));
        else if (!below)
            snprintf(problem, sizeof problem,
                     "version %llu is not stored: the chain of versions has a gap here that no "
                     "client can walk",
                     (unsigned long long)(v - 1));
    }
    kiln_errclear();
    if (below && !problem[0])
        snprintf(note, sizeof note,
                 "at or below the server's --trust (version %llu), where its walk starts",
                 (unsigned long long)w->sv);
    bool ok = base && base_ok && !below && !problem[0];
    kiln_err err = KILN_OK;
    if (out) {
        out->version = v;
        out->checked = base != NULL;
        out->in_force = ok && v == w->in_force;
        out->problem = dup_or_null(problem);
        out->note = dup_or_null(note);
        if ((problem[0] && !out->problem) || (note[0] && !out->note)) err = KILN_ERR_NOMEM;
        if (base && next && !err) {
            out->changes = kiln_sign_trust_diff(base, next);
            if (!out->changes) err = KILN_ERR_NOMEM;
        }
    }
    kiln_sign_trust_free(w->prev);
    w->prev = next;
    w->prev_v = v;
    w->prev_ok = ok;
    return err ? kiln_fail(err, "out of memory") : KILN_OK;
}

/* The signers of a row as web/ takes them, into s[] (KILN_SIGN_TRUST_MAX_SIGS). */
static size_t row_signers(const trust_row *r, kiln_web_trust_signer *s) {
    size_t n = 0;
    for (size_t i = 0; i < r->res.nsigs && i < KILN_SIGN_TRUST_MAX_SIGS; i++) {
        if (!r->res.sigs[i].keyid[0]) continue; /* the check stopped before it */
        s[n] = (kiln_web_trust_signer){.name = r->res.sigs[i].name,
                                       .old_root = r->res.sigs[i].old_root,
                                       .new_root = r->res.sigs[i].new_root};
        snprintf(s[n].keyid, sizeof s[n].keyid, "%s", r->res.sigs[i].keyid);
        n++;
    }
    return n;
}

kiln_err reg_ui_trust(sqlite3 *db, const kiln_sign_trust *in_force, const kiln_sign_trust *start,
                      uint64_t before, int64_t now, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL;
    kiln_err rc = KILN_OK;
    trust_row *rows = NULL;
    size_t n = 0;
    ui_policy u = {0};
    trust_walk w = {.start = start,
                    .sv = start ? kiln_sign_trust_version(start) : 0,
                    .in_force = in_force ? kiln_sign_trust_version(in_force) : 0};
    if (before > (uint64_t)INT64_MAX) before = 0; /* no version; read as the newest page */
    int64_t below = before > 0 ? (int64_t)before : INT64_MAX;
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT (SELECT count(*) FROM trust_versions WHERE version >= 1), low,"
                       " EXISTS(SELECT 1 FROM trust_versions WHERE version >= 1 AND version < low)"
                       " FROM (SELECT (SELECT version FROM trust_versions WHERE version >= 1"
                       "  AND version < ?1 ORDER BY version DESC LIMIT 1 OFFSET ?2) AS low)",
                       &st, "reading trust versions"));
    sqlite3_bind_int64(st, 1, below);
    sqlite3_bind_int(st, 2, UI_TRUST_PAGE - 1);
    KILN_CHECK_IF(rc, out, sqlite3_step(st) != SQLITE_ROW, KILN_ERR_IO,
                  "registry database: %s while reading trust versions", sqlite3_errmsg(db));
    int64_t total = sqlite3_column_int64(st, 0);
    /* The page's oldest version; with fewer than a page below before, every one is on it. */
    bool full = sqlite3_column_type(st, 1) != SQLITE_NULL;
    int64_t lowest = full ? sqlite3_column_int64(st, 1) : 1;
    bool more = sqlite3_column_int(st, 2) != 0;
    sqlite3_finalize(st);
    st = NULL;
    rows = kiln_calloc(UI_TRUST_PAGE, sizeof *rows);
    KILN_CHECK_IF(rc, out, !rows, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out,
               prepare(db,
                       "SELECT version, document, publisher, created FROM trust_versions"
                       " WHERE version >= 1 AND version < ?1 ORDER BY version",
                       &st, "reading trust versions"));
    sqlite3_bind_int64(st, 1, below);
    int r;
    while ((r = sqlite3_step(st)) == SQLITE_ROW) {
        int64_t v = sqlite3_column_int64(st, 0);
        const char *doc = (const char *)sqlite3_column_blob(st, 1);
        size_t len = (size_t)sqlite3_column_bytes(st, 1);
        trust_row *row = v >= lowest && n < UI_TRUST_PAGE ? &rows[n++] : NULL;
        KILN_CHECK(rc, out, walk_row(&w, (uint64_t)v, doc ? doc : "", len, row));
        if (row) {
            row->created = sqlite3_column_int64(st, 3);
            row->publisher = reg_col(st, 2) ? kiln_strdup(reg_col(st, 2)) : NULL;
            KILN_CHECK_IF(rc, out, reg_col(st, 2) && !row->publisher, KILN_ERR_NOMEM, "out of memory");
        }
    }
    KILN_CHECK(rc, out, step_done(db, r, "reading trust versions"));
    if (in_force) KILN_CHECK(rc, out, ui_policy_of(in_force, &u));
    kiln_web_begin(b, KILN_WEB_TRUST, NULL, NULL, NULL);
    kiln_web_trust_policy_show(b, in_force ? &u.p : NULL, w.sv);
    kiln_web_trust_history_begin(b, total, before);
    for (size_t i = n; i-- > 0;) {
        kiln_web_trust_signer signers[KILN_SIGN_TRUST_MAX_SIGS];
        const trust_row *t = &rows[i];
        kiln_web_trust_version v = {.version = t->version,
                                    .created = t->created,
                                    .publisher = t->publisher,
                                    .checked = t->checked,
                                    .signers = signers,
                                    .nsigners = row_signers(t, signers),
                                    .nold = t->res.nold,
                                    .nnew = t->res.nnew,
                                    .old_threshold = t->res.old_threshold,
                                    .new_threshold = t->res.new_threshold,
                                    .changes = t->changes,
                                    .problem = t->problem,
                                    .note = t->note,
                                    .in_force = t->in_force};
        kiln_web_trust_history_row(b, &v);
    }
    kiln_web_trust_history_end(b, n ? rows[0].version : 0, more);
    kiln_web_end(b, KILN_WEB_TRUST, NULL, NULL, now);
out:
    sqlite3_finalize(st);
    for (size_t i = 0; rows && i < n; i++)
        trust_row_release(&rows[i]);
    free(rows);
    kiln_sign_trust_free(w.prev);
    ui_policy_release(&u);
    return rc;
}

/* ---- "/ui/models/{model}/versions/{version}" ---- */

/* The summaries read last, by the archive's digest (a stored archive never changes): reaching
 * run_summary.json means decompressing the archive through model.safetensors, so a page seen
 * again is drawn from memory. Small summaries only; the least recently used goes. */
#define UI_SUMMARY_CACHE 8
#define UI_SUMMARY_CACHE_MAX (4u << 20)
static pthread_mutex_t summary_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char hex[KILN_SHA256_HEX];
    char *bytes; /* NULL: the archive has none */
    size_t len;
    unsigned long long used;
} summary_cache[UI_SUMMARY_CACHE];
static unsigned long long summary_tick;

/* Whether hex is cached: its bytes copied into *bytes (NULL when it has none). */
static bool summary_cached(const char *hex, char **bytes, size_t *len, bool *nomem) {
    bool hit = false;
    pthread_mutex_lock(&summary_mu);
    for (size_t i = 0; i < UI_SUMMARY_CACHE && !hit; i++)
        if (summary_cache[i].used && !strcmp(summary_cache[i].hex, hex)) {
            hit = true;
            summary_cache[i].used = ++summary_tick;
            *len = summary_cache[i].len;
            *bytes = NULL;
            if (summary_cache[i].bytes && !(*bytes = kiln_malloc(*len + 1))) *nomem = true;
            if (*bytes) memcpy(*bytes, summary_cache[i].bytes, *len + 1);
        }
    pthread_mutex_unlock(&summary_mu);
    return hit;
}

static void summary_keep(const char *hex, const char *bytes, size_t len) {
    if (bytes && len > UI_SUMMARY_CACHE_MAX) return;
    char *copy = NULL;
    if (bytes && !(copy = kiln_malloc(len + 1))) return;
    if (copy) memcpy(copy, bytes, len + 1);
    pthread_mutex_lock(&summary_mu);
    size_t lru = 0;
    for (size_t i = 1; i < UI_SUMMARY_CACHE; i++)
        if (summary_cache[i].used < summary_cache[lru].used) lru = i;
    free(summary_cache[lru].bytes);
    memcpy(summary_cache[lru].hex, hex, KILN_SHA256_HEX);
    summary_cache[lru].bytes = copy;
    summary_cache[lru].len = len;
    summary_cache[lru].used = ++summary_tick;
    pthread_mutex_unlock(&summary_mu);
}

/* The run summary the stored archive carries, parsed; NULL when it carries none. A summary
 * that does not match the manifest, or an archive that cannot be read, fails. */
#define UI_SUMMARY_MAX (16u << 20)
static kiln_err version_summary(const char *root, const char *digest, json_t **out) {
    *out = NULL;
    char hex[KILN_SHA256_HEX];
    KILN_FAIL_IF(!digest || !reg_digest_hex(digest, hex), KILN_ERR_FORMAT,
                 "stored digest '%s' is malformed", digest ? digest : "");
    char *cbytes = NULL;
    size_t clen = 0;
    bool nomem = false;
    if (summary_cached(hex, &cbytes, &clen, &nomem)) {
        KILN_FAIL_IF(nomem, KILN_ERR_NOMEM, "out of memory");
        if (cbytes) *out = json_loadb(cbytes, clen, JSON_REJECT_DUPLICATES, NULL);
        free(cbytes);
        return KILN_OK;
    }
    char *path = reg_blob_path(root, hex);
    KILN_FAIL_IF(!path, KILN_ERR_NOMEM, "out of memory");
    kiln_manifest *m = NULL;
    json_t *card = NULL;
    char *bytes = NULL;
    size_t len = 0;
    kiln_err rc = kiln_archive_inspect_with(path, "run_summary.json", UI_SUMMARY_MAX, &m, &card,
                                            &bytes, &len);
    free(path);
    if (!rc && bytes) {
        json_error_t je;
        *out = json_loadb(bytes, len, JSON_REJECT_DUPLICATES, &je);
        if (!*out)
            rc = kiln_fail(KILN_ERR_FORMAT, "run_summary.json of %s: %s (line %d)", digest, je.text,
                           je.line);
    } else if (!rc && len) {
        rc = kiln_fail(KILN_ERR_FORMAT, "run_summary.json of %s: %zu bytes, more than the %u read",
                       digest, len, UI_SUMMARY_MAX);
    }
    if (!rc) summary_keep(hex, bytes, len);
    free(bytes);
    json_decref(card);
    kiln_manifest_free(m);
    return rc;
}

/* The version's reproduction records (kiln reproduce --sign), one line each as verified here
 * under the server's policy (docs/reproduce.md). */
static void reproductions(sqlite3 *db, const kiln_sign_trust *t, const char *model,
                          const char *version, const char *digest, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL;
    kiln_web_printf(b, "<h2>Reproductions</h2>\n");
    if (prepare(db,
                "SELECT record, signature FROM reproductions WHERE model = ?1 AND version = ?2 "
                "ORDER BY created, rowid",
                &st, "reading reproduction records")) {
        kiln_web_para(b, kiln_errmsg());
        kiln_errclear();
        return;
    }
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
    int n = 0;
    while (sqlite3_step(st) == SQLITE_ROW) {
        char line[1024];
        const kiln_sign_trust_key *k = NULL;
        bool same = false;
        json_t *rec = NULL;
        n++;
        if (!t) {
            snprintf(line, sizeof line,
                     "a record, not verified: this registry has no trust policy");
        } else if (reg_repro_verify(t, reg_col(st, 0), reg_col(st, 1), "reproduction record", model,
                                    version, digest, &k, &same) != KILN_OK) {
            snprintf(line, sizeof line, "a record that does not verify: %s", kiln_errmsg());
            kiln_errclear();
        } else {
            rec = json_loads(reg_col(st, 0), JSON_REJECT_DUPLICATES, NULL);
            snprintf(line, sizeof line, "%s by %s on %s at %s, kiln %s (verified)",
                     same ? "identical" : "different", k->name,
                     json_string_value(json_object_get(rec, "host")) ?: "?",
                     json_string_value(json_object_get(rec, "time")) ?: "?",
                     json_string_value(json_object_get(rec, "code_version")) ?: "?");
        }
        json_decref(rec);
        kiln_web_para(b, line);
    }
    sqlite3_finalize(st);
    if (!n) kiln_web_para(b, "No reproduction records (kiln reproduce --sign puts one).");
}

kiln_err reg_ui_version(sqlite3 *db, const kiln_sign_trust *t, const char *root, const char *model,
                        const char *version, int64_t now, kiln_web_buf *b) {
    sqlite3_stmt *st = NULL;
    KILN_TRY(prepare(db,
                     "SELECT version, digest, size, signature, card, validation, publisher, created,"
                     " validation_text FROM versions WHERE model = ?1 AND version = ?2",
                     &st, "reading a version"));
    sqlite3_bind_text(st, 1, model, -1, SQLITE_TRANSIENT);
    sqlite3_bind_text(st, 2, version, -1, SQLITE_TRANSIENT);
    int r = sqlite3_step(st);
    if (r != SQLITE_ROW) {
        kiln_err rc = r == SQLITE_DONE ? kiln_fail(KILN_ERR_NOTFOUND, "version '%s' of model '%s' "
                                                                      "not found",
                                                   version, model)
                                       : reg_db_fail(db, "reading a version");
        sqlite3_finalize(st);
        return rc;
    }
    kiln_web_signer signers[KILN_SIGN_ARCHIVE_MAX_SIGS];
    kiln_sign_sig *sigs = NULL;
    size_t nsigs = 0;
    kiln_web_version v = {.version = reg_col(st, 0),
                          .digest = reg_col(st, 1),
                          .size = (uint64_t)sqlite3_column_int64(st, 2),
                          .publisher = reg_col(st, 6),
                          .created = sqlite3_column_int64(st, 7),
                          .signers = signers};
    v.nsigners = archive_signers(t, reg_col(st, 3), &sigs, &nsigs, signers);
    json_t *card = reg_col(st, 4) ? json_loads(reg_col(st, 4), JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *val = reg_col(st, 5) ? json_loads(reg_col(st, 5), JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *passed = json_object_get(val, "passed");
    v.validation = json_is_boolean(passed) ? (json_is_true(passed) ? "passed" : "failed") : "absent";
    v.card = card;
    json_t *summary = NULL;
    kiln_err src = version_summary(root, v.digest, &summary);
    kiln_web_begin(b, KILN_WEB_VERSION, model, version, NULL);
    kiln_web_versions_begin(b);
    kiln_web_versions_row(b, model, &v);
    kiln_web_table_end(b, NULL);
    /* The whole report (validation.json's bytes, as kiln provenance reads it). */
    json_t *report = reg_col(st, 8) ? json_loads(reg_col(st, 8), JSON_REJECT_DUPLICATES, NULL) : NULL;
    kiln_web_validation_report(b, report ? report : val);
    json_decref(report);
    if (src) {
        /* The page still shows what the store holds; the archive's trouble is said. */
        kiln_web_run_summary(b, NULL);
        kiln_web_para(b, kiln_errmsg());
    } else {
        kiln_web_run_summary(b, summary);
    }
    reproductions(db, t, model, version, v.digest, b);
    kiln_web_end(b, KILN_WEB_VERSION, model, version, now);
    json_decref(summary);
    json_decref(card);
    json_decref(val);
    kiln_sign_archive_sigs_free(sigs, nsigs);
    sqlite3_finalize(st);
    return KILN_OK;
}
