/* version.c - a registry version's page below its row: the validation report check by check
 * (as kiln provenance prints it) with a link to the baseline it was measured against, and
 * the run summary the archive carries (run_summary.json) drawn with the charts of
 * kiln runs serve. Both documents came from an uploaded archive: every value is checked for
 * its type before use, every string escaped, and sizes are bounded. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "web.h"
#include "web_int.h"

#define lit(b, s) kiln_web_raw((b), "" s, sizeof(s) - 1)

static const char *str(const json_t *o, const char *k) {
    return json_string_value(json_object_get(o, k));
}

/* ---- the validation report ---- */

void kiln_web_validation_report(kiln_web_buf *b, const json_t *r) {
    lit(b, "<h2>Validation</h2>\n");
    if (!json_is_object(r)) {
        lit(b, "<p class=\"no-validation\">no validation report: the version was published "
               "unvalidated</p>\n");
        return;
    }
    const json_t *passed = json_object_get(r, "passed");
    lit(b, "<p>verdict <span class=\"tag ");
    if (json_is_true(passed))
        lit(b, "ok\">passed");
    else if (json_is_false(passed))
        lit(b, "bad\">failed");
    else
        lit(b, "warn\">unknown");
    lit(b, "</span>");
    if (str(r, "kiln_version")) {
        lit(b, " <small>by kiln ");
        kiln_web_text(b, str(r, "kiln_version"));
        lit(b, "</small>");
    }
    lit(b, "</p>\n");
    /* The baseline: a link to its own page when it is named. */
    const json_t *base = json_object_get(r, "baseline");
    lit(b, "<p class=\"baseline\">baseline ");
    if (json_is_object(base) && str(base, "name") && str(base, "version")) {
        lit(b, "<a class=\"baseline\" href=\"/ui/models/");
        kiln_web_pct(b, str(base, "name"), "+"); /* a path segment */
        lit(b, "/versions/");
        kiln_web_pct(b, str(base, "version"), "+");
        lit(b, "\">");
        kiln_web_text(b, str(base, "name"));
        lit(b, " ");
        kiln_web_text(b, str(base, "version"));
        lit(b, "</a>");
        if (str(base, "channel")) {
            lit(b, " <small>pulled through ");
            kiln_web_text(b, str(base, "channel"));
            const json_t *seq = json_object_get(base, "seq");
            if (json_is_integer(seq)) kiln_web_printf(b, " (seq %lld)", (long long)json_integer_value(seq));
            lit(b, "</small>");
        }
        if (str(base, "digest")) {
            lit(b, " <code>");
            kiln_web_text(b, str(base, "digest"));
            lit(b, "</code>");
        }
    } else if (base && !json_is_null(base)) {
        lit(b, "<small>named without a name and version</small>");
    } else {
        lit(b, "<small>none: validated without --baseline</small>");
    }
    lit(b, "</p>\n<table class=\"checks\">\n<thead><tr><th>check</th><th>status</th><th>why</th>"
           "</tr></thead>\n<tbody>\n");
    const char *name;
    const json_t *c;
    size_t k = 0;
    json_object_foreach((json_t *)json_object_get(r, "checks"), name, c) {
        if (k++ == 64) break;
        const char *st = str(c, "status");
        lit(b, "<tr class=\"check\"><td><code>");
        kiln_web_text(b, name);
        lit(b, "</code></td><td><span class=\"tag");
        if (st && !strcmp(st, "passed")) lit(b, " ok");
        if (st && !strcmp(st, "failed")) lit(b, " bad");
        lit(b, "\">");
        kiln_web_text(b, st ? st : "?");
        lit(b, "</span></td><td>");
        kiln_web_text(b, str(c, "reason"));
        if (str(c, "note")) {
            lit(b, " <small>");
            kiln_web_text(b, str(c, "note"));
            lit(b, "</small>");
        }
        const json_t *f = json_object_get(c, "figures");
        const json_t *mr = json_object_get(f, "max_rel_err");
        if (json_is_number(mr)) kiln_web_printf(b, " <small>max rel err %.3g</small>", json_number_value(mr));
        lit(b, "</td></tr>\n");
    }
    lit(b, "</tbody>\n</table>\n");
}

/* ---- the run summary ---- */

#define MAX_POINTS 5000

typedef struct curve {
    const char *name;
    double *x, *y;
    size_t n;
} curve;

/* The summary's series, each checked: "step" integers and "value" numbers or nulls of one
 * length, at most MAX_POINTS. A malformed one is left out. */
static curve *curves_of(const json_t *series, size_t *n) {
    *n = 0;
    size_t cap = json_object_size(series);
    if (!cap || cap > 4096) return NULL;
    curve *c = kiln_calloc(cap, sizeof *c);
    if (!c) return NULL;
    const char *name;
    const json_t *s;
    json_object_foreach((json_t *)series, name, s) {
        const json_t *xs = json_object_get(s, "step"), *ys = json_object_get(s, "value");
        size_t m = json_array_size(xs);
        if (!json_is_array(xs) || !json_is_array(ys) || json_array_size(ys) != m || !m ||
            m > MAX_POINTS)
            continue;
        double *x = kiln_malloc(m * sizeof *x), *y = kiln_malloc(m * sizeof *y);
        bool ok = x && y;
        for (size_t i = 0; ok && i < m; i++) {
            const json_t *xv = json_array_get(xs, i), *yv = json_array_get(ys, i);
            ok = json_is_integer(xv) && (json_is_number(yv) || json_is_null(yv)) &&
                 (!i || (double)json_integer_value(xv) >= x[i - 1]);
            if (ok) {
                x[i] = (double)json_integer_value(xv);
                y[i] = json_is_null(yv) ? NAN : json_number_value(yv);
            }
        }
        if (!ok) {
            free(x);
            free(y);
            continue;
        }
        c[(*n)++] = (curve){name, x, y, m};
    }
    return c;
}

static const curve *find(const curve *c, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(c[i].name, name)) return &c[i];
    return NULL;
}

static void chart(kiln_web_buf *b, const curve *c, size_t n, const char *id, const char *title,
                  const char *const *names, size_t k, kiln_web_scale scale,
                  const kiln_web_mark *m, size_t nm, double lo, double hi) {
    kiln_web_series s[16];
    size_t ns = 0;
    for (size_t i = 0; i < k && ns < 16; i++) {
        const curve *cv = find(c, n, names[i]);
        if (cv) s[ns++] = (kiln_web_series){cv->name, cv->x, cv->y, cv->n};
    }
    if (!ns) return;
    kiln_web_chart ch = {.id = id, .title = title, .series = s, .n_series = ns, .marks = m,
                         .n_marks = nm, .scale = scale, .x_lo = lo, .x_hi = hi};
    kiln_web_chart_svg(b, &ch);
}

static kiln_web_mark_kind mark_kind(const char *k) {
    if (!k) return KILN_WEB_MARK_EVENT;
    if (!strcmp(k, "spike")) return KILN_WEB_MARK_SPIKE;
    if (!strcmp(k, "nonfinite")) return KILN_WEB_MARK_NONFINITE;
    if (!strcmp(k, "resume")) return KILN_WEB_MARK_RESUME;
    if (!strcmp(k, "device_change")) return KILN_WEB_MARK_DEVICE;
    return KILN_WEB_MARK_EVENT;
}

void kiln_web_run_summary(kiln_web_buf *b, const json_t *s) {
    lit(b, "<h2>Training</h2>\n");
    size_t n = 0;
    curve *c = json_is_object(s) ? curves_of(json_object_get(s, "series"), &n) : NULL;
    if (!n) {
        lit(b, "<p class=\"no-summary\">no run summary: the archive carries no "
               "run_summary.json (exported before kiln wrote one, or from a run without "
               "metrics)</p>\n");
        free(c);
        return;
    }
    const json_t *step = json_object_get(s, "step");
    lit(b, "<p class=\"summary\"><small>run ");
    kiln_web_text(b, str(s, "run_id"));
    if (json_is_integer(step))
        kiln_web_printf(b, ", exported at step %lld", (long long)json_integer_value(step));
    lit(b, "; from run_summary.json, signed with the archive (at most 1000 points a curve, "
           "each bucket's extremes kept)</small></p>\n");
    /* The marks: the run's events, and the step the model was exported from. */
    const json_t *ev = json_object_get(s, "events");
    size_t ne = json_array_size(ev) < 1000 ? json_array_size(ev) : 1000;
    kiln_web_mark *m = kiln_calloc(ne + 1, sizeof *m);
    char **texts = kiln_calloc(ne + 2, sizeof *texts);
    size_t nm = 0;
    if (!m || !texts) {
        b->nomem = true;
        ne = 0;
    }
    for (size_t i = 0; i < ne; i++) {
        const json_t *e = json_array_get(ev, i);
        const json_t *es = json_object_get(e, "step");
        if (!json_is_integer(es)) continue;
        texts[nm] = kiln_asprintf("%s at step %lld: %s", str(e, "kind") ? str(e, "kind") : "?",
                                  (long long)json_integer_value(es),
                                  str(e, "message") ? str(e, "message") : "");
        if (!texts[nm]) continue;
        m[nm] = (kiln_web_mark){(double)json_integer_value(es), mark_kind(str(e, "kind")),
                                texts[nm], NULL};
        nm++;
    }
    if (m && texts && json_is_integer(step)) {
        texts[nm] = kiln_asprintf("exported checkpoint: step %lld (this version's weights)",
                                  (long long)json_integer_value(step));
        if (texts[nm]) {
            m[nm] = (kiln_web_mark){(double)json_integer_value(step), KILN_WEB_MARK_EXPORTED,
                                    texts[nm], NULL};
            nm++;
        }
    }
    const json_t *first = json_object_get(s, "first"), *last = json_object_get(s, "last");
    double lo = json_is_integer(first) ? (double)json_integer_value(first) : 0,
           hi = json_is_integer(last) ? (double)json_integer_value(last) : 0;
    if (!(hi > lo)) lo = hi = 0;
    static const char *const lossn[] = {"loss", "mse", "load_balance", "z"};
    static const char *const valn[] = {"val_loss"}, *const r2n[] = {"val_r2"};
    static const char *const lrn[] = {"lr"}, *const gnn[] = {"grad_norm"};
    lit(b, "<div class=\"charts\">\n");
    /* The loss on an axis of its own, its terms beside it (issue 30). */
    chart(b, c, n, "loss", "loss", lossn, 1, KILN_WEB_SCALE_AUTO, m, nm, lo, hi);
    chart(b, c, n, "loss_terms", "loss terms (mse, load_balance, z)", lossn + 1, 3,
          KILN_WEB_SCALE_AUTO, m, nm, lo, hi);
    chart(b, c, n, "val_loss", "validation loss", valn, 1, KILN_WEB_SCALE_AUTO, m, nm, lo, hi);
    chart(b, c, n, "val_r2", "validation R\xC2\xB2", r2n, 1, KILN_WEB_SCALE_LINEAR, m, nm, lo, hi);
    chart(b, c, n, "lr", "learning rate", lrn, 1, KILN_WEB_SCALE_LINEAR, m, nm, lo, hi);
    chart(b, c, n, "grad_norm", "gradient norm", gnn, 1, KILN_WEB_SCALE_AUTO, m, nm, lo, hi);
    /* Per layer: a series per layer of each diagnostic. */
    const json_t *nl = json_object_get(s, "n_layers");
    int L = json_is_integer(nl) && json_integer_value(nl) > 0 && json_integer_value(nl) <= 16
                ? (int)json_integer_value(nl)
                : 0;
    static const struct {
        const char *metric, *title;
    } lay[] = {{"router_entropy", "router entropy"}, {"load_imbalance", "load imbalance"},
               {"dead_experts", "dead experts"},     {"overflow", "overflow"},
               {"attn_entropy", "attention entropy"}, {"act_rms", "activation RMS"}};
    for (size_t k = 0; L && k < KILN_ARRAY_LEN(lay); k++) {
        char names[16][64];
        const char *np[16];
        for (int l = 0; l < L; l++) {
            snprintf(names[l], sizeof names[l], "%s@%d", lay[k].metric, l);
            np[l] = names[l];
        }
        chart(b, c, n, lay[k].metric, lay[k].title, np, (size_t)L, KILN_WEB_SCALE_LINEAR, m, nm,
              lo, hi);
    }
    /* The movers' update ratios. */
    const json_t *mv = json_object_get(s, "movers");
    char ub[8][300];
    const char *un[8];
    size_t nu = 0;
    for (size_t i = 0; i < json_array_size(mv) && nu < 8; i++) {
        const char *t = json_string_value(json_array_get(mv, i));
        if (!t) continue;
        snprintf(ub[nu], sizeof ub[nu], "update_ratio@%s", t);
        un[nu] = ub[nu];
        nu++;
    }
    chart(b, c, n, "tensor_update_ratio", "update / weight ratio, top movers", un, nu,
          KILN_WEB_SCALE_AUTO, m, nm, lo, hi);
    lit(b, "</div>\n");
    for (size_t i = 0; i < nm; i++)
        free(texts[i]);
    free(texts);
    free(m);
    for (size_t i = 0; i < n; i++) {
        free(c[i].x);
        free(c[i].y);
    }
    free(c);
}
