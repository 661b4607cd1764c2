/* run_page.c - a run's page of kiln runs serve, composed from the plain values of a
 * kiln_web_run_view (cli/runs_views.c reads the run and hands them): the run's summary,
 * its charts with the events and checkpoints marked, the expert load, the top movers, the
 * events and the config. Every string goes out through kiln_web_text (runs_pages.c's tables,
 * chart.c's charts). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "web.h"
#include "web_int.h"

/* ---- the marks: events and checkpoints ---- */

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

/* A spike's and a non-finite step's explanation (caller frees), else NULL. */
static char *explain_href(const char *name, const kiln_web_event *e) {
    kiln_web_mark_kind k = kind_of(e->kind);
    if (k != KILN_WEB_MARK_SPIKE && k != KILN_WEB_MARK_NONFINITE) return NULL;
    return kiln_web_run_href("explain", name, e->step);
}

/* Events worth a mark (spikes, non-finite steps, resumes, device changes, skipped
 * checkpoints; not the start, which is every run's), then the checkpoints, the best named;
 * room for one more, the best validation (best_validation adds it from the curve). */
static bool marks_of(const kiln_web_run_view *r, marks *m) {
    size_t cap = r->n_events + r->n_ckpts + 2;
    m->m = calloc(cap, sizeof *m->m);
    m->owned = calloc(2 * cap, sizeof *m->owned);
    if (!m->m || !m->owned) return false;
    for (size_t i = 0; i < r->n_events; i++) {
        const kiln_web_event *e = &r->events[i];
        if (!strcmp(e->kind, "start") || !strcmp(e->kind, "buckets")) continue;
        char *text = own(m, kiln_asprintf("%s at step %ld: %s", e->kind, e->step, e->message));
        char *href = own(m, explain_href(r->name, e));
        if (!text) return false;
        m->m[m->n++] = (kiln_web_mark){(double)e->step, kind_of(e->kind), text, href};
    }
    for (size_t i = 0; i < r->n_ckpts; i++) {
        bool best = r->ckpts[i] == r->best_ckpt;
        char *text = own(m, best ? kiln_asprintf("best checkpoint: step %ld (the lowest "
                                                 "validation loss of those on disk)",
                                                 r->ckpts[i])
                                 : kiln_asprintf("checkpoint: step %ld", r->ckpts[i]));
        if (!text) return false;
        m->m[m->n++] = (kiln_web_mark){(double)r->ckpts[i],
                                       best ? KILN_WEB_MARK_BEST : KILN_WEB_MARK_CKPT, text, NULL};
    }
    return true;
}

/* ---- the charts ---- */

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
static void chart_of(kiln_web_buf *b, const kiln_web_run_view *r, const char *id, const char *title,
                     const char *const *names, size_t n, kiln_web_scale scale, const marks *m) {
    kiln_web_series s[16];
    size_t k = 0;
    for (size_t i = 0; i < n && k < 16; i++) {
        const kiln_web_series *c = kiln_web_series_find(r->curves, r->n_curves, names[i]);
        if (c) s[k++] = *c;
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
                         .x_lo = (double)r->first,
                         .x_hi = (double)r->last};
    kiln_web_chart_svg(b, &ch);
}

/* A chart of one layer metric, a series per layer. */
static void layer_chart(kiln_web_buf *b, const kiln_web_run_view *r, const char *metric,
                        const char *title, const marks *m) {
    char names[16][64];
    const char *np[16];
    int L = r->n_layers < 16 ? r->n_layers : 16;
    for (int l = 0; l < L; l++) {
        snprintf(names[l], sizeof names[l], "%s@%d", metric, l);
        np[l] = names[l];
    }
    chart_of(b, r, metric, title, np, (size_t)L, KILN_WEB_SCALE_LINEAR, m);
}

/* ---- the page ---- */

/* The best validation from the curve: each bucket keeps its minimum, so its least is the
 * run's (the scan kiln runs show makes for it would cost a read of every step). Its row, and
 * its mark beside the best checkpoint, which may be another step (the best of those on
 * disk): the header and the charts then agree (issue 30). */
static void best_validation(kiln_web_buf *b, const kiln_web_run_view *r, marks *m) {
    const kiln_web_series *vl = kiln_web_series_find(r->curves, r->n_curves, "val_loss");
    const kiln_web_series *vr = kiln_web_series_find(r->curves, r->n_curves, "val_r2");
    size_t bi = (size_t)-1;
    for (size_t i = 0; vl && i < vl->n; i++)
        if (isfinite(vl->y[i]) && (bi == (size_t)-1 || vl->y[i] < vl->y[bi])) bi = i;
    if (bi == (size_t)-1) return;
    double r2 = NAN;
    for (size_t i = 0; vr && i < vr->n; i++)
        if (vr->x[i] == vl->x[bi]) r2 = vr->y[i];
    char t[512];
    int o2 = snprintf(t, sizeof t, "val_loss %.6g at step %.0f", vl->y[bi], vl->x[bi]);
    if (isfinite(r2) && o2 > 0) snprintf(t + o2, sizeof t - (size_t)o2, ", val_r2 %.4f", r2);
    kiln_web_kv_row(b, "best validation", t);
    char *text = m->m && m->owned ? own(m, kiln_asprintf("best validation: %s", t)) : NULL;
    if (text) m->m[m->n++] = (kiln_web_mark){vl->x[bi], KILN_WEB_MARK_BEST_VAL, text, NULL};
}

/* What kiln runs show says first. */
static void summary(kiln_web_buf *b, const kiln_web_run_view *r, marks *m) {
    kiln_web_kv_begin(b, "Run");
    char t[512];
    kiln_web_kv_row(b, "run id", r->run_id);
    kiln_web_kv_row(b, "created", r->created);
    kiln_web_kv_row(b, "dataset", r->dataset);
    kiln_web_kv_row(b, "dataset sha256", r->dataset_sha256);
    snprintf(t, sizeof t, "step %ld of %ld, %s%s%s", r->step, r->steps, r->state,
             r->stop_message ? ": " : "", r->stop_message ? r->stop_message : "");
    kiln_web_kv_row(b, "progress", t);
    best_validation(b, r, m);
    size_t o = 0;
    t[0] = 0;
    for (size_t i = 0; i < r->n_ckpts && o < sizeof t - 40; i++)
        o += (size_t)snprintf(t + o, sizeof t - o, "%s%ld%s", i ? " " : "", r->ckpts[i],
                              r->ckpts[i] == r->best_ckpt ? " (best)" : "");
    kiln_web_kv_row(b, "checkpoints", r->n_ckpts ? t : "none");
    snprintf(t, sizeof t, "%zu spikes, %zu non-finite steps, %zu events in all", r->n_spikes,
             r->n_nonfinite, r->total_events);
    kiln_web_kv_row(b, "events", t);
    kiln_web_kv_end(b);
}

static void training(kiln_web_buf *b, const kiln_web_run_view *r, const marks *m) {
    static const char *const lossn[] = {"loss", "mse", "load_balance", "z"};
    static const char *const valn[] = {"val_loss"}, *const r2n[] = {"val_r2"};
    static const char *const lrn[] = {"lr"}, *const gnn[] = {"grad_norm"};
    kiln_web_section_begin(b, "Training", NULL);
    /* The loss on an axis of its own: beside z (6-9) it was flattened at the bottom and
     * hidden under mse (issue 30). */
    chart_of(b, r, "loss", "loss", lossn, 1, KILN_WEB_SCALE_AUTO, m);
    chart_of(b, r, "loss_terms", "loss terms (mse, load_balance, z)", lossn + 1, 3,
             KILN_WEB_SCALE_AUTO, m);
    chart_of(b, r, "val_loss", "validation loss", valn, 1, KILN_WEB_SCALE_AUTO, m);
    chart_of(b, r, "val_r2", "validation R\xC2\xB2", r2n, 1, KILN_WEB_SCALE_LINEAR, m);
    chart_of(b, r, "lr", "learning rate", lrn, 1, KILN_WEB_SCALE_LINEAR, m);
    chart_of(b, r, "grad_norm", "gradient norm", gnn, 1, KILN_WEB_SCALE_AUTO, m);
    kiln_web_section_end(b);
}

/* What a long run's sampled curves say (the layers' and tensors' own: a run before
 * layer_sums, tensor_sums). */
static const char *sampled_note(const kiln_web_run_view *r) {
    return r->sampled ? "; read at 1000 evenly spaced steps and every spike's and non-finite "
                        "step's"
                      : "";
}

static void layers(kiln_web_buf *b, const kiln_web_run_view *r, const marks *m) {
    char t[512];
    snprintf(t, sizeof t, "%d layers, a series each%s", r->n_layers,
             r->layers_summed ? "" : sampled_note(r));
    kiln_web_section_begin(b, "Layers", t);
    layer_chart(b, r, "router_entropy", "router entropy", m);
    layer_chart(b, r, "load_imbalance", "load imbalance (max / mean expert load)", m);
    layer_chart(b, r, "dead_experts", "dead experts", m);
    layer_chart(b, r, "overflow", "overflow (tokens past capacity)", m);
    layer_chart(b, r, "attn_entropy", "attention entropy", m);
    layer_chart(b, r, "act_rms", "activation RMS", m);
    kiln_web_section_end(b);
}

/* A heat map of layer l's experts. */
static void expert_load(kiln_web_buf *b, const kiln_web_run_view *r, int l, const marks *m) {
    kiln_web_series rows[64];
    char names[64][24];
    size_t k = 0;
    for (int x = 0; x < r->n_experts && k < 64; x++) {
        char nm[64];
        snprintf(nm, sizeof nm, "expert_load@%d/%d", l, x);
        const kiln_web_series *cc = kiln_web_series_find(r->curves, r->n_curves, nm);
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
                          .marks = m->m,
                          .n_marks = m->n};
    kiln_web_heatmap_svg(b, &h);
}

static void experts(kiln_web_buf *b, const kiln_web_run_view *r, const marks *m) {
    char t[512];
    snprintf(t, sizeof t,
             "expert x step; a cell is the largest share of tokens the expert took there%s",
             sampled_note(r));
    kiln_web_section_begin(b, "Expert load", t);
    for (int l = 0; l < r->n_layers && l < 16; l++)
        expert_load(b, r, l, m);
    kiln_web_section_end(b);
}

static void movers(kiln_web_buf *b, const kiln_web_run_view *r, const marks *m) {
    const char *gn[8], *ur[8];
    char gbuf[8][300], ubuf[8][300], t[512];
    size_t k = r->n_movers < 8 ? r->n_movers : 8;
    for (size_t i = 0; i < k; i++) {
        snprintf(gbuf[i], sizeof gbuf[i], "grad_norm@%s", r->movers[i]);
        snprintf(ubuf[i], sizeof ubuf[i], "update_ratio@%s", r->movers[i]);
        gn[i] = gbuf[i];
        ur[i] = ubuf[i];
    }
    snprintf(t, sizeof t, "the tensors whose update/weight ratio rose highest%s",
             r->tensors_summed ? "" : sampled_note(r));
    kiln_web_section_begin(b, "Tensors: the top movers", t);
    chart_of(b, r, "tensor_update_ratio", "update / weight ratio", ur, k, KILN_WEB_SCALE_AUTO, m);
    chart_of(b, r, "tensor_grad_norm", "gradient norm per tensor", gn, k, KILN_WEB_SCALE_AUTO, m);
    kiln_web_section_end(b);
}

/* The events, newest last, each spike and non-finite step linked to its explanation. */
static void events(kiln_web_buf *b, const kiln_web_run_view *r) {
    kiln_web_events_begin(b);
    size_t from = r->n_events > KILN_WEB_EVENT_ROWS ? r->n_events - KILN_WEB_EVENT_ROWS : 0;
    for (size_t i = from; i < r->n_events; i++) {
        const kiln_web_event *ev = &r->events[i];
        char *href = explain_href(r->name, ev);
        kiln_web_events_row(b, ev->step, ev->kind, ev->message, href);
        free(href);
    }
    kiln_web_table_end(b, "no events");
}

void kiln_web_run_page(kiln_web_buf *b, const kiln_web_run_view *r, const char *root, double now) {
    marks m = {0};
    if (!marks_of(r, &m)) b->nomem = true;
    kiln_web_runs_begin(b, r->title);
    summary(b, r, &m);
    if (r->curves_error) {
        kiln_web_para(b, r->curves_error);
    } else {
        training(b, r, &m);
        if (r->n_layers) layers(b, r, &m);
        if (r->n_layers && r->n_experts) experts(b, r, &m);
        if (r->n_movers) movers(b, r, &m);
    }
    events(b, r);
    kiln_web_kv_begin(b, "Config");
    for (size_t i = 0; i < r->n_config; i++)
        kiln_web_kv_row(b, r->config[i].key, r->config[i].value);
    kiln_web_kv_end(b);
    kiln_web_runs_end(b, root, now);
    marks_release(&m);
}
