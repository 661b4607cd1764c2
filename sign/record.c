/* record.c - signed channel records: which version of a model a channel points at, with
 * a sequence number against rollback and an expiry against replay, signed by as many
 * promote keys as the channel's threshold asks. Every signature is a minisign signature
 * over the canonical body; the body carries its own format tag, so a signature over a
 * record cannot be taken for a signature over anything else kiln signs. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "sign_int.h"

#define RECORD_FORMAT "kiln-channel/1"
#define RECORD_FILE_LIMIT (1u << 20)
#define RECORD_SEQ_MAX ((1ull << 53) - 1) /* exact in every JSON reader */

/* ---- time ------------------------------------------------------------------------- */

static bool digits(const char *s, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

kiln_err kiln_sign_parse_time(const char *s, const char *what, int64_t *out) {
    int Y, M, D, h, m, sec;
    bool ok = strlen(s) == 20 && digits(s, 4, &Y) && s[4] == '-' && digits(s + 5, 2, &M) &&
              s[7] == '-' && digits(s + 8, 2, &D) && s[10] == 'T' && digits(s + 11, 2, &h) &&
              s[13] == ':' && digits(s + 14, 2, &m) && s[16] == ':' && digits(s + 17, 2, &sec) &&
              s[19] == 'Z' && Y >= 1970 && M >= 1 && M <= 12 && D >= 1 && D <= 31 && h <= 23 &&
              m <= 59 && sec <= 59;
    if (ok) {
        struct tm tm = {.tm_year = Y - 1900,
                        .tm_mon = M - 1,
                        .tm_mday = D,
                        .tm_hour = h,
                        .tm_min = m,
                        .tm_sec = sec};
        int64_t t = (int64_t)timegm(&tm);
        char back[21];
        kiln_format_time(t, back);
        ok = !strcmp(back, s); /* refuses 2025-02-30 and friends */
        if (ok) *out = t;
    }
    KILN_FAIL_IF(!ok, KILN_ERR_FORMAT,
                 "%s: '%.40s' is not an RFC 3339 UTC time like 2026-01-31T12:00:00Z", what, s);
    return KILN_OK;
}

/* ---- the archive's trusted comment --------------------------------------------------- */

#define ARCHIVE_TAG "kiln-archive/1"
#define ARCHIVE_ALLOW "allow-unvalidated"

static const char *const verdicts[] = {"unset", "passed", "failed", "absent"};

const char *kiln_sign_validation_name(kiln_sign_validation v) {
    return (unsigned)v < KILN_ARRAY_LEN(verdicts) ? verdicts[v] : verdicts[0];
}

char *kiln_sign_archive_comment(const kiln_sign_archive_info *info) {
    if (!kiln_sign_name_ok(info->model) || !kiln_sign_name_ok(info->version)) {
        kiln_fail(KILN_ERR_USAGE, "model '%.64s' and version '%.64s' must be names", info->model,
                  info->version);
        return NULL;
    }
    kiln_sign_validation v = info->validation;
    if (v != KILN_SIGN_VALIDATION_PASSED && v != KILN_SIGN_VALIDATION_FAILED &&
        v != KILN_SIGN_VALIDATION_ABSENT) {
        kiln_fail(KILN_ERR_USAGE, "archive trusted comment: the validation verdict is not set");
        return NULL;
    }
    if (info->allow_unvalidated != (v != KILN_SIGN_VALIDATION_PASSED)) {
        kiln_fail(KILN_ERR_USAGE, "archive trusted comment: allow-unvalidated goes with a "
                                  "verdict other than passed, and only with one");
        return NULL;
    }
    char hex[KILN_SHA256_HEX];
    kiln_hex(info->manifest_sha256, 32, hex);
    return kiln_asprintf(ARCHIVE_TAG "\tmodel:%s\tversion:%s\tmanifest:sha256:%s\tvalidation:%s%s",
                         info->model, info->version, hex, kiln_sign_validation_name(v),
                         info->allow_unvalidated ? "\t" ARCHIVE_ALLOW : "");
}

/* One "key:value" field of the comment at *p, ending at a tab or the end: *val and *n get the
 * value, *p moves past it and its tab. KILN_ERR_FORMAT when the key is not there. */
static kiln_err comment_field(const char **p, const char *key, int index, const char *label,
                              const char **val, size_t *n) {
    size_t kl = strlen(key);
    KILN_FAIL_IF(strncmp(*p, key, kl) != 0, KILN_ERR_FORMAT,
                 "'%s': archive trusted comment: expected '%s' as field %d", label, key, index);
    *val = *p + kl;
    const char *end = strchr(*val, '\t');
    *n = end ? (size_t)(end - *val) : strlen(*val);
    *p = *val + *n + (end ? 1 : 0);
    return KILN_OK;
}

kiln_err kiln_sign_archive_comment_parse(const char *tc, const char *label,
                                         kiln_sign_archive_info *out) {
    memset(out, 0, sizeof *out);
    size_t tl = strlen(ARCHIVE_TAG);
    KILN_FAIL_IF(
        strncmp(tc, ARCHIVE_TAG "\t", tl + 1) != 0, KILN_ERR_FORMAT,
        "'%s': the trusted comment is not a kiln archive's (it should start with '" ARCHIVE_TAG
        "')",
        label);
    const char *p = tc + tl + 1, *v;
    size_t n;
    static const char *const names[] = {"model:", "version:"};
    for (int i = 0; i < 2; i++) {
        KILN_TRY(comment_field(&p, names[i], i + 2, label, &v, &n));
        KILN_FAIL_IF(n > KILN_SIGN_NAME_MAX, KILN_ERR_FORMAT,
                     "'%s': archive trusted comment: '%s' is too long", label, names[i]);
        char *dst = i == 0 ? out->model : out->version;
        memcpy(dst, v, n);
        dst[n] = 0;
        KILN_FAIL_IF(!kiln_sign_name_ok(dst), KILN_ERR_FORMAT,
                     "'%s': archive trusted comment: '%s' is not a name", label, names[i]);
    }
    KILN_TRY(comment_field(&p, "manifest:sha256:", 4, label, &v, &n));
    char hex[65] = "";
    if (n == 64) memcpy(hex, v, 64);
    KILN_FAIL_IF(n != 64 || !kiln_unhex(hex, out->manifest_sha256, 32), KILN_ERR_FORMAT,
                 "'%s': archive trusted comment: the manifest digest is not 64 hex digits", label);
    for (size_t k = 0; k < 64; k++)
        KILN_FAIL_IF(v[k] >= 'A' && v[k] <= 'F', KILN_ERR_FORMAT,
                     "'%s': archive trusted comment: the manifest digest must be lowercase", label);
    KILN_FAIL_IF(!*p && v[n] != '\t', KILN_ERR_FORMAT,
                 "'%s': archive trusted comment: the 'validation:' field is missing", label);
    KILN_TRY(comment_field(&p, "validation:", 5, label, &v, &n));
    for (int i = KILN_SIGN_VALIDATION_PASSED; i <= KILN_SIGN_VALIDATION_ABSENT; i++)
        if (strlen(verdicts[i]) == n && !strncmp(v, verdicts[i], n))
            out->validation = (kiln_sign_validation)i;
    KILN_FAIL_IF(!out->validation, KILN_ERR_FORMAT,
                 "'%s': archive trusted comment: validation must be passed, failed or absent",
                 label);
    bool more = v[n] == '\t';
    bool passed = out->validation == KILN_SIGN_VALIDATION_PASSED;
    if (passed) {
        KILN_FAIL_IF(more, KILN_ERR_FORMAT,
                     "'%s': archive trusted comment: unexpected field after 'validation:passed'",
                     label);
        return KILN_OK;
    }
    KILN_FAIL_IF(!more || strcmp(p, ARCHIVE_ALLOW) != 0, KILN_ERR_FORMAT,
                 "'%s': archive trusted comment: validation:%s must be followed by exactly '"
                 "\\t" ARCHIVE_ALLOW "'",
                 label, verdicts[out->validation]);
    out->allow_unvalidated = true;
    return KILN_OK;
}

/* ---- records ------------------------------------------------------------------------- */

void kiln_sign_record_init(kiln_sign_record *r) {
    memset(r, 0, sizeof *r);
}

static void free_sigs(kiln_sign_record *r) {
    for (size_t i = 0; i < r->nsigs; i++)
        free(r->sigs[i]);
    free(r->sigs);
    r->sigs = NULL;
    r->nsigs = 0;
}

void kiln_sign_record_release(kiln_sign_record *r) {
    free_sigs(r);
    free(r->reason);
    kiln_sign_record_init(r);
}

static kiln_err check_fields(const char *model, const char *channel, const char *version,
                             uint64_t seq, const char *reason, const char *label) {
    KILN_FAIL_IF(!kiln_sign_name_ok(model), KILN_ERR_FORMAT,
                 "'%s': model '%.64s' must be 1 to %d letters, digits and ._+-", label, model,
                 KILN_SIGN_NAME_MAX);
    KILN_FAIL_IF(!kiln_sign_name_ok(channel), KILN_ERR_FORMAT,
                 "'%s': channel '%.64s' must be 1 to %d letters, digits and ._+-", label, channel,
                 KILN_SIGN_NAME_MAX);
    KILN_FAIL_IF(!kiln_sign_name_ok(version), KILN_ERR_FORMAT,
                 "'%s': version '%.64s' must be 1 to %d letters, digits and ._+-", label, version,
                 KILN_SIGN_NAME_MAX);
    KILN_FAIL_IF(seq < 1 || seq > RECORD_SEQ_MAX, KILN_ERR_FORMAT,
                 "'%s': seq %llu must be between 1 and 2^53-1", label, (unsigned long long)seq);
    size_t rl = strlen(reason);
    KILN_FAIL_IF(rl == 0 || rl > KILN_SIGN_REASON_MAX, KILN_ERR_FORMAT,
                 "'%s': reason must be 1 to %d bytes", label, KILN_SIGN_REASON_MAX);
    for (size_t i = 0; i < rl; i++)
        KILN_FAIL_IF((unsigned char)reason[i] < 0x20 || reason[i] == 0x7f, KILN_ERR_FORMAT,
                     "'%s': reason contains a control character", label);
    return KILN_OK;
}

kiln_err kiln_sign_record_set(kiln_sign_record *r, const char *model, const char *channel,
                              const char *version, const uint8_t digest[32], uint64_t seq,
                              int64_t expires, const char *reason) {
    KILN_TRY(check_fields(model, channel, version, seq, reason, "channel record"));
    char *rs = kiln_strdup(reason);
    if (!rs) return KILN_ERR_NOMEM;
    kiln_sign_record_release(r);
    snprintf(r->model, sizeof r->model, "%s", model);
    snprintf(r->channel, sizeof r->channel, "%s", channel);
    snprintf(r->version, sizeof r->version, "%s", version);
    memcpy(r->digest, digest, 32);
    r->seq = seq;
    r->expires = expires;
    r->reason = rs;
    return KILN_OK;
}

static json_t *body_json(const kiln_sign_record *r) {
    char hex[KILN_SHA256_HEX], exp[21];
    kiln_digest digest;
    kiln_hex(r->digest, 32, hex);
    snprintf(digest, sizeof digest, "sha256:%s", hex);
    kiln_format_time(r->expires, exp);
    json_t *b =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:s, s:I, s:s}", "format", RECORD_FORMAT, "model",
                  r->model, "channel", r->channel, "version", r->version, "digest", digest,
                  "expires", exp, "seq", (json_int_t)r->seq, "reason", r->reason ? r->reason : "");
    if (!b) kiln_fail(KILN_ERR_NOMEM, "out of memory building a channel record");
    return b;
}

kiln_err kiln_sign_record_body(const kiln_sign_record *r, char **out, size_t *len) {
    *out = NULL;
    json_t *b = body_json(r);
    if (!b) return KILN_ERR_NOMEM;
    *out = kiln_json_canonical(b);
    json_decref(b);
    if (!*out) return KILN_ERR_NOMEM;
    *len = strlen(*out);
    return KILN_OK;
}

kiln_err kiln_sign_record_add_signature(kiln_sign_record *r, const kiln_sign_seckey *sk) {
    KILN_FAIL_IF(r->nsigs >= KILN_SIGN_RECORD_MAX_SIGS, KILN_ERR_LIMIT,
                 "a channel record holds at most %d signatures", KILN_SIGN_RECORD_MAX_SIGS);
    kiln_sign_pubkey pk;
    KILN_TRY(kiln_sign_seckey_pubkey(sk, &pk));
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(pk.keyid, id);
    for (size_t i = 0; i < r->nsigs; i++) {
        kiln_sign_sig s;
        kiln_sign_sig_init(&s);
        KILN_TRY(
            sign_sig_parse_in(r->sigs[i], strlen(r->sigs[i]), "channel record", "signature", &s));
        bool same = !sodium_memcmp(s.keyid, pk.keyid, KILN_SIGN_KEYID_BYTES);
        kiln_sign_sig_release(&s);
        KILN_FAIL_IF(same, KILN_ERR_CONFLICT, "the record is already signed by key id %s", id);
    }
    char *text = NULL, *tc = NULL;
    json_t *body = body_json(r);
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !body, KILN_ERR_NOMEM, "out of memory");
    tc = kiln_asprintf(RECORD_FORMAT "\tmodel:%s\tchannel:%s\tversion:%s\tseq:%llu", r->model,
                       r->channel, r->version, (unsigned long long)r->seq);
    KILN_CHECK_IF(rc, out, !tc, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, out, sign_canonical_sign(body, sk, tc, &text));
    char **nv = realloc(r->sigs, (r->nsigs + 1) * sizeof *nv);
    KILN_CHECK_IF(rc, out, !nv, KILN_ERR_NOMEM, "out of memory");
    r->sigs = nv;
    r->sigs[r->nsigs++] = text;
    text = NULL;
out:
    json_decref(body);
    free(text);
    free(tc);
    return rc;
}

static const char *str_field(const json_t *o, const char *k) {
    return sign_json_str(json_object_get(o, k));
}

kiln_err kiln_sign_record_parse(const char *buf, size_t len, const char *label,
                                kiln_sign_record *r) {
    static const char *const top[] = {"record", "signatures", NULL};
    static const char *const body[] = {"channel", "digest", "expires", "format", "model",
                                       "reason",  "seq",    "version", NULL};
    kiln_sign_record_release(r);
    KILN_TRY(sign_init());
    json_t *j = NULL;
    KILN_TRY(kiln_json_parse(buf, len, label, &j));
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !json_is_object(j), KILN_ERR_FORMAT, "'%s': not a JSON object", label);
    KILN_CHECK(rc, out, sign_only_fields(j, top, label, NULL));
    const json_t *b = json_object_get(j, "record");
    KILN_CHECK_IF(rc, out, !json_is_object(b), KILN_ERR_FORMAT, "'%s': 'record' must be an object",
                  label);
    KILN_CHECK(rc, out, sign_only_fields(b, body, label, "record"));
    for (const char *const *a = body; *a; a++) {
        const json_t *f = json_object_get(b, *a);
        bool isint = !strcmp(*a, "seq");
        KILN_CHECK_IF(rc, out, !f, KILN_ERR_FORMAT, "'%s': record: '%s' is missing", label, *a);
        KILN_CHECK_IF(rc, out, isint ? !json_is_integer(f) : !sign_json_str(f), KILN_ERR_FORMAT,
                      "'%s': record: '%s' must be %s", label, *a,
                      isint ? "an integer" : "a string (without NUL characters)");
    }
    const char *fmt = str_field(b, "format");
    KILN_CHECK_IF(rc, out, strcmp(fmt, RECORD_FORMAT) != 0, KILN_ERR_FORMAT,
                  "'%s': record: 'format' must be \"" RECORD_FORMAT "\"", label);
    json_int_t seq = json_integer_value(json_object_get(b, "seq"));
    KILN_CHECK_IF(rc, out, seq < 1, KILN_ERR_FORMAT, "'%s': seq %lld must be at least 1", label,
                  (long long)seq);
    KILN_CHECK(rc, out,
               check_fields(str_field(b, "model"), str_field(b, "channel"), str_field(b, "version"),
                            (uint64_t)seq, str_field(b, "reason"), label));
    const char *dg = str_field(b, "digest");
    bool dok = strlen(dg) == 71 && !strncmp(dg, "sha256:", 7) && kiln_unhex(dg + 7, r->digest, 32);
    for (size_t i = 7; dok && i < 71; i++)
        dok = !(dg[i] >= 'A' && dg[i] <= 'F');
    KILN_CHECK_IF(rc, out, !dok, KILN_ERR_FORMAT,
                  "'%s': record: 'digest' must be \"sha256:\" and 64 lowercase hex digits", label);
    char what[KILN_SIGN_NAME_MAX + 64];
    snprintf(what, sizeof what, "'%s': record: 'expires'", label);
    KILN_CHECK(rc, out, kiln_sign_parse_time(str_field(b, "expires"), what, &r->expires));
    snprintf(r->model, sizeof r->model, "%s", str_field(b, "model"));
    snprintf(r->channel, sizeof r->channel, "%s", str_field(b, "channel"));
    snprintf(r->version, sizeof r->version, "%s", str_field(b, "version"));
    r->seq = (uint64_t)seq;
    r->reason = kiln_strdup(str_field(b, "reason"));
    KILN_CHECK_IF(rc, out, !r->reason, KILN_ERR_NOMEM, "out of memory");

    const json_t *sigs = json_object_get(j, "signatures");
    KILN_CHECK(rc, out, sign_sigs_check(sigs, KILN_SIGN_RECORD_MAX_SIGS, label, "a record"));
    size_t n = json_array_size(sigs);
    r->sigs = kiln_calloc(n, sizeof *r->sigs);
    KILN_CHECK_IF(rc, out, !r->sigs, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++) {
        r->sigs[i] = kiln_strdup(json_string_value(json_array_get(sigs, i)));
        KILN_CHECK_IF(rc, out, !r->sigs[i], KILN_ERR_NOMEM, "out of memory");
        r->nsigs++;
    }
out:
    json_decref(j);
    if (rc != KILN_OK) kiln_sign_record_release(r);
    return rc;
}

kiln_err kiln_sign_record_load(const char *path, kiln_sign_record *r) {
    char *buf;
    size_t len;
    kiln_sign_record_release(r);
    KILN_TRY(kiln_read_file(path, RECORD_FILE_LIMIT, &buf, &len));
    kiln_err rc = kiln_sign_record_parse(buf, len, path, r);
    free(buf);
    return rc;
}

/* The file's JSON: {"record": body, "signatures": [...]}; new reference. */
static kiln_err record_file_json(const kiln_sign_record *r, const char *label, json_t **out) {
    *out = NULL;
    KILN_FAIL_IF(r->nsigs == 0, KILN_ERR_USAGE, "'%s': a channel record needs a signature", label);
    json_t *b = body_json(r), *sigs = json_array(), *top = NULL;
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, out, !b || !sigs, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < r->nsigs; i++)
        KILN_CHECK_IF(rc, out, json_array_append_new(sigs, json_string(r->sigs[i])) != 0,
                      KILN_ERR_NOMEM, "out of memory");
    top = json_pack("{s:O, s:O}", "record", b, "signatures", sigs);
    KILN_CHECK_IF(rc, out, !top, KILN_ERR_NOMEM, "out of memory");
    *out = top;
out:
    json_decref(b);
    json_decref(sigs);
    return rc;
}

kiln_err kiln_sign_record_save(const kiln_sign_record *r, const char *path) {
    json_t *top;
    KILN_TRY(record_file_json(r, path, &top));
    kiln_err rc = kiln_json_write_file(path, top);
    json_decref(top);
    return rc;
}

kiln_err kiln_sign_record_text(const kiln_sign_record *r, char **text, size_t *len) {
    *text = NULL;
    *len = 0;
    json_t *top;
    KILN_TRY(record_file_json(r, "channel record", &top));
    /* What kiln_json_write_file writes, so that a saved file and this text are the same bytes. */
    *text = kiln_json_document(top, len);
    json_decref(top);
    KILN_FAIL_IF(!*text, KILN_ERR_NOMEM, "out of memory encoding a channel record");
    return KILN_OK;
}

kiln_err kiln_sign_record_verify(const kiln_sign_record *r, const kiln_sign_trust *t, int64_t now,
                                 uint64_t min_seq, const char *label,
                                 kiln_sign_record_result *res) {
    kiln_sign_record_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    KILN_TRY(sign_init());
    int threshold;
    if (kiln_sign_trust_threshold(t, r->channel, &threshold) != KILN_OK)
        return kiln_fail(KILN_ERR_VERIFY, "'%s': channel '%s' is not in the trust policy '%s'",
                         label, r->channel, sign_trust_label(t));
    res->threshold = threshold;
    KILN_FAIL_IF(r->nsigs == 0 || r->nsigs > KILN_SIGN_RECORD_MAX_SIGS, KILN_ERR_VERIFY,
                 "'%s': the record has %zu signatures", label, r->nsigs);
    char *body;
    size_t blen;
    KILN_TRY(kiln_sign_record_body(r, &body, &blen));
    kiln_err rc = KILN_OK;
    size_t repeats = 0;
    char what[64];
    for (size_t i = 0; i < r->nsigs; i++) {
        kiln_sign_sig s;
        kiln_sign_sig_init(&s);
        snprintf(what, sizeof what, "signature %zu", i + 1);
        rc = sign_sig_parse_in(r->sigs[i], strlen(r->sigs[i]), label, what, &s);
        const kiln_sign_trust_key *k = NULL;
        if (rc == KILN_OK) rc = sign_trust_signer(t, &s, KILN_SIGN_ROLE_PROMOTE, &k);
        if (rc == KILN_OK) rc = kiln_sign_verify_buffer(&k->pub, &s, body, blen, "the record body");
        kiln_sign_sig_release(&s);
        if (rc != KILN_OK) goto out;
        bool seen = false;
        for (size_t j = 0; j < res->nsigners; j++)
            seen = seen || res->signers[j] == k;
        if (seen)
            repeats++;
        else
            res->signers[res->nsigners++] = k;
    }
    if (res->nsigners < (size_t)threshold) {
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "'%s': channel '%s' needs %d distinct promote keys, the record is signed by "
                       "%zu%s",
                       label, r->channel, threshold, res->nsigners,
                       repeats ? " (a key that signs more than once counts once)" : "");
        goto out;
    }
    char exp[21], nows[21];
    kiln_format_time(r->expires, exp);
    kiln_format_time(now, nows);
    KILN_CHECK_IF(rc, out, now >= r->expires, KILN_ERR_VERIFY,
                  "'%s': the record expired at %s (now %s)", label, exp, nows);
    KILN_CHECK_IF(rc, out, r->seq < min_seq, KILN_ERR_VERIFY,
                  "'%s': seq %llu is lower than %llu, the last this client accepted for channel "
                  "'%s' (a rollback to an older record)",
                  label, (unsigned long long)r->seq, (unsigned long long)min_seq, r->channel);
out:
    free(body);
    return rc;
}

kiln_record_expiry kiln_record_expiry_at(int64_t expires, int64_t now) {
    if (expires <= now) return KILN_RECORD_EXPIRY_EXPIRED;
    return expires - now < KILN_RECORD_SOON_SECS ? KILN_RECORD_EXPIRY_SOON : KILN_RECORD_EXPIRY_OK;
}

const char *kiln_record_expiry_name(kiln_record_expiry e) {
    return e == KILN_RECORD_EXPIRY_EXPIRED ? "expired"
           : e == KILN_RECORD_EXPIRY_SOON  ? "expires soon"
                                           : "ok";
}
