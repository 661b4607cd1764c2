/* cmd_runs_serve.c - kiln runs serve: a read-only web page over a directory of runs (a sweep,
 * or one run). Each request reads the runs afresh (train/'s readers: run.json, metrics.db in
 * one read transaction, the checkpoints on disk), so a run in training shows its new steps on
 * reload, and a reader never holds a lock the trainer would wait on (SQLite WAL). web/ draws
 * the pages from the plain values handed to it; no JavaScript, the registry page's content
 * security policy (with the overlay form allowed to this server). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <microhttpd.h>

#include "cli.h"
#include "kiln.h"
#include "runs.h"
#include "web.h"

#define MAX_EVENTS 2000  /* the newest events read for the marks */
#define EVENT_ROWS 200   /* the newest shown in the table */
#define MAX_OVERLAY 10   /* runs on one overlay */
#define CURVE_BUCKETS 500
#define MAX_VARIED 64    /* config keys the sweep's table has a column for */

typedef struct server {
    const char *root;
    kiln_run_cache *cache; /* the steps read so far of each run: a reload reads what is new */
    bool single;           /* root is itself a run: / is its page (issue 30), not a list of one */
} server;

static double now_s(void) {
    return (double)kiln_unix_time();
}

/* ---- answering ---- */

static enum MHD_Result send_error(struct MHD_Connection *c, const server *s, unsigned status,
                                  const char *msg);

static enum MHD_Result send_page(struct MHD_Connection *c, const server *s, unsigned status,
                                 kiln_web_buf *b) {
    size_t len;
    bool over = b->over;
    char *html = kiln_web_buf_take(b, &len);
    /* A page past KILN_WEB_PAGE_MAX: a 500 that says so (the error page itself is small). */
    if (!html && over && status != 500) return send_error(c, s, 500, kiln_errmsg());
    if (!html) return MHD_NO;
    struct MHD_Response *r = MHD_create_response_from_buffer(len, html, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(html);
        return MHD_NO;
    }
    size_t n;
    const kiln_web_header *h = kiln_web_headers_form(&n);
    for (size_t i = 0; i < n; i++)
        MHD_add_response_header(r, h[i].name, h[i].value);
    if (status == 405) MHD_add_response_header(r, "Allow", "GET, HEAD");
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const server *s, unsigned status,
                                  const char *msg) {
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    char title[32];
    snprintf(title, sizeof title, "%u", status);
    kiln_web_runs_begin(&b, title);
    kiln_web_para(&b, msg);
    kiln_web_runs_end(&b, s->root, now_s());
    return send_page(c, s, status, &b);
}

/* ---- finding a run by the name its link carries ---- */

/* "." is the directory served; a name is one of its direct children, no path in it, and a
 * directory itself, not a symlink to one (kiln runs list does not list such a link either).
 * The caller frees the path. NULL: no such name (nothing outside the directory is reachable:
 * the readers open a run's files without following links, runs/runs.c). */
static char *run_path(const server *s, const char *name) {
    if (!name || !*name) return NULL;
    if (!strcmp(name, ".")) return kiln_strdup(s->root);
    if (name[0] == '.' || strchr(name, '/') || strlen(name) > 255) return NULL;
    char *p = kiln_path_join(s->root, name);
    struct stat sb;
    if (p && (lstat(p, &sb) != 0 || !S_ISDIR(sb.st_mode))) {
        free(p);
        return NULL;
    }
    return p;
}

/* The name a run's links carry: "." for the directory served itself, else its child's name. */
static const char *link_name(const server *s, const kiln_run_row *r) {
    if (!strcmp(r->dir, s->root)) return ".";
    const char *slash = strrchr(r->dir, '/');
    return slash ? slash + 1 : r->dir;
}

static const char *display_name(const server *s, const char *name) {
    return strcmp(name, ".") ? name : s->root;
}

/* ---- / ---- */

static enum MHD_Result page_sweep(struct MHD_Connection *c, const server *s) {
    kiln_run_list l;
    const char *paths[1] = {s->root};
    kiln_err e = kiln_run_list_load(paths, 1, NULL, &l);
    if (e) return send_error(c, s, 500, kiln_errmsg());
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    char title[300];
    snprintf(title, sizeof title, "%zu run%s in %s", l.n, l.n == 1 ? "" : "s", s->root);
    kiln_web_runs_begin(&b, title);
    /* What every run shares, as "key=value" words; the varied keys' names. */
    char *same = NULL;
    size_t same_len = 0;
    FILE *f = open_memstream(&same, &same_len);
    const char *key;
    json_t *v;
    if (f) {
        json_object_foreach(l.same, key, v) {
            char *t = kiln_run_config_value_text(v);
            fprintf(f, "%s=%s ", key, t ? t : "?");
            free(t);
        }
        fclose(f);
    }
    /* At most MAX_VARIED columns: a run with thousands of config keys of its own must not
     * make the sweep's page too large to show (KILN_WEB_PAGE_MAX). */
    size_t nv_all = json_array_size(l.varied), nv = nv_all < MAX_VARIED ? nv_all : MAX_VARIED;
    const char **varied = calloc(nv + 1, sizeof *varied);
    for (size_t k = 0; varied && k < nv; k++)
        varied[k] = json_string_value(json_array_get(l.varied, k));
    kiln_web_sweep_begin(&b, same, varied, varied ? nv : 0);
    char **vals = calloc(nv + 1, sizeof *vals);
    for (size_t i = 0; i < l.n && varied && vals; i++) {
        const kiln_run_row *r = &l.rows[i];
        for (size_t k = 0; k < nv; k++) {
            json_t *x = r->config ? json_object_get(r->config, varied[k]) : NULL;
            vals[k] = x ? kiln_run_config_value_text(x) : NULL;
        }
        kiln_web_run_row row = {.name = link_name(s, r),
                                .state = kiln_run_state_name(r->state),
                                .message = r->message,
                                .step = r->step,
                                .steps = r->steps,
                                .loss = r->loss,
                                .val_loss = r->val_loss,
                                .val_r2 = r->val_r2,
                                .val_step = r->val_step,
                                .spikes = r->spikes,
                                .nonfinite = r->nonfinite,
                                .varied = (const char *const *)vals};
        kiln_web_sweep_row(&b, &row, nv);
        for (size_t k = 0; k < nv; k++) {
            free(vals[k]);
            vals[k] = NULL;
        }
    }
    kiln_web_sweep_end(&b);
    if (nv < nv_all) {
        char more[128];
        snprintf(more, sizeof more, "%zu more config keys differ between the runs; kiln runs "
                 "list shows them", nv_all - nv);
        kiln_web_para(&b, more);
    }
    if (!varied || !vals) b.nomem = true;
    free(vals);
    free(varied);
    free(same);
    kiln_web_runs_end(&b, s->root, now_s());
    kiln_run_list_release(&l);
    return send_page(c, s, 200, &b);
}

/* ---- a run's marks: events and checkpoints ---- */

typedef struct marks {
    kiln_web_mark *m;
    size_t n;
    char **owned; /* texts and links made here */
    size_t n_owned;
} marks;

static void marks_release(marks *m) {
    for (size_t i = 0; i < m->n_owned; i++)
        free(m->owned[i]);
    free(m->owned);
    free(m->m);
    memset(m, 0, sizeof *m);
}

static char *own(marks *m, char *s) {
    if (s) m->owned[m->n_owned++] = s;
    return s;
}

static kiln_web_mark_kind kind_of(const char *k) {
    if (!strcmp(k, "spike")) return KILN_WEB_MARK_SPIKE;
    if (!strcmp(k, "nonfinite")) return KILN_WEB_MARK_NONFINITE;
    if (!strcmp(k, "resume")) return KILN_WEB_MARK_RESUME;
    if (!strcmp(k, "device_change") || !strcmp(k, "devices")) return KILN_WEB_MARK_DEVICE;
    return KILN_WEB_MARK_EVENT;
}

/* A page of the run linked as name: "/run?r=NAME", or with step >= 1
 * "/explain?r=NAME&step=N". Caller frees; NULL when out of memory. */
static char *run_href(const char *page, const char *name, long step) {
    char *q = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&q, &n);
    if (!f) return NULL;
    fprintf(f, "/%s?r=", page);
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            *p == '.' || *p == '_' || *p == '-' || *p == '~')
            fputc(*p, f);
        else
            fprintf(f, "%%%02X", *p);
    if (step >= 1) fprintf(f, "&step=%ld", step);
    if (fclose(f)) {
        free(q);
        return NULL;
    }
    return q;
}

static char *explain_href(const char *name, long step) {
    return run_href("explain", name, step);
}

/* Events worth a mark (spikes, non-finite steps, resumes, device changes, skipped
 * checkpoints; not the start, which is every run's), then the checkpoints, the best named;
 * room for one more, the best validation (page_run adds it from the curve). */
static bool marks_of(const kiln_run_info *ri, const char *name, marks *m) {
    size_t cap = ri->n_events + ri->n_ckpts + 2;
    m->m = calloc(cap, sizeof *m->m);
    m->owned = calloc(2 * cap, sizeof *m->owned);
    if (!m->m || !m->owned) return false;
    for (size_t i = 0; i < ri->n_events; i++) {
        const kiln_run_event *e = &ri->events[i];
        if (!strcmp(e->kind, "start") || !strcmp(e->kind, "buckets")) continue;
        kiln_web_mark_kind k = kind_of(e->kind);
        char *text = own(m, kiln_asprintf("%s at step %ld: %s", e->kind, e->step, e->message));
        char *href = k == KILN_WEB_MARK_SPIKE || k == KILN_WEB_MARK_NONFINITE
                         ? own(m, explain_href(name, e->step))
                         : NULL;
        if (!text) return false;
        m->m[m->n++] = (kiln_web_mark){(double)e->step, k, text, href};
    }
    for (size_t i = 0; i < ri->n_ckpts; i++) {
        bool best = ri->ckpts[i] == ri->best_ckpt;
        char *text = own(m, best ? kiln_asprintf("best checkpoint: step %ld (the lowest "
                                                 "validation loss of those on disk)",
                                                 ri->ckpts[i])
                                 : kiln_asprintf("checkpoint: step %ld", ri->ckpts[i]));
        if (!text) return false;
        m->m[m->n++] = (kiln_web_mark){(double)ri->ckpts[i],
                                       best ? KILN_WEB_MARK_BEST : KILN_WEB_MARK_CKPT, text, NULL};
    }
    return true;
}

/* ---- a run's page ---- */

/* Whether every finite value of the k series is 0 (and there is one). */
static bool all_zero(const kiln_web_series *s, size_t k) {
    bool any = false;
    for (size_t i = 0; i < k; i++)
        for (size_t j = 0; j < s[i].n; j++) {
            if (!isfinite(s[i].y[j])) continue;
            if (s[i].y[j] != 0) return false;
            any = true;
        }
    return any;
}

/* A chart of the named curves that the run has (a series each). One whose every value is 0
 * (no overflow, no dead expert) is folded into a line saying so: a flat chart is a screen of
 * nothing (issue 30). */
static void chart_of(kiln_web_buf *b, const kiln_run_curves *cv, const char *id, const char *title,
                     const char *const *names, size_t n, kiln_web_scale scale, const marks *m) {
    kiln_web_series s[16];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 16; i++) {
        const kiln_run_curve *c = kiln_run_curve_find(cv, names[i]);
        if (c) s[k++] = (kiln_web_series){c->name, c->x, c->y, c->n};
    }
    if (!k) return;
    if (all_zero(s, k)) {
        kiln_web_printf(b, "<p class=\"folded\" id=\"folded-");
        kiln_web_text(b, id);
        kiln_web_printf(b, "\">");
        kiln_web_text(b, title);
        kiln_web_printf(b, ": 0 at every step logged (chart folded)</p>\n");
        return;
    }
    kiln_web_chart ch = {.id = id,
                         .title = title,
                         .series = s,
                         .n_series = k,
                         .marks = m->m,
                         .n_marks = m->n,
                         .scale = scale,
                         .x_lo = (double)cv->first,
                         .x_hi = (double)cv->last};
    kiln_web_chart_svg(b, &ch);
}

/* A chart of one layer metric, a series per layer. */
static void layer_chart(kiln_web_buf *b, const kiln_run_curves *cv, const char *metric,
                        const char *title, const marks *m) {
    char names[16][64];
    const char *np[16];
    int L = cv->n_layers < 16 ? cv->n_layers : 16;
    for (int l = 0; l < L; l++) {
        snprintf(names[l], sizeof names[l], "%s@%d", metric, l);
        np[l] = names[l];
    }
    chart_of(b, cv, metric, title, np, (size_t)L, KILN_WEB_SCALE_LINEAR, m);
}

static void config_rows(kiln_web_buf *b, const char *prefix, const json_t *o) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)o, key, v) {
        char *k = prefix ? kiln_asprintf("%s.%s", prefix, key) : kiln_strdup(key);
        if (!k) {
            b->nomem = true;
            return;
        }
        if (json_is_object(v)) {
            config_rows(b, k, v);
        } else {
            char *t = kiln_run_config_value_text(v);
            if (!t) b->nomem = true;
            kiln_web_kv_row(b, k, t);
            free(t);
        }
        free(k);
    }
}

static enum MHD_Result page_run(struct MHD_Connection *c, const server *s, const char *name) {
    char *dir = run_path(s, name);
    if (!dir) return send_error(c, s, 404, "no such run here");
    kiln_run_info ri;
    kiln_err e = kiln_run_info_load_quick(dir, MAX_EVENTS, &ri);
    if (e) {
        free(dir);
        return send_error(c, s, e == KILN_ERR_NOTFOUND ? 404 : 500, kiln_errmsg());
    }
    bool live = false;
    if (kiln_run_live(dir, &live)) live = false;
    kiln_run_curves cv;
    bool have_curves = false;
    char curves_err[512] = "";
    e = kiln_run_curves_load_cached(s->cache, dir, CURVE_BUCKETS, 8, &cv);
    if (!e)
        have_curves = true;
    else
        snprintf(curves_err, sizeof curves_err, "%s", kiln_errmsg());
    marks m = {0};
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    if (!marks_of(&ri, name, &m)) b.nomem = true;
    const char *shown = display_name(s, name);
    kiln_web_runs_begin(&b, shown);

    /* What kiln runs show says first. */
    const json_t *cfg = json_object_get(ri.run, "config");
    kiln_web_kv_begin(&b, "Run");
    char t[512];
    kiln_web_kv_row(&b, "run id", json_string_value(json_object_get(ri.run, "run_id")));
    kiln_web_kv_row(&b, "created", json_string_value(json_object_get(ri.run, "created")));
    kiln_web_kv_row(&b, "dataset", json_string_value(json_object_get(ri.run, "dataset_path")));
    kiln_web_kv_row(&b, "dataset sha256",
                    json_string_value(json_object_get(ri.run, "dataset_sha256")));
    long steps = (long)json_integer_value(json_object_get(cfg, "steps"));
    kiln_run_state st = kiln_run_state_of(&ri, live);
    snprintf(t, sizeof t, "step %ld of %ld, %s%s%s", ri.last_step, steps, kiln_run_state_name(st),
             ri.stop_message ? ": " : "", ri.stop_message ? ri.stop_message : "");
    kiln_web_kv_row(&b, "progress", t);
    /* The best validation from the curve: each bucket keeps its minimum, so its least is the
     * run's (the scan kiln runs show makes for it would cost a read of every step). */
    const kiln_run_curve *vl = have_curves ? kiln_run_curve_find(&cv, "val_loss") : NULL;
    const kiln_run_curve *vr = have_curves ? kiln_run_curve_find(&cv, "val_r2") : NULL;
    size_t bi = (size_t)-1;
    for (size_t i = 0; vl && i < vl->n; i++)
        if (isfinite(vl->y[i]) && (bi == (size_t)-1 || vl->y[i] < vl->y[bi])) bi = i;
    if (bi != (size_t)-1) {
        double r2 = NAN;
        for (size_t i = 0; vr && i < vr->n; i++)
            if (vr->x[i] == vl->x[bi]) r2 = vr->y[i];
        int o2 = snprintf(t, sizeof t, "val_loss %.6g at step %.0f", vl->y[bi], vl->x[bi]);
        if (isfinite(r2) && o2 > 0) snprintf(t + o2, sizeof t - (size_t)o2, ", val_r2 %.4f", r2);
        kiln_web_kv_row(&b, "best validation", t);
        /* Marked and named on the charts beside the best checkpoint, which may be another
         * step (the best of those on disk): the header and the charts then agree (issue 30). */
        char *text =
            m.m && m.owned ? own(&m, kiln_asprintf("best validation: %s", t)) : NULL;
        if (text) m.m[m.n++] = (kiln_web_mark){vl->x[bi], KILN_WEB_MARK_BEST_VAL, text, NULL};
    }
    size_t o = 0;
    t[0] = 0;
    for (size_t i = 0; i < ri.n_ckpts && o < sizeof t - 40; i++)
        o += (size_t)snprintf(t + o, sizeof t - o, "%s%ld%s", i ? " " : "", ri.ckpts[i],
                              ri.ckpts[i] == ri.best_ckpt ? " (best)" : "");
    kiln_web_kv_row(&b, "checkpoints", ri.n_ckpts ? t : "none");
    snprintf(t, sizeof t, "%zu spikes, %zu non-finite steps, %zu events in all", ri.n_spikes,
             ri.n_nonfinite, ri.total_events);
    kiln_web_kv_row(&b, "events", t);
    kiln_web_kv_end(&b);

    if (!have_curves) {
        kiln_web_para(&b, curves_err);
    } else {
        static const char *const lossn[] = {"loss", "mse", "load_balance", "z"};
        static const char *const valn[] = {"val_loss"}, *const r2n[] = {"val_r2"};
        static const char *const lrn[] = {"lr"}, *const gnn[] = {"grad_norm"};
        kiln_web_section_begin(&b, "Training", NULL);
        /* The loss on an axis of its own: beside z (6-9) it was flattened at the bottom and
         * hidden under mse (issue 30). */
        chart_of(&b, &cv, "loss", "loss", lossn, 1, KILN_WEB_SCALE_AUTO, &m);
        chart_of(&b, &cv, "loss_terms", "loss terms (mse, load_balance, z)", lossn + 1, 3,
                 KILN_WEB_SCALE_AUTO, &m);
        chart_of(&b, &cv, "val_loss", "validation loss", valn, 1, KILN_WEB_SCALE_AUTO, &m);
        chart_of(&b, &cv, "val_r2", "validation R\xC2\xB2", r2n, 1, KILN_WEB_SCALE_LINEAR, &m);
        chart_of(&b, &cv, "lr", "learning rate", lrn, 1, KILN_WEB_SCALE_LINEAR, &m);
        chart_of(&b, &cv, "grad_norm", "gradient norm", gnn, 1, KILN_WEB_SCALE_AUTO, &m);
        kiln_web_section_end(&b);
        /* What a long run's sampled curves say (the layers' and tensors' own: a run before
           layer_sums, tensor_sums). */
        const char *sampled = cv.sampled ? "; read at 1000 evenly spaced steps and every spike's "
                                           "and non-finite step's"
                                         : "";
        if (cv.n_layers) {
            snprintf(t, sizeof t, "%d layers, a series each%s", cv.n_layers,
                     cv.layers_summed ? "" : sampled);
            kiln_web_section_begin(&b, "Layers", t);
            layer_chart(&b, &cv, "router_entropy", "router entropy", &m);
            layer_chart(&b, &cv, "load_imbalance", "load imbalance (max / mean expert load)", &m);
            layer_chart(&b, &cv, "dead_experts", "dead experts", &m);
            layer_chart(&b, &cv, "overflow", "overflow (tokens past capacity)", &m);
            layer_chart(&b, &cv, "attn_entropy", "attention entropy", &m);
            layer_chart(&b, &cv, "act_rms", "activation RMS", &m);
            kiln_web_section_end(&b);
        }
        if (cv.n_layers && cv.n_experts) {
            snprintf(t, sizeof t,
                     "expert x step; a cell is the largest share of tokens the expert took "
                     "there%s",
                     sampled);
            kiln_web_section_begin(&b, "Expert load", t);
            for (int l = 0; l < cv.n_layers && l < 16; l++) {
                kiln_web_series rows[64];
                char names[64][24];
                size_t k = 0;
                for (int x = 0; x < cv.n_experts && k < 64; x++) {
                    char nm[64];
                    snprintf(nm, sizeof nm, "expert_load@%d/%d", l, x);
                    const kiln_run_curve *cc = kiln_run_curve_find(&cv, nm);
                    if (!cc) continue;
                    snprintf(names[k], sizeof names[k], "expert %d", x);
                    rows[k] = (kiln_web_series){names[k], cc->x, cc->y, cc->n};
                    k++;
                }
                char id[32], title[64];
                snprintf(id, sizeof id, "expert_load-%d", l);
                snprintf(title, sizeof title, "expert load, layer %d", l);
                kiln_web_heatmap h = {.id = id,
                                      .title = title,
                                      .row_label = "expert",
                                      .rows = rows,
                                      .n_rows = k,
                                      .marks = m.m,
                                      .n_marks = m.n};
                kiln_web_heatmap_svg(&b, &h);
            }
            kiln_web_section_end(&b);
        }
        if (cv.n_movers) {
            const char *gn[8], *ur[8];
            char gbuf[8][300], ubuf[8][300];
            size_t k = cv.n_movers < 8 ? cv.n_movers : 8;
            for (size_t i = 0; i < k; i++) {
                snprintf(gbuf[i], sizeof gbuf[i], "grad_norm@%s", cv.movers[i]);
                snprintf(ubuf[i], sizeof ubuf[i], "update_ratio@%s", cv.movers[i]);
                gn[i] = gbuf[i];
                ur[i] = ubuf[i];
            }
            snprintf(t, sizeof t, "the tensors whose update/weight ratio rose highest%s",
                     cv.tensors_summed ? "" : sampled);
            kiln_web_section_begin(&b, "Tensors: the top movers", t);
            chart_of(&b, &cv, "tensor_update_ratio", "update / weight ratio", ur, k,
                     KILN_WEB_SCALE_AUTO, &m);
            chart_of(&b, &cv, "tensor_grad_norm", "gradient norm per tensor", gn, k,
                     KILN_WEB_SCALE_AUTO, &m);
            kiln_web_section_end(&b);
        }
    }

    /* The events, newest last, each spike and non-finite step linked to its explanation. */
    kiln_web_events_begin(&b);
    size_t from = ri.n_events > EVENT_ROWS ? ri.n_events - EVENT_ROWS : 0;
    for (size_t i = from; i < ri.n_events; i++) {
        const kiln_run_event *ev = &ri.events[i];
        kiln_web_mark_kind k = kind_of(ev->kind);
        char *href = k == KILN_WEB_MARK_SPIKE || k == KILN_WEB_MARK_NONFINITE
                         ? explain_href(name, ev->step)
                         : NULL;
        kiln_web_events_row(&b, ev->step, ev->kind, ev->message, href);
        free(href);
    }
    kiln_web_table_end(&b, "no events");

    kiln_web_kv_begin(&b, "Config");
    if (cfg) config_rows(&b, NULL, cfg);
    kiln_web_kv_end(&b);
    kiln_web_runs_end(&b, s->root, now_s());
    marks_release(&m);
    if (have_curves) kiln_run_curves_release(&cv);
    kiln_run_info_release(&ri);
    free(dir);
    return send_page(c, s, 200, &b);
}

/* ---- /overlay?run=A&run=B ---- */

typedef struct overlay_args {
    const char *names[MAX_OVERLAY];
    size_t n;
    bool too_many;
} overlay_args;

static enum MHD_Result collect_runs(void *cls, enum MHD_ValueKind kind, const char *key,
                                    const char *value) {
    overlay_args *a = cls;
    if (!strcmp(key, "run") && value) {
        if (a->n == MAX_OVERLAY)
            a->too_many = true;
        else
            a->names[a->n++] = value;
    }
    return MHD_YES;
}

/* The overlay's table of what differs: the config keys the n runs do not share (kiln runs
 * list's "varied", over those runs alone), a row per run linked to its page. Four overlaid
 * curves say little until one knows which lr each is (issue 30). */
static void differs(kiln_web_buf *b, const server *s, const overlay_args *a, size_t n) {
    char *dirs[MAX_OVERLAY];
    const char *paths[MAX_OVERLAY];
    size_t nd = 0;
    for (size_t i = 0; i < n; i++)
        if ((dirs[nd] = run_path(s, a->names[i]))) paths[nd] = dirs[nd], nd++;
    kiln_run_list l;
    bool have = nd == n && kiln_run_list_load(paths, nd, NULL, &l) == KILN_OK;
    if (!have) kiln_errclear();
    size_t nv = have ? json_array_size(l.varied) : 0;
    const char *keys[64], *vals[64];
    char *owned[64];
    if (nv > 64) nv = 64;
    for (size_t k = 0; k < nv; k++)
        keys[k] = json_string_value(json_array_get(l.varied, k));
    char *same = NULL;
    size_t same_len = 0;
    FILE *f = have ? open_memstream(&same, &same_len) : NULL;
    if (f) {
        const char *key;
        json_t *v;
        json_object_foreach(l.same, key, v) {
            char *t = kiln_run_config_value_text(v);
            fprintf(f, "%s=%s ", key, t ? t : "?");
            free(t);
        }
        fclose(f);
    }
    kiln_web_differs_begin(b, same, keys, nv);
    for (size_t i = 0; i < n; i++) {
        /* the row of run i (the list is sorted by its own key): the one of its directory */
        const json_t *cfg = NULL;
        for (size_t j = 0; have && nd == n && j < l.n && !cfg; j++)
            if (l.rows[j].dir && !strcmp(l.rows[j].dir, dirs[i])) cfg = l.rows[j].config;
        for (size_t k = 0; k < nv; k++) {
            const json_t *x = cfg ? json_object_get(cfg, keys[k]) : NULL;
            owned[k] = x ? kiln_run_config_value_text(x) : NULL;
            vals[k] = owned[k];
        }
        char *href = run_href("run", a->names[i], 0);
        kiln_web_differs_row(b, display_name(s, a->names[i]), href, vals, nv);
        free(href);
        for (size_t k = 0; k < nv; k++)
            free(owned[k]);
    }
    kiln_web_differs_end(b);
    free(same);
    if (have) kiln_run_list_release(&l);
    for (size_t i = 0; i < nd; i++)
        free(dirs[i]);
}

static enum MHD_Result page_overlay(struct MHD_Connection *c, const server *s) {
    overlay_args a = {0};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_runs, &a);
    if (!a.n) return send_error(c, s, 400, "tick one run or more to overlay them");
    if (a.too_many) return send_error(c, s, 400, "at most 10 runs overlaid at once");
    kiln_run_curves cv[MAX_OVERLAY];
    size_t n = 0;
    for (size_t i = 0; i < a.n; i++) {
        char *dir = run_path(s, a.names[i]);
        kiln_err e = dir ? kiln_run_curves_load(dir, CURVE_BUCKETS, 1, 0, &cv[n]) : KILN_ERR_NOTFOUND;
        free(dir);
        if (e) {
            char msg[600];
            snprintf(msg, sizeof msg, "run '%s': %s", a.names[i],
                     e == KILN_ERR_NOTFOUND && !dir ? "no such run here" : kiln_errmsg());
            for (size_t k = 0; k < n; k++)
                kiln_run_curves_release(&cv[k]);
            return send_error(c, s, 404, msg);
        }
        n++;
    }
    /* smooth=W: the moving average's weight (0 draws the curves as they are); 0.9 by default,
     * each curve then drawn faint beneath its average (issue 30: four noisy curves on each
     * other were unreadable). */
    double smooth = 0.9;
    const char *sa = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "smooth");
    if (sa) {
        char *end = NULL;
        smooth = strtod(sa, &end);
        if (!*sa || *end || !(smooth >= 0 && smooth < 1)) {
            for (size_t k = 0; k < n; k++)
                kiln_run_curves_release(&cv[k]);
            return send_error(c, s, 400, "smooth: a weight in [0, 1) (0: no smoothing)");
        }
    }
    /* log=1: the loss, validation loss and gradient norm on log axes; log=0: linear; absent:
     * log where the values span two decades (issue 30 asked for a log scale to choose). */
    const char *la = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "log");
    if (la && strcmp(la, "0") && strcmp(la, "1")) {
        for (size_t k = 0; k < n; k++)
            kiln_run_curves_release(&cv[k]);
        return send_error(c, s, 400, "log: 1 (log axes) or 0 (linear ones)");
    }
    const kiln_web_scale loss_scale = !la                ? KILN_WEB_SCALE_AUTO
                                      : !strcmp(la, "1") ? KILN_WEB_SCALE_LOG
                                                         : KILN_WEB_SCALE_LINEAR;
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    char title[64];
    snprintf(title, sizeof title, "%zu runs overlaid", n);
    kiln_web_runs_begin(&b, title);
    /* noisy: a value every step, smoothed; the validation's few points and the schedule's
     * exact ones are drawn as they are (a moving average of 20 points only lags) */
    static const struct {
        const char *metric, *title;
        kiln_web_scale scale;
        bool noisy;
    } charts[] = {{"loss", "loss", KILN_WEB_SCALE_AUTO, true},
                  {"val_loss", "validation loss", KILN_WEB_SCALE_AUTO, false},
                  {"val_r2", "validation R\xC2\xB2", KILN_WEB_SCALE_LINEAR, false},
                  {"lr", "learning rate", KILN_WEB_SCALE_LINEAR, false},
                  {"grad_norm", "gradient norm", KILN_WEB_SCALE_AUTO, true}};
    long first = cv[0].first, last = cv[0].last;
    for (size_t i = 1; i < n; i++) {
        if (cv[i].first < first) first = cv[i].first;
        if (cv[i].last > last) last = cv[i].last;
    }
    char note[256];
    if (smooth > 0)
        snprintf(note, sizeof note,
                 "loss and gradient norm smoothed (a moving average of weight %g, as TensorBoard "
                 "smooths), the raw curve faint beneath; smooth=0 in the address draws them raw",
                 smooth);
    kiln_web_section_begin(&b, "Runs on the same axes", smooth > 0 ? note : NULL);
    for (size_t k = 0; k < KILN_ARRAY_LEN(charts); k++) {
        kiln_web_series ser[MAX_OVERLAY];
        size_t ns = 0;
        for (size_t i = 0; i < n; i++) {
            const kiln_run_curve *cc = kiln_run_curve_find(&cv[i], charts[k].metric);
            if (cc) ser[ns++] = (kiln_web_series){display_name(s, a.names[i]), cc->x, cc->y, cc->n};
        }
        kiln_web_chart ch = {.id = charts[k].metric,
                             .title = charts[k].title,
                             .series = ser,
                             .n_series = ns,
                             .scale = charts[k].scale == KILN_WEB_SCALE_AUTO ? loss_scale
                                                                              : charts[k].scale,
                             /* full width, one a row (issue 30: four noisy runs side by
                              * side in 720 pixels were unreadable); svg.chart shrinks to a
                              * narrower window (web/page.c) */
                             .width = 1200,
                             .height = 300,
                             .x_lo = (double)first,
                             .x_hi = (double)last,
                             .smooth = charts[k].noisy ? smooth : 0,
                             .hover_cols = 48};
        kiln_web_chart_svg(&b, &ch);
    }
    kiln_web_section_end(&b);
    differs(&b, s, &a, n);
    kiln_web_runs_end(&b, s->root, now_s());
    for (size_t i = 0; i < n; i++)
        kiln_run_curves_release(&cv[i]);
    return send_page(c, s, 200, &b);
}

/* ---- /explain?r=NAME&step=N ---- */

static void fmt_num(const json_t *v, char out[32]) {
    if (json_is_number(v))
        snprintf(out, 32, "%.6g", json_number_value(v));
    else
        snprintf(out, 32, "-");
}

/* A ratio as kiln runs explain prints it: "174.8". */
static void fmt_ratio(const json_t *v, char out[32]) {
    if (json_is_number(v))
        snprintf(out, 32, "%.4g", json_number_value(v));
    else
        snprintf(out, 32, "-");
}

static enum MHD_Result page_explain(struct MHD_Connection *c, const server *s, const char *name,
                                    const char *step_arg) {
    char *end = NULL;
    long step = step_arg ? strtol(step_arg, &end, 10) : 0;
    if (!step_arg || !*step_arg || *end || step < 1)
        return send_error(c, s, 400, "step: a step number from 1");
    char *dir = run_path(s, name);
    if (!dir) return send_error(c, s, 404, "no such run here");
    json_t *d = NULL;
    kiln_err e = kiln_run_explain(dir, step, 0, &d);
    free(dir);
    if (e) return send_error(c, s, e == KILN_ERR_USAGE || e == KILN_ERR_NOTFOUND ? 404 : 500,
                             kiln_errmsg());
    kiln_web_buf b = {.limit = KILN_WEB_PAGE_MAX};
    char title[300];
    snprintf(title, sizeof title, "%s, step %ld: why", display_name(s, name), step);
    kiln_web_runs_begin(&b, title);
    char *back = run_href("run", name, 0);
    if (back) kiln_web_link(&b, back, "back to the run");
    free(back);
    kiln_web_kv_begin(&b, "Findings");
    size_t i;
    json_t *f;
    json_array_foreach(json_object_get(d, "findings"), i, f)
        kiln_web_kv_row(&b, json_string_value(json_object_get(f, "kind")),
                        json_string_value(json_object_get(f, "text")));
    if (!json_array_size(json_object_get(d, "findings")))
        kiln_web_kv_row(&b, "-", "nothing stands out against the steps before");
    kiln_web_kv_end(&b);
    kiln_web_kv_begin(&b, "The step against the median of the steps before");
    const char *key;
    json_t *v;
    json_object_foreach(json_object_get(d, "step_metrics"), key, v) {
        char a[32], m[32], r[32], line[128];
        fmt_num(json_object_get(v, "value"), a);
        fmt_num(json_object_get(v, "median"), m);
        fmt_ratio(json_object_get(v, "ratio"), r);
        snprintf(line, sizeof line, "%s (median %s, %sx)", a, m, r);
        kiln_web_kv_row(&b, key, line);
    }
    kiln_web_kv_end(&b);
    kiln_web_kv_begin(&b, "Tensors, the most changed first");
    json_array_foreach(json_object_get(d, "tensors"), i, v) {
        if (i >= 12) break;
        char a[32], m[32], r[32], line[128];
        fmt_num(json_object_get(v, "value"), a);
        fmt_num(json_object_get(v, "median"), m);
        fmt_ratio(json_object_get(v, "ratio"), r);
        snprintf(line, sizeof line, "gradient norm %s (median %s, %sx)", a, m, r);
        kiln_web_kv_row(&b, json_string_value(json_object_get(v, "name")), line);
    }
    kiln_web_kv_end(&b);
    kiln_web_kv_begin(&b, "Events at this step");
    json_array_foreach(json_object_get(d, "events"), i, v) {
        kiln_web_kv_row(&b, json_string_value(json_object_get(v, "kind")),
                        json_string_value(json_object_get(v, "message")));
    }
    kiln_web_kv_end(&b);
    kiln_web_runs_end(&b, s->root, now_s());
    json_decref(d);
    return send_page(c, s, 200, &b);
}

/* ---- the server ---- */

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url,
                               const char *method, const char *version, const char *upload,
                               size_t *upload_size, void **state) {
    const server *s = cls;
    if (!*state) { /* the first call: headers only */
        *state = (void *)1;
        return MHD_YES;
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD"))
        return send_error(c, s, 405, "kiln runs serve reads only: GET or HEAD");
    if (*upload_size) return send_error(c, s, 400, "no request body expected");
    const char *r = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "r");
    if (!strcmp(url, "/")) return s->single ? page_run(c, s, ".") : page_sweep(c, s);
    if (!strcmp(url, "/run")) return page_run(c, s, r);
    if (!strcmp(url, "/overlay")) return page_overlay(c, s);
    if (!strcmp(url, "/explain"))
        return page_explain(c, s, r, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "step"));
    return send_error(c, s, 404, "no such page");
}

int cmd_runs_serve(int argc, char **argv) {
    const char *listen = NULL;
    const cli_opt opts[] = {
        {"listen", CLI_STR, &listen, "HOST:PORT",
         "address to listen on (default 127.0.0.1:0: a free port, printed)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs serve [--listen HOST:PORT] DIR",
        "Serve a read-only web page of a sweep of runs or one run: the runs as kiln runs list "
        "has them, each run's curves, events and checkpoints, runs overlaid; reload for new "
        "steps.",
        opts, 1, 1};
    const char *dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &dir, &rc)) return rc;
    if (!listen) listen = "127.0.0.1:0";
    /* The registry's rule (web/httpd.c), checked before the directory is read. */
    struct sockaddr_storage ss;
    bool v6 = false;
    kiln_err e = kiln_web_listen_parse(listen, &ss, &v6);
    if (e) return cli_usage_error("--listen: %s", kiln_errmsg());
    /* The directory must hold runs now: a typo is said at once, not as an empty page. */
    kiln_run_list l;
    const char *paths[1] = {dir};
    e = kiln_run_list_load(paths, 1, NULL, &l);
    if (e) return cli_fail(e);
    char *root = kiln_strdup(dir);
    if (!root) {
        kiln_run_list_release(&l);
        return cli_fail(kiln_fail(KILN_ERR_NOMEM, "out of memory"));
    }
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/')
        root[--rl] = 0;
    server s = {root, NULL, false};
    s.single = l.n == 1 && !strcmp(link_name(&s, &l.rows[0]), ".");
    kiln_run_list_release(&l);
    e = kiln_run_cache_create(&s.cache);
    if (e) {
        free(root);
        return cli_fail(e);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* The registry's daemon (web/httpd.c): the same threads, per-address connection limit and
     * header and idle timeouts, so that one address holding connections half-open cannot
     * lock every other client out. */
    kiln_web_http_opts ho = {.listen = listen, .handler = handler, .handler_cls = &s,
                             .what = "kiln runs serve"};
    kiln_web_http *http = NULL;
    e = kiln_web_http_start(&ho, &http);
    if (e) {
        free(root);
        kiln_run_cache_free(s.cache);
        return cli_fail(e);
    }
    unsigned port = kiln_web_http_port(http);
    const char *colon = strrchr(listen, ':');
    printf("kiln runs: serving '%s' on http://%.*s:%u/\n", root, (int)(colon - listen), listen,
           port);
    fflush(stdout);
    int sig = 0;
    sigwait(&set, &sig);
    kiln_web_http_stop(http);
    kiln_run_cache_free(s.cache);
    free(root);
    return 0;
}
