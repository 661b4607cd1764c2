/* failover.c - one pull over several registries: a primary and its mirrors
 * (docs/registry.md, "Mirrors"). A client trusts no registry, so any copy of the primary's
 * data is as good as the primary; what matters is which copy is the newest. The trust policy
 * is walked through every registry that answers (each can only move it forward), a channel's
 * current record is asked of every registry and the highest seq that verifies wins (a stale
 * mirror can only serve a lower seq, and a rollback is a higher seq too, so this never runs an
 * older model than the primary says), and the archive comes from the first registry that holds
 * it and verifies. Everything is checked by client.c's and trustwalk.c's own functions. */
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "client_int.h"
#include "export.h"

kiln_err reg_registries_init(reg_registries *r, const kiln_registry_client_opts *cs, size_t n,
                             kiln_registry_note note, void *ctx) {
    memset(r, 0, sizeof *r);
    KILN_FAIL_IF(!cs || !n, KILN_ERR_USAGE, "a pull needs at least one registry");
    r->c = kiln_calloc(n, sizeof *r->c);
    r->down = kiln_calloc(n, sizeof *r->down);
    if (!r->c || !r->down) {
        reg_registries_release(r);
        return KILN_ERR_NOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        r->c[i] = cs[i];
        /* With several registries the next one is the retry: a registry that does not
         * answer is passed over at once, not after seconds of backoff, and one that hangs
         * (stopped, a disk stall, a partition dropping packets) within seconds, not the
         * minute a lone registry is given. */
        if (n > 1) {
            r->c[i].retries = 0;
            if (!r->c[i].timeout_ms) r->c[i].timeout_ms = KILN_REGISTRY_FAILOVER_TIMEOUT_MS;
            if (!r->c[i].stall_ms) r->c[i].stall_ms = KILN_REGISTRY_FAILOVER_STALL_MS;
        }
    }
    r->n = n;
    r->note = note;
    r->ctx = ctx;
    reg_deadline_start(r->c, n);
    return KILN_OK;
}

kiln_err reg_pull_opts_clients(const kiln_pull_opts *o, kiln_registry_client_opts **cs, size_t *n) {
    *cs = NULL;
    *n = 0;
    size_t k = (o->registry ? 1 : 0) + (o->registries ? o->nregistries : 0);
    KILN_FAIL_IF(!k, KILN_ERR_USAGE, "a pull needs a registry URL (registry or registries)");
    kiln_registry_client_opts *c = kiln_calloc(k, sizeof *c);
    if (!c) return KILN_ERR_NOMEM;
    size_t i = 0;
    if (o->registry) c[i++].url = o->registry;
    for (size_t j = 0; o->registries && j < o->nregistries; j++)
        c[i++].url = o->registries[j];
    for (i = 0; i < k; i++) {
        if (!c[i].url) {
            free(c);
            return kiln_fail(KILN_ERR_USAGE, "registry %zu of the pull's list is NULL", i + 1);
        }
        c[i].token = o->token;
        c[i].retries = -1;
        c[i].timeout_ms = o->timeout_ms;
        c[i].stall_ms = o->timeout_ms;
        c[i].ca_file = o->ca_file;
        c[i].max_size = o->max_size;
        c[i].min_rate = o->min_rate;
        c[i].deadline_ms = o->deadline_ms;
    }
    *cs = c;
    *n = k;
    return KILN_OK;
}

void reg_registries_release(reg_registries *r) {
    free(r->c);
    free(r->down);
    memset(r, 0, sizeof *r);
}

void reg_registries_reset(reg_registries *r) {
    if (r->down) memset(r->down, 0, r->n * sizeof *r->down);
    reg_deadline_start(r->c, r->n); /* a watch's poll is an operation of its own */
    r->why[0] = 0;
    r->why_len = 0;
    r->why_verify = false;
    r->why_last = KILN_OK;
    r->only_stale = false;
}

static void say(const reg_registries *r, const char *fmt, ...) KILN_PRINTF(2, 3);
static void say(const reg_registries *r, const char *fmt, ...) {
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->note)
        r->note(r->ctx, line);
    else
        kiln_warn("%s", line);
}

/* Registry url's reason, for the error when none served. */
static void reason_add(reg_registries *r, const char *url, kiln_err rc, const char *msg) {
    bool named = strstr(msg, url) != NULL; /* the client's messages name the registry */
    size_t cap = sizeof r->why;
    if (r->why_len < cap)
        r->why_len +=
            (size_t)snprintf(r->why + r->why_len, cap - r->why_len, "%s%s%s%s",
                             r->why_len ? "; " : "", named ? "" : url, named ? "" : ": ", msg);
    if (r->why_len >= cap) r->why_len = cap - 1;
    if (rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT) r->why_verify = true;
    r->why_last = rc;
}

static kiln_err reasons_fail(const reg_registries *r, const char *what) {
    return kiln_fail(r->why_verify ? KILN_ERR_VERIFY
                     : r->why_last ? r->why_last
                                   : KILN_ERR_NETWORK,
                     "%s: %s", what, r->why_len ? r->why : "no registry answered");
}

/* The next registry after i still in the running, or NULL. */
static const char *next_url(const reg_registries *r, size_t i) {
    for (size_t k = i + 1; k < r->n; k++)
        if (!r->down[k]) return r->c[k].url;
    return NULL;
}

/* Registry i is passed over for rc (the message is the current error's): the note says why
 * and what comes next, loudly when what it served did not verify; one that did not answer at
 * all (or answered 5xx) is not asked again during this pull. */
static void pass_over(reg_registries *r, size_t i, kiln_err rc) {
    char msg[1536];
    snprintf(msg, sizeof msg, "%s", *kiln_errmsg() ? kiln_errmsg() : kiln_strerror(rc));
    if (rc == KILN_ERR_NETWORK) r->down[i] = true;
    const char *next = next_url(r, i), *url = r->c[i].url;
    bool verify = rc == KILN_ERR_VERIFY || rc == KILN_ERR_FORMAT;
    /* The client's messages name the registry ("registry 'URL/v1/...': ...") already. */
    bool named = !strncmp(msg, "registry '", 10) && strstr(msg, url);
    const char *sep = next ? "; trying " : "", *nx = next ? next : "";
    if (verify)
        say(r, "registry %s served something that does not verify: %s%s%s", url, msg, sep, nx);
    else if (named)
        say(r, "%s%s%s", msg, sep, nx);
    else
        say(r, "registry %s: %s%s%s", url, msg, sep, nx);
    reason_add(r, url, rc, msg);
}

/* ---- the trust policy ---- */

typedef struct step_filter {
    void (*on_step)(void *ctx, const kiln_registry_trust_step *s);
    void *ctx;
    uint64_t said; /* the newest version passed on: each is heard once */
} step_filter;

static void filter_step(void *ctx, const kiln_registry_trust_step *s) {
    step_filter *f = ctx;
    if (s->version <= f->said) return;
    f->said = s->version;
    if (f->on_step) f->on_step(f->ctx, s);
}

kiln_err reg_trust_walk_regs(reg_registries *r, const char *trust, const char *state,
                             void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                             void *ctx, kiln_sign_trust **out) {
    *out = NULL;
    if (r->n == 1) return kiln_registry_trust_walk(&r->c[0], trust, state, on_step, ctx, out);
    step_filter f = {on_step, ctx, 0};
    /* The client's own part first (its policy file, its state): what is wrong there is no
     * registry's fault and fails the walk as it is. */
    kiln_sign_trust *best = NULL;
    KILN_TRY(kiln_registry_trust_walk(NULL, trust, state, filter_step, &f, &best));
    bool any = false;
    for (size_t i = 0; i < r->n; i++) {
        if (r->down[i]) continue;
        kiln_sign_trust *t = NULL;
        kiln_err rc = kiln_registry_trust_walk(&r->c[i], trust, state, filter_step, &f, &t);
        if (rc == KILN_ERR_NOMEM) {
            kiln_sign_trust_free(best);
            return rc;
        }
        if (rc) {
            pass_over(r, i, rc);
            continue;
        }
        /* Each walk starts from state, which holds what the walks before saved: the last
         * that succeeded has the newest. */
        kiln_sign_trust_free(best);
        best = t;
        any = true;
    }
    if (!any) {
        kiln_sign_trust_free(best);
        return reasons_fail(r, "the trust policy could not be walked at any registry");
    }
    *out = best;
    return KILN_OK;
}

kiln_err kiln_registry_trust_walk_any(const kiln_registry_client_opts *cs, size_t n,
                                      const char *trust, const char *state,
                                      void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                                      void *ctx, kiln_registry_note note, void *note_ctx,
                                      kiln_sign_trust **out) {
    *out = NULL;
    reg_registries r;
    KILN_TRY(reg_registries_init(&r, cs, n, note, note_ctx));
    kiln_err rc = reg_trust_walk_regs(&r, trust, state, on_step, ctx, out);
    reg_registries_release(&r);
    return rc;
}

/* ---- the channel's newest record ---- */

kiln_err reg_newest_record(reg_registries *r, const kiln_sign_trust *trust, const char *state,
                           const char *model, const char *channel, char **text, size_t *len,
                           size_t *from) {
    *text = NULL;
    *len = 0;
    *from = 0;
    if (r->n == 1) /* the pull checks the record itself */
        return kiln_registry_get_channel(&r->c[0], model, channel, text, len);
    int64_t last;
    bool known;
    KILN_TRY(reg_channel_state(state, model, channel, &last, &known));
    int64_t *seqs = kiln_calloc(r->n, sizeof *seqs); /* each registry's verified seq, or 0 */
    if (!seqs) return KILN_ERR_NOMEM;
    bool served = false, missing = false;
    size_t stale_n = 0, bad_n = 0;
    r->only_stale = false;
    kiln_err rc = KILN_OK;
    for (size_t i = 0; i < r->n; i++) {
        if (r->down[i]) continue;
        char *t = NULL;
        size_t tl = 0;
        rc = kiln_registry_get_channel(&r->c[i], model, channel, &t, &tl);
        if (rc == KILN_ERR_NOTFOUND) {
            missing = true;
            reason_add(r, r->c[i].url, rc, kiln_errmsg());
            kiln_errclear();
            rc = KILN_OK;
            continue;
        }
        if (rc == KILN_ERR_NOMEM) break;
        if (rc) {
            pass_over(r, i, rc);
            rc = KILN_OK;
            continue;
        }
        served = true;
        reg_record rec;
        bool stale;
        rc = reg_record_accept(trust, t, tl, model, channel, last, known, &rec, &stale);
        if (!rc) rc = reg_record_fork_check(state, model, channel, &rec, t, tl);
        if (rc == KILN_ERR_NOMEM) {
            free(t);
            break;
        }
        if (rc && stale) {
            /* A stale mirror: not an error while another registry has a newer record. */
            const char *next = next_url(r, i);
            say(r,
                "registry %s has %s@%s at seq %lld, below seq %lld this client accepted (a "
                "stale mirror)%s%s",
                r->c[i].url, model, channel, (long long)rec.seq, (long long)last,
                next ? "; trying " : "", next ? next : "");
            reason_add(r, r->c[i].url, KILN_ERR_VERIFY, kiln_errmsg());
            stale_n++;
        } else if (rc) {
            pass_over(r, i, rc);
            bad_n++;
        } else if (!*text || rec.seq > seqs[*from]) {
            free(*text);
            *text = t;
            *len = tl;
            *from = i;
            t = NULL;
        }
        if (!rc) seqs[i] = rec.seq;
        rc = KILN_OK;
        free(t);
    }
    if (!rc && *text)
        for (size_t i = 0; i < r->n; i++)
            if (seqs[i] && seqs[i] < seqs[*from])
                say(r, "registry %s has %s@%s at seq %lld, %s has seq %lld: using the newer",
                    r->c[i].url, model, channel, (long long)seqs[i], r->c[*from].url,
                    (long long)seqs[*from]);
    free(seqs);
    if (rc) {
        free(*text);
        *text = NULL;
        return rc;
    }
    if (*text) return KILN_OK;
    r->only_stale = stale_n > 0 && !bad_n && !missing;
    if (missing && !served)
        return kiln_fail(KILN_ERR_NOTFOUND, "no registry has channel '%s' of '%s'", channel, model);
    char what[200];
    snprintf(what, sizeof what, "no registry serves a record of %s@%s that this client accepts",
             model, channel);
    return reasons_fail(r, what);
}

kiln_err reg_first_record(reg_registries *r, const char *model, const char *channel, char **text,
                          size_t *len, size_t *from) {
    kiln_err rc = KILN_ERR_NOTFOUND;
    for (size_t i = 0; i < r->n; i++) {
        if (r->down[i]) continue;
        rc = kiln_registry_get_channel(&r->c[i], model, channel, text, len);
        if (rc == KILN_OK || rc == KILN_ERR_NOMEM) {
            *from = i;
            return rc;
        }
    }
    return rc;
}

/* ---- JSON reads: the first registry that holds what is asked ---- */

kiln_err reg_get_json_first(reg_registries *r, const char *path, const char *what, json_t **out,
                            size_t *from) {
    *out = NULL;
    *from = 0;
    if (r->n == 1) return kiln_registry_get_json(&r->c[0], path, out);
    bool missing = false, asked = false;
    kiln_err rc = KILN_ERR_NETWORK;
    for (size_t i = 0; i < r->n; i++) {
        if (r->down[i]) continue;
        asked = true;
        rc = kiln_registry_get_json(&r->c[i], path, out);
        if (rc == KILN_OK) {
            *from = i;
            return KILN_OK;
        }
        if (rc == KILN_ERR_NOMEM) return rc;
        /* A stale mirror may lack what the primary has: not held there is no failure. */
        missing = missing || rc == KILN_ERR_NOTFOUND;
        pass_over(r, i, rc);
    }
    if (missing || !asked) return kiln_fail(KILN_ERR_NOTFOUND, "no registry holds %s", what);
    char msg[200];
    snprintf(msg, sizeof msg, "no registry answered for %s", what);
    return reasons_fail(r, msg);
}

/* ---- the pull ---- */

kiln_err reg_pull_regs(reg_registries *r, const kiln_registry_pull_opts *p,
                       const kiln_sign_trust *trust, kiln_registry_pulled *res) {
    memset(res, 0, sizeof *res);
    if (r->n == 1) {
        kiln_err rc = reg_pull_with_trust(&r->c[0], p, trust, res);
        if (!rc) snprintf(res->registry, sizeof res->registry, "%s", r->c[0].url);
        return rc;
    }
    char model[KILN_REGISTRY_NAME_MAX + 1] = "", what[KILN_REGISTRY_NAME_MAX + 1] = "";
    bool is_version;
    if (p->exact_version) /* a record's version, read as stored: one pull per registry */
        is_version = true;
    else
        KILN_TRY(kiln_registry_ref_parse(p->ref, model, what, &is_version));
    KILN_TRY(kiln_archive_dir_replaceable(p->out, "a pull"));
    kiln_registry_pull_opts pinned = *p;
    char *text = NULL;
    size_t len = 0, from = 0;
    bool have_from = false;
    kiln_err rc = KILN_OK;
    if (!p->record && !is_version) {
        rc = reg_newest_record(r, trust, p->state, model, what, &text, &len, &from);
        if (rc == KILN_ERR_NOTFOUND) {
            /* No registry has the channel: a failure (a refusal when this client accepted a
             * record of it before), never a reason to read the name as a version. */
            return reg_channel_missing(r->c, r->n, p->state, model, what);
        } else if (rc) {
            return rc;
        } else {
            pinned.record = text;
            pinned.record_len = len;
            have_from = true;
        }
    }
    bool done = false;
    for (size_t i = 0; i < r->n && !done; i++) {
        if (r->down[i]) continue;
        rc = reg_pull_with_trust(&r->c[i], &pinned, trust, res);
        if (rc == KILN_ERR_NOMEM) break;
        if (rc) {
            pass_over(r, i, rc);
            continue;
        }
        done = true;
        snprintf(res->registry, sizeof res->registry, "%s", r->c[i].url);
        if (have_from && from != i)
            snprintf(res->record_from, sizeof res->record_from, "%s", r->c[from].url);
    }
    free(text);
    if (done) return KILN_OK;
    if (rc == KILN_ERR_NOMEM) return rc;
    char msg[200];
    snprintf(msg, sizeof msg, "no registry gave %s that verifies", p->ref);
    return reasons_fail(r, msg);
}

kiln_err kiln_registry_pull_any(const kiln_registry_client_opts *cs, size_t n,
                                const kiln_registry_pull_opts *p, kiln_registry_note note,
                                void *note_ctx, kiln_registry_pulled *out) {
    memset(out, 0, sizeof *out);
    KILN_FAIL_IF(!p->ref || !p->trust || !p->out, KILN_ERR_USAGE,
                 "pull needs a NAME@CHANNEL or NAME@VERSION, a trust policy and an output "
                 "directory");
    reg_registries r;
    KILN_TRY(reg_registries_init(&r, cs, n, note, note_ctx));
    kiln_sign_trust *trust = NULL;
    kiln_err rc = KILN_OK;
    if (n == 1) {
        /* kiln_registry_pull, word for word. */
        rc = kiln_registry_pull(&r.c[0], p, out);
        if (!rc) snprintf(out->registry, sizeof out->registry, "%s", r.c[0].url);
    } else {
        /* Step 0 through every registry, then the rest under the newest policy. */
        rc = reg_trust_walk_regs(&r, p->trust, p->state, NULL, NULL, &trust);
        if (!rc) rc = reg_pull_regs(&r, p, trust, out);
    }
    kiln_sign_trust_free(trust);
    reg_registries_release(&r);
    return rc;
}

/* ---- the public API (include/kiln.h) ---- */

void reg_pull_result(const kiln_registry_pulled *r, kiln_pull_result *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->model, sizeof out->model, "%s", r->model);
    snprintf(out->version, sizeof out->version, "%s", r->version);
    snprintf(out->channel, sizeof out->channel, "%s", r->channel);
    memcpy(out->digest, r->digest, sizeof out->digest);
    out->size = r->size;
    out->seq = r->seq;
}

kiln_err kiln_pull(const kiln_pull_opts *o, kiln_pull_result *result) {
    KILN_FAIL_IF(!o || (!o->registry && !o->nregistries), KILN_ERR_USAGE,
                 "kiln_pull needs options with a registry URL");
    kiln_registry_client_opts *cs;
    size_t n;
    KILN_TRY(reg_pull_opts_clients(o, &cs, &n));
    kiln_registry_pull_opts p = {
        .ref = o->ref, .trust = o->trust, .out = o->out, .state = o->state};
    kiln_registry_pulled r;
    kiln_err rc = kiln_registry_pull_any(cs, n, &p, o->on_registry, o->registry_ctx, &r);
    free(cs);
    if (rc == KILN_OK && result) reg_pull_result(&r, result);
    return rc;
}
