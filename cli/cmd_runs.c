/* cmd_runs.c - kiln runs show DIR, kiln runs diff A B: read run directories back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "core.h"
#include "train.h"

static const char *jstr(const json_t *o, const char *k) {
    const char *s = json_string_value(json_object_get(o, k));
    return s ? s : "?";
}

int cmd_runs_show(int argc, char **argv) {
    long max_events = 20;
    const cli_opt opts[] = {
        {"events", CLI_INT, &max_events, "N", "show the newest N events (default 20)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs show [--events N] DIR",
        "Show a run: config, data digest, progress, last and best metrics, events.", opts, 1, 1};
    const char *dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &dir, &rc)) return rc;
    if (max_events < 0) return cli_usage_error("--events must not be negative");
    kiln_run_info ri;
    kiln_err err = kiln_run_info_load(dir, (size_t)max_events, &ri);
    if (err) return cli_fail(err);
    const json_t *cfg = json_object_get(ri.run, "config");
    long steps = (long)json_integer_value(json_object_get(cfg, "steps"));
    printf("run         %s\n", dir);
    printf("run id      %s\n", jstr(ri.run, "run_id"));
    printf("created     %s by kiln %s\n", jstr(ri.run, "created"), jstr(ri.run, "kiln_version"));
    printf("dataset     %s\n            sha256 %s\n", jstr(ri.run, "dataset_path"),
           jstr(ri.run, "dataset_sha256"));
    if (json_object_get(ri.run, "init"))
        printf("init        %s\n", jstr(json_object_get(ri.run, "init"), "path"));
    printf("progress    step %ld of %ld (%.0f%%)%s\n", ri.last_step, steps,
           steps > 0 ? 100.0 * (double)ri.last_step / (double)steps : 0.0,
           ri.last_step >= steps ? ", finished" : "");
    printf("checkpoints");
    if (!ri.n_ckpts) printf(" none");
    for (size_t i = 0; i < ri.n_ckpts; i++)
        printf(" %ld", ri.ckpts[i]);
    printf("\n");
    if (ri.last_step)
        printf("last        step %ld: loss %.6g, lr %.3g, gradient norm %.4g\n", ri.last_step,
               ri.last_loss, ri.last_lr, ri.last_grad_norm);
    if (ri.last_val_step) {
        printf("validation  step %ld: loss %.6g, r2 %.4f\n", ri.last_val_step, ri.last_val_loss,
               ri.last_val_r2);
        printf("best        step %ld: loss %.6g, r2 %.4f\n", ri.best_val_step, ri.best_val_loss,
               ri.best_val_r2);
    }
    if (json_array_size(ri.layers)) {
        /* What a research engineer looks at first when a mixture misbehaves. */
        printf("layers      at step %ld\n", ri.last_step);
        printf("  layer  attn_H  router_H  imbalance  dead  overflow  act_rms  expert load\n");
        size_t i;
        json_t *row;
        json_array_foreach(ri.layers, i, row) {
            printf("  %-5lld  %6.3f  %8.3f  %9.3f  %4lld  %8.4f  %7.4f ",
                   (long long)json_integer_value(json_object_get(row, "layer")),
                   json_real_value(json_object_get(row, "attn_entropy")),
                   json_real_value(json_object_get(row, "router_entropy")),
                   json_real_value(json_object_get(row, "load_imbalance")),
                   (long long)json_integer_value(json_object_get(row, "dead_experts")),
                   json_real_value(json_object_get(row, "overflow")),
                   json_real_value(json_object_get(row, "act_rms")));
            size_t e;
            json_t *f;
            json_array_foreach(json_object_get(row, "expert_load"), e, f)
                printf(" %.3f", json_number_value(f));
            printf("\n");
        }
    }
    char *ctext = json_dumps(cfg, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(15));
    printf("config      %s\n", ctext ? ctext : "?");
    free(ctext);
    printf("events      %zu", ri.total_events);
    if (ri.n_events < ri.total_events) printf(" (newest %zu shown)", ri.n_events);
    printf("\n");
    for (size_t i = 0; i < ri.n_events; i++) {
        char when[21];
        kiln_format_time((int64_t)ri.events[i].time, when);
        printf("  step %-8ld %s  %-12s %s\n", ri.events[i].step, when, ri.events[i].kind,
               ri.events[i].message);
    }
    kiln_run_info_release(&ri);
    return 0;
}

int cmd_runs_diff(int argc, char **argv) {
    const cli_spec spec = {
        "kiln runs diff A B",
        "Compare two runs: config differences and the first step whose losses differ bit for "
        "bit. Exits 0 when identical, 1 when they differ.",
        NULL, 2, 2};
    const char *pos[2];
    int rc;
    if (!cli_parse_args(&spec, argc, argv, pos, &rc)) return rc;
    kiln_run_diff d;
    kiln_err err = kiln_run_diff_load(pos[0], pos[1], &d);
    if (err) return cli_fail(err);
    bool same = true;
    if (json_object_size(d.config)) {
        same = false;
        printf("config differs:\n");
        const char *k;
        json_t *v;
        json_object_foreach(d.config, k, v) {
            char *a = json_dumps(json_array_get(v, 0), JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
            char *b = json_dumps(json_array_get(v, 1), JSON_ENCODE_ANY | JSON_REAL_PRECISION(15));
            printf("  %-16s %s  vs  %s\n", k, a ? a : "?", b ? b : "?");
            free(a);
            free(b);
        }
    } else {
        printf("config identical\n");
    }
    if (d.first_diff) {
        same = false;
        printf("losses first differ at step %ld: %.17g (%s) vs %.17g (%s)\n", d.first_diff,
               d.a_loss, pos[0], d.b_loss, pos[1]);
    } else {
        printf("losses identical over %ld common steps", d.common_steps);
        if (d.a_steps != d.b_steps)
            printf(" (%s has %ld, %s has %ld)", pos[0], d.a_steps, pos[1], d.b_steps);
        printf("\n");
    }
    if (same && d.a_steps == d.b_steps)
        printf("identical\n");
    else
        same = false;
    kiln_run_diff_release(&d);
    return same ? 0 : 1;
}
