/* watch.c - kiln_watch: follow a channel, pull and verify each new version, load it with
 * the runtime, and swap it in for the service only once all of that worked. Models are
 * reference counted so that streams on the old one finish on it. Each poll walks the trust
 * policy forward first (trustwalk.c), so a key revoked by a new signed version is
 * refused from the next poll on, without a restart.
 *
 * The model in service stays on disk when the watch stops (OUT/gen-N, N counting installs in
 * OUT across restarts), so that the next start can use it again: without a download when the
 * channel still names it, and when no registry answers at all (a trading service restarted
 * during an outage), after checking it again against the trust policy and the state the pull
 * left (reg_installed_verify). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "client_int.h"

typedef struct slot {
    kiln_model *m;
    kiln_pull_result what; /* model, version, channel, digest, size, seq */
    uint64_t gen;
    int refs;
    char *dir;
    struct slot *next; /* retired slots still held */
} slot;

struct kiln_watch {
    kiln_watch_opts o;
    char *ref, *trust, *out, *state, *token, *model, *channel, *ca_file;
    char **urls; /* the registries, in order (a primary and its mirrors) */
    size_t nurls;
    reg_registries regs;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, thread_started;
    int cancel; /* set by kiln_watch_stop (atomically): transfers in flight end at once */
    pthread_t thread;
    slot *cur, *retired, *dead; /* dead: nobody holds them; the watcher's thread frees them */
    uint64_t gen;               /* the generation in service (1 at start) */
    uint64_t dirno;             /* the N of the newest OUT/gen-N made or found */
    char *served;           /* the text of the record in service */
    char *last_record;      /* the text of the record last tried (served, or refused) */
    uint64_t trust_version; /* of the policy the last poll walked to */
    /* What kiln_watch_metrics says, under mu (the watcher's thread counts each poll). */
    char *metrics_file;
    bool metrics_failing; /* the last write of metrics_file failed (said once) */
    uint64_t polls, poll_failures, refused, swaps, failures_in_row, trust_seen;
    int64_t last_ok;        /* unix time of the last poll that went through; 0: none yet */
    int64_t served_expires; /* the expiry of the record in service */
    bool offline_start;     /* the start served the kept model with no registry answering */
    bool withdrawn;         /* the policy walked to withdrew the model in service */
};

/* The registry clients' progress callback: a stop ends a poll's transfers within about a
 * second (libcurl calls it at least that often), instead of after their deadlines (seconds
 * to minutes while a registry hangs), which a service shutting down would otherwise wait. */
static bool cancelled(kiln_watch *w) {
    return __atomic_load_n(&w->cancel, __ATOMIC_ACQUIRE) != 0;
}

static int watch_cancel(void *ctx, uint64_t done, uint64_t total) {
    (void)done, (void)total;
    return cancelled(ctx);
}

/* keep: the directory stays (the model in service when the watch stops). */
static void slot_free(slot *s, bool keep) {
    if (!s) return;
    kiln_model_free(s->m);
    if (!keep) reg_rmtree(s->dir);
    free(s->dir);
    free(s);
}

static slot *slot_new(kiln_model *m, uint64_t gen, char *dir) {
    slot *s = kiln_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->m = m;
    s->gen = gen;
    s->refs = 1;
    s->dir = dir;
    return s;
}

/* N of a name "gen-N" followed exactly by tail ("" for a directory, "\n" in OUT/current);
 * 0 when the name is not one. */
static uint64_t gen_number(const char *name, const char *tail) {
    if (strncmp(name, "gen-", 4) || !isdigit((unsigned char)name[4])) return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(name + 4, &end, 10);
    return !errno && !strcmp(end, tail) ? v : 0;
}

/* OUT/gen-N (caller frees; NULL when out of memory). */
static char *gen_dir(const kiln_watch *w, uint64_t n) {
    return kiln_asprintf("%s/gen-%llu", w->out, (unsigned long long)n);
}

/* The N of the newest OUT/gen-N, 0 when there is none. */
static uint64_t newest_dir(const char *out) {
    uint64_t n = 0;
    DIR *d = opendir(out);
    for (struct dirent *e; d && (e = readdir(d));) {
        uint64_t v = gen_number(e->d_name, "");
        if (v > n) n = v;
    }
    if (d) closedir(d);
    return n;
}

/* OUT/current names the directory in service ("gen-N\n"), written after each swap, so that
 * a start knows which to use again, whatever a crash left beside it. */
static void mark_current(const kiln_watch *w, const slot *s) {
    char *p = kiln_path_join(w->out, "current"), text[40];
    const char *base = strrchr(s->dir, '/') ? strrchr(s->dir, '/') + 1 : s->dir;
    int n = snprintf(text, sizeof text, "%s\n", base);
    if (!p || kiln_write_file_atomic(p, text, (size_t)n))
        kiln_warn("%s (a start without a registry cannot use the model in service)",
                  p ? kiln_errmsg() : "out of memory");
    free(p);
}

/* The N of the directory OUT/current names, 0 when none does. */
static uint64_t current_dir(const char *out) {
    char *p = kiln_path_join(out, "current"), *text = NULL;
    size_t len = 0;
    uint64_t n = 0;
    if (p && kiln_path_exists(p) && kiln_read_file(p, 64, &text, &len) == KILN_OK)
        n = gen_number(text, "\n");
    free(text);
    free(p);
    return n;
}

/* Whether name is the temporary directory of a pull into OUT/gen-N: ".gen-N.pull-XXXXXX"
 * (client.c's mkdtemp beside its output). */
static bool pull_tmp_name(const char *name) {
    if (strncmp(name, ".gen-", 5) || !isdigit((unsigned char)name[5])) return false;
    const char *p = name + 5;
    while (isdigit((unsigned char)*p))
        p++;
    return !strncmp(p, ".pull-", 6) && strlen(p + 6) == 6;
}

/* OUT is the watch's own: absent, empty, or holding only what a watch makes there (gen-N
 * directories, OUT/current, the temporary directories of pulls: remove_dirs' and a pull's
 * to replace). Anything else is refused by name before anything is written or removed, so
 * that pointing a watch at a directory of other files takes none of them away. */
static kiln_err watch_dir_check(const char *out) {
    struct stat sb;
    if (lstat(out, &sb) != 0) {
        if (errno == ENOENT) return KILN_OK;
        return kiln_fail_errno(KILN_ERR_IO, "cannot look at '%s'", out);
    }
    KILN_FAIL_IF(!S_ISDIR(sb.st_mode), KILN_ERR_CONFLICT,
                 "'%s' exists and is not a directory; kiln_watch keeps its models in a directory "
                 "of its own",
                 out);
    DIR *d = opendir(out);
    if (!d) return kiln_fail_errno(KILN_ERR_IO, "cannot read directory '%s'", out);
    kiln_err rc = KILN_OK;
    for (struct dirent *e; !rc && (e = readdir(d));) {
        const char *n = e->d_name;
        if (!strcmp(n, ".") || !strcmp(n, "..")) continue;
        struct stat es;
        bool ok = false;
        if (fstatat(dirfd(d), n, &es, AT_SYMLINK_NOFOLLOW) == 0)
            ok = !strcmp(n, "current")
                     ? S_ISREG(es.st_mode)
                     : S_ISDIR(es.st_mode) && (gen_number(n, "") > 0 || pull_tmp_name(n));
        if (!ok)
            rc = kiln_fail(KILN_ERR_CONFLICT,
                           "'%s' holds '%s', which kiln_watch does not make there: a watch keeps "
                           "its models in a directory of its own (gen-N, current) and removes "
                           "the ones it retires; give a new or an empty directory, or one an "
                           "earlier watch used",
                           out, n);
    }
    closedir(d);
    return rc;
}

/* Remove every OUT/gen-N but keep (an earlier run's, one a crash left), and the temporary
 * directories of pulls a crash interrupted (OUT/.gen-N.pull-XXXXXX): those names only, in a
 * directory watch_dir_check found to be a watch's. */
static void remove_dirs(const char *out, const char *keep) {
    DIR *d = opendir(out);
    for (struct dirent *e; d && (e = readdir(d));) {
        if (!gen_number(e->d_name, "") && !pull_tmp_name(e->d_name)) continue;
        char *p = kiln_path_join(out, e->d_name);
        if (p && strcmp(p, keep)) reg_rmtree(p);
        free(p);
    }
    if (d) closedir(d);
}

/* Whether OUT/gen-N exists. */
static bool gen_exists(const kiln_watch *w, uint64_t n) {
    char *dir = gen_dir(w, n);
    bool there = dir && kiln_path_exists(dir);
    free(dir);
    return there;
}

/* The model an earlier run left at OUT/gen-N, checked under t against the state its pull
 * left (reg_installed_verify) and loaded: *s (refs 1), *record its channel record's text.
 * want (may be NULL): the record the channel has now; another is KILN_ERR_NOTFOUND. */
static kiln_err load_kept(kiln_watch *w, const kiln_sign_trust *t, uint64_t n, const char *want,
                          char **record, reg_record *rec, slot **s) {
    *s = NULL;
    *record = NULL;
    char *dir = gen_dir(w, n);
    if (!dir) return KILN_ERR_NOMEM;
    kiln_model *m = NULL;
    kiln_err rc =
        reg_installed_verify(t, w->state, w->model, w->channel, dir, want, record, rec, NULL);
    if (!rc) rc = kiln_model_open(dir, &m);
    if (!rc && !(*s = slot_new(m, w->gen + 1, dir))) rc = KILN_ERR_NOMEM;
    if (rc) {
        kiln_model_free(m);
        free(dir);
        free(*record);
        *record = NULL;
        return rc;
    }
    kiln_pull_result *r = &(*s)->what;
    snprintf(r->model, sizeof r->model, "%s", w->model);
    snprintf(r->version, sizeof r->version, "%s", rec->version);
    snprintf(r->channel, sizeof r->channel, "%s", w->channel);
    snprintf(r->digest, sizeof r->digest, "%s", rec->digest);
    r->seq = rec->seq;
    return KILN_OK;
}

/* Pull the channel (record: its current record's text, from the registry that had the
 * newest) into out/gen-N under t and load it; *s is the new slot (refs 1: the watcher's). */
static kiln_err load_next(kiln_watch *w, const kiln_sign_trust *t, const char *record,
                          kiln_pull_result *res, slot **s) {
    *s = NULL;
    char *dir = gen_dir(w, ++w->dirno);
    if (!dir) return KILN_ERR_NOMEM;
    reg_rmtree(dir); /* left by an earlier failed attempt */
    /* The pull's state is made the client's only once the model loads: a version that
     * verifies but cannot load is never in service, and the state keeps the evidence of the
     * one that is, for a start with no registry (load_kept). */
    kiln_registry_pull_opts p = {.ref = w->ref,
                                 .trust = w->trust,
                                 .out = dir,
                                 .state = w->state,
                                 .record = record,
                                 .record_len = record ? strlen(record) : 0,
                                 .defer_state = true};
    kiln_registry_pulled r;
    kiln_model *m = NULL;
    kiln_err rc = reg_pull_regs(&w->regs, &p, t, &r);
    const bool pulled = !rc;
    if (!rc) rc = kiln_model_open(dir, &m);
    if (!rc) rc = reg_state_settle(w->state, w->model, w->channel, true);
    if (!rc && !(*s = slot_new(m, w->gen + 1, dir))) rc = KILN_ERR_NOMEM;
    if (rc) {
        if (pulled) {
            char why[1024];
            snprintf(why, sizeof why, "%s", kiln_errmsg());
            if (reg_state_settle(w->state, w->model, w->channel, false)) kiln_errclear();
            kiln_fail(rc, "%s", why); /* the failure said is the load's, not the drop's */
        }
        kiln_model_free(m);
        reg_rmtree(dir);
        free(dir);
        return rc;
    }
    reg_pull_result(&r, res);
    (*s)->what = *res;
    return KILN_OK;
}

/* Drop one reference; a retired slot nobody holds moves to the dead list, which the
 * watcher's thread frees (the model, and its directory removed: unlinking a 1 GiB file took
 * 0.37 s here), so that neither a service thread's kiln_watch_release nor anyone waiting on
 * mu pays for it. Called with mu held. */
static void unref(kiln_watch *w, slot *s) {
    if (--s->refs > 0 || s == w->cur) return;
    for (slot **p = &w->retired; *p; p = &(*p)->next)
        if (*p == s) {
            *p = s->next;
            break;
        }
    s->next = w->dead;
    w->dead = s;
    pthread_cond_signal(&w->cv);
}

static void slots_free(slot *s, bool keep) {
    while (s) {
        slot *n = s->next;
        slot_free(s, keep);
        s = n;
    }
}

/* Each version of the trust policy the registry gave: an event (rc KILN_OK, no result). */
static void heard_trust(void *ctx, const kiln_registry_trust_step *st) {
    kiln_watch *w = ctx;
    if (st->from_state || !w->o.on_update) return;
    char *msg = kiln_asprintf("trust policy version %llu accepted from %s%s%s",
                              (unsigned long long)st->version, st->source,
                              *st->changes ? "; changes:\n" : " (no changes besides the version)",
                              st->changes);
    w->o.on_update(w->o.ctx, KILN_OK, msg ? msg : "trust policy updated", NULL);
    free(msg);
}

/* After the policy moved: does the record in service still verify under it? A service is
 * told when it does not (the model stays in service: replacing it is the release manager's
 * call, by a new record). A record refused under the old policy is forgotten, so that the
 * next poll tries it under the new one (a new version may trust the key that signed it). */
static void recheck_in_service(kiln_watch *w, const kiln_sign_trust *t) {
    if (w->last_record && strcmp(w->last_record, w->served) != 0) {
        char *s = kiln_strdup(w->served);
        if (s) {
            free(w->last_record);
            w->last_record = s;
        }
    }
    char label[256];
    snprintf(label, sizeof label, "the channel record in service (%s@%s)", w->model, w->channel);
    reg_record rec;
    kiln_err rc = reg_record_verify(t, w->served, strlen(w->served), label, &rec);
    if (!rc) {
        rc = reg_withdrawn(t, rec.digest, "the model in service");
        pthread_mutex_lock(&w->mu); /* for kiln_watch_metrics */
        w->withdrawn = rc != KILN_OK;
        pthread_mutex_unlock(&w->mu);
    }
    if (!w->o.on_update) {
        kiln_errclear();
        return;
    }
    if (rc) {
        kiln_errprefix(rc, "under trust policy version %llu: ",
                       (unsigned long long)kiln_sign_trust_version(t));
        w->o.on_update(w->o.ctx, rc, kiln_errmsg(), NULL);
    }
}

/* Whether a failure refused what a registry gave (a record, a trust version, an archive or a
 * model that does not verify or load), rather than not reaching one or the disk: a refused
 * record is not tried again until a newer one comes, and is counted as refused. */
static bool refusal(kiln_err rc) {
    return rc && rc != KILN_ERR_NETWORK && rc != KILN_ERR_IO && rc != KILN_ERR_NOMEM;
}

/* The expiry of a record's text (already verified), for the metrics; 0 if it does not
 * parse. */
static int64_t record_expires(const char *text) {
    kiln_sign_record r;
    kiln_sign_record_init(&r);
    int64_t e =
        kiln_sign_record_parse(text, strlen(text), "the record in service", &r) ? 0 : r.expires;
    if (!e) kiln_errclear();
    kiln_sign_record_release(&r);
    return e;
}

/* One poll: the trust walk, the channel's newest record, a new version pulled, loaded and
 * swapped in (*swapped). Its outcome (KILN_OK: it went through, with or without news). */
static kiln_err poll_once(kiln_watch *w, bool *swapped) {
    char *text = NULL;
    size_t len = 0;
    kiln_sign_trust *t = NULL;
    reg_registries_reset(&w->regs); /* a registry down at the last poll is asked again */
    kiln_err rc = reg_trust_walk_regs(&w->regs, w->trust, w->state, heard_trust, w, &t);
    if (rc) {
        /* Fail closed: nothing is pulled under a policy that did not walk. */
        if (w->o.on_update && !cancelled(w)) w->o.on_update(w->o.ctx, rc, kiln_errmsg(), NULL);
        return rc;
    }
    if (kiln_sign_trust_version(t) != w->trust_version) {
        w->trust_version = kiln_sign_trust_version(t);
        recheck_in_service(w, t);
    }
    size_t from;
    rc = reg_newest_record(&w->regs, t, w->state, w->model, w->channel, &text, &len, &from);
    if (!rc && w->last_record && !strcmp(text, w->last_record)) {
        free(text);
        kiln_sign_trust_free(t);
        return KILN_OK; /* nothing new */
    }
    kiln_pull_result res;
    memset(&res, 0, sizeof res);
    slot *s = NULL;
    if (!rc) rc = load_next(w, t, text, &res, &s);
    if (!rc) {
        const int64_t expires = record_expires(text);
        pthread_mutex_lock(&w->mu);
        slot *old = w->cur;
        w->cur = s;
        w->gen = s->gen;
        w->served_expires = expires;
        w->withdrawn = false; /* it was accepted under the policy walked to */
        *swapped = true;
        old->next = w->retired;
        w->retired = old;
        unref(w, old); /* the watcher's own reference */
        pthread_mutex_unlock(&w->mu);
        mark_current(w, s); /* a file written and synced: not under mu */
        char *served = kiln_strdup(text);
        if (served) {
            free(w->served);
            w->served = served;
        }
        free(w->last_record);
        w->last_record = text;
        text = NULL;
    } else {
        /* A record refused or a model that fails to load is not tried again on every poll
         * (a newer record is); a network or disk failure is. */
        if (text && refusal(rc)) {
            free(w->last_record);
            w->last_record = text;
            text = NULL;
        }
    }
    /* A stop's cancelled transfers are no failure to report. */
    if (w->o.on_update && !(rc && cancelled(w))) {
        /* A swap is said in words too (issue 30: a success came with an empty message). */
        char said[512] = "";
        if (!rc && res.channel[0])
            snprintf(said, sizeof said, "serving %s@%s (channel %s, seq %lld) %s", res.model,
                     res.version, res.channel, (long long)res.seq, res.digest);
        else if (!rc)
            snprintf(said, sizeof said, "serving %s@%s %s", res.model, res.version, res.digest);
        w->o.on_update(w->o.ctx, rc, rc ? kiln_errmsg() : said, rc ? NULL : &res);
    }
    free(text);
    kiln_sign_trust_free(t);
    return rc;
}

/* A poll's outcome, counted for the metrics. Called with mu held. */
static void count_poll(kiln_watch *w, kiln_err rc, bool swapped) {
    w->polls++;
    if (rc) {
        w->poll_failures++;
        w->failures_in_row++;
        /* Not a registry out of reach or a disk: something was refused. */
        if (refusal(rc)) w->refused++;
    } else {
        w->failures_in_row = 0;
        w->last_ok = kiln_unix_time();
    }
    if (swapped) w->swaps++;
    w->trust_seen = w->trust_version;
}

/* Rewrite metrics_file (when asked for): at the start, whose failure fails the start
 * (polled false), and after each poll, whose failure is said once until a write works again. */
static kiln_err write_metrics(kiln_watch *w, bool polled) {
    if (!w->metrics_file) return KILN_OK;
    char *text = kiln_watch_metrics(w);
    kiln_err rc = text ? kiln_write_file_atomic(w->metrics_file, text, strlen(text))
                       : kiln_fail(KILN_ERR_NOMEM, "out of memory");
    free(text);
    if (rc && polled && !w->metrics_failing) kiln_warn("kiln_watch: metrics: %s", kiln_errmsg());
    w->metrics_failing = rc != KILN_OK;
    return rc;
}

static void *watch_main(void *arg) {
    kiln_watch *w = arg;
    unsigned ms = w->o.interval_ms ? w->o.interval_ms : 30000;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += ms / 1000;
        ts.tv_nsec += (long)(ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        while (!w->stop) {
            if (w->dead) { /* freed without the lock */
                slot *d = w->dead;
                w->dead = NULL;
                pthread_mutex_unlock(&w->mu);
                slots_free(d, false);
                pthread_mutex_lock(&w->mu);
                continue;
            }
            if (pthread_cond_timedwait(&w->cv, &w->mu, &ts) == ETIMEDOUT) break;
        }
        if (w->stop) break;
        pthread_mutex_unlock(&w->mu);
        bool swapped = false;
        kiln_err rc = poll_once(w, &swapped);
        if (!cancelled(w)) { /* a stop's cancelled transfers are no failed poll */
            pthread_mutex_lock(&w->mu);
            count_poll(w, rc, swapped);
            pthread_mutex_unlock(&w->mu);
            write_metrics(w, true);
        }
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

/* Whether text, the one registry's current record, is older than this client accepted (a
 * stale mirror): then why says so. */
static bool stale_record(kiln_watch *w, const kiln_sign_trust *t, const char *text, size_t len,
                         char *why, size_t cap) {
    int64_t last;
    bool known, stale = false;
    reg_record rec;
    if (reg_channel_state(w->state, w->model, w->channel, &last, &known)) return false;
    if (reg_record_accept(t, text, len, w->model, w->channel, last, known, &rec, &stale) && stale) {
        snprintf(why, cap, "registry %s: %s", w->urls[0], kiln_errmsg());
        return true;
    }
    return false;
}

/* The first model of a start, in w->cur, and its record in *text: the channel's current
 * version (the kept model when the channel still names it and it verifies, else pulled); or,
 * when no registry can give the channel's newest record (none answers, or each that does
 * has only records older than this client accepted: stale mirrors), the kept model checked
 * again without them. note (cap bytes) and *note_rc: what on_update is to hear, if anything. */
static kiln_err start_model(kiln_watch *w, uint64_t kept, char **text, char *note, size_t cap,
                            kiln_err *note_rc) {
    kiln_sign_trust *t = NULL;
    size_t len = 0, from;
    reg_record rec;
    char why[1024] = "";
    kiln_err rc = reg_trust_walk_regs(&w->regs, w->trust, w->state, NULL, NULL, &t);
    const bool walked = !rc;
    if (!rc) rc = reg_newest_record(&w->regs, t, w->state, w->model, w->channel, text, &len, &from);
    kiln_err outage =
        rc == KILN_ERR_NETWORK || (rc == KILN_ERR_VERIFY && w->regs.only_stale) ? rc : KILN_OK;
    if (outage) snprintf(why, sizeof why, "%s", kiln_errmsg());
    if (!rc && kept && w->regs.n == 1 && stale_record(w, t, *text, len, why, sizeof why))
        outage = KILN_ERR_VERIFY;
    if (!rc && !outage) {
        /* The channel still names the kept model: no download. One that no longer verifies
         * (a file changed on disk) is said, and replaced by a pull. */
        char *kept_record = NULL;
        kiln_err k =
            kept ? load_kept(w, t, kept, *text, &kept_record, &rec, &w->cur) : KILN_ERR_NOTFOUND;
        free(kept_record);
        if (k && k != KILN_ERR_NOTFOUND) {
            *note_rc = k;
            snprintf(note, cap, "the model kept in '%s/gen-%llu' was not used: %s", w->out,
                     (unsigned long long)kept, kiln_errmsg());
        }
        if (k) {
            kiln_pull_result res;
            rc = load_next(w, t, *text, &res, &w->cur);
        }
        /* The channel's version refused (a record or an archive that does not verify, a model
         * that does not load): as a running watch keeps its model then, a start keeps the one
         * it kept, checked as for a start with no registry, and says why. The refused record
         * is not tried again until a newer one comes. */
        if (refusal(rc) && kept &&
            k == KILN_ERR_NOTFOUND) {
            char refused[1024];
            snprintf(refused, sizeof refused, "%s", kiln_errmsg());
            char *kept_text = NULL;
            if (!load_kept(w, t, kept, NULL, &kept_text, &rec, &w->cur)) {
                char when[21];
                kiln_format_time(rec.expires, when);
                *note_rc = rc;
                snprintf(note, cap,
                         "the channel's current version was refused: %s; serving %s@%s (%s seq "
                         "%lld, expires %s) as kept in '%s', checked again against the trust "
                         "policy and the state of its pull",
                         refused, w->model, rec.version, w->channel, (long long)rec.seq, when,
                         w->cur->dir);
                w->served = kept_text;
                w->refused = 1;
                rc = KILN_OK;
            } else {
                rc = kiln_fail(rc, "%s; and the model kept in '%s/gen-%llu' cannot serve: %s",
                               refused, w->out, (unsigned long long)kept, kiln_errmsg());
            }
        }
    } else if (outage && kept) {
        /* The kept model, checked again under the policy walked (or, when no registry
         * answered, the one this client holds: its trust file and the versions in state)
         * against the state its pull left, is served until a registry gives the newest
         * record (the watch polls on). An expired record, one older than accepted since, or
         * a file changed on disk fail the start. */
        free(*text);
        *text = NULL;
        rc = KILN_OK;
        if (!walked) {
            kiln_sign_trust_free(t);
            t = NULL;
            rc = kiln_registry_trust_walk(NULL, w->trust, w->state, NULL, NULL, &t);
        }
        if (!rc) rc = load_kept(w, t, kept, NULL, text, &rec, &w->cur);
        /* A crash between a pull's install and its OUT/current leaves the newer directory
         * unnamed (and the state naming its record): the others are tried, newest first. */
        char whynot[1024];
        snprintf(whynot, sizeof whynot, "%s", kiln_errmsg());
        for (uint64_t n = w->dirno; rc && rc != KILN_ERR_NOMEM && n > 0; n--)
            if (n != kept && gen_exists(w, n)) rc = load_kept(w, t, n, NULL, text, &rec, &w->cur);
        if (rc) {
            rc = kiln_fail(rc, "%s; and the model kept in '%s/gen-%llu' cannot serve: %s", why,
                           w->out, (unsigned long long)kept, whynot);
        } else {
            char when[21];
            kiln_format_time(rec.expires, when);
            *note_rc = outage;
            w->offline_start = true;
            snprintf(note, cap,
                     "%s; serving %s@%s (%s seq %lld, expires %s) as kept in '%s', checked "
                     "again against the trust policy and the state of its pull",
                     why, w->model, rec.version, w->channel, (long long)rec.seq, when, w->cur->dir);
        }
    }
    if (!rc) w->trust_version = kiln_sign_trust_version(t);
    kiln_sign_trust_free(t);
    return rc;
}

kiln_err kiln_watch_start(const kiln_watch_opts *o, kiln_watch **out) {
    *out = NULL;
    KILN_FAIL_IF(!o || (!o->pull.registry && !o->pull.nregistries) || !o->pull.ref ||
                     !o->pull.trust || !o->pull.out,
                 KILN_ERR_USAGE,
                 "kiln_watch needs a registry, a NAME@CHANNEL, a trust policy and a directory");
    char model[KILN_REGISTRY_NAME_MAX + 1], channel[KILN_REGISTRY_NAME_MAX + 1];
    KILN_FAIL_IF(!reg_ref_split(o->pull.ref, model, channel), KILN_ERR_USAGE,
                 "'%s' is not NAME@CHANNEL", o->pull.ref);
    kiln_watch *w = kiln_calloc(1, sizeof *w);
    if (!w) return KILN_ERR_NOMEM;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    w->o = *o;
    w->ref = kiln_strdup(o->pull.ref);
    w->trust = kiln_strdup(o->pull.trust);
    w->out = kiln_strdup(o->pull.out);
    w->token = o->pull.token ? kiln_strdup(o->pull.token) : NULL;
    w->state = o->pull.state ? kiln_strdup(o->pull.state) : NULL;
    w->ca_file = o->pull.ca_file ? kiln_strdup(o->pull.ca_file) : NULL;
    w->model = kiln_strdup(model);
    w->channel = kiln_strdup(channel);
    kiln_err rc = KILN_OK;
    KILN_CHECK_IF(rc, fail,
                  !w->ref || !w->trust || !w->out || (o->pull.token && !w->token) ||
                      (o->pull.state && !w->state) || (o->pull.ca_file && !w->ca_file) ||
                      !w->model || !w->channel,
                  KILN_ERR_NOMEM, "out of memory");
    KILN_CHECK(rc, fail, kiln_registry_check_name("model", w->model));
    KILN_CHECK_IF(rc, fail, kiln_registry_looks_like_version(w->channel), KILN_ERR_USAGE,
                  "'%s' names a version ('%s' begins with a digit or with 'v' and a digit): "
                  "kiln_watch follows a channel, NAME@CHANNEL",
                  w->ref, w->channel);
    KILN_CHECK(rc, fail, kiln_registry_check_channel(w->channel));
    /* The registries: the caller's strings copied, since the watch outlives its options. */
    {
        kiln_registry_client_opts *cs;
        KILN_CHECK(rc, fail, reg_pull_opts_clients(&o->pull, &cs, &w->nurls));
        w->urls = kiln_calloc(w->nurls, sizeof *w->urls);
        for (size_t i = 0; w->urls && i < w->nurls; i++) {
            w->urls[i] = kiln_strdup(cs[i].url);
            cs[i].url = w->urls[i];
            cs[i].token = w->token;
            cs[i].ca_file = w->ca_file;
            cs[i].progress = watch_cancel;
            cs[i].progress_ctx = w;
            if (!w->urls[i]) rc = KILN_ERR_NOMEM;
        }
        if (!w->urls) rc = KILN_ERR_NOMEM;
        if (!rc)
            rc = reg_registries_init(&w->regs, cs, w->nurls, o->pull.on_registry,
                                     o->pull.registry_ctx);
        free(cs);
        if (rc) goto fail;
    }
    KILN_CHECK(rc, fail, watch_dir_check(w->out));
    KILN_CHECK(rc, fail, kiln_mkdir_p(w->out));
    char *text = NULL, note[2048] = "";
    kiln_err note_rc = KILN_OK;
    /* The model an earlier run kept, if any; new installs go after every gen-N there. */
    const uint64_t kept = current_dir(w->out);
    w->dirno = newest_dir(w->out);
    rc = start_model(w, kept, &text, note, sizeof note, &note_rc);
    if (rc) {
        free(text);
        goto fail;
    }
    mark_current(w, w->cur);
    remove_dirs(w->out, w->cur->dir);
    w->gen = w->cur->gen;
    w->last_record = text;
    if (!w->served) w->served = kiln_strdup(text); /* else the kept one, the channel's refused */
    KILN_CHECK_IF(rc, fail, !w->served, KILN_ERR_NOMEM, "out of memory");
    w->served_expires = record_expires(w->served);
    w->trust_seen = w->trust_version;
    if (o->metrics_file) {
        KILN_CHECK_IF(rc, fail, !(w->metrics_file = kiln_strdup(o->metrics_file)), KILN_ERR_NOMEM,
                      "out of memory");
        KILN_CHECK(rc, fail, write_metrics(w, false));
    }
    /* Said before the watcher's thread starts, so that on_update is never called twice at
     * once: served offline, or a kept model refused. */
    if (note_rc && o->on_update) o->on_update(o->ctx, note_rc, note, NULL);
    KILN_CHECK_IF(rc, fail, pthread_create(&w->thread, NULL, watch_main, w) != 0, KILN_ERR_INTERNAL,
                  "cannot start the watcher's thread");
    w->thread_started = true;
    *out = w;
    return KILN_OK;
fail:
    kiln_watch_stop(w);
    return rc;
}

const kiln_model *kiln_watch_acquire(kiln_watch *w, uint64_t *generation) {
    pthread_mutex_lock(&w->mu);
    slot *s = w->cur;
    s->refs++;
    if (generation) *generation = s->gen;
    pthread_mutex_unlock(&w->mu);
    return s->m;
}

kiln_err kiln_watch_serving(kiln_watch *w, uint64_t generation, kiln_pull_result *out) {
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&w->mu);
    const slot *s = !generation || w->cur->gen == generation ? w->cur : NULL;
    for (const slot *r = w->retired; !s && r; r = r->next)
        if (r->gen == generation) s = r;
    if (s) *out = s->what;
    pthread_mutex_unlock(&w->mu);
    KILN_FAIL_IF(!s, KILN_ERR_NOTFOUND, "generation %llu is no longer held",
                 (unsigned long long)generation);
    return KILN_OK;
}

void kiln_watch_release(kiln_watch *w, const kiln_model *m) {
    if (!m) return;
    pthread_mutex_lock(&w->mu);
    slot *s = w->cur && w->cur->m == m ? w->cur : NULL;
    for (slot *r = w->retired; !s && r; r = r->next)
        if (r->m == m) s = r;
    if (s) unref(w, s);
    pthread_mutex_unlock(&w->mu);
}

void kiln_watch_stop(kiln_watch *w) {
    if (!w) return;
    if (w->thread_started) {
        __atomic_store_n(&w->cancel, 1, __ATOMIC_RELEASE);
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_signal(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
    }
    slot_free(w->cur, true); /* kept for the next start */
    slots_free(w->retired, false);
    slots_free(w->dead, false);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    free(w->ref), free(w->trust), free(w->out), free(w->state), free(w->model), free(w->channel);
    free(w->ca_file);
    for (size_t i = 0; w->urls && i < w->nurls; i++)
        free(w->urls[i]);
    free(w->urls);
    reg_registries_release(&w->regs);
    if (w->token) sodium_memzero(w->token, strlen(w->token));
    free(w->token);
    free(w->last_record);
    free(w->served);
    free(w->metrics_file);
    free(w);
}

char *kiln_watch_metrics(kiln_watch *w) {
    pthread_mutex_lock(&w->mu);
    const kiln_pull_result r = w->cur->what;
    const uint64_t gen = w->gen, polls = w->polls, failed = w->poll_failures,
                   in_row = w->failures_in_row, refused = w->refused, swaps = w->swaps,
                   trust = w->trust_seen;
    const int64_t last_ok = w->last_ok, expires = w->served_expires;
    const bool offline = w->offline_start && !last_ok, withdrawn = w->withdrawn;
    pthread_mutex_unlock(&w->mu);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return NULL;
    /* Model, channel and version are registry names ([a-z0-9._-] and the like), the digest
     * hex: nothing in a label value to escape. */
    fprintf(f,
            "# HELP kiln_watch_info The model version this service runs.\n"
            "# TYPE kiln_watch_info gauge\n"
            "kiln_watch_info{model=\"%s\",channel=\"%s\",version=\"%s\",digest=\"%s\"} 1\n"
            "# HELP kiln_watch_generation Versions swapped in since the start, from 1.\n"
            "# TYPE kiln_watch_generation gauge\nkiln_watch_generation %llu\n"
            "# HELP kiln_watch_record_seq The seq of the channel record in service.\n"
            "# TYPE kiln_watch_record_seq gauge\nkiln_watch_record_seq %lld\n"
            "# HELP kiln_watch_record_expiry_timestamp_seconds When the record in service expires "
            "(a restart with no registry serves the kept model until then).\n"
            "# TYPE kiln_watch_record_expiry_timestamp_seconds gauge\n"
            "kiln_watch_record_expiry_timestamp_seconds %lld\n"
            "# HELP kiln_watch_polls_total Polls of the channel.\n"
            "# TYPE kiln_watch_polls_total counter\nkiln_watch_polls_total %llu\n"
            "# HELP kiln_watch_poll_failures_total Polls that failed (no registry, a refusal).\n"
            "# TYPE kiln_watch_poll_failures_total counter\nkiln_watch_poll_failures_total %llu\n"
            "# HELP kiln_watch_poll_failures_in_row Failed polls since the last that went "
            "through.\n"
            "# TYPE kiln_watch_poll_failures_in_row gauge\nkiln_watch_poll_failures_in_row %llu\n"
            "# HELP kiln_watch_last_poll_success_timestamp_seconds The last poll that went "
            "through (0: none since the start).\n"
            "# TYPE kiln_watch_last_poll_success_timestamp_seconds gauge\n"
            "kiln_watch_last_poll_success_timestamp_seconds %lld\n"
            "# HELP kiln_watch_swaps_total New versions swapped in.\n"
            "# TYPE kiln_watch_swaps_total counter\nkiln_watch_swaps_total %llu\n"
            "# HELP kiln_watch_refused_total Polls that refused what a registry gave (a record, "
            "a trust version, a model that does not verify or load).\n"
            "# TYPE kiln_watch_refused_total counter\nkiln_watch_refused_total %llu\n"
            "# HELP kiln_watch_trust_policy_version The trust policy version walked to.\n"
            "# TYPE kiln_watch_trust_policy_version gauge\nkiln_watch_trust_policy_version %llu\n"
            "# HELP kiln_watch_serving_offline 1 while the kept model the start served with no "
            "registry answering has not been confirmed by a poll.\n"
            "# TYPE kiln_watch_serving_offline gauge\nkiln_watch_serving_offline %d\n"
            "# HELP kiln_watch_serving_withdrawn 1 while the model in service is one the trust "
            "policy withdrew (it stays until the channel names another).\n"
            "# TYPE kiln_watch_serving_withdrawn gauge\nkiln_watch_serving_withdrawn %d\n",
            r.model, r.channel, r.version, r.digest, (unsigned long long)gen, (long long)r.seq,
            (long long)expires, (unsigned long long)polls, (unsigned long long)failed,
            (unsigned long long)in_row, (long long)last_ok, (unsigned long long)swaps,
            (unsigned long long)refused, (unsigned long long)trust, offline ? 1 : 0,
            withdrawn ? 1 : 0);
    if (fclose(f) != 0) {
        free(buf);
        return NULL;
    }
    return buf;
}
