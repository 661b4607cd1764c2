/* cmd_runs.c - kiln runs show DIR, kiln runs diff A B, kiln runs explain DIR, kiln runs plot
 * DIR...: read run directories back. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "core.h"
#include "runs.h"

static void print_event(const kiln_run_event *e) {
    char when[21];
    kiln_format_time((int64_t)e->time, when);
    printf("  step %-8ld %s  %-12s %s\n", e->step, when, e->kind, e->message);
}

/* Exit status of a run that is no longer training: 0 finished, 1 otherwise. */
static int state_status(kiln_run_state s) {
    return s == KILN_RUN_FINISHED ? 0 : 1;
}

/* A follower's pause between two looks. */
static void sleep_ms(uint64_t ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int follow(const char *dir, kiln_run_cursor *cur, long every, uint64_t interval_ms);
static const char *telling_finding(const json_t *d);

int cmd_runs_show(int argc, char **argv) {
    long max_events = 20, every = 0;
    bool follow_run = false;
    const char *interval = NULL;
    const cli_opt opts[] = {
        {"events", CLI_INT, &max_events, "N", "show the newest N events (default 20)", false},
        {"follow", CLI_FLAG, &follow_run, NULL,
         "then print each step and event as the trainer logs it, until the run stops (exit 0 "
         "when it finished, 1 when it stopped short)",
         false},
        {"every", CLI_INT, &every, "N",
         "with --follow: print every Nth step (default a twentieth of the run; validations, "
         "the first and the last always)",
         false},
        {"interval", CLI_STR, &interval, "DURATION",
         "with --follow: how often to look (default 1s)", false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs show [--events N] [--follow [--every N] [--interval 1s]] DIR",
        "Show a run: config, data digest, progress, last and best metrics, events; with "
        "--follow, then the steps and events as they come.",
        opts, 1, 1};
    const char *dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &dir, &rc)) return rc;
    if (max_events < 0) return cli_usage_error("--events must not be negative");
    if ((every || interval) && !follow_run)
        return cli_usage_error("--every and --interval go with --follow");
    if (every < 0) return cli_usage_error("--every must not be negative");
    uint64_t interval_ms = 1000;
    if (interval && cli_parse_duration_ms(interval, 3600 * 1000, &interval_ms) != 1)
        return cli_usage_error("--interval '%s': expected a duration of at most 1h (100ms, 2s)",
                               interval);
    bool live = false;
    kiln_run_info ri;
    kiln_run_cursor cur;
    /* The cursor before the picture: a step logged in between is printed twice at worst,
     * never missed. */
    kiln_err err = follow_run ? kiln_run_cursor_end(dir, &cur) : KILN_OK;
    if (!err) err = kiln_run_live(dir, &live);
    if (!err) err = kiln_run_info_load(dir, (size_t)max_events, &ri);
    if (err) return cli_fail(err);
    kiln_run_state state = kiln_run_state_of(&ri, live);
    const json_t *cfg = json_object_get(ri.run, "config");
    long steps = (long)json_integer_value(json_object_get(cfg, "steps"));
    printf("run         %s\n", dir);
    printf("run id      %s\n", cli_jstr(ri.run, "run_id"));
    printf("created     %s by kiln %s\n", cli_jstr(ri.run, "created"),
           cli_jstr(ri.run, "kiln_version"));
    printf("dataset     %s\n            sha256 %s\n", cli_jstr(ri.run, "dataset_path"),
           cli_jstr(ri.run, "dataset_sha256"));
    if (json_object_get(ri.run, "init"))
        printf("init        %s\n", cli_jstr(json_object_get(ri.run, "init"), "path"));
    printf("progress    step %ld of %ld (%.0f%%), %s", ri.last_step, steps,
           steps > 0 ? 100.0 * (double)ri.last_step / (double)steps : 0.0,
           kiln_run_state_name(state));
    if (state == KILN_RUN_DIVERGED || state == KILN_RUN_FAILED)
        printf(": %s", ri.stop_message);
    if (state == KILN_RUN_INTERRUPTED || state == KILN_RUN_DIVERGED || state == KILN_RUN_FAILED)
        printf(" (kiln train --resume %s continues it)", dir);
    printf("\n");
    printf("checkpoints");
    if (!ri.n_ckpts) printf(" none");
    for (size_t i = 0; i < ri.n_ckpts; i++)
        printf(" %ld", ri.ckpts[i]);
    if (ri.best_ckpt >= 0)
        printf(" (best validation loss: %ld, which kiln export --best takes)", ri.best_ckpt);
    printf("\n");
    if (ri.last_step)
        printf("last        step %ld: loss %.6g, lr %.3g, gradient norm %.4g\n", ri.last_step,
               ri.last_loss, ri.last_lr, ri.last_grad_norm);
    if (ri.last_val_step) {
        printf("validation  step %ld: loss %.6g, r2 %.4f\n", ri.last_val_step, ri.last_val_loss,
               ri.last_val_r2);
        if (json_array_size(ri.last_val_targets)) {
            size_t i;
            json_t *row;
            printf("  r2 per target:");
            json_array_foreach(ri.last_val_targets, i, row) {
                printf(" %s %.4f", json_string_value(json_object_get(row, "name")),
                       json_real_value(json_object_get(row, "r2")));
            }
            printf("\n");
        }
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
    for (size_t i = 0; i < ri.n_events; i++)
        print_event(&ri.events[i]);
    cli_print_trouble(stdout, "trouble     ", &ri, dir);
    kiln_run_info_release(&ri);
    if (!follow_run) return 0;
    if (!live) {
        printf("following   nothing: the run is not training (%s)\n", kiln_run_state_name(state));
        return state_status(state);
    }
    return follow(dir, &cur, every, interval_ms);
}

/* Print what the trainer logs after cur until it lets go of the run, then how it ended. */
static int follow(const char *dir, kiln_run_cursor *cur, long every, uint64_t interval_ms) {
    printf("following   %s until it stops (Ctrl-C stops following, not the run)\n", dir);
    fflush(stdout);
    long first_step = -1; /* the next step after a start or resume: always printed */
    double t0 = NAN;      /* the first step seen, for the ETA */
    long s0 = 0;
    /* Spikes and non-finite steps seen, explained once their step's row is in. */
    long why[64];
    size_t n_why = 0;
    for (bool live = true;;) {
        kiln_run_news n;
        /* Once the trainer has let go, one more read: every row it committed is there. */
        kiln_err err = kiln_run_live(dir, &live);
        if (!err) err = kiln_run_follow(dir, cur, 100000, &n);
        if (err) return cli_fail(err);
        size_t i = 0, j = 0;
        while (i < n.n_steps || j < n.n_events) {
            if (j < n.n_events && (i == n.n_steps || n.events[j].time <= n.step_times[i])) {
                const kiln_run_event *e = &n.events[j++];
                print_event(e);
                if (!strcmp(e->kind, "start") || !strcmp(e->kind, "resume")) {
                    first_step = e->step + 1;
                    t0 = NAN;
                }
                if ((!strcmp(e->kind, "spike") || !strcmp(e->kind, "nonfinite")) &&
                    n_why < KILN_ARRAY_LEN(why))
                    why[n_why++] = e->step;
                continue;
            }
            kiln_train_progress *p = &n.steps[i];
            double t = n.step_times[i++];
            long k = every ? every : cli_step_every(p->steps);
            if (isnan(t0) || p->step <= s0) {
                t0 = t;
                s0 = p->step;
            }
            p->eta_s = p->step > s0 && p->steps > p->step
                           ? (t - t0) / (double)(p->step - s0) * (double)(p->steps - p->step)
                           : -1;
            if (p->has_val || !p->applied || p->step == first_step || p->step == p->steps ||
                p->step % k == 0)
                cli_print_step(stdout, "  ", p);
            for (size_t q = 0; q < n_why;) {
                if (why[q] > p->step) {
                    q++;
                    continue;
                }
                json_t *d = NULL;
                if (!kiln_run_explain(dir, why[q], 0, &d))
                    printf("    why (step %ld): %s\n", why[q], telling_finding(d));
                else
                    kiln_errclear(); /* a resume took the step back: nothing to say */
                json_decref(d);
                memmove(why + q, why + q + 1, (--n_why - q) * sizeof *why);
            }
        }
        kiln_run_news_release(&n);
        fflush(stdout);
        if (!live) break;
        sleep_ms(interval_ms);
    }
    kiln_run_info ri;
    kiln_err err = kiln_run_info_load(dir, 0, &ri);
    if (err) return cli_fail(err);
    kiln_run_state state = kiln_run_state_of(&ri, false);
    const json_t *steps = json_object_get(json_object_get(ri.run, "config"), "steps");
    printf("stopped     step %ld of %lld, %s", ri.last_step, (long long)json_integer_value(steps),
           kiln_run_state_name(state));
    if (state == KILN_RUN_DIVERGED || state == KILN_RUN_FAILED) printf(": %s", ri.stop_message);
    if (state != KILN_RUN_FINISHED) printf(" (kiln train --resume %s continues it)", dir);
    printf("\n");
    kiln_run_info_release(&ri);
    return state_status(state);
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
            char *a = kiln_run_config_value_text(json_array_get(v, 0)),
                 *b = kiln_run_config_value_text(json_array_get(v, 1));
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

/* ---- kiln runs explain ---- */

/* A number of an explain document: "%.4g", or "-" when it is null (not finite, none). */
static const char *xnum(const json_t *v, char *buf, size_t len) {
    if (!json_is_number(v)) return "-";
    snprintf(buf, len, "%.4g", json_number_value(v));
    return buf;
}

static const char *xratio(const json_t *stat, char *buf, size_t len) {
    const json_t *r = json_object_get(stat, "ratio");
    if (!json_is_number(r)) return "-";
    snprintf(buf, len, "%.1fx", json_number_value(r));
    return buf;
}

/* "value (median)" of a layer's figure, padded to width (0: not padded). */
static void print_vm(const json_t *stat, int width) {
    char a[32], b[32], cell[80] = "-";
    if (stat && !json_is_null(stat))
        snprintf(cell, sizeof cell, "%s (%s)", xnum(json_object_get(stat, "value"), a, sizeof a),
                 xnum(json_object_get(stat, "median"), b, sizeof b));
    printf("  %-*s", width, cell);
}

static void print_explain(const json_t *d, long max_tensors) {
    char a[32], b[32], c[32];
    const json_t *ev = json_object_get(d, "events");
    const long step = (long)json_integer_value(json_object_get(d, "step"));
    const long window = (long)json_integer_value(json_object_get(d, "window"));
    printf("run       %s\n", cli_jstr(d, "run"));
    printf("step      %ld of %lld", step,
           (long long)json_integer_value(json_object_get(d, "steps")));
    if (!strcmp(cli_jstr(d, "chosen"), "asked"))
        printf("\n");
    else
        printf(", the run's first spike or non-finite step (%lld in all; --step N for another)\n",
               (long long)json_integer_value(json_object_get(d, "trouble_steps")));
    size_t i;
    const json_t *e;
    json_array_foreach(ev, i, e)
        printf("          %s: %s\n", cli_jstr(e, "kind"), cli_jstr(e, "message"));
    printf("update    %s\n", json_is_true(json_object_get(d, "applied")) ? "applied" : "skipped");
    printf("\n                at step %-8ld median of %lld before  ratio\n", step,
           (long long)json_integer_value(json_object_get(d, "baseline_steps")));
    static const char *const rows[][2] = {{"loss", "loss"},
                                          {"grad_norm", "gradient norm"},
                                          {"lr", "lr"},
                                          {"max_abs_output", "largest output"}};
    const json_t *sm = json_object_get(d, "step_metrics");
    for (size_t k = 0; k < KILN_ARRAY_LEN(rows); k++) {
        const json_t *st = json_object_get(sm, rows[k][0]);
        printf("%-15s %-16s %-21s %s", rows[k][1], xnum(json_object_get(st, "value"), a, sizeof a),
               xnum(json_object_get(st, "median"), b, sizeof b), xratio(st, c, sizeof c));
        const json_t *since = json_object_get(st, "since");
        if (json_is_integer(since) && json_integer_value(since) < step)
            printf("  (over 3x since step %lld)", (long long)json_integer_value(since));
        printf("\n");
    }
    const json_t *ts = json_object_get(d, "tensors");
    size_t nt = json_array_size(ts);
    if (nt) {
        printf(
            "\ngradient norms, the %zu furthest from their median (of %zu tensors; --tensors N)\n",
            nt < (size_t)max_tensors ? nt : (size_t)max_tensors, nt);
        printf("  %-32s %-10s %-10s %-8s %-16s %s\n", "tensor", "norm", "median", "ratio",
               "over 3x since", "largest update of the 8 steps before");
        json_array_foreach(ts, i, e) {
            if (i >= (size_t)max_tensors) break;
            char since[32] = "-", upd[96] = "-", u1[32], u2[32];
            const json_t *sv = json_object_get(e, "since");
            if (json_is_integer(sv))
                snprintf(since, sizeof since, "step %lld", (long long)json_integer_value(sv));
            if (json_is_number(json_object_get(e, "update_max")))
                snprintf(upd, sizeof upd, "%s at step %lld (median %s)",
                         xnum(json_object_get(e, "update_max"), u1, sizeof u1),
                         (long long)json_integer_value(json_object_get(e, "update_step")),
                         xnum(json_object_get(e, "update_median"), u2, sizeof u2));
            printf("  %-32s %-10s %-10s %-8s %-16s %s\n", cli_jstr(e, "name"),
                   xnum(json_object_get(e, "value"), a, sizeof a),
                   xnum(json_object_get(e, "median"), b, sizeof b), xratio(e, c, sizeof c), since,
                   upd);
        }
    }
    const json_t *ls = json_object_get(d, "layers");
    if (json_array_size(ls)) {
        const long E = (long)json_integer_value(json_object_get(d, "n_experts"));
        printf("\nlayers at step %ld (median of the %ld steps before in brackets)\n", step, window);
        printf("  %-5s  %-18s  %-18s  %-5s  %-18s  %-18s  %s\n", "layer", "attn entropy",
               "router entropy", "dead", "load imbalance", "overflow", "output rms");
        json_array_foreach(ls, i, e) {
            printf("  %-5lld", (long long)json_integer_value(json_object_get(e, "layer")));
            print_vm(json_object_get(e, "attn_entropy"), 18);
            print_vm(json_object_get(e, "router_entropy"), 18);
            char dead[32] = "-";
            const json_t *dv = json_object_get(json_object_get(e, "dead_experts"), "value");
            if (E && json_is_number(dv))
                snprintf(dead, sizeof dead, "%.0f/%ld", json_number_value(dv), E);
            printf("  %-5s", dead);
            print_vm(json_object_get(e, "load_imbalance"), 18);
            print_vm(json_object_get(e, "overflow"), 18);
            print_vm(json_object_get(e, "act_rms"), 0);
            printf("\n");
        }
    }
    printf("\nfindings\n");
    json_array_foreach(json_object_get(d, "findings"), i, e)
        printf("  - %s\n", cli_jstr(e, "text"));
}

/* The most telling finding of an explain document past the step's own loss and norm, which
 * a spike's event line says already; those when there is nothing else. */
static const char *telling_finding(const json_t *d) {
    const json_t *fs = json_object_get(d, "findings"), *pick = json_array_get(fs, 0), *e;
    size_t k;
    json_array_foreach(fs, k, e) {
        if (strcmp(cli_jstr(e, "kind"), "loss") && strcmp(cli_jstr(e, "kind"), "grad_norm")) {
            pick = e;
            break;
        }
    }
    return cli_jstr(pick, "text");
}

/* --all: each trouble step of first's "trouble" list, one line: step, events, first finding. */
static int explain_all(const char *dir, long window, const json_t *first) {
    const json_t *steps = json_object_get(first, "trouble");
    long total = (long)json_integer_value(json_object_get(first, "trouble_steps"));
    printf("%zu spike and non-finite step%s%s (kiln runs explain --step N %s for one in full)\n",
           json_array_size(steps), json_array_size(steps) == 1 ? "" : "s",
           (long)json_array_size(steps) < total ? " (the first shown)" : "", dir);
    size_t i;
    const json_t *v;
    json_array_foreach(steps, i, v) {
        const long s = (long)json_integer_value(v);
        json_t *d = NULL;
        kiln_err err = kiln_run_explain(dir, s, window, &d);
        if (err) return cli_fail(err);
        char kinds[64] = "";
        size_t k;
        const json_t *e;
        json_array_foreach(json_object_get(d, "events"), k, e) {
            size_t n = strlen(kinds);
            snprintf(kinds + n, sizeof kinds - n, "%s%s", n ? "," : "", cli_jstr(e, "kind"));
        }
        printf("step %-8ld %-10s %s\n", s, kinds, telling_finding(d));
        json_decref(d);
    }
    return 0;
}

int cmd_runs_explain(int argc, char **argv) {
    long step = 0, window = KILN_EXPLAIN_WINDOW, max_tensors = 8;
    bool as_json = false, all = false;
    const cli_opt opts[] = {
        {"step", CLI_INT, &step, "N",
         "the step to explain (default the run's first spike or non-finite step)", false},
        {"window", CLI_INT, &window, "N", "how many steps before it are its baseline (default 64)",
         false},
        {"tensors", CLI_INT, &max_tensors, "N",
         "show the N tensors furthest from their median (default 8)", false},
        {"json", CLI_FLAG, &as_json, NULL,
         "print the whole analysis as JSON (every tensor and layer)", false},
        {"all", CLI_FLAG, &all, NULL,
         "a line for each spike and non-finite step: its first finding", false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs explain [--step N | --all] [--window 64] [--tensors 8] [--json] DIR",
        "Why a step went wrong: a spike or non-finite step set against the steps before it, "
        "tensor by tensor and layer by layer (gradient norms, updates, router and attention "
        "entropies, dead experts, activations), with findings in words.",
        opts, 1, 1};
    const char *dir;
    int rc;
    if (!cli_parse_args(&spec, argc, argv, &dir, &rc)) return rc;
    if (step < 0) return cli_usage_error("--step must be a step number from 1");
    if (all && (step || as_json))
        return cli_usage_error("--all goes without --step and --json (--json lists the steps in "
                               "\"trouble\"; --step N explains one)");
    if (window < 1 || window > 100000) return cli_usage_error("--window must be 1 to 100000");
    if (max_tensors < 0) return cli_usage_error("--tensors must not be negative");
    json_t *d = NULL;
    kiln_err err = kiln_run_explain(dir, step, window, &d);
    if (err) return cli_fail(err);
    if (as_json) {
        int status = cli_print_json(d, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
        json_decref(d);
        return status;
    }
    if (all && !json_is_null(json_object_get(d, "step"))) {
        int status = explain_all(dir, window, d);
        json_decref(d);
        return status;
    }
    if (json_is_null(json_object_get(d, "step")))
        printf("'%s': no spike and no non-finite step in %lld logged steps: nothing to explain "
               "(--step N looks at any step)\n",
               dir, (long long)json_integer_value(json_object_get(d, "last_logged")));
    else
        print_explain(d, max_tensors);
    json_decref(d);
    return 0;
}

/* ---- kiln runs plot ---- */

#define PLOT_MAX_RUNS 8

static const char glyphs[] = "*o+x@%&=~$";

/* Events worth a mark under a curve: what a research engineer lines a jump up against. */
static char event_glyph(const char *kind) {
    if (!strcmp(kind, "spike")) return '^';
    if (!strcmp(kind, "resume")) return 'R';
    if (!strcmp(kind, "device_change")) return 'D';
    if (!strcmp(kind, "ckpt_skipped")) return 'S';
    return 0;
}

/* The plot's width: --width, else the terminal's less the axis, else 64. */
static int plot_width(long asked) {
    if (asked) return (int)asked;
    struct winsize ws;
    if (isatty(1) && !ioctl(1, TIOCGWINSZ, &ws) && ws.ws_col >= 40)
        return ws.ws_col - 16 > 200 ? 200 : ws.ws_col - 16;
    return 64;
}

/* --csv: one row per step any series has, a column per series, empty where one has none. */
static void print_csv(const kiln_run_chart_series *s, size_t n) {
    printf("step");
    for (size_t k = 0; k < n; k++)
        printf(",%s", s[k].label);
    printf("\n");
    size_t *at = calloc(n, sizeof *at);
    if (!at) return;
    for (;;) {
        double step = INFINITY;
        for (size_t k = 0; k < n; k++)
            if (at[k] < s[k].n && s[k].x[at[k]] < step) step = s[k].x[at[k]];
        if (step == INFINITY) break;
        printf("%.0f", step);
        for (size_t k = 0; k < n; k++) {
            putchar(',');
            if (at[k] < s[k].n && s[k].x[at[k]] == step) {
                double v = s[k].y[at[k]++];
                if (isfinite(v))
                    printf("%.9g", v);
                else
                    printf("nan");
            }
        }
        printf("\n");
    }
    free(at);
}

typedef struct plot_run {
    kiln_run_series *s; /* per metric */
    size_t n;
} plot_run;

/* What one drawing of kiln runs plot takes. */
typedef struct plot_args {
    char **dirs;
    int ndirs;
    const char *const *names;
    size_t n_names;
    long from, to, width, height;
    bool log_y, csv;
} plot_args;

/* Draw every metric of a->names for a->dirs once (each run read afresh); 0, or the exit status
 * of a failure (said on stderr). */
static int plot_draw(const plot_args *a) {
    const int ndirs = a->ndirs;
    char **dirs = a->dirs;
    plot_run *runs = calloc((size_t)ndirs, sizeof *runs);
    kiln_run_info *info = calloc((size_t)ndirs, sizeof *info);
    kiln_run_chart_mark *marks = NULL;
    size_t n_marks = 0;
    bool any_marks = false;
    kiln_err err = KILN_OK;
    int rc = 0;
    if (!runs || !info) {
        rc = cli_fail(kiln_fail(KILN_ERR_NOMEM, "out of memory"));
        goto out;
    }
    for (int d = 0; d < ndirs; d++) {
        if ((err = kiln_run_info_load(dirs[d], (size_t)-1, &info[d]))) {
            rc = cli_fail(err);
            goto out;
        }
        n_marks += info[d].n_events;
    }
    /* The runs' events, the same under every chart. */
    marks = calloc(n_marks ? n_marks : 1, sizeof *marks);
    if (!marks) {
        rc = cli_fail(kiln_fail(KILN_ERR_NOMEM, "out of memory"));
        goto out;
    }
    n_marks = 0;
    for (int d = 0; d < ndirs; d++)
        for (size_t e = 0; e < info[d].n_events; e++) {
            char g = event_glyph(info[d].events[e].kind);
            if (g) marks[n_marks++] = (kiln_run_chart_mark){(double)info[d].events[e].step, g};
        }
    const long last = a->to ? a->to : (long)(((unsigned long)-1) >> 1);
    for (size_t m = 0; m < a->n_names && !rc; m++) {
        /* Every run's series of this metric (one each, or one per expert). */
        size_t total = 0;
        for (int d = 0; d < ndirs; d++) {
            kiln_run_series_free(runs[d].s, runs[d].n);
            runs[d].s = NULL;
            runs[d].n = 0;
            if ((err = kiln_run_series_load(dirs[d], a->names[m], a->from, last, &runs[d].s,
                                            &runs[d].n))) {
                rc = cli_fail(err);
                goto out;
            }
            total += runs[d].n;
        }
        kiln_run_chart_series *cs = calloc(total, sizeof *cs);
        char **owned = calloc(total, sizeof *owned);
        if (!cs || !owned) {
            free(cs);
            free(owned);
            rc = cli_fail(kiln_fail(KILN_ERR_NOMEM, "out of memory"));
            goto out;
        }
        size_t k = 0;
        for (int d = 0; d < ndirs; d++)
            for (size_t j = 0; j < runs[d].n; j++, k++) {
                kiln_run_series *s = &runs[d].s[j];
                owned[k] =
                    ndirs > 1 && runs[d].n > 1 ? kiln_asprintf("%s %s", dirs[d], s->name) : NULL;
                cs[k] =
                    (kiln_run_chart_series){owned[k]    ? owned[k]
                                        : ndirs > 1 ? dirs[d]
                                                    : s->name,
                                        s->step, s->value, s->n, glyphs[k % (sizeof glyphs - 1)]};
            }
        if (a->csv) {
            if (m) printf("\n");
            print_csv(cs, total);
        } else {
            kiln_run_chart ch = {
                a->names[m],    cs,      total, marks, n_marks, "step", plot_width(a->width),
                (int)a->height, a->log_y};
            char *text = NULL;
            if ((err = kiln_run_chart_render(&ch, &text))) {
                rc = cli_fail(err);
            } else {
                printf("%s%s", m ? "\n" : "", text);
                any_marks |= strstr(text, "      marks  ") != NULL;
            }
            free(text);
        }
        for (size_t j = 0; j < total; j++)
            free(owned[j]);
        free(owned);
        free(cs);
    }
    if (!rc && any_marks)
        printf("marks: ^ loss or gradient spike, R resumed, D device changed, S checkpoint "
               "skipped, ! non-finite value\n");
out:
    for (int d = 0; d < ndirs && runs && info; d++) {
        kiln_run_series_free(runs[d].s, runs[d].n);
        kiln_run_info_release(&info[d]);
    }
    free(runs);
    free(info);
    free(marks);
    return rc;
}

/* --follow: draw again every interval while any run trains (on a terminal over the last
 * drawing, else one after another, each after a line with the time), then once more; 0 when
 * every run finished, 1 when one stopped short. */
static int plot_follow(const plot_args *a, uint64_t interval_ms) {
    const bool tty = isatty(1);
    for (;;) {
        bool live = false;
        for (int d = 0; d < a->ndirs; d++) {
            bool l = false;
            kiln_err err = kiln_run_live(a->dirs[d], &l);
            if (err) return cli_fail(err);
            live |= l;
        }
        char now[21];
        kiln_format_time(kiln_unix_time(), now);
        if (tty) printf("\033[H\033[2J");
        printf("-- %s%s\n", now,
               live ? " (following: redrawn while a run trains; Ctrl-C stops following)"
                    : " (no run is training: the last drawing)");
        int rc = plot_draw(a);
        fflush(stdout);
        if (rc) return rc;
        if (!live) break;
        sleep_ms(interval_ms);
    }
    int status = 0;
    for (int d = 0; d < a->ndirs; d++) {
        kiln_run_info ri;
        kiln_err err = kiln_run_info_load(a->dirs[d], 0, &ri);
        if (err) return cli_fail(err);
        kiln_run_state st = kiln_run_state_of(&ri, false);
        printf("%s: %s at step %ld\n", a->dirs[d], kiln_run_state_name(st), ri.last_step);
        if (state_status(st)) status = 1;
        kiln_run_info_release(&ri);
    }
    return status;
}

int cmd_runs_plot(int argc, char **argv) {
    cli_list metrics = {0};
    long from = 0, to = 0, width = 0, height = 12;
    bool log_y = false, csv = false, list = false, follow_runs = false;
    const char *interval = NULL;
    const cli_opt opts[] = {
        {"metric", CLI_MULTI, &metrics, "NAME",
         "what to draw, one chart each (repeatable; default loss and grad_norm; --list)", false},
        {"from", CLI_INT, &from, "STEP", "first step drawn (default the first)", false},
        {"to", CLI_INT, &to, "STEP", "last step drawn (default the last)", false},
        {"width", CLI_INT, &width, "N", "plot columns, 10 to 1000 (default: the terminal)", false},
        {"height", CLI_INT, &height, "N", "plot rows, 3 to 200 (default 12)", false},
        {"log", CLI_FLAG, &log_y, NULL, "log10 y axis", false},
        {"csv", CLI_FLAG, &csv, NULL, "print the values as CSV instead (step, one column each)",
         false},
        {"list", CLI_FLAG, &list, NULL, "list the metrics each run logged", false},
        {"follow", CLI_FLAG, &follow_runs, NULL,
         "draw again while a run trains (exit 0 when all finished, 1 when one stopped short)",
         false},
        {"interval", CLI_STR, &interval, "DURATION", "with --follow: how often (default 2s)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs plot [--metric NAME]... [--from STEP] [--to STEP] [--log] [--csv] [--follow "
        "[--interval 2s]] DIR...",
        "Draw a run's metrics over its steps (several runs overlaid): losses, gradient norm, "
        "router and attention statistics per layer, per-tensor gradient norms; spikes, resumes "
        "and non-finite steps marked under the curve.",
        opts, 1, PLOT_MAX_RUNS};
    char **dirs = NULL;
    int ndirs = 0, rc = cli_parse(&spec, argc, argv, &dirs, &ndirs);
    if (rc) {
        free(metrics.v);
        return rc == CLI_HELP_SHOWN ? 0 : rc;
    }
    static const char *const defaults[] = {"loss", "grad_norm"};
    plot_args a = {.dirs = dirs,
                   .ndirs = ndirs,
                   .names = metrics.n ? metrics.v : defaults,
                   .n_names = metrics.n ? (size_t)metrics.n : 2,
                   .from = from,
                   .to = to,
                   .width = width,
                   .height = height,
                   .log_y = log_y,
                   .csv = csv};
    uint64_t interval_ms = 2000;
    if (from < 0 || (to && to < from)) {
        rc = cli_usage_error("--from and --to: need 0 <= from <= to");
    } else if (interval && !follow_runs) {
        rc = cli_usage_error("--interval goes with --follow");
    } else if (follow_runs && (list || csv)) {
        rc = cli_usage_error("--follow draws charts: not with --list or --csv");
    } else if (interval && cli_parse_duration_ms(interval, 3600 * 1000, &interval_ms) != 1) {
        rc = cli_usage_error("--interval '%s': expected a duration of at most 1h (500ms, 2s)",
                             interval);
    } else if (list) {
        for (int d = 0; d < ndirs && !rc; d++) {
            char *text = NULL;
            kiln_err err = kiln_run_metrics_list(dirs[d], &text);
            if (err) {
                rc = cli_fail(err);
                break;
            }
            printf("%s%s\n%s", d ? "\n" : "", dirs[d], text);
            free(text);
        }
    } else {
        rc = follow_runs ? plot_follow(&a, interval_ms) : plot_draw(&a);
    }
    free(dirs);
    free(metrics.v);
    return rc;
}

/* ---- kiln runs list ---- */

/* The table's width: --width, else the terminal's, else $COLUMNS, else no limit (a pipe). */
static int list_width(long asked) {
    if (asked >= 0) return (int)asked;
    struct winsize ws;
    if (isatty(1) && !ioctl(1, TIOCGWINSZ, &ws) && ws.ws_col > 0) return ws.ws_col;
    const char *cols = getenv("COLUMNS");
    long c = cols ? strtol(cols, NULL, 10) : 0;
    return c > 0 && c < 10000 ? (int)c : 0;
}

int cmd_runs_list(int argc, char **argv) {
    cli_list where = {0};
    const char *sort = NULL;
    long top = 0, width = -1;
    bool json = false, csv = false;
    const cli_opt opts[] = {
        {"sort", CLI_STR, &sort, "[-]KEY",
         "order by a column or config key, -KEY descending (default val_loss; runs without "
         "one last)",
         false},
        {"top", CLI_INT, &top, "N", "show the first N runs only", false},
        {"where", CLI_MULTI, &where, "KEY=VALUE",
         "only runs whose column or config key has this value (repeatable: different keys all "
         "match, one key repeated matches any of its values)",
         false},
        {"json", CLI_FLAG, &json, NULL, "print every field as JSON", false},
        {"csv", CLI_FLAG, &csv, NULL, "print the table as CSV, numbers exact", false},
        {"width", CLI_INT, &width, "N", "fit the table in N columns, 0 no limit (default: yours)",
         false},
        {0},
    };
    const cli_spec spec = {
        "kiln runs list [--sort [-]KEY] [--top N] [--where KEY=VALUE]... [--json | --csv] PATH...",
        "Compare runs side by side: each PATH a run directory or a directory of runs (a sweep). "
        "A row per run (state, step, last loss, best validation, tokens/s, age, non-finite "
        "steps and spikes) and a column per config key that differs between the runs; the keys "
        "they share are summed up above. A run that cannot be read is listed as an error and "
        "the exit status is 1.",
        opts, 1, -1};
    char **paths = NULL;
    int npaths = 0, rc = cli_parse(&spec, argc, argv, &paths, &npaths);
    if (rc) {
        free(where.v);
        return rc == CLI_HELP_SHOWN ? 0 : rc;
    }
    kiln_run_list l = {0};
    if (json && csv) {
        rc = cli_usage_error("--json and --csv: choose one");
        goto out;
    }
    if (top < 0 || width < -1 || (width > 0 && width < 20) || width > 10000) {
        rc = cli_usage_error(top < 0 ? "--top must not be negative"
                                     : "--width: 0 (no limit) or 20 to 10000 columns");
        goto out;
    }
    const kiln_run_list_opts o = {where.v, (size_t)where.n, sort, (size_t)top};
    kiln_err err = kiln_run_list_load((const char *const *)paths, (size_t)npaths, &o, &l);
    if (err) {
        rc = cli_fail(err);
        goto out;
    }
    char *text = NULL;
    if (json) {
        json_t *doc = kiln_run_list_json(&l);
        text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(15)) : NULL;
        json_decref(doc);
        if (!text) err = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    } else if (csv) {
        err = kiln_run_list_csv(&l, &text);
    } else {
        err = kiln_run_list_table(&l, list_width(width), (double)kiln_unix_time(), &text);
    }
    if (err) {
        rc = cli_fail(err);
        goto out;
    }
    fputs(text, stdout);
    if (json) putchar('\n');
    free(text);
    /* The broken runs' rows say so; their messages go where errors go, and the status
     * tells a script. */
    for (size_t i = 0; i < l.errors; i++)
        fprintf(stderr, "kiln: error: %s\n", l.error_messages[i]);
    rc = l.errors ? 1 : 0;
out:
    kiln_run_list_release(&l);
    free(paths);
    free(where.v);
    return rc;
}
