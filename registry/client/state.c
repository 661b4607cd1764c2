/* state.c - the client's state directory ($HOME/.local/state/kiln, or the caller's): what a
 * pull of a channel accepted (STATE/channels/MODEL/CHANNEL.json: the seq, the record and the
 * archive's signatures), read back for the checks of the next record (seq, expiry,
 * withdrawal) and settled after a deferred pull. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client_int.h"

char *reg_default_state(void) {
    const char *home = getenv("HOME");
    return kiln_asprintf("%s/.local/state/kiln", home && *home ? home : ".");
}

/* The last accepted seq of model/channel from the state directory; 0 and *known false if none. */
static kiln_err state_read(const char *path, int64_t *seq, bool *known) {
    *seq = 0;
    *known = false;
    if (!kiln_path_exists(path)) return KILN_OK;
    json_t *j = NULL;
    KILN_TRY(kiln_json_load_file(path, &j));
    json_t *s = json_object_get(j, "seq");
    kiln_err rc = KILN_OK;
    if (!json_is_integer(s) || json_integer_value(s) < 0)
        rc = kiln_fail(KILN_ERR_FORMAT, "'%s': 'seq' is not a non-negative integer", path);
    else {
        *seq = json_integer_value(s);
        *known = true;
    }
    json_decref(j);
    return rc;
}

kiln_err reg_channel_state(const char *state, const char *model, const char *channel, int64_t *seq,
                           bool *known) {
    char *st = state ? kiln_strdup(state) : reg_default_state(),
         *file = st ? kiln_asprintf("%s/channels/%s/%s.json", st, model, channel) : NULL;
    kiln_err rc = file ? state_read(file, seq, known) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(st);
    free(file);
    return rc;
}

kiln_err reg_record_fork_check(const char *state, const char *model, const char *channel,
                               const reg_record *rec, const char *text, size_t len) {
    char *st = state ? kiln_strdup(state) : reg_default_state(),
         *file = st ? kiln_asprintf("%s/channels/%s/%s.json", st, model, channel) : NULL;
    kiln_err rc = file ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    json_t *j = NULL;
    if (!rc && kiln_path_exists(file)) rc = kiln_json_load_file(file, &j);
    json_t *seq = json_object_get(j, "seq"), *kept = json_object_get(j, "record");
    if (!rc && json_is_integer(seq) && json_integer_value(seq) == rec->seq &&
        json_is_string(kept) &&
        (json_string_length(kept) != len || memcmp(json_string_value(kept), text, len)))
        rc = kiln_fail(KILN_ERR_VERIFY,
                       "channel record %s@%s seq %lld is not the record this client accepted at "
                       "that seq (two records of one seq: a fork, as two promoters racing on a "
                       "registry without compare-and-swap, or a registry that rewrote it, make); "
                       "refusing",
                       model, channel, (long long)rec->seq);
    json_decref(j);
    free(st);
    free(file);
    return rc;
}

/* Whether some registry of c[0..n) may have the model: false only when every one answers that
 * it has no such model (GET /v1/models/MODEL: 404) and the first one's list of models (GET
 * /v1/models) answers without it; a registry that cannot be asked leaves the channel's message
 * standing. When false, *hint is what kiln_name_hint says of the models listed. */
static bool model_exists(const kiln_registry_client_opts *c, size_t n, const char *model,
                         char *hint, size_t len) {
    char path[KILN_REGISTRY_NAME_MAX + 16];
    snprintf(path, sizeof path, "/v1/models/%s", model);
    hint[0] = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *j = NULL;
        kiln_err rc = kiln_registry_get_json(&c[i], path, &j);
        json_decref(j);
        if (rc != KILN_ERR_NOTFOUND) {
            kiln_errclear();
            return true;
        }
    }
    json_t *list = NULL;
    bool exists = true;
    if (!kiln_registry_get_json(&c[0], "/v1/models", &list) &&
        json_is_array(json_object_get(list, "models"))) {
        const json_t *arr = json_object_get(list, "models");
        size_t k = json_array_size(arr), m = 0;
        const char **names = kiln_calloc(k + 1, sizeof *names);
        exists = !names;
        for (size_t i = 0; names && i < k; i++) {
            const char *s = json_string_value(json_object_get(json_array_get(arr, i), "name"));
            if (s && !strcmp(s, model)) exists = true;
            if (s) names[m++] = s;
        }
        if (!exists && m) kiln_name_hint(model, names, m, sizeof *names, NULL, hint, len);
        free(names);
    }
    json_decref(list);
    kiln_errclear();
    return exists;
}

kiln_err reg_channel_missing(const kiln_registry_client_opts *c, size_t n, const char *state,
                             const char *model, const char *channel) {
    const bool several = n > 1;
    int64_t last;
    bool known;
    KILN_TRY(reg_channel_state(state, model, channel, &last, &known));
    KILN_FAIL_IF(known, KILN_ERR_VERIFY,
                 "channel '%s' of '%s' was accepted at seq %lld before, but %s; refusing", channel,
                 model, (long long)last,
                 several ? "no registry has it now" : "the registry no longer has it");
    char hint[400];
    if (!model_exists(c, n, model, hint, sizeof hint))
        return kiln_fail(KILN_ERR_NOTFOUND, "%s model '%s'%s (kiln models lists the models)",
                         several ? "no registry has a" : "the registry has no", model, hint);
    return kiln_fail(KILN_ERR_NOTFOUND,
                     "%s channel '%s' of '%s' (%s@%s names a channel: a version begins with a "
                     "digit or with 'v' and a digit, and a channel is never read as a version)",
                     several ? "no registry has" : "the registry has no", channel, model, model,
                     channel);
}

kiln_err reg_record_accept(const kiln_sign_trust *trust, const char *record, size_t len,
                           const char *model, const char *channel, int64_t last, bool known,
                           reg_record *rec, bool *stale) {
    if (stale) *stale = false;
    char label[200];
    snprintf(label, sizeof label, "channel record %s@%s", model, channel);
    /* 1: signatures meet the policy's threshold for the channel. */
    KILN_TRY(reg_record_verify(trust, record, len, label, rec));
    KILN_FAIL_IF(strcmp(rec->model, model) || strcmp(rec->channel, channel), KILN_ERR_VERIFY,
                 "%s names %s@%s instead", label, rec->model, rec->channel);
    /* 2: not older than what this client accepted. */
    if (known && rec->seq < last && stale) *stale = true;
    KILN_FAIL_IF(known && rec->seq < last, KILN_ERR_VERIFY,
                 "%s has seq %lld, lower than %lld accepted before (a replayed or rolled-back "
                 "record); refusing",
                 label, (long long)rec->seq, (long long)last);
    /* 3: not expired. */
    char when[21];
    kiln_format_time(rec->expires, when);
    KILN_FAIL_IF(rec->expires <= kiln_unix_time(), KILN_ERR_VERIFY, "%s expired at %s; refusing",
                 label, when);
    /* 3b: not an archive the policy withdrew. */
    char what[400];
    snprintf(what, sizeof what, "%s@%s, which %s names,", model, rec->version, label);
    return reg_withdrawn(trust, rec->digest, what);
}

kiln_err reg_state_settle(const char *state, const char *model, const char *channel, bool commit) {
    char *st = state ? kiln_strdup(state) : reg_default_state();
    char *dir = st ? kiln_asprintf("%s/channels/%s", st, model) : NULL,
         *file = dir ? kiln_asprintf("%s/%s.json", dir, channel) : NULL,
         *pending = file ? kiln_asprintf("%s.pending", file) : NULL;
    kiln_err rc = pending ? KILN_OK : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!rc && commit && rename(pending, file) != 0)
        rc = kiln_fail(KILN_ERR_IO, "cannot rename '%s' to '%s': %s", pending, file,
                       strerror(errno));
    if (!rc && commit) rc = kiln_fsync_dir(dir);
    if (!rc && !commit && unlink(pending) != 0 && errno != ENOENT)
        rc = kiln_fail(KILN_ERR_IO, "cannot remove '%s': %s", pending, strerror(errno));
    free(pending), free(file), free(dir), free(st);
    return rc;
}
