/* runlog.c - a run's progress as kiln train logs it and kiln runs show follows it. */
#include <stdio.h>

#include "cli.h"
#include "core.h"
#include "runs.h"

void cli_fmt_eta(double s, char *out, size_t n) {
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, n, "%ld:%02ld", t / 60, t % 60);
}

long cli_step_every(long steps) {
    return steps / 20 > 0 ? steps / 20 : 1;
}

void cli_print_step(FILE *f, const char *prefix, const kiln_train_progress *p) {
    fprintf(f, "%sstep %ld/%ld loss %.6g mse %.6g lb %.4g z %.4g lr %.3g gnorm %.4g %.0f tok/s",
            prefix, p->step, p->steps, p->loss, p->mse, p->load_balance, p->z, p->lr, p->grad_norm,
            p->tokens_per_s);
    if (p->eta_s >= 0) {
        char eta[32];
        cli_fmt_eta(p->eta_s, eta, sizeof eta);
        fprintf(f, " ETA %s", eta);
    }
    if (!p->applied) fprintf(f, " (update skipped)");
    if (p->has_val) fprintf(f, " val_loss %.6g val_r2 %.4f", p->val_loss, p->val_r2);
    fputc('\n', f);
}

void cli_print_trouble(FILE *f, const char *prefix, const kiln_run_info *ri, const char *dir) {
    if (!(ri->n_spikes + ri->n_nonfinite)) return;
    fprintf(f,
            "%s%zu spike%s, %zu non-finite step%s: kiln runs explain %s shows what led to the "
            "first\n",
            prefix, ri->n_spikes, ri->n_spikes == 1 ? "" : "s", ri->n_nonfinite,
            ri->n_nonfinite == 1 ? "" : "s", dir);
}
