/* client_int.h - helpers shared inside the registry's client (registry/client/): the state
 * directory, the pull and its checks, several registries failing over. Server files never
 * include it. */
#ifndef KILN_REGISTRY_CLIENT_INT_H
#define KILN_REGISTRY_CLIENT_INT_H

#include "registry_common.h"

/* ---- the pull (client.c) and the state directory (state.c, installed.c) ---- */

/* The public kiln_pull_result (include/kiln.h) of a pull: kiln_pull's and kiln_watch's. */
void reg_pull_result(const kiln_registry_pulled *r, kiln_pull_result *out);

/* The state directory when none is given: $HOME/.local/state/kiln; caller frees. */
char *reg_default_state(void);
/* A deferred pull's state (kiln_registry_pull_opts.defer_state) made the state of
 * model/channel (commit: renamed over CHANNEL.json, the directory synced) or dropped. */
kiln_err reg_state_settle(const char *state, const char *model, const char *channel, bool commit);
/* The last seq this client accepted for model/channel (STATE/channels/MODEL/CHANNEL.json;
 * state NULL: the default); 0 and *known false when none. */
kiln_err reg_channel_state(const char *state, const char *model, const char *channel, int64_t *seq,
                           bool *known);
/* A channel that none of the n registries c has: KILN_ERR_VERIFY when this client accepted a
 * record of it before (a registry that no longer has it is refused as a rollback would be),
 * else KILN_ERR_NOTFOUND saying so; when no registry has the model at all, that is what it
 * says, with the registry's model the name was likely meant to be (issue 30: it explained
 * version naming for a misspelt model). Never a reason to read the name as a version
 * (kiln_registry_looks_like_version). Always a failure. */
kiln_err reg_channel_missing(const kiln_registry_client_opts *c, size_t n, const char *state,
                             const char *model, const char *channel);
/* A model directory a pull of model@channel installed (dir), checked without a registry
 * against what that pull kept in state (STATE/channels/MODEL/CHANNEL.json; state NULL: the
 * default): the kept record's signatures reach trust's threshold, it names model@channel, it
 * is the one this client accepted last (the state's seq) and has not expired; the kept
 * archive signatures verify under trust with comments naming the directory's manifest
 * (kiln_sign_verify_manifest_sigs: release keys, threshold, unvalidated rule); that manifest
 * is model@ the record's version; every file matches it and there is no other
 * (kiln_manifest_verify_dir). *record (caller frees) is the record's text and *rec it parsed;
 * info (may be NULL) gets the rest of what was checked (its trust_version is the caller's).
 * want (may be NULL): the record text the channel has now; a kept record that is another is
 * KILN_ERR_NOTFOUND before any file is hashed.
 * Not checked, for want of the archive: that its bytes are those the record's digest names
 * (the record binds the archive, the release keys' signed comments bind the manifest).
 * KILN_ERR_NOTFOUND when state keeps no such pull, KILN_ERR_VERIFY naming a failed check. */
kiln_err reg_installed_verify(const kiln_sign_trust *trust, const char *state, const char *model,
                              const char *channel, const char *dir, const char *want,
                              char **record, reg_record *rec,
                              kiln_registry_installed *info) KILN_MUST_CHECK;
/* A pull's checks 1-3 of a channel record: its signatures reach trust's threshold for the
 * channel, it names model and channel, its seq is not below last (when known; *stale, may be
 * NULL, says that was the failure), it has not expired. KILN_ERR_VERIFY naming the failure. */
kiln_err reg_record_accept(const kiln_sign_trust *trust, const char *record, size_t len,
                           const char *model, const char *channel, int64_t last, bool known,
                           reg_record *rec, bool *stale) KILN_MUST_CHECK;
/* The fork rule: a record at the seq this client accepted last (state's
 * STATE/channels/MODEL/CHANNEL.json) must be byte for byte the record kept there; another is
 * KILN_ERR_VERIFY. An OCI registry has no compare-and-swap on tags, so two promoters can
 * each write a record of one seq: whichever a client accepted first stays the only one. */
kiln_err reg_record_fork_check(const char *state, const char *model, const char *channel,
                               const reg_record *rec, const char *text, size_t len)
    KILN_MUST_CHECK;
/* kiln_registry_pull under a policy the caller walked already (kiln_watch walks it once per
 * poll). */
kiln_err reg_pull_with_trust(const kiln_registry_client_opts *c, const kiln_registry_pull_opts *p,
                             const kiln_sign_trust *trust, kiln_registry_pulled *res)
    KILN_MUST_CHECK;

/* ---- several registries (failover.c) ---- */

/* The registries of one pull or watch poll, in order. */
typedef struct reg_registries {
    kiln_registry_client_opts *c; /* each with retries 0 when there are several */
    size_t n;
    bool *down; /* did not answer during this pull: not asked again by it */
    kiln_registry_note note;
    void *ctx;
    /* Why each registry was passed over during this pull ("URL1: why; URL2: why"), for the
     * error when none served. */
    char why[4096];
    size_t why_len;
    bool why_verify; /* one served something that did not verify */
    kiln_err why_last;
    /* Set by reg_newest_record when it found no record because every registry that served
     * one served a record older than this client accepted (stale mirrors; the others did not
     * answer): nothing wrong was served, the newest is just out of reach. */
    bool only_stale;
} reg_registries;
/* Copy cs[0..n) (the URLs and tokens stay the caller's); release with reg_registries_release. */
kiln_err reg_registries_init(reg_registries *r, const kiln_registry_client_opts *cs, size_t n,
                             kiln_registry_note note, void *ctx);
void reg_registries_release(reg_registries *r);
/* The registries of kiln_pull_opts (registry, then registries[]) as client options with
 * token; *cs: caller frees (the strings stay o's). */
kiln_err reg_pull_opts_clients(const kiln_pull_opts *o, kiln_registry_client_opts **cs, size_t *n);
/* Forget which registries did not answer and why (each watch poll starts afresh). */
void reg_registries_reset(reg_registries *r);
kiln_err reg_trust_walk_regs(reg_registries *r, const char *trust, const char *state,
                             void (*on_step)(void *ctx, const kiln_registry_trust_step *s),
                             void *ctx, kiln_sign_trust **out) KILN_MUST_CHECK;
/* The current record of model/channel with the highest seq that passes reg_record_accept,
 * among the registries that have it: *text (caller frees), *len and *from (its registry's
 * index). KILN_ERR_NOTFOUND when every registry that answered has no such channel (and
 * none failed otherwise); another failure names each registry's reason. */
kiln_err reg_newest_record(reg_registries *r, const kiln_sign_trust *trust, const char *state,
                           const char *model, const char *channel, char **text, size_t *len,
                           size_t *from) KILN_MUST_CHECK;
/* The current record of model/channel as the first registry that has one serves it, unchecked
 * (*text: caller frees; *from its index): what is shown, and flagged, when reg_newest_record
 * finds none that verifies. KILN_ERR_NOTFOUND when none has it, or the last failure. */
kiln_err reg_first_record(reg_registries *r, const char *model, const char *channel, char **text,
                          size_t *len, size_t *from);
/* GET path's JSON (*out: caller json_decrefs) from the first registry that holds it, in order
 * (a version, a model): one
 * that answers 404 does not hold it and the next is asked; one that fails otherwise is passed
 * over (the note says why; one that does not answer is not asked again). *from: the index of
 * the one that answered. KILN_ERR_NOTFOUND ("no registry holds WHAT") when each that answered
 * lacks it; another failure names each registry's reason. With one registry,
 * kiln_registry_get_json and its message, without notes. */
kiln_err reg_get_json_first(reg_registries *r, const char *path, const char *what, json_t **out,
                            size_t *from);
/* reg_pull_with_trust over the registries: the newest record (reg_newest_record), then the
 * archive from the first registry that holds it and verifies (p->record, when given, is used
 * as the record). */
kiln_err reg_pull_regs(reg_registries *r, const kiln_registry_pull_opts *p,
                       const kiln_sign_trust *trust, kiln_registry_pulled *res) KILN_MUST_CHECK;

#endif
