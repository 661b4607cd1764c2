/* runs_views.c - kiln runs serve's run data as web/'s plain values (runs_views.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"
#include "runs_views.h"

const char *runs_link_name(const char *root, const kiln_run_row *r) {
    if (!strcmp(r->dir, root)) return ".";
    const char *slash = strrchr(r->dir, '/');
    return slash ? slash + 1 : r->dir;
}

/* What every run shares as "key=value " words (kiln runs list's line); caller frees. */
static char *same_text(const json_t *same) {
    char *t = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&t, &len);
    const char *key;
    json_t *v;
    if (!f) return NULL;
    json_object_foreach((json_t *)same, key, v) {
        char *x = kiln_run_config_value_text(v);
        fprintf(f, "%s=%s ", key, x ? x : "?");
        free(x);
    }
    fclose(f);
    return t;
}

/* The value of each of the n keys in cfg as kiln runs list writes it (NULL: none); the caller
 * frees each. */
static void values_of(const json_t *cfg, const char *const *keys, size_t n, char **out) {
    for (size_t k = 0; k < n; k++) {
        const json_t *x = cfg ? json_object_get(cfg, keys[k]) : NULL;
        out[k] = x ? kiln_run_config_value_text(x) : NULL;
    }
}

static void free_all(char **v, size_t n) {
    for (size_t i = 0; v && i < n; i++)
        free(v[i]);
}

/* A run's curves as series (they point into cv); caller frees the array. */
static kiln_web_series *series_of(const kiln_run_curves *cv) {
    kiln_web_series *s = calloc(cv->n + 1, sizeof *s);
    for (size_t i = 0; s && i < cv->n; i++)
        s[i] = (kiln_web_series){cv->c[i].name, cv->c[i].x, cv->c[i].y, cv->c[i].n};
    return s;
}

/* ---- the sweep ---- */

kiln_err runs_sweep_view_load(const char *root, runs_sweep_view *v) {
    memset(v, 0, sizeof *v);
    const char *paths[1] = {root};
    KILN_TRY(kiln_run_list_load(paths, 1, NULL, &v->l));
    const kiln_run_list *l = &v->l;
    /* At most RUNS_MAX_VARIED columns: a run with thousands of config keys of its own must
     * not make the sweep's page too large to show (KILN_WEB_PAGE_MAX). */
    size_t nv_all = json_array_size(l->varied);
    size_t nv = nv_all < RUNS_MAX_VARIED ? nv_all : RUNS_MAX_VARIED;
    for (size_t k = 0; k < nv; k++)
        v->varied[k] = json_string_value(json_array_get(l->varied, k));
    v->vals = calloc(l->n * nv + 1, sizeof *v->vals);
    v->rows = calloc(l->n + 1, sizeof *v->rows);
    v->sw = (kiln_web_sweep){same_text(l->same), v->varied, nv, nv_all, v->rows, l->n};
    v->same = (char *)v->sw.same;
    v->nomem = !v->vals || !v->rows;
    for (size_t i = 0; !v->nomem && i < l->n; i++) {
        const kiln_run_row *r = &l->rows[i];
        values_of(r->config, v->varied, nv, v->vals + i * nv);
        v->rows[i] = (kiln_web_run_row){.name = runs_link_name(root, r),
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
                                        .varied = (const char *const *)v->vals + i * nv};
    }
    return KILN_OK;
}

void runs_sweep_view_release(runs_sweep_view *v) {
    free_all(v->vals, v->sw.n_rows * v->sw.n_varied);
    free(v->vals);
    free(v->rows);
    free(v->same);
    kiln_run_list_release(&v->l); /* zeroed when it was not read */
    memset(v, 0, sizeof *v);
}

/* ---- a run ---- */

/* The config flattened ("opt.beta1"), its values as kiln runs show writes them. */
static bool flatten(runs_run_view *o, const char *prefix, const json_t *obj) {
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        char *k = prefix ? kiln_asprintf("%s.%s", prefix, key) : kiln_strdup(key);
        if (!k) return false;
        if (json_is_object(v)) {
            bool ok = flatten(o, k, v);
            free(k);
            if (!ok) return false;
            continue;
        }
        if (o->n_config == o->cap_config) {
            size_t cap = 2 * o->cap_config + 8;
            kiln_web_kv *grown = realloc(o->config, cap * sizeof *grown);
            if (!grown) {
                free(k);
                return false;
            }
            o->config = grown, o->cap_config = cap;
        }
        o->config[o->n_config] = (kiln_web_kv){k, kiln_run_config_value_text(v)};
        if (!o->config[o->n_config++].value) return false;
    }
    return true;
}

static const char *run_str(const kiln_run_info *ri, const char *key) {
    return json_string_value(json_object_get(ri->run, key));
}

/* The view of ri and cv (NULL: none); false: out of memory. */
static bool run_view_of(runs_run_view *v, const kiln_run_info *ri, bool live,
                        const kiln_run_curves *cv, const char *name, const char *title) {
    const json_t *cfg = json_object_get(ri->run, "config");
    v->events = calloc(ri->n_events + 1, sizeof *v->events);
    for (size_t i = 0; v->events && i < ri->n_events; i++)
        v->events[i] =
            (kiln_web_event){ri->events[i].step, ri->events[i].kind, ri->events[i].message};
    v->curves = cv ? series_of(cv) : NULL;
    bool ok = v->events && (!cv || v->curves) && (!cfg || flatten(v, NULL, cfg));
    static const kiln_run_curves none = {0};
    if (!cv) cv = &none;
    v->v = (kiln_web_run_view){.name = name,
                               .title = title,
                               .run_id = run_str(ri, "run_id"),
                               .created = run_str(ri, "created"),
                               .dataset = run_str(ri, "dataset_path"),
                               .dataset_sha256 = run_str(ri, "dataset_sha256"),
                               .step = ri->last_step,
                               .steps = (long)json_integer_value(json_object_get(cfg, "steps")),
                               .state = kiln_run_state_name(kiln_run_state_of(ri, live)),
                               .stop_message = ri->stop_message,
                               .ckpts = ri->ckpts,
                               .n_ckpts = ri->n_ckpts,
                               .best_ckpt = ri->best_ckpt,
                               .n_spikes = ri->n_spikes,
                               .n_nonfinite = ri->n_nonfinite,
                               .total_events = ri->total_events,
                               .events = v->events,
                               .n_events = ri->n_events,
                               .config = v->config,
                               .n_config = v->n_config,
                               .curves_error = cv == &none ? v->curves_error : NULL,
                               .curves = v->curves,
                               .n_curves = cv->n,
                               .first = cv->first,
                               .last = cv->last,
                               .n_layers = cv->n_layers,
                               .n_experts = cv->n_experts,
                               .movers = (const char *const *)cv->movers,
                               .n_movers = cv->n_movers,
                               .sampled = cv->sampled,
                               .layers_summed = cv->layers_summed,
                               .tensors_summed = cv->tensors_summed};
    return ok;
}

kiln_err runs_run_view_load(kiln_run_cache *cache, const char *dir, const char *name,
                            const char *title, runs_run_view *v) {
    memset(v, 0, sizeof *v);
    KILN_TRY(kiln_run_info_load_quick(dir, RUNS_MAX_EVENTS, &v->ri));
    v->have_info = true;
    bool live = false;
    if (kiln_run_live(dir, &live)) live = false;
    v->have_curves = !kiln_run_curves_load_cached(cache, dir, RUNS_CURVE_BUCKETS, 8, &v->cv);
    if (!v->have_curves) snprintf(v->curves_error, sizeof v->curves_error, "%s", kiln_errmsg());
    v->nomem = !run_view_of(v, &v->ri, live, v->have_curves ? &v->cv : NULL, name, title);
    return KILN_OK;
}

void runs_run_view_release(runs_run_view *v) {
    for (size_t i = 0; i < v->n_config; i++) {
        free((char *)v->config[i].key);
        free((char *)v->config[i].value);
    }
    free(v->config);
    free(v->curves);
    free(v->events);
    if (v->have_curves) kiln_run_curves_release(&v->cv);
    if (v->have_info) kiln_run_info_release(&v->ri);
    memset(v, 0, sizeof *v);
}

/* ---- the overlay ---- */

/* What differs between the n runs: the config keys they do not share (kiln runs list's
 * "varied", over those runs alone) and each run's value of them. */
static void differs_of(const char *const *dirs, size_t n, runs_overlay_view *v) {
    v->have_list = kiln_run_list_load(dirs, n, NULL, &v->l) == KILN_OK;
    if (!v->have_list) kiln_errclear();
    size_t nv = v->have_list ? json_array_size(v->l.varied) : 0;
    if (nv > 64) nv = 64;
    for (size_t k = 0; k < nv; k++)
        v->keys[k] = json_string_value(json_array_get(v->l.varied, k));
    v->same = v->have_list ? same_text(v->l.same) : NULL;
    for (size_t i = 0; i < n; i++) {
        /* the row of run i (the list is sorted by its own key): the one of its directory */
        const json_t *cfg = NULL;
        for (size_t j = 0; v->have_list && j < v->l.n && !cfg; j++)
            if (v->l.rows[j].dir && !strcmp(v->l.rows[j].dir, dirs[i])) cfg = v->l.rows[j].config;
        values_of(cfg, v->keys, nv, v->vals[i]);
        v->runs[i].values = (const char *const *)v->vals[i];
    }
    v->o.same = v->same, v->o.keys = v->keys, v->o.n_keys = nv;
}

kiln_err runs_overlay_view_load(const char *const *names, const char *const *titles,
                                const char *const *dirs, size_t n, runs_overlay_view *v) {
    memset(v, 0, sizeof *v);
    for (; v->loaded < n; v->loaded++) {
        size_t i = v->loaded;
        if (!dirs[i]) return kiln_fail(KILN_ERR_NOTFOUND, "run '%s': no such run here", names[i]);
        kiln_err e = kiln_run_curves_load(dirs[i], RUNS_CURVE_BUCKETS, 1, 0, &v->cv[i]);
        if (e) return kiln_errprefix(e, "run '%s': ", names[i]);
        v->runs[i] = (kiln_web_overlay_run){.name = names[i],
                                            .title = titles[i],
                                            .curves = series_of(&v->cv[i]),
                                            .n_curves = v->cv[i].n,
                                            .first = v->cv[i].first,
                                            .last = v->cv[i].last};
        v->nomem |= !v->runs[i].curves;
    }
    v->o.runs = v->runs, v->o.n_runs = n;
    differs_of(dirs, n, v);
    return KILN_OK;
}

void runs_overlay_view_release(runs_overlay_view *v) {
    for (size_t i = 0; i < v->loaded; i++) {
        free((kiln_web_series *)v->runs[i].curves);
        free_all(v->vals[i], v->o.n_keys);
        kiln_run_curves_release(&v->cv[i]);
    }
    free(v->same);
    if (v->have_list) kiln_run_list_release(&v->l);
    memset(v, 0, sizeof *v);
}

/* ---- a step explained ---- */

static double num(const json_t *o, const char *key) {
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

static const char *str(const json_t *o, const char *key) {
    return json_string_value(json_object_get(o, key));
}

static kiln_web_explain_figure figure(const char *name, const json_t *v) {
    return (kiln_web_explain_figure){name, num(v, "value"), num(v, "median"), num(v, "ratio")};
}

/* The answer d as plain values (pointing into it); false: out of memory. */
static bool explain_of(const json_t *d, kiln_web_explain *x) {
    const json_t *fi = json_object_get(d, "findings"), *sm = json_object_get(d, "step_metrics");
    const json_t *te = json_object_get(d, "tensors"), *ev = json_object_get(d, "events");
    kiln_web_kv *f = calloc(json_array_size(fi) + json_array_size(ev) + 1, sizeof *f);
    kiln_web_explain_figure *g = calloc(json_object_size(sm) + json_array_size(te) + 1, sizeof *g);
    x->findings = f, x->metrics = g;
    if (!f || !g) return false;
    x->events = f + json_array_size(fi), x->tensors = g + json_object_size(sm);
    size_t i;
    const char *key;
    json_t *v;
    json_array_foreach(fi, i, v) f[x->n_findings++] = (kiln_web_kv){str(v, "kind"), str(v, "text")};
    json_array_foreach(ev, i, v) f[x->n_findings + x->n_events++] =
        (kiln_web_kv){str(v, "kind"), str(v, "message")};
    json_object_foreach((json_t *)sm, key, v) g[x->n_metrics++] = figure(key, v);
    json_array_foreach(te, i, v) g[x->n_metrics + x->n_tensors++] = figure(str(v, "name"), v);
    return true;
}

kiln_err runs_explain_view_load(const char *dir, long step, const char *name, const char *title,
                                runs_explain_view *v) {
    memset(v, 0, sizeof *v);
    KILN_TRY(kiln_run_explain(dir, step, 0, &v->d));
    v->x.name = name, v->x.title = title, v->x.step = step;
    v->nomem = !explain_of(v->d, &v->x);
    return KILN_OK;
}

void runs_explain_view_release(runs_explain_view *v) {
    free((kiln_web_kv *)v->x.findings);
    free((kiln_web_explain_figure *)v->x.metrics);
    json_decref(v->d);
    memset(v, 0, sizeof *v);
}
