/* trust.c - the trust policy (trust.json): named public keys with roles, and per channel
 * how many distinct promote keys must sign its records; its version and the root keys that
 * sign the next version (sign/rotate.c). Parsed strictly: a policy that is ambiguous (a key
 * listed twice under two names) would let one key count as two. A file may hold the policy
 * itself or a signed policy ({"policy": ..., "signatures": [...]}); the policy a client is
 * configured with is its root of trust, so a signed one's signatures are parsed but not
 * checked here (kiln_sign_trust_update checks them against the version before). */
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "sign_int.h"

#define TRUST_FORMAT "kiln-trust/1"
#define TRUST_MAX_KEYS 256
#define TRUST_MAX_CHANNELS 1024
#define TRUST_MAX_WITHDRAWN 4096

typedef struct trust_channel {
    char *name;
    int threshold;
    char **repro_keys; /* "reproduced_by": names of keys with the reproduce role */
    size_t nrepro;
    int repro_threshold; /* 0: none asked */
} trust_channel;

typedef struct trust_withdrawn {
    char digest[KILN_SHA256_HEX + 8]; /* "sha256:<hex>" */
    char *reason;
} trust_withdrawn;

struct kiln_sign_trust {
    char *label;
    kiln_sign_trust_key *keys;
    size_t nkeys;
    trust_channel *chans;
    size_t nchans;
    int npromote;
    int nrelease;
    int release_threshold;   /* distinct release keys an archive needs (default 1) */
    bool accept_unvalidated; /* archives signed with allow-unvalidated verify (default no) */
    uint64_t version;        /* 1.. (default 1) */
    int nroot;               /* keys holding the root role */
    int root_threshold;      /* distinct root keys a next version needs (default 1) */
    size_t nsigs;            /* signatures of the signed document it came from; 0: plain */
    trust_withdrawn *withdrawn; /* archives no client may install, whoever signed them */
    size_t nwithdrawn;
};

static const struct {
    const char *name;
    int bit;
} ROLES_TABLE[] = {{"release", KILN_SIGN_ROLE_RELEASE},
             {"promote", KILN_SIGN_ROLE_PROMOTE},
             {"root", KILN_SIGN_ROLE_ROOT},
             {"reproduce", KILN_SIGN_ROLE_REPRODUCE}};

const char *sign_trust_role_names(int roles, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (size_t j = 0; j < KILN_ARRAY_LEN(ROLES_TABLE); j++)
        if ((roles & ROLES_TABLE[j].bit) && n < cap)
            n += (size_t)snprintf(buf + n, cap - n, "%s%s", n ? ", " : "", ROLES_TABLE[j].name);
    return buf;
}

const char *sign_json_str(const json_t *j) {
    const char *s = json_string_value(j);
    return s && strlen(s) == json_string_length(j) ? s : NULL;
}

bool kiln_sign_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > KILN_SIGN_NAME_MAX) return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        if (!alnum && (i == 0 || !strchr("._+-", c))) return false;
    }
    return true;
}

kiln_err sign_only_fields(const json_t *obj, const char *const *allowed, const char *label,
                          const char *where) {
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)obj, k, v) {
        bool ok = false;
        for (const char *const *a = allowed; *a; a++)
            ok = ok || !strcmp(k, *a);
        KILN_FAIL_IF(!ok && where, KILN_ERR_FORMAT, "'%s': %s: unknown field '%s'", label, where,
                     k);
        KILN_FAIL_IF(!ok, KILN_ERR_FORMAT, "'%s': unknown field '%s'", label, k);
    }
    return KILN_OK;
}

kiln_err sign_sigs_check(const json_t *sigs, size_t max, const char *label, const char *holder) {
    KILN_FAIL_IF(!json_is_array(sigs) || json_array_size(sigs) == 0, KILN_ERR_FORMAT,
                 "'%s': 'signatures' must be a non-empty array of minisign signatures", label);
    size_t n = json_array_size(sigs);
    KILN_FAIL_IF(n > max, KILN_ERR_LIMIT, "'%s': %zu signatures, more than the %zu %s may hold",
                 label, n, max, holder);
    for (size_t i = 0; i < n; i++) {
        const json_t *s = json_array_get(sigs, i);
        char what[64];
        snprintf(what, sizeof what, "signature %zu", i + 1);
        KILN_FAIL_IF(!sign_json_str(s), KILN_ERR_FORMAT,
                     "'%s': %s is not a string (without NUL characters)", label, what);
        kiln_sign_sig parsed;
        kiln_sign_sig_init(&parsed);
        kiln_err rc =
            sign_sig_parse_in(json_string_value(s), json_string_length(s), label, what, &parsed);
        kiln_sign_sig_release(&parsed);
        KILN_TRY(rc);
    }
    return KILN_OK;
}

kiln_err sign_canonical_sign(const json_t *body, const kiln_sign_seckey *sk, const char *tc,
                             char **sig) {
    *sig = NULL;
    char *text = kiln_json_canonical(body);
    KILN_FAIL_IF(!text, KILN_ERR_NOMEM, "out of memory");
    kiln_err rc = kiln_sign_buffer(sk, text, strlen(text), tc, KILN_SIGN_PREHASHED, sig);
    free(text);
    return rc;
}

void kiln_sign_trust_free(kiln_sign_trust *t) {
    if (!t) return;
    for (size_t i = 0; i < t->nkeys; i++)
        free((char *)t->keys[i].name);
    for (size_t i = 0; i < t->nchans; i++) {
        free(t->chans[i].name);
        for (size_t k = 0; k < t->chans[i].nrepro; k++)
            free(t->chans[i].repro_keys[k]);
        free(t->chans[i].repro_keys);
    }
    for (size_t i = 0; i < t->nwithdrawn; i++)
        free(t->withdrawn[i].reason);
    free(t->keys);
    free(t->chans);
    free(t->withdrawn);
    free(t->label);
    free(t);
}

static kiln_err parse_key(kiln_sign_trust *t, const json_t *k, size_t i, const char *label) {
    static const char *const fields[] = {"name", "pubkey", "roles", NULL};
    char where[64];
    snprintf(where, sizeof where, "keys[%zu]", i);
    KILN_FAIL_IF(!json_is_object(k), KILN_ERR_FORMAT, "'%s': %s is not an object", label, where);
    KILN_TRY(sign_only_fields(k, fields, label, where));
    const char *name = sign_json_str(json_object_get(k, "name"));
    const char *pub = sign_json_str(json_object_get(k, "pubkey"));
    const json_t *rl = json_object_get(k, "roles");
    KILN_FAIL_IF(!name || !kiln_sign_name_ok(name), KILN_ERR_FORMAT,
                 "'%s': %s: 'name' must be a name of 1 to %d letters, digits and ._+-", label,
                 where, KILN_SIGN_NAME_MAX);
    snprintf(where, sizeof where, "key '%s'", name);
    KILN_FAIL_IF(!pub, KILN_ERR_FORMAT,
                 "'%s': %s: 'pubkey' (a minisign public key in base64) is missing", label, where);
    kiln_sign_trust_key *key = &t->keys[t->nkeys];
    char sub[256];
    snprintf(sub, sizeof sub, "%s: %s: pubkey", label, where);
    KILN_TRY(kiln_sign_pubkey_from_base64(pub, sub, &key->pub));
    KILN_FAIL_IF(!json_is_array(rl) || json_array_size(rl) == 0, KILN_ERR_FORMAT,
                 "'%s': %s: 'roles' must be a non-empty array of \"release\", \"promote\", \"root\" "
                 "and \"reproduce\"",
                 label, where);
    key->roles = 0;
    for (size_t r = 0; r < json_array_size(rl); r++) {
        const char *s = sign_json_str(json_array_get(rl, r));
        int bit = 0;
        for (size_t j = 0; s && j < KILN_ARRAY_LEN(ROLES_TABLE); j++)
            if (!strcmp(s, ROLES_TABLE[j].name)) bit = ROLES_TABLE[j].bit;
        KILN_FAIL_IF(!bit, KILN_ERR_FORMAT,
                     "'%s': %s: unknown role %s%s%s (want \"release\", \"promote\", \"root\" or "
                     "\"reproduce\")",
                     label, where, s ? "'" : "", s ? s : "(not a string)", s ? "'" : "");
        KILN_FAIL_IF(key->roles & bit, KILN_ERR_FORMAT, "'%s': %s: role '%s' listed twice", label,
                     where, s);
        key->roles |= bit;
    }
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(key->pub.keyid, id);
    for (size_t j = 0; j < t->nkeys; j++) {
        KILN_FAIL_IF(!strcmp(t->keys[j].name, name), KILN_ERR_FORMAT,
                     "'%s': key name '%s' appears twice", label, name);
        KILN_FAIL_IF(!sodium_memcmp(t->keys[j].pub.keyid, key->pub.keyid, KILN_SIGN_KEYID_BYTES),
                     KILN_ERR_FORMAT, "'%s': keys '%s' and '%s' have the same key id %s", label,
                     t->keys[j].name, name, id);
        /* The key id is not covered by the signature: the same Ed25519 key under two ids
         * would let one holder count twice toward a threshold. */
        KILN_FAIL_IF(!sodium_memcmp(t->keys[j].pub.pk, key->pub.pk, KILN_SIGN_PK_BYTES),
                     KILN_ERR_FORMAT, "'%s': keys '%s' and '%s' are the same public key", label,
                     t->keys[j].name, name);
    }
    key->name = kiln_strdup(name);
    if (!key->name) return KILN_ERR_NOMEM;
    t->nkeys++;
    if (key->roles & KILN_SIGN_ROLE_PROMOTE) t->npromote++;
    if (key->roles & KILN_SIGN_ROLE_RELEASE) t->nrelease++;
    if (key->roles & KILN_SIGN_ROLE_ROOT) t->nroot++;
    return KILN_OK;
}

/* A channel's "reproduced_by": {"keys": [names of keys with the reproduce role, each once],
 * "threshold": 1..len(keys)}. */
static kiln_err parse_reproduced_by(kiln_sign_trust *t, trust_channel *c, const json_t *v,
                                    const char *label, const char *where) {
    static const char *const fields[] = {"keys", "threshold", NULL};
    char sub[KILN_SIGN_NAME_MAX + 64];
    snprintf(sub, sizeof sub, "%s: reproduced_by", where);
    KILN_FAIL_IF(!json_is_object(v), KILN_ERR_FORMAT,
                 "'%s': %s must be {\"keys\": [names], \"threshold\": N}", label, sub);
    KILN_TRY(sign_only_fields(v, fields, label, sub));
    const json_t *ks = json_object_get(v, "keys"), *th = json_object_get(v, "threshold");
    KILN_FAIL_IF(!json_is_array(ks) || !json_array_size(ks) || json_array_size(ks) > TRUST_MAX_KEYS,
                 KILN_ERR_FORMAT, "'%s': %s: 'keys' must be a non-empty array of key names",
                 label, sub);
    c->repro_keys = kiln_calloc(json_array_size(ks), sizeof *c->repro_keys);
    if (!c->repro_keys) return KILN_ERR_NOMEM;
    for (size_t i = 0; i < json_array_size(ks); i++) {
        const char *n = sign_json_str(json_array_get(ks, i));
        const kiln_sign_trust_key *k = NULL;
        for (size_t j = 0; n && j < t->nkeys; j++)
            if (!strcmp(t->keys[j].name, n)) k = &t->keys[j];
        KILN_FAIL_IF(!k || !(k->roles & KILN_SIGN_ROLE_REPRODUCE), KILN_ERR_FORMAT,
                     "'%s': %s: '%.64s' is not a key of the policy with the reproduce role", label,
                     sub, n ? n : "(not a string)");
        for (size_t j = 0; j < c->nrepro; j++)
            KILN_FAIL_IF(!strcmp(c->repro_keys[j], n), KILN_ERR_FORMAT,
                         "'%s': %s: key '%s' listed twice", label, sub, n);
        if (!(c->repro_keys[c->nrepro] = kiln_strdup(n))) return KILN_ERR_NOMEM;
        c->nrepro++;
    }
    KILN_FAIL_IF(!json_is_integer(th), KILN_ERR_FORMAT, "'%s': %s: 'threshold' must be an integer",
                 label, sub);
    json_int_t x = json_integer_value(th);
    KILN_FAIL_IF(x < 1 || (size_t)x > c->nrepro, KILN_ERR_FORMAT,
                 "'%s': %s: threshold %lld must be 1 to the %zu keys listed", label, sub,
                 (long long)x, c->nrepro);
    c->repro_threshold = (int)x;
    return KILN_OK;
}

static kiln_err parse_channels(kiln_sign_trust *t, const json_t *ch, const char *label) {
    static const char *const fields[] = {"threshold", "reproduced_by", NULL};
    KILN_FAIL_IF(!json_is_object(ch), KILN_ERR_FORMAT,
                 "'%s': 'channels' must be an object of channel name to {\"threshold\": N}", label);
    size_t n = json_object_size(ch);
    KILN_FAIL_IF(n > TRUST_MAX_CHANNELS, KILN_ERR_LIMIT, "'%s': more than %d channels", label,
                 TRUST_MAX_CHANNELS);
    t->chans = kiln_calloc(n ? n : 1, sizeof *t->chans);
    if (!t->chans) return KILN_ERR_NOMEM;
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)ch, name, v) {
        char where[KILN_SIGN_NAME_MAX + 32];
        KILN_FAIL_IF(!kiln_sign_name_ok(name), KILN_ERR_FORMAT,
                     "'%s': channel name '%.64s' must be 1 to %d letters, digits and ._+-", label,
                     name, KILN_SIGN_NAME_MAX);
        snprintf(where, sizeof where, "channel '%s'", name);
        KILN_FAIL_IF(!json_is_object(v), KILN_ERR_FORMAT, "'%s': %s is not an object", label,
                     where);
        KILN_TRY(sign_only_fields(v, fields, label, where));
        const json_t *th = json_object_get(v, "threshold");
        KILN_FAIL_IF(!json_is_integer(th), KILN_ERR_FORMAT,
                     "'%s': %s: 'threshold' must be an integer", label, where);
        json_int_t x = json_integer_value(th);
        KILN_FAIL_IF(x < 1, KILN_ERR_FORMAT, "'%s': %s: threshold %lld must be at least 1", label,
                     where, (long long)x);
        KILN_FAIL_IF(x > t->npromote, KILN_ERR_FORMAT,
                     "'%s': %s: threshold %lld can never be met: the policy has %d promote key%s",
                     label, where, (long long)x, t->npromote, t->npromote == 1 ? "" : "s");
        trust_channel *c = &t->chans[t->nchans++];
        c->threshold = (int)x;
        if (!(c->name = kiln_strdup(name))) return KILN_ERR_NOMEM;
        const json_t *rb = json_object_get(v, "reproduced_by");
        if (rb) KILN_TRY(parse_reproduced_by(t, c, rb, label, where));
    }
    return KILN_OK;
}

/* "withdrawn" (optional): [{"digest": "sha256:<64 hex>", "reason": TEXT}], archives that no
 * client installs and no registry lets a channel name, whatever signed them: a model found
 * harmful after its release. Each digest once; a reason as a record's (1 to
 * KILN_SIGN_REASON_MAX bytes, no control characters). */
static kiln_err parse_withdrawn(kiln_sign_trust *t, const json_t *w, const char *label) {
    static const char *const fields[] = {"digest", "reason", NULL};
    if (!w) return KILN_OK;
    KILN_FAIL_IF(!json_is_array(w), KILN_ERR_FORMAT,
                 "'%s': 'withdrawn' must be an array of {\"digest\", \"reason\"}", label);
    size_t n = json_array_size(w);
    KILN_FAIL_IF(n > TRUST_MAX_WITHDRAWN, KILN_ERR_LIMIT, "'%s': more than %d withdrawn archives",
                 label, TRUST_MAX_WITHDRAWN);
    t->withdrawn = kiln_calloc(n ? n : 1, sizeof *t->withdrawn);
    if (!t->withdrawn) return KILN_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        const json_t *e = json_array_get(w, i);
        char where[48];
        snprintf(where, sizeof where, "withdrawn[%zu]", i);
        KILN_FAIL_IF(!json_is_object(e), KILN_ERR_FORMAT, "'%s': %s is not an object", label,
                     where);
        KILN_TRY(sign_only_fields(e, fields, label, where));
        const char *d = sign_json_str(json_object_get(e, "digest")),
                   *r = sign_json_str(json_object_get(e, "reason"));
        bool hex = d && strlen(d) == 71 && !strncmp(d, "sha256:", 7);
        for (size_t k = 7; hex && k < 71; k++)
            hex = (d[k] >= '0' && d[k] <= '9') || (d[k] >= 'a' && d[k] <= 'f');
        KILN_FAIL_IF(!hex, KILN_ERR_FORMAT,
                     "'%s': %s: 'digest' must be an archive's \"sha256:<64 lowercase hex>\"", label,
                     where);
        size_t rl = r ? strlen(r) : 0;
        bool text = rl >= 1 && rl <= KILN_SIGN_REASON_MAX;
        for (size_t k = 0; text && k < rl; k++)
            text = (unsigned char)r[k] >= 0x20 && r[k] != 0x7f;
        KILN_FAIL_IF(!text, KILN_ERR_FORMAT,
                     "'%s': %s: 'reason' must be 1 to %d bytes of text (why it was withdrawn)",
                     label, where, KILN_SIGN_REASON_MAX);
        KILN_FAIL_IF(kiln_sign_trust_withdrawn(t, d), KILN_ERR_FORMAT,
                     "'%s': %s: %s is withdrawn twice", label, where, d);
        memcpy(t->withdrawn[i].digest, d, 72);
        t->withdrawn[i].reason = kiln_strdup(r);
        if (!t->withdrawn[i].reason) return KILN_ERR_NOMEM;
        t->nwithdrawn++;
    }
    return KILN_OK;
}

const char *kiln_sign_trust_withdrawn(const kiln_sign_trust *t, const char *digest) {
    for (size_t i = 0; digest && i < t->nwithdrawn; i++)
        if (!strcmp(t->withdrawn[i].digest, digest)) return t->withdrawn[i].reason;
    return NULL;
}

size_t kiln_sign_trust_withdrawn_count(const kiln_sign_trust *t) {
    return t->nwithdrawn;
}

const char *kiln_sign_trust_withdrawn_at(const kiln_sign_trust *t, size_t i, const char **reason) {
    if (reason) *reason = t->withdrawn[i].reason;
    return t->withdrawn[i].digest;
}

/* The archive rules: release_threshold (optional, default 1; at most the number of release
 * keys when given) and accept_unvalidated (optional boolean, default false). */
static kiln_err parse_archive_rules(kiln_sign_trust *t, const json_t *j, const char *label) {
    t->release_threshold = 1;
    const json_t *th = json_object_get(j, "release_threshold");
    if (th) {
        KILN_FAIL_IF(!json_is_integer(th), KILN_ERR_FORMAT,
                     "'%s': 'release_threshold' must be an integer", label);
        json_int_t x = json_integer_value(th);
        KILN_FAIL_IF(x < 1, KILN_ERR_FORMAT, "'%s': release_threshold %lld must be at least 1",
                     label, (long long)x);
        KILN_FAIL_IF(x > t->nrelease, KILN_ERR_FORMAT,
                     "'%s': release_threshold %lld can never be met: the policy has %d release "
                     "key%s",
                     label, (long long)x, t->nrelease, t->nrelease == 1 ? "" : "s");
        t->release_threshold = (int)x;
    }
    const json_t *au = json_object_get(j, "accept_unvalidated");
    KILN_FAIL_IF(au && !json_is_boolean(au), KILN_ERR_FORMAT,
                 "'%s': 'accept_unvalidated' must be true or false", label);
    t->accept_unvalidated = au && json_is_true(au);
    return KILN_OK;
}

/* The root rules: version (optional, default 1) and root_threshold (at most the number of
 * root keys, and only with root keys; optional with one root key, where it can only be 1, and
 * required with more: a default of 1 would let any one of them, stolen, rotate every key). */
static kiln_err parse_root_rules(kiln_sign_trust *t, const json_t *j, const char *label) {
    t->version = 1;
    const json_t *v = json_object_get(j, "version");
    if (v) {
        KILN_FAIL_IF(!json_is_integer(v), KILN_ERR_FORMAT, "'%s': 'version' must be an integer",
                     label);
        json_int_t x = json_integer_value(v);
        KILN_FAIL_IF(x < 1 || (uint64_t)x > KILN_SIGN_TRUST_VERSION_MAX, KILN_ERR_FORMAT,
                     "'%s': version %lld must be between 1 and 2^53-1", label, (long long)x);
        t->version = (uint64_t)x;
    }
    t->root_threshold = 1;
    const json_t *th = json_object_get(j, "root_threshold");
    KILN_FAIL_IF(!th && t->nroot > 1, KILN_ERR_FORMAT,
                 "'%s': %d keys hold the \"root\" role but 'root_threshold' is missing: say how "
                 "many of them must sign the next version",
                 label, t->nroot);
    if (th) {
        KILN_FAIL_IF(!json_is_integer(th), KILN_ERR_FORMAT,
                     "'%s': 'root_threshold' must be an integer", label);
        json_int_t x = json_integer_value(th);
        KILN_FAIL_IF(t->nroot == 0, KILN_ERR_FORMAT,
                     "'%s': root_threshold is given, but no key holds the \"root\" role", label);
        KILN_FAIL_IF(x < 1, KILN_ERR_FORMAT, "'%s': root_threshold %lld must be at least 1", label,
                     (long long)x);
        KILN_FAIL_IF(x > t->nroot, KILN_ERR_FORMAT,
                     "'%s': root_threshold %lld can never be met: the policy has %d root key%s",
                     label, (long long)x, t->nroot, t->nroot == 1 ? "" : "s");
        t->root_threshold = (int)x;
    }
    return KILN_OK;
}

/* A policy object (the whole file, or a signed document's "policy"); where names it for a
 * field that does not belong ("top level", "policy"). */
static kiln_err policy_from_json(const json_t *j, const char *label, const char *where,
                                 kiln_sign_trust **out) {
    static const char *const fields[] = {"format",
                                         "keys",
                                         "channels",
                                         "release_threshold",
                                         "accept_unvalidated",
                                         "version",
                                         "root_threshold",
                                         "withdrawn",
                                         NULL};
    *out = NULL;
    kiln_err rc = KILN_OK;
    kiln_sign_trust *t = kiln_calloc(1, sizeof *t);
    KILN_CHECK_IF(rc, out, !t, KILN_ERR_NOMEM, "out of memory");
    t->label = kiln_strdup(label);
    KILN_CHECK_IF(rc, out, !t->label, KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK_IF(rc, out, !json_is_object(j), KILN_ERR_FORMAT, "'%s': not a JSON object", label);
    KILN_CHECK(rc, out, sign_only_fields(j, fields, label, where));
    const char *fmt = sign_json_str(json_object_get(j, "format"));
    KILN_CHECK_IF(rc, out, !fmt || strcmp(fmt, TRUST_FORMAT) != 0, KILN_ERR_FORMAT,
                  "'%s': 'format' must be \"" TRUST_FORMAT "\"", label);
    const json_t *keys = json_object_get(j, "keys");
    KILN_CHECK_IF(rc, out, !json_is_array(keys) || json_array_size(keys) == 0, KILN_ERR_FORMAT,
                  "'%s': 'keys' must be a non-empty array", label);
    KILN_CHECK_IF(rc, out, json_array_size(keys) > TRUST_MAX_KEYS, KILN_ERR_LIMIT,
                  "'%s': more than %d keys", label, TRUST_MAX_KEYS);
    t->keys = kiln_calloc(json_array_size(keys), sizeof *t->keys);
    KILN_CHECK_IF(rc, out, !t->keys, KILN_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < json_array_size(keys); i++)
        KILN_CHECK(rc, out, parse_key(t, json_array_get(keys, i), i, label));
    const json_t *ch = json_object_get(j, "channels");
    KILN_CHECK_IF(rc, out, !ch, KILN_ERR_FORMAT, "'%s': 'channels' is missing", label);
    KILN_CHECK(rc, out, parse_channels(t, ch, label));
    KILN_CHECK(rc, out, parse_archive_rules(t, j, label));
    KILN_CHECK(rc, out, parse_root_rules(t, j, label));
    KILN_CHECK(rc, out, parse_withdrawn(t, json_object_get(j, "withdrawn"), label));
    *out = t;
    t = NULL;
out:
    kiln_sign_trust_free(t);
    return rc;
}

kiln_err sign_trust_read(const char *buf, size_t len, const char *label, json_t **doc,
                         const json_t **policy, const json_t **sigs, kiln_sign_trust **out) {
    static const char *const fields[] = {"policy", "signatures", NULL};
    *out = NULL;
    if (doc) *doc = NULL;
    if (policy) *policy = NULL;
    if (sigs) *sigs = NULL;
    KILN_TRY(sign_init());
    json_t *j = NULL;
    KILN_TRY(kiln_json_parse(buf, len, label, &j));
    kiln_err rc = KILN_OK;
    const json_t *pol = j, *sg = NULL;
    /* A signed document has no "format" of its own: one that has is a plain policy, read (and
     * refused) exactly as before signed documents existed. */
    bool is_signed = json_is_object(j) && !json_object_get(j, "format") &&
                     (json_object_get(j, "policy") || json_object_get(j, "signatures"));
    if (is_signed) {
        KILN_CHECK(rc, out, sign_only_fields(j, fields, label, NULL));
        pol = json_object_get(j, "policy");
        KILN_CHECK_IF(rc, out, !json_is_object(pol), KILN_ERR_FORMAT,
                      "'%s': 'policy' must be a kiln-trust/1 policy (an object)", label);
        sg = json_object_get(j, "signatures");
        KILN_CHECK(rc, out,
                   sign_sigs_check(sg, KILN_SIGN_TRUST_MAX_SIGS, label, "a signed policy"));
    }
    KILN_CHECK(rc, out, policy_from_json(pol, label, is_signed ? "policy" : "top level", out));
    (*out)->nsigs = sg ? json_array_size(sg) : 0;
    if (policy) *policy = pol;
    if (sigs) *sigs = sg;
    if (doc) {
        *doc = j;
        j = NULL;
    }
out:
    json_decref(j);
    return rc;
}

kiln_err kiln_sign_trust_parse(const char *buf, size_t len, const char *label,
                               kiln_sign_trust **out) {
    return sign_trust_read(buf, len, label, NULL, NULL, NULL, out);
}

kiln_err kiln_sign_trust_load(const char *path, kiln_sign_trust **out) {
    char *buf;
    size_t len;
    *out = NULL;
    KILN_TRY(kiln_read_file(path, KILN_SIGN_TRUST_FILE_LIMIT, &buf, &len));
    kiln_err rc = kiln_sign_trust_parse(buf, len, path, out);
    free(buf);
    return rc;
}

uint64_t kiln_sign_trust_version(const kiln_sign_trust *t) {
    return t->version;
}

int kiln_sign_trust_root_threshold(const kiln_sign_trust *t) {
    return t->root_threshold;
}

int kiln_sign_trust_role_count(const kiln_sign_trust *t, int role) {
    return role == KILN_SIGN_ROLE_ROOT      ? t->nroot
           : role == KILN_SIGN_ROLE_PROMOTE ? t->npromote
           : role == KILN_SIGN_ROLE_RELEASE ? t->nrelease
                                            : 0;
}

size_t kiln_sign_trust_signatures(const kiln_sign_trust *t) {
    return t->nsigs;
}

size_t sign_trust_channel_count(const kiln_sign_trust *t) {
    return t->nchans;
}

const char *sign_trust_channel_at(const kiln_sign_trust *t, size_t i, int *threshold) {
    if (i >= t->nchans) return NULL;
    *threshold = t->chans[i].threshold;
    return t->chans[i].name;
}

const char *sign_trust_label(const kiln_sign_trust *t) {
    return t->label;
}

size_t kiln_sign_trust_key_count(const kiln_sign_trust *t) {
    return t->nkeys;
}

const kiln_sign_trust_key *kiln_sign_trust_key_at(const kiln_sign_trust *t, size_t i) {
    return i < t->nkeys ? &t->keys[i] : NULL;
}

const kiln_sign_trust_key *kiln_sign_trust_find(const kiln_sign_trust *t,
                                                const uint8_t keyid[KILN_SIGN_KEYID_BYTES]) {
    for (size_t i = 0; i < t->nkeys; i++)
        if (!sodium_memcmp(t->keys[i].pub.keyid, keyid, KILN_SIGN_KEYID_BYTES)) return &t->keys[i];
    return NULL;
}

int kiln_sign_trust_reproduced_by(const kiln_sign_trust *t, const char *channel,
                                  const char *const **keys, size_t *nkeys) {
    *keys = NULL;
    *nkeys = 0;
    for (size_t i = 0; channel && i < t->nchans; i++)
        if (!strcmp(t->chans[i].name, channel)) {
            *keys = (const char *const *)t->chans[i].repro_keys;
            *nkeys = t->chans[i].nrepro;
            return t->chans[i].repro_threshold;
        }
    return 0;
}

kiln_err kiln_sign_trust_threshold(const kiln_sign_trust *t, const char *channel, int *out) {
    for (size_t i = 0; i < t->nchans; i++)
        if (!strcmp(t->chans[i].name, channel)) {
            *out = t->chans[i].threshold;
            return KILN_OK;
        }
    return kiln_fail(KILN_ERR_NOTFOUND, "'%s': channel '%s' is not in the trust policy", t->label,
                     channel);
}

int kiln_sign_trust_release_threshold(const kiln_sign_trust *t) {
    return t->release_threshold;
}

bool kiln_sign_trust_accepts_unvalidated(const kiln_sign_trust *t) {
    return t->accept_unvalidated;
}

/* The key of the policy that made sig, holding role; KILN_ERR_VERIFY otherwise. */
kiln_err sign_trust_signer(const kiln_sign_trust *t, const kiln_sign_sig *sig, int role,
                           const kiln_sign_trust_key **out) {
    char id[KILN_SIGN_KEYID_HEX];
    kiln_sign_keyid_hex(sig->keyid, id);
    const kiln_sign_trust_key *k = kiln_sign_trust_find(t, sig->keyid);
    KILN_FAIL_IF(!k, KILN_ERR_VERIFY,
                 "'%s': signed by key id %s, which is not in the trust policy '%s'",
                 sig->label ? sig->label : "signature", id, t->label);
    const char *rn = role == KILN_SIGN_ROLE_RELEASE ? "release" : "promote";
    KILN_FAIL_IF(!(k->roles & role), KILN_ERR_VERIFY,
                 "'%s': signed by key '%s' (%s), which does not hold the '%s' role in '%s'",
                 sig->label ? sig->label : "signature", k->name, id, rn, t->label);
    *out = k;
    return KILN_OK;
}

kiln_err kiln_sign_trust_verify_file(const kiln_sign_trust *t, const kiln_sign_sig *sig,
                                     const char *path, int role,
                                     const kiln_sign_trust_key **signer) {
    const kiln_sign_trust_key *k;
    if (signer) *signer = NULL;
    KILN_TRY(sign_trust_signer(t, sig, role, &k));
    KILN_TRY(kiln_sign_verify_file(&k->pub, sig, path));
    if (signer) *signer = k;
    return KILN_OK;
}

/* The public face of sign_trust_channel_*: the registry's web page lists a policy's
 * channels. */
size_t kiln_sign_trust_channel_count(const kiln_sign_trust *t) {
    return sign_trust_channel_count(t);
}

const char *kiln_sign_trust_channel_at(const kiln_sign_trust *t, size_t i, int *threshold) {
    return sign_trust_channel_at(t, i, threshold);
}
